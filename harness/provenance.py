"""What a measurement ran on, said one way in every record and table header
(``harness bench``, ``harness ab``): the backend, the device and the build.

Without a GPU the engine runs its NumPy backend on the CPU. A table that
said only "numpy" beside a tokens/s figure could pass for a GPU's, so the
NumPy engine is spelled out with the CPU it ran on.
"""

from __future__ import annotations

import platform

CPU_BACKENDS = ("numpy", "cpu")  # the engine's NumPy backend; llama.cpp's CPU build


def cpu_name() -> str:
    """This machine's CPU model (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(backend: str | None, gpu: str | None) -> str | None:
    """The device a run computed on: the GPU NVML named for a GPU backend,
    this machine's CPU (where the runs' children ran) for a CPU backend;
    None when the run said neither."""
    if backend and backend.lower() in CPU_BACKENDS:
        return cpu_name()
    return gpu or None


def phrase(backend: str | None, device_name: str | None) -> str:
    """"cuda on NVIDIA H200", "numpy (the NumPy engine) on the CPU: AMD EPYC 7B13"."""
    if backend and backend.lower() == "numpy":
        return f"numpy (the NumPy engine) on the CPU: {device_name or 'not reported'}"
    if backend and backend.lower() == "cpu":
        return f"cpu on the CPU: {device_name or 'not reported'}"
    return f"{backend or 'backend not reported'} on {device_name or 'a device not reported'}"
