"""``harness doctor`` on this machine: every check reports, the missing ones
say how to fix them, and missing optional parts do not fail it."""

from __future__ import annotations

import json
import os
import types

import pytest

from engine.backends.cuda.device import gpu_available
from harness import doctor


@pytest.fixture(scope="module")
def checks():
    return {c.name: c for c in doctor.diagnose()}


def test_every_check_reports(checks):
    assert list(checks) == ["python", "engine", "numpy", "gguf", "nvrtc", "nvrtc compile", "cuda gpu", "nvml",
                            "cublas", "llama-cpp-python", "llama-bench", "model cache", "catalog models"]
    for c in checks.values():
        assert isinstance(c.ok, bool) and c.detail
        if not c.ok:
            assert c.fix, f"{c.name} is not ok and says no fix"


def test_required_parts_present(checks):
    import engine.bench

    for name in ("python", "engine", "numpy", "gguf", "model cache"):
        assert checks[name].ok and checks[name].required, checks[name]
    assert engine.bench.build_hash() in checks["engine"].detail


def test_nvrtc_compiles_without_touching_the_cache_env(checks):
    # NVRTC is a pip dependency: it works with or without a GPU
    assert checks["nvrtc"].ok and checks["nvrtc"].detail.startswith("NVRTC ")
    assert checks["nvrtc compile"].ok and "sm_90" in checks["nvrtc compile"].detail
    before = os.environ.get("ANVIL_CACHE_DIR")
    doctor.check_nvrtc_compile()
    assert os.environ.get("ANVIL_CACHE_DIR") == before


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_no_gpu_is_reported_with_a_fix(checks):
    gpu = checks["cuda gpu"]
    assert not gpu.ok and not gpu.required and "NumPy backend" in gpu.fix
    assert not checks["nvml"].ok and "driver" in checks["nvml"].fix


def test_a_broken_check_is_a_finding():
    def check_exploding():
        raise RuntimeError("boom\nsecond line")

    (c,) = doctor.diagnose([check_exploding])
    assert c.name == "exploding" and not c.ok and c.detail == "check failed: RuntimeError: boom"


def test_catalog_models_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("ANVIL_MODELS_DIR", str(tmp_path))
    c = doctor.check_catalog()
    assert not c.ok and "missing (cpu tier)" in c.detail and "tiny-qwen3" in c.detail
    assert c.fix.startswith("harness models")
    assert doctor.check_models_dir().detail.startswith(str(tmp_path))


def test_report_and_exit_status(checks, capsys, monkeypatch):
    text = doctor.format_report(list(checks.values()))
    for c in checks.values():
        assert c.name in text
    if any(not c.ok for c in checks.values()):
        assert "fix: " in text
    monkeypatch.setattr(doctor, "diagnose", lambda: list(checks.values()))
    assert doctor.main_doctor(types.SimpleNamespace()) == 0  # optional parts missing: still 0
    assert "Anvil doctor" in capsys.readouterr().out
    assert doctor.main_doctor(types.SimpleNamespace(json=True)) == 0
    assert {c["name"] for c in json.loads(capsys.readouterr().out)} == set(checks)
    broken = [doctor.Check("engine", False, "not importable", "pip install -e .", required=True)]
    monkeypatch.setattr(doctor, "diagnose", lambda: broken)
    assert doctor.main_doctor(None) == 1
    assert "FAIL" in capsys.readouterr().out
