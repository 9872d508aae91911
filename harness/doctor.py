"""``harness doctor``: what this machine can run, and how to fix what it cannot.

Each check says what was found and, when something is missing, the command
or action that fixes it. Only the parts everything needs (Python, the engine,
NumPy, gguf, a writable model cache) are required: without a GPU, NVML,
cuBLAS or llama.cpp the NumPy engine and the committed references still
work, so those are reported but do not fail the doctor (exit 0).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

MIN_PYTHON = (3, 11)
GGUF_PIN = "0.19.0"  # pyproject.toml


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # the command or action that makes it ok (when it is not)
    required: bool = False  # a failing required check makes the doctor exit 1


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():  # pynvml's deprecation notice, etc.
        warnings.simplefilter("ignore")
        yield


# ---- the checks: each returns a Check, or raises (reported as not ok) -------

def check_python() -> Check:
    v = sys.version_info
    ok = v[:2] >= MIN_PYTHON
    return Check("python", ok, f"{sys.version.split()[0]} ({sys.executable})",
                 f"install Python {'.'.join(map(str, MIN_PYTHON))} or newer", required=True)


def check_engine() -> Check:
    fix = "pip install -e . (from the repository root)"
    try:
        import engine
        import engine.bench
    except Exception as e:
        return Check("engine", False, f"not importable: {_first_line(e)}", fix, required=True)
    return Check("engine", True, f"{Path(engine.__file__).parent} (build {engine.bench.build_hash()})", fix,
                 required=True)


def check_numpy() -> Check:
    try:
        import numpy
    except Exception as e:
        return Check("numpy", False, f"not importable: {_first_line(e)}", "pip install 'numpy>=1.26'", required=True)
    return Check("numpy", True, numpy.__version__, "pip install 'numpy>=1.26'", required=True)


def check_gguf() -> Check:
    fix = f"pip install gguf=={GGUF_PIN}"
    try:
        import gguf  # noqa: F401
    except Exception as e:
        return Check("gguf", False, f"not importable: {_first_line(e)}", fix, required=True)
    v = _version("gguf") or "unknown version"
    note = "" if v == GGUF_PIN else f" (pyproject pins {GGUF_PIN}: `{fix}`)"
    return Check("gguf", True, v + note, fix, required=True)


def check_nvrtc() -> Check:
    from engine.backends.cuda import compile as nvrtc

    nvrtc.nvrtc_version.cache_clear()
    major, minor = nvrtc.nvrtc_version()
    return Check("nvrtc", True, f"NVRTC {major}.{minor}", "pip install 'cuda-toolkit[nvrtc]==13.*'")


def check_nvrtc_compile() -> Check:
    """A real compile of argmax.cu for sm_90 into a throw-away cache (needs
    NVRTC and the CUDA headers, not a GPU)."""
    from engine.backends.cuda import compile as nvrtc

    fix = "pip install 'cuda-toolkit[nvrtc,cudart]==13.*' (NVRTC + headers), or set CUDA_HOME to a CUDA toolkit"
    saved = {k: os.environ.get(k) for k in ("ANVIL_CACHE_DIR", "ANVIL_NO_COMPILE")}
    with tempfile.TemporaryDirectory(prefix="anvil-doctor-") as tmp:
        os.environ["ANVIL_CACHE_DIR"] = tmp
        os.environ.pop("ANVIL_NO_COMPILE", None)
        try:
            t0 = time.perf_counter()
            cubin = nvrtc.compile_cubin("argmax.cu", "sm_90")
            dt = time.perf_counter() - t0
        except Exception as e:
            return Check("nvrtc compile", False, f"argmax.cu for sm_90: {_first_line(e)}", fix)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return Check("nvrtc compile", True, f"argmax.cu -> sm_90 cubin, {len(cubin)} bytes in {dt:.2f} s "
                 f"(headers: {nvrtc.cuda_include_dir()})", fix)


def check_gpu() -> Check:
    from engine.backends.cuda.device import gpu_probe

    fix = ("no usable NVIDIA GPU: the engine falls back to the NumPy backend. On a GPU machine install the "
           "NVIDIA driver and check that `nvidia-smi` lists the GPU")
    if why := gpu_probe():
        return Check("cuda gpu", False, why.splitlines()[0], fix)
    from cuda.bindings import driver

    _, n = driver.cuDeviceGetCount()
    _, dev = driver.cuDeviceGet(0)
    _, name = driver.cuDeviceGetName(64, dev)
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    _, drv = driver.cuDriverGetVersion()
    name = name.split(b"\0", 1)[0].decode(errors="replace")
    return Check("cuda gpu", True, f"{n} device(s); 0: {name}, sm_{major}{minor}, "
                 f"driver CUDA {drv // 1000}.{drv % 1000 // 10}", fix)


def check_nvml() -> Check:
    fix = ("NVML ships with the NVIDIA driver (libnvidia-ml.so); `pip install nvidia-ml-py` for the bindings. "
           "Without it runs record no GPU name, clocks or power")
    try:
        with _quiet():
            import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        driver = pynvml.nvmlSystemGetDriverVersion()
        power = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
    except Exception as e:
        return Check("nvml", False, _first_line(e), fix)
    return Check("nvml", True, f"{name}, driver {driver}, power limit {power:.0f} W", fix)


def check_cublas() -> Check:
    fix = "pip install 'cuda-toolkit[cublas]==13.*' (or pip install -e '.[cuda]'): cuBLAS runs the GPU prefill"
    try:
        import cuda.pathfinder

        lib = cuda.pathfinder.load_nvidia_dynamic_lib("cublas")
    except Exception as e:
        return Check("cublas", False, _first_line(e), fix)
    return Check("cublas", True, f"{lib.abs_path}", fix)


_LLAMA_PROBE = ("import json, llama_cpp; print(json.dumps({'version': llama_cpp.__version__, "
                "'gpu': bool(llama_cpp.llama_supports_gpu_offload())}))")


def check_llama_cpp_python() -> Check:
    # in a child: importing llama_cpp here, after NumPy, is what crashes its CUDA build
    fix = ("scripts/llamacpp-python.sh (a portable CPU build; a few minutes), or with CUDA on the GPU host "
           "(scripts/gpu/llamacpp.sh); needed only to regenerate references or benchmark llama.cpp")
    p = subprocess.run([sys.executable, "-c", _LLAMA_PROBE], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        return Check("llama-cpp-python", False, f"not importable: {err}", fix)
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return Check("llama-cpp-python", True, f"{info['version']} ({'GPU offload' if info['gpu'] else 'CPU only'})",
                 fix)


def check_llama_bench() -> Check:
    fix = ("build llama.cpp (scripts/gpu/llamacpp.sh leaves llama-bench in /tmp/llamacpp/build/bin) and put it "
           "on PATH, or name it directly as llama-bench:/path/to/llama-bench")
    path = shutil.which("llama-bench")
    return Check("llama-bench", path is not None, path or "not on PATH", fix)


def check_models_dir() -> Check:
    from . import fetch

    fix = "set ANVIL_MODELS_DIR to a writable directory"
    try:
        d = fetch.models_dir()
        with tempfile.NamedTemporaryFile(dir=d, prefix=".doctor-"):
            pass
    except OSError as e:
        return Check("model cache", False, f"{os.environ.get('ANVIL_MODELS_DIR') or '~/.cache/anvil/models'}: "
                     f"not writable ({e.strerror or e})", fix, required=True)
    return Check("model cache", True, f"{d} (writable)", fix, required=True)


def catalog_file(e) -> Path:
    """Where the model cache keeps a catalog entry's file."""
    from . import catalog, fetch

    if e.source == "synth":
        return catalog.synth_path(e)
    return fetch.models_dir() / e.name / e.raw.get("filename", "")


def check_catalog() -> Check:
    from engine.errors import AnvilError

    from . import catalog, project

    try:
        cat = catalog.load()
    except AnvilError as e:  # no project here: nothing the harness does can work
        return Check("catalog models", False, str(e).split(": no catalog here")[0] + ": no catalog",
                     f"cd into an Anvil checkout, or name one: harness --project DIR (or {project.ENV}=DIR)",
                     required=True)
    present = [n for n, e in cat.items() if catalog_file(e).is_file()]
    missing_cpu = [n for n, e in cat.items() if e.tier == "cpu" and n not in present]
    missing_gpu = [n for n, e in cat.items() if e.tier == "gpu" and n not in present]
    detail = f"present: {', '.join(present) or 'none'}"
    if missing_cpu:
        detail += f"; missing (cpu tier): {', '.join(missing_cpu)}"
    if missing_gpu:
        detail += f"; not generated (gpu tier, GBs, on request): {', '.join(missing_gpu)}"
    return Check("catalog models", not missing_cpu, detail,
                 "harness models (fetches/generates the cpu tier; `harness models NAME` for a gpu-tier one)")


CHECKS = [check_python, check_engine, check_numpy, check_gguf, check_nvrtc, check_nvrtc_compile, check_gpu,
          check_nvml, check_cublas, check_llama_cpp_python, check_llama_bench, check_models_dir, check_catalog]


def diagnose(checks=None) -> list[Check]:
    out = []
    for fn in checks or CHECKS:
        name = fn.__name__.removeprefix("check_").replace("_", " ")
        try:
            out.append(fn())
        except Exception as e:  # a check that breaks is a finding, not a crash
            out.append(Check(name, False, f"check failed: {_first_line(e)}", "see the error above"))
    return out


def format_report(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks) if checks else 0
    lines = ["Anvil doctor"]
    for c in checks:
        status = "ok" if c.ok else ("FAIL" if c.required else "--")
        lines.append(f"  {status:4s}  {c.name:{width}s}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"        {'':{width}s}  fix: {c.fix}")
    failed = [c.name for c in checks if not c.ok and c.required]
    missing = [c.name for c in checks if not c.ok and not c.required]
    if failed:
        lines.append(f"required and failing: {', '.join(failed)}")
    lines.append(f"optional and missing: {', '.join(missing)}" if missing else "everything optional is present")
    if not failed:
        lines.append("everything required is present")
    return "\n".join(lines)


def main_doctor(args=None) -> int:
    """Print the report (``args.json``: as a JSON list). Exit 1 only when a
    required check fails; missing optional parts still exit 0."""
    checks = diagnose()
    if getattr(args, "json", False):
        print(json.dumps([asdict(c) for c in checks], indent=1))
    else:
        print(format_report(checks))
    return 1 if any(c.required and not c.ok for c in checks) else 0
