"""Whether a GPU is usable, and why not: engine's gpu_probe with a fake CUDA
driver, and the test suite's policy on it (conftest: skip and say why, or,
with ANVIL_REQUIRE_GPU=1, fail). CPU only."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import REPO, gpu_skip_reason
from engine.backends.cuda import device


class _Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804


def fake_driver(init=_Result.CUDA_SUCCESS, count=(_Result.CUDA_SUCCESS, 1)):
    """A cuda.bindings.driver whose cuInit returns ``init`` (or raises it, an
    exception) and cuDeviceGetCount ``count``."""
    def cu_init(flags):
        if isinstance(init, Exception):
            raise init
        return (init,)

    texts = {_Result.CUDA_ERROR_NO_DEVICE: b"no CUDA-capable device is detected",
             _Result.CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: b"forward compatibility was attempted on non "
                                                                b"supported HW"}
    return SimpleNamespace(CUresult=_Result, cuInit=cu_init, cuDeviceGetCount=lambda: count,
                           cuGetErrorName=lambda e: (_Result.CUDA_SUCCESS, e.name.encode()),
                           cuGetErrorString=lambda e: (_Result.CUDA_SUCCESS, texts.get(e, b"")))


@pytest.fixture
def driver(monkeypatch):
    """Install a fake driver where ``from cuda.bindings import driver`` finds it."""
    bindings = pytest.importorskip("cuda.bindings")
    pytest.importorskip("cuda.core")  # imported first: its import reads the real driver's types

    def install(fake):
        monkeypatch.setattr(bindings, "driver", fake)
    return install


def test_a_usable_gpu_has_no_reason(driver):
    driver(fake_driver())
    assert device.gpu_probe() is None and device.gpu_available()


@pytest.mark.parametrize("fake, why", [
    (fake_driver(init=_Result.CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
     "cuInit: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (forward compatibility was attempted on non supported HW)"),
    (fake_driver(count=(_Result.CUDA_ERROR_NO_DEVICE, 0)),
     "cuDeviceGetCount: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"),
    (fake_driver(count=(_Result.CUDA_SUCCESS, 0)), "the CUDA driver reports no devices"),
    (fake_driver(init=RuntimeError("Failed to dlopen libcuda.so.1")),
     "the CUDA driver failed (RuntimeError: Failed to dlopen libcuda.so.1)"),
])
def test_a_broken_driver_says_what_broke(driver, fake, why):
    driver(fake)
    assert device.gpu_probe() == why and not device.gpu_available()
    with pytest.raises(device.AnvilError, match=r"no usable NVIDIA GPU \(.*\): use --backend numpy"):
        device.Device()


def test_the_doctor_reports_the_drivers_words(driver):
    from harness import doctor

    driver(fake_driver(init=_Result.CUDA_ERROR_NO_DEVICE))
    c = doctor.check_gpu()
    assert not c.ok and c.detail == "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"


def test_gpu_tests_skip_saying_why_or_fail_where_a_gpu_is_required():
    assert gpu_skip_reason(None, required=False) is None and gpu_skip_reason(None, required=True) is None
    why = "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"
    assert gpu_skip_reason(why, required=False) == f"no usable NVIDIA GPU: {why}"
    with pytest.raises(pytest.UsageError, match=r"ANVIL_REQUIRE_GPU=1 but no usable NVIDIA GPU: cuInit: "
                                                r"CUDA_ERROR_NO_DEVICE \(no CUDA-capable"):
        gpu_skip_reason(why, required=True)


@pytest.mark.skipif(device.gpu_available(), reason="a GPU is usable here: nothing to refuse")
def test_a_run_that_requires_a_gpu_stops_on_a_machine_without_one():
    """The whole path: pytest with ANVIL_REQUIRE_GPU=1 exits with a usage
    error naming the driver's reason before it runs a test; without it, the
    GPU tests are skipped with that reason."""
    why = device.gpu_probe()
    test = "tests/test_diff.py"  # small, and it holds gpu-marked tests
    env = {**os.environ, "ANVIL_REQUIRE_GPU": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "gpu", "-p", "no:cacheprovider", test]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == pytest.ExitCode.USAGE_ERROR, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"ANVIL_REQUIRE_GPU=1 but no usable NVIDIA GPU: {why}" in p.stderr
    env.pop("ANVIL_REQUIRE_GPU")
    p = subprocess.run(cmd + ["-rs"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == pytest.ExitCode.OK, p.stdout[-2000:]
    assert f"no usable NVIDIA GPU: {why}" in p.stdout and " passed" not in p.stdout
