"""harness.nvml on a machine without a GPU: the real unavailable path, and the
sampler/summary logic against a scripted fake pynvml."""

from __future__ import annotations

import itertools
import json
import sys
import time
import types

import pytest

from harness import nvml


class FakeNVMLError(Exception):
    pass


def fake_pynvml(sm=(1980,), reasons=(0,), event_api=True, broken=(), procs=()):
    """A pynvml stand-in: each query returns the next scripted value (cycling)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.calls = {"init": 0, "shutdown": 0, "temp": 0}
    sm_it, rs_it = itertools.cycle(sm), itertools.cycle(reasons)

    def init():
        nv.calls["init"] += 1

    def shutdown():
        nv.calls["shutdown"] += 1

    def temperature(h, kind):
        nv.calls["temp"] += 1
        if "temp" in broken:
            raise FakeNVMLError("Not Supported")
        return 61

    nv.nvmlInit, nv.nvmlShutdown = init, shutdown
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"dev{i}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # old pynvml returns bytes
    nv.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # mW
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetClockInfo = lambda h, kind: next(sm_it) if kind == 1 else 3201
    nv.nvmlDeviceGetPowerUsage = lambda h: 350_000
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=60)
    nv.nvmlDeviceGetTemperature = temperature
    reason_fn = lambda h: next(rs_it)  # noqa: E731
    if event_api:
        nv.nvmlDeviceGetCurrentClocksEventReasons = reason_fn
    else:  # drivers/bindings before the rename only have the Throttle name
        nv.nvmlDeviceGetCurrentClocksThrottleReasons = reason_fn
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]
    return nv


def run_sampler(monkeypatch, nv, seconds=0.1, **kw):
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    s = nvml.Sampler(interval_s=0.002, **kw)
    with s:
        thread = s._thread
        assert s.running
        time.sleep(seconds)
    return s, thread


# -- really unavailable here ---------------------------------------------------

def test_unavailable_without_driver():
    with nvml.Sampler() as s:
        time.sleep(0.01)
    assert not s.available and "NVML" in s.reason
    assert s.trace["t"] == [] and not s.running
    summ = nvml.summarize(s.trace, s.static)
    assert summ["n_samples"] == 0 and summ["sm_mhz_median"] is None and not summ["sm_bimodal"]
    assert nvml.gpu_busy_by_other_processes() == []


def test_unavailable_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with nvml.Sampler() as s:
        pass
    assert not s.available and "pynvml" in s.reason
    assert nvml.gpu_busy_by_other_processes() == []


def test_no_such_device(monkeypatch):
    nv = fake_pynvml()

    def no_device(i):
        raise FakeNVMLError("Invalid Argument")

    nv.nvmlDeviceGetHandleByIndex = no_device
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    with nvml.Sampler(device_index=3) as s:
        pass
    assert not s.available and "device 3" in s.reason
    assert nv.calls["init"] == nv.calls["shutdown"] == 1


def test_body_exception_propagates(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with pytest.raises(ZeroDivisionError):
        with nvml.Sampler(interval_s=0.002) as s:
            1 / 0
    assert not s.running


# -- fake NVML ---------------------------------------------------------------------

def test_sampler_records_and_stops(monkeypatch):
    nv = fake_pynvml(sm=(1980, 1965))
    s, thread = run_sampler(monkeypatch, nv)
    assert s.available and s.reason == ""
    assert not thread.is_alive() and not s.running
    assert nv.calls["init"] == nv.calls["shutdown"] == 1
    tr = s.trace
    n = len(tr["t"])
    assert n >= 4 and all(len(v) == n for v in tr.values())
    assert tr["t"] == sorted(tr["t"]) and tr["t"][0] >= 0
    assert set(tr["sm_mhz"]) == {1980, 1965} and set(tr["mem_mhz"]) == {3201}
    assert tr["power_w"][0] == 350.0 and tr["gpu_util"][0] == 97 and tr["temp_c"][0] == 61
    assert s.static == {"device_index": 0, "gpu": "NVIDIA H200", "driver": "580.159.04",
                        "power_limit_w": 700.0, "sm_clock_max_mhz": 1980}
    json.dumps(tr), json.dumps(s.summary())  # JSON-friendly
    # nothing is appended once the context has exited
    time.sleep(0.01)
    assert len(s.trace["t"]) == n


def test_steady_clock_is_not_bimodal(monkeypatch):
    # two adjacent 15 MHz bins: jitter, not two modes
    s, _ = run_sampler(monkeypatch, fake_pynvml(sm=(1980, 1965, 1980, 1950)))
    summ = s.summary()
    assert not summ["sm_bimodal"] and summ["sm_low_fraction"] == 0.0
    assert 1950 <= summ["sm_mhz_median"] <= 1980
    assert summ["power_frac_of_limit"] == pytest.approx(0.5)
    assert summ["throttle_reasons"] == [] and summ["throttle_mask"] == 0


def test_bimodal_clock_and_throttle_union(monkeypatch):
    # a host-sync-starved run: idle clock for 1 sample in 3
    nv = fake_pynvml(sm=(1980, 1980, 345), reasons=(0x1, 0x0, 0x4), event_api=False)
    s, _ = run_sampler(monkeypatch, nv)
    summ = s.summary()
    assert summ["sm_bimodal"] and 0.2 < summ["sm_low_fraction"] < 0.45
    assert summ["sm_mhz_min"] == 345 and summ["sm_mhz_max"] == 1980
    assert summ["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]  # via the Throttle fallback


def test_failing_query_becomes_none_and_is_not_retried(monkeypatch):
    nv = fake_pynvml(broken=("temp",))
    s, _ = run_sampler(monkeypatch, nv)
    assert set(s.trace["temp_c"]) == {None} and nv.calls["temp"] == 1
    assert s.summary()["temp_c_max"] is None and s.summary()["sm_mhz_median"] == 1980


def test_summarize_rule_directly():
    def trace(sm):
        return {"t": [i * 0.025 for i in range(len(sm))], "sm_mhz": sm, "reasons": [0] * len(sm)}

    steady = nvml.summarize(trace([1980] * 100))
    assert steady["sm_mhz_p10"] == steady["sm_mhz_p90"] == 1980 and not steady["sm_bimodal"]
    assert steady["duration_s"] == pytest.approx(99 * 0.025)
    # both clusters need >= 10% of samples
    assert nvml.summarize(trace([1980] * 85 + [345] * 15))["sm_bimodal"]
    assert not nvml.summarize(trace([1980] * 95 + [345] * 5))["sm_bimodal"]
    assert not nvml.summarize(trace([1980] * 5 + [345] * 95))["sm_bimodal"]
    # a ramp through intermediate clocks still counts
    assert nvml.summarize(trace([1980] * 60 + [1500, 1000, 600] + [345] * 37))["sm_bimodal"]


def test_decode_reasons():
    assert nvml.decode_reasons(0) == [] and nvml.decode_reasons(None) == []
    assert nvml.decode_reasons(0x4 | 0x20 | 0x40 | 0x8) == [
        "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert nvml.decode_reasons(0x1 | 0x400) == ["gpu_idle", "bit_0x400"]


def test_other_processes(monkeypatch):
    import os

    nv = fake_pynvml(procs=[(os.getpid(), 1 << 20), (4242, 5 << 30), (4343, None)])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    assert nvml.gpu_busy_by_other_processes() == [(4242, 5 << 30), (4343, None)]
    assert nv.calls["init"] == nv.calls["shutdown"] == 1


def _trace(n=100, dt=0.025, busy=range(40, 60)):
    """A run that loads (idle GPU), measures over samples ``busy``, then tears down."""
    return {"t": [i * dt for i in range(n)], "sm_mhz": [1980 if i in busy else 345 for i in range(n)],
            "power_w": [500.0 if i in busy else 90.0 for i in range(n)],
            "gpu_util": [100 if i in busy else 0 for i in range(n)]}


def test_window_keeps_the_measured_samples():
    w = nvml.window(_trace(), 1.0, 1.475)
    assert w["t"][0] == 1.0 and len(w["t"]) == 20 and set(w["power_w"]) == {500.0}
    # shorter than the sampling interval: the nearest samples, not nothing
    w = nvml.window(_trace(), 1.2101, 1.2102)
    assert len(w["t"]) == nvml.MIN_WINDOW_SAMPLES and set(w["power_w"]) == {500.0}
    assert nvml.summarize(nvml.window(_trace(), 1.0, 1.475))["power_w_mean"] == 500.0


def test_measured_window_engine_timestamps_and_llama_bench_estimate():
    from harness import ab

    s = types.SimpleNamespace(trace=_trace(), t0_unix=1000.0, static={})
    # the engine stamps its repetitions: exactly the busy samples
    summary, info = ab.measured(s, [{"test": "tg128", "window_unix": [1001.0, 1001.475]}], exit_unix=1002.5)
    assert info["source"] == "engine timestamps" and summary["power_w_mean"] == 500.0
    assert summary["sm_mhz_median"] == 1980 and not summary["sm_bimodal"]
    # llama-bench: estimated from its repetition times before exit, trimmed to the busy samples
    rec = {"test": "tg128", "samples_tok_s": [128 / 0.08] * 5}  # 5 x 80 ms (+ a warm-up) = 0.48 s
    summary, info = ab.measured(s, [rec], exit_unix=1000.0 + 2.475)
    assert info["source"].startswith("estimated") and summary["power_w_mean"] == 500.0


def test_a_pinned_process_samples_and_names_its_own_gpu(monkeypatch):
    """A worker of `harness --gpus 3` (CUDA_VISIBLE_DEVICES=3, PCI bus order)
    computes on NVML's GPU 3: the sampler and the record's GPU are that one's,
    not GPU 0's (NVML ignores CUDA_VISIBLE_DEVICES)."""
    from engine import bench

    nv = fake_pynvml()
    nv.nvmlDeviceGetCount = lambda: 4
    nv.nvmlDeviceGetName = lambda h: f"GPU named {h}"
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert bench.nvml_index() == 3 and bench.gpu_info()["gpu"] == "GPU named dev3"
    with nvml.Sampler(interval_s=0.002) as s:
        pass
    assert s.device_index == 3 and s.static["gpu"] == "GPU named dev3"
    assert nvml.devices() == ([f"GPU named dev{i}" for i in range(4)], "")
    for unpinned in ("", "GPU-5f3a", "MIG-1"):  # not an index: CUDA's device 0 is NVML's 0 as far as we can tell
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", unpinned)
        assert bench.nvml_index() == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)
    names, why = nvml.devices()
    assert names == [] and why.startswith("NVML unavailable: ModuleNotFoundError")
