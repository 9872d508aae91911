"""NVML sampling around a measured run: SM/memory clock, power, utilisation,
temperature and clock-event (throttle) reasons, so a slow number can be
explained (a host-sync-starved boost clock looks bimodal; a power-capped run
shows ``sw_power_cap`` with power near the limit).

    with Sampler() as s:
        run_benchmark()
    s.trace                       # columnar dict of lists, JSON-ready
    summarize(s.trace, s.static)  # medians, bimodality flag, throttle names

Without NVML (no driver, no GPU) ``Sampler.available`` is False, ``reason``
says why, nothing is sampled and nothing raises. ``pynvml`` is imported at
call time (never at module import), so tests can put a fake one in
``sys.modules``.
"""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np

# nvml.h's clocks-event reason bits (stable ABI; the *ThrottleReason* names
# are the older aliases of the same bits). Decoded here rather than read from
# pynvml so decoding works with any pynvml version, or none.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

FIELDS = ("sm_mhz", "mem_mhz", "power_w", "gpu_util", "mem_util", "temp_c", "reasons")

# Bimodality rule for the SM clock (see summarize): samples below LOW_RATIO x
# the p95 clock are "low"; the trace is bimodal when both the low and the
# high cluster hold at least MIN_CLUSTER of the samples. A 20% gap is far
# beyond the 15 MHz clock bins and boost jitter (1980 vs 1965 MHz is not two
# modes) but catches the idle-clock dips of a host-sync-starved run
# (345 <-> 1980 MHz). Sarle's bimodality coefficient was rejected: a clock
# flipping between two adjacent bins scores ~1 ("bimodal"), and one outlier
# inflates it through skewness.
LOW_RATIO = 0.8
MIN_CLUSTER = 0.10


def _pynvml():
    with warnings.catch_warnings():  # the `pynvml` shim warns about itself on import
        warnings.simplefilter("ignore")
        import pynvml
    return pynvml


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def decode_reasons(mask: int | None) -> list[str]:
    """Names of the set bits; unknown bits as ``bit_0x...`` (newer drivers add some)."""
    if not mask:
        return []
    names = [name for bit, name in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    names += [f"bit_{1 << i:#x}" for i in range(64) if rest >> i & 1]
    return names


class Sampler:
    """Context manager: a daemon thread samples device ``device_index``
    (default: the GPU this process computes on, engine.bench.nvml_index) every
    ``interval_s`` seconds (one sample on entry and one on exit, so even a
    very short run has two)."""

    def __init__(self, interval_s: float = 0.025, device_index: int | None = None):
        from engine.bench import nvml_index

        self.interval_s = float(interval_s)
        self.device_index = nvml_index() if device_index is None else device_index
        self.available = False
        self.reason = "not started"
        self.static: dict = {}
        self._trace = {"t": [], **{f: [] for f in FIELDS}}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = self._handle = None
        self._getters: dict = {}
        self.t0_unix: float | None = None

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self) -> Sampler:
        self._stop.clear()  # a Sampler may be reused; each use starts a fresh trace
        self._trace = {"t": [], **{f: [] for f in FIELDS}}
        try:
            nv = _pynvml()
            nv.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
            return self
        try:
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:
            self.reason = f"no NVML device {self.device_index}: {type(e).__name__}: {e}"
            _quiet(nv.nvmlShutdown)
            return self
        self._nv, self.available, self.reason = nv, True, ""
        self.static = static_info(nv, self._handle, self.device_index)
        self._getters = self._make_getters(nv, self._handle)
        self._t0 = time.monotonic()
        self.t0_unix = time.time()  # wall-clock time of trace t = 0
        self._sample()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
        if self._nv is not None:
            _quiet(self._nv.nvmlShutdown)
            self._nv = None
        return False  # never swallow the measured run's exception

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def trace(self) -> dict:
        """{"t": [s since start], "sm_mhz": [...], ...}; None where a query failed."""
        with self._lock:
            return {k: list(v) for k, v in self._trace.items()}

    def summary(self) -> dict:
        return summarize(self.trace, self.static)

    # -- sampling ----------------------------------------------------------
    @staticmethod
    def _make_getters(nv, h) -> dict:
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return {
            "sm_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW
            "gpu_util": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "mem_util": lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "reasons": lambda: int(reasons(h)),
        }

    def _sample(self) -> None:
        t = time.monotonic() - self._t0
        row = {}
        for f in FIELDS:
            get = self._getters.get(f)
            try:
                row[f] = get() if get else None
            except Exception:
                # Unsupported on this board (or the driver went away): stop
                # asking, so a failing query does not cost every interval.
                self._getters.pop(f, None)
                row[f] = None
        with self._lock:
            self._trace["t"].append(t)
            for f in FIELDS:
                self._trace[f].append(row[f])

    def _run(self) -> None:
        # Fixed deadlines rather than sleep(interval): query time does not drift the rate.
        nxt = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, nxt - time.monotonic())):
            self._sample()
            nxt = max(nxt + self.interval_s, time.monotonic())


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Exception:
        return None


def static_info(nv, h, device_index: int = 0) -> dict:
    """Facts that do not change during a run; None for whatever the board refuses."""
    limit = _quiet(nv.nvmlDeviceGetEnforcedPowerLimit, h)  # mW
    name = _quiet(nv.nvmlDeviceGetName, h)
    driver = _quiet(nv.nvmlSystemGetDriverVersion)
    return {
        "device_index": device_index,
        "gpu": _str(name) if name is not None else None,
        "driver": _str(driver) if driver is not None else None,
        "power_limit_w": limit / 1000.0 if limit is not None else None,
        "sm_clock_max_mhz": _quiet(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
    }


# What a saved trace keeps (results.save): the clock reads t to the
# nanosecond and NVML power to the milliwatt; a trace that is plotted, and
# summarised only where its record kept no summary, needs neither. Times to
# 1 ms (samples are 25 ms apart at the finest), power to 0.1 W (NVML's stated
# accuracy is +-5 W); clocks, utilisation, temperature and reasons are
# integers already. Summaries are kept as measured: a rounded fraction could
# cross a diagnosis threshold.
TRACE_DECIMALS = {"t": 3, "power_w": 1}


def is_trace(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("t"), list) and "sm_mhz" in obj


def compact(obj):
    """``obj`` (a record, or any part of one) with every NVML trace in it
    rounded by TRACE_DECIMALS; everything else as it was (a new object
    where something changed)."""
    if is_trace(obj):
        return {k: [x if x is None or k not in TRACE_DECIMALS else round(float(x), TRACE_DECIMALS[k]) for x in v]
                if isinstance(v, list) else v for k, v in obj.items()}
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [compact(v) for v in obj]
    return obj


MIN_WINDOW_SAMPLES = 3


def window(trace: dict, start_s: float, end_s: float) -> dict:
    """The samples of ``trace`` with t in [start_s, end_s] (trace time), or,
    when the window is shorter than a few sampling intervals, the
    MIN_WINDOW_SAMPLES samples nearest its middle: a 0.2 s prefill test
    must not be summarised by the model load around it."""
    t = np.asarray(trace.get("t", []), dtype=float)
    idx = np.flatnonzero((t >= start_s) & (t <= end_s))
    if idx.size < MIN_WINDOW_SAMPLES and t.size:
        mid = 0.5 * (start_s + end_s)
        idx = np.sort(np.argsort(np.abs(t - mid), kind="stable")[:MIN_WINDOW_SAMPLES])
    return {k: [v[i] for i in idx] for k, v in trace.items()}


def _vals(trace: dict, key: str) -> np.ndarray:
    return np.array([v for v in trace.get(key, []) if v is not None], dtype=float)


def summarize(trace: dict, static: dict | None = None) -> dict:
    """One flat, JSON-ready dict per run; None where there were no samples.

    ``sm_bimodal``: at least MIN_CLUSTER of the samples sit below
    LOW_RATIO x the p95 SM clock and at least MIN_CLUSTER sit above it
    (see the constants' comment for why this rule)."""
    static = static or {}
    t, sm, pw = _vals(trace, "t"), _vals(trace, "sm_mhz"), _vals(trace, "power_w")
    gu, mu, tc = _vals(trace, "gpu_util"), _vals(trace, "mem_util"), _vals(trace, "temp_c")
    mem = _vals(trace, "mem_mhz")
    mask = 0
    for r in trace.get("reasons", []):
        mask |= int(r or 0)

    def stat(a, fn):
        return float(fn(a)) if a.size else None

    low_frac = float(np.mean(sm < LOW_RATIO * np.percentile(sm, 95))) if sm.size else None
    limit, max_clk = static.get("power_limit_w"), static.get("sm_clock_max_mhz")
    sm_med, pw_mean = stat(sm, np.median), stat(pw, np.mean)
    return {
        "n_samples": int(len(trace.get("t", []))),
        "duration_s": float(t[-1] - t[0]) if t.size > 1 else 0.0,
        "sm_mhz_median": sm_med,
        "sm_mhz_p10": stat(sm, lambda a: np.percentile(a, 10)),
        "sm_mhz_p90": stat(sm, lambda a: np.percentile(a, 90)),
        "sm_mhz_min": stat(sm, np.min),
        "sm_mhz_max": stat(sm, np.max),
        "sm_frac_of_max": sm_med / max_clk if sm_med is not None and max_clk else None,
        "sm_low_fraction": low_frac,
        "sm_bimodal": low_frac is not None and MIN_CLUSTER <= low_frac <= 1 - MIN_CLUSTER,
        "mem_mhz_median": stat(mem, np.median),
        "power_w_mean": pw_mean,
        "power_w_max": stat(pw, np.max),
        "power_frac_of_limit": pw_mean / limit if pw_mean is not None and limit else None,
        "gpu_util_mean": stat(gu, np.mean),
        "mem_util_mean": stat(mu, np.mean),
        "temp_c_max": stat(tc, np.max),
        "throttle_mask": mask,
        "throttle_reasons": decode_reasons(mask),
    }


def devices() -> tuple[list[str], str]:
    """The GPUs NVML reports, by index: (their names, ""), or ([], why not)."""
    try:
        nv = _pynvml()
        nv.nvmlInit()
    except Exception as e:
        return [], f"NVML unavailable: {type(e).__name__}: {e}"
    try:
        return [_str(_quiet(nv.nvmlDeviceGetName, nv.nvmlDeviceGetHandleByIndex(i)) or f"GPU {i}")
                for i in range(int(nv.nvmlDeviceGetCount()))], ""
    except Exception as e:
        return [], f"NVML cannot list the GPUs: {type(e).__name__}: {e}"
    finally:
        _quiet(nv.nvmlShutdown)


def gpu_busy_by_other_processes(device_index: int = 0) -> list[tuple[int, int | None]]:
    """(pid, used GPU memory in bytes or None) of compute processes on the
    device other than this one; [] when NVML is unavailable.

    Call it from the harness process before starting a round: inside a PID
    namespace (containers) NVML reports host PIDs, so a process of ours that
    holds a CUDA context could show up here as "other"."""
    try:
        nv = _pynvml()
        nv.nvmlInit()
    except Exception:
        return []
    try:
        h = nv.nvmlDeviceGetHandleByIndex(device_index)
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        me = os.getpid()
        return [(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in procs if int(p.pid) != me]
    except Exception:
        return []
    finally:
        _quiet(nv.nvmlShutdown)
