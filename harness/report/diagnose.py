"""Why a run is as fast as it is, from its NVML summary and its achieved rate.

``diagnose(test, summary, gb_s=..., tflop_s=..., roofline=...)`` returns a
``Diagnosis``: a label and one sentence carrying the numbers that led to it, e.g.

    decode reads 1206 GB/s = 28% of the 4300 GB/s roofline with the SM clock
    at 1980 MHz (pinned) and 44% power, 55% utilisation: launch-latency bound

The roofline is the one measured on the run's GPU (harness/roofline.py: its
newest ``roofline`` record); without one, the sentence says "no roofline
measured" and the memory-bound rule cannot fire.

The summary must cover the measured repetitions only (harness.ab.measured:
the engine stamps them; llama-bench's are estimated); a trace of the whole
process is mostly model load and says nothing about the test.

The rules, first match wins (thresholds are the named constants below):

1. no NVML summary (or one with no samples) -> "unknown (no NVML trace)";
   fewer than MIN_SAMPLES samples -> "unknown (too few NVML samples)";
   a summary of the whole run rather than the measured window -> "unknown
   (whole-run trace)"; a window shorter than MIN_WINDOW_S -> "unknown
   (window shorter than NVML's averaging)": NVML averages power over ~1 s
   and utilisation over 1/6-1 s, so a 0.2 s prefill test cannot be read.
2. decode at >= MEMORY_BOUND_FRAC of the measured HBM roofline
   -> "memory-bandwidth bound" (nothing else can make it faster).
3. SM clock bimodal, or its median below CLOCK_LOW_FRAC of the maximum,
   with mean power below LOW_POWER_FRAC of the limit -> "host-sync starved":
   the GPU idles between host round-trips, the boost governor drops the
   clock, and every kernel then runs slower too.
4. prefill with utilisation >= BUSY_UTIL_PCT and power >= HIGH_POWER_FRAC
   -> "compute bound".
5. clock pinned (median >= CLOCK_PINNED_FRAC of the maximum, not bimodal),
   utilisation below BUSY_UTIL_PCT and power below LOW_POWER_FRAC
   -> "launch-latency bound": the GPU sits idle between kernels (launch
   gaps, host work per token) too briefly for the clock to drop.
6. clock pinned and utilisation >= BUSY_UTIL_PCT, below the roofline
   -> "kernel-latency bound": a kernel is resident all the time, yet the
   kernels move far less than the HBM can: each is too short or too serial
   (ramp-up and tail of every launch, little work in flight) to fill it.
7. anything else -> "unclassified", with the same numbers.

Calibrated on the H200 traces of 2026-11-29 (measured windows): Anvil's
graph decode (tg128, 29-31% of the roofline) pins the clock at 1980 MHz
with 99% utilisation and 65-67% power (rule 6); llama.cpp's decode pins it
with 55-58% utilisation and 44-46% power (rule 5); both engines' pp512
windows last 0.2-0.4 s (rule 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..roofline import Roofline

NO_ROOFLINE = "no roofline measured"  # what the page says where the GPU has no roofline record

# Decode at 70% of copy bandwidth: the best GEMV kernels reach 80-90% of a
# plain copy; the weight-bytes estimate ignores KV-cache and activation
# reads, so 70% already leaves the HBM little to give.
MEMORY_BOUND_FRAC = 0.70
# Clock "pinned at boost": median within 5% of the maximum SM clock
# (1881 of 1980 MHz on the H200) - boost jitter is a bin or two of 15 MHz.
CLOCK_PINNED_FRAC = 0.95
# Clock "low": median below 85% of the maximum. Between 85% and 95% the
# clock is neither pinned nor clearly dropping; no clock rule fires there.
CLOCK_LOW_FRAC = 0.85
# Mean power below 55% of the limit (385 of 700 W): SMs and HBM are mostly
# waiting. A saturated HBM stream or a tensor-core GEMM draws far more.
LOW_POWER_FRAC = 0.55
# Prefill drawing >= 70% of the limit (490 W) with a kernel resident >= 90%
# of the time: tensor cores busy. A power-capped GEMM sits at ~100%.
HIGH_POWER_FRAC = 0.70
# "Busy": a kernel resident >= 90% of the time. Graph-replayed decode reads
# 99%; decode with host work between tokens (llama.cpp) 55-58%.
BUSY_UTIL_PCT = 90.0
# NVML averages power over ~1 s and utilisation over 1/6-1 s: a shorter
# measured window reads mostly what came before it.
MIN_WINDOW_S = 1.0
# A summary of fewer samples says too little (the sampler takes one at
# entry, one at exit, and one per 25 ms between).
MIN_SAMPLES = 3
# Q4_K_M mixes Q4_K with Q6_K: ~4.9 bits per weight over the matrices an 8B
# model reads per token (qwen3-8b: 4.67 GB for 7.57 G matrix parameters).
# Used only to estimate parameters when no record of the model file has them.
Q4_K_M_BITS_PER_WEIGHT = 4.9

UNKNOWN = "unknown (no NVML trace)"
TOO_SHORT = "unknown (too few NVML samples)"
MEMORY = "memory-bandwidth bound"
HOST_SYNC = "host-sync starved"
COMPUTE = "compute bound"
LAUNCH = "launch-latency bound"
KERNEL = "kernel-latency bound"
UNCLASSIFIED = "unclassified"
WHOLE_RUN = "unknown (whole-run trace)"
SHORT_WINDOW = "unknown (window shorter than NVML's averaging)"
LABELS = (MEMORY, HOST_SYNC, COMPUTE, LAUNCH, KERNEL, UNCLASSIFIED, UNKNOWN, TOO_SHORT, WHOLE_RUN, SHORT_WINDOW)

# the rules as the report prints them (the scoreboard's "How runs are diagnosed")
RULES = (
    (MEMORY, f"decode reads >= {MEMORY_BOUND_FRAC:.0%} of the copy bandwidth measured on its GPU (its roofline "
             f"record; never fires without one)"),
    (HOST_SYNC, f"SM clock bimodal or its median < {CLOCK_LOW_FRAC:.0%} of the maximum, "
                f"with mean power < {LOW_POWER_FRAC:.0%} of the limit"),
    (COMPUTE, f"prefill with GPU utilisation >= {BUSY_UTIL_PCT:.0f}% and power >= {HIGH_POWER_FRAC:.0%} of the limit"),
    (LAUNCH, f"SM clock median >= {CLOCK_PINNED_FRAC:.0%} of the maximum (pinned at boost), utilisation "
             f"< {BUSY_UTIL_PCT:.0f}% and power < {LOW_POWER_FRAC:.0%} of the limit: idle gaps between kernels"),
    (KERNEL, f"SM clock pinned and utilisation >= {BUSY_UTIL_PCT:.0f}%, yet below the roofline: "
             f"kernels resident all the time but too short or serial to fill the HBM"),
    (UNCLASSIFIED, "none of the above"),
    (UNKNOWN, f"no NVML summary for the run, or fewer than {MIN_SAMPLES} samples"),
    (WHOLE_RUN, "the NVML summary covers the whole process (model load included), not the measured repetitions"),
    (SHORT_WINDOW, f"the measured repetitions lasted < {MIN_WINDOW_S:.0f} s, shorter than NVML's power and "
                   f"utilisation averaging"),
)


@dataclass(frozen=True)
class Diagnosis:
    label: str
    sentence: str

    @property
    def css(self) -> str:
        """A class name for the label's badge."""
        return {MEMORY: "memory", HOST_SYNC: "hostsync", COMPUTE: "compute", LAUNCH: "launch",
                KERNEL: "kernel"}.get(
            self.label, "unknown")


@dataclass(frozen=True)
class Rate:
    """What a measured tok/s means in hardware terms."""
    gb_s: float | None = None      # decode: bytes read from HBM per second / 1e9
    tflop_s: float | None = None   # prefill: estimated FLOP/s / 1e12
    text: str = ""                 # "1121 GB/s", "~292 TFLOP/s" ("~": estimated)
    note: str = ""                 # how it was obtained
    ceiling: Roofline | None = None  # the roofline measured on the run's GPU, if any

    @property
    def roofline(self) -> float | None:
        """Fraction of the measured copy bandwidth (decode) or bf16 GEMM rate (prefill); None without a roofline."""
        if self.ceiling is None:
            return None
        if self.gb_s is not None:
            return self.gb_s / self.ceiling.copy_gb_s
        if self.tflop_s is not None:
            return self.tflop_s / self.ceiling.bf16_tflops
        return None


def rate(test: str, tok_s: float, *, gb_s: float | None = None, weight_bytes: float | None = None,
         file_bytes: float | None = None, n_params: float | None = None,
         params_per_token: float | None = None, roofline: Roofline | None = None) -> Rate:
    """``_rate`` with the GPU's ``roofline`` attached (see _rate for the estimates)."""
    import dataclasses

    r = _rate(test, tok_s, gb_s=gb_s, weight_bytes=weight_bytes, file_bytes=file_bytes, n_params=n_params,
              params_per_token=params_per_token)
    return dataclasses.replace(r, ceiling=roofline) if roofline is not None and r.text else r


def _rate(test: str, tok_s: float, *, gb_s: float | None = None, weight_bytes: float | None = None,
          file_bytes: float | None = None, n_params: float | None = None,
          params_per_token: float | None = None) -> Rate:
    """Decode: the recorded GB/s, else weight bytes per token x tok/s, else
    the file size x tok/s (an over-estimate: the file holds the embedding
    table, of which a token reads one row). Prefill: 2 FLOPs (a multiply-add)
    per weight a token is multiplied by, per token (attention's FLOPs, ~2% at
    512 tokens of an 8B model, are not counted): the recorded
    params_per_token, else the model's n_params, else n_params estimated from
    the weight bytes at Q4_K_M_BITS_PER_WEIGHT. A model whose decode reads
    under half its file (routed experts) multiplies by far fewer weights than
    it has: without params_per_token, no estimate rather than a wrong one."""
    if test.startswith("tg"):
        if gb_s is not None:
            return Rate(gb_s=gb_s, text=f"{gb_s:.0f} GB/s", note="recorded")
        if weight_bytes:
            g = weight_bytes * tok_s / 1e9
            return Rate(gb_s=g, text=f"{g:.0f} GB/s", note="weight bytes per token x tok/s")
        if file_bytes:
            g = file_bytes * tok_s / 1e9
            return Rate(gb_s=g, text=f"~{g:.0f} GB/s",
                        note="model file size x tok/s (over-estimate: counts the whole embedding table)")
    if test.startswith("pp"):
        if params_per_token:
            tf = 2 * params_per_token * tok_s / 1e12
            return Rate(tflop_s=tf, text=f"~{tf:.0f} TFLOP/s", note="2 x params_per_token FLOPs per token")
        if weight_bytes and file_bytes and weight_bytes < 0.5 * file_bytes:
            return Rate()  # sparse (Mixture of Experts): n_params would over-count ~10x
        note = "2 x n_params FLOPs per token"
        if not n_params and weight_bytes:
            n_params = weight_bytes * 8 / Q4_K_M_BITS_PER_WEIGHT
            note += f", n_params estimated from the weight bytes at {Q4_K_M_BITS_PER_WEIGHT} bits/weight"
        if n_params:
            tf = 2 * n_params * tok_s / 1e12
            return Rate(tflop_s=tf, text=f"~{tf:.0f} TFLOP/s", note=note)
    return Rate()


def _num(summary: dict, key: str) -> float | None:
    v = summary.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _rate_phrase(test: str, gb_s: float | None, tflop_s: float | None, roof: Roofline | None) -> str:
    if test.startswith("tg") and gb_s is not None:
        if roof is None:
            return f"decode reads {gb_s:.0f} GB/s ({NO_ROOFLINE} on this GPU)"
        return f"decode reads {gb_s:.0f} GB/s = {gb_s / roof.copy_gb_s:.0%} of the {roof.copy_gb_s:.0f} GB/s roofline"
    if test.startswith("pp") and tflop_s is not None:
        if roof is None:
            return f"prefill computes ~{tflop_s:.0f} TFLOP/s ({NO_ROOFLINE} on this GPU)"
        return (f"prefill computes ~{tflop_s:.0f} TFLOP/s = {tflop_s / roof.bf16_tflops:.0%} of the "
                f"{roof.bf16_tflops:.0f} TFLOP/s bf16 peak")
    return f"{'decode' if test.startswith('tg') else 'prefill' if test.startswith('pp') else test} " \
           f"(no achieved-rate estimate)"


def clock_fraction(summary: dict, sm_clock_max_mhz: float | None = None) -> tuple[float | None, str]:
    """Median SM clock over the board's maximum; without the maximum, over the
    trace's own highest sample (then a never-boosting run cannot look low)."""
    frac = _num(summary, "sm_frac_of_max")
    med = _num(summary, "sm_mhz_median")
    if frac is not None:
        return frac, "of max"
    if med is not None and sm_clock_max_mhz:
        return med / float(sm_clock_max_mhz), "of max"
    top = _num(summary, "sm_mhz_max")
    if med is not None and top:
        return med / top, "of the trace's max"
    return None, ""


def power_fraction(summary: dict, power_limit_w: float | None = None) -> float | None:
    frac = _num(summary, "power_frac_of_limit")
    mean = _num(summary, "power_w_mean")
    if frac is None and mean is not None and power_limit_w:
        frac = mean / float(power_limit_w)
    return frac


def diagnose(test: str, summary: dict | None, *, gb_s: float | None = None, tflop_s: float | None = None,
             power_limit_w: float | None = None, sm_clock_max_mhz: float | None = None,
             windowed: bool = True, roofline: Roofline | None = None) -> Diagnosis:
    """Classify one run of ``test`` (``pp512``, ``tg128``, ...). ``summary`` is
    harness.nvml.summarize()'s dict (or None); ``gb_s`` the achieved decode
    bandwidth, ``tflop_s`` the estimated prefill throughput; the limits fill
    in fractions a summary lacks. ``windowed`` False says the summary is of
    the whole process, not of the measured repetitions. ``roofline``: the
    one measured on the run's GPU (None: no memory-bound verdict)."""
    rate = _rate_phrase(test, gb_s, tflop_s, roofline)
    decode = test.startswith("tg")
    if not summary or summary.get("available") is False or not summary.get("n_samples"):
        why = summary.get("reason") if summary else None
        return Diagnosis(UNKNOWN, f"{rate}; no NVML trace{f' ({why})' if why else ''}")
    n = int(summary["n_samples"])
    if n < MIN_SAMPLES:
        return Diagnosis(TOO_SHORT, f"{rate}; only {n} NVML sample{'s' if n != 1 else ''}")
    if not windowed:
        return Diagnosis(WHOLE_RUN, f"{rate}; the NVML trace covers the whole run, model load included, "
                                    f"not the measured repetitions")
    duration = _num(summary, "window_s")
    duration = _num(summary, "duration_s") if duration is None else duration
    if duration is not None and duration < MIN_WINDOW_S:
        return Diagnosis(SHORT_WINDOW, f"{rate}; the measured repetitions lasted {duration:.2f} s, shorter than "
                                       f"NVML's ~{MIN_WINDOW_S:.0f} s power and utilisation averaging")

    clk, clk_ref = clock_fraction(summary, sm_clock_max_mhz)
    pwr = power_fraction(summary, power_limit_w)
    util = _num(summary, "gpu_util_mean")
    med = _num(summary, "sm_mhz_median")
    bimodal = bool(summary.get("sm_bimodal"))
    low_frac = _num(summary, "sm_low_fraction")

    # the evidence, in words, in a fixed order
    if med is None:
        clock = "no SM clock samples"
    elif bimodal:
        clock = (f"the SM clock bimodal (median {med:.0f} MHz, "
                 f"{low_frac:.0%} of samples low)" if low_frac is not None else f"the SM clock bimodal (median {med:.0f} MHz)")
    elif clk is not None and clk >= CLOCK_PINNED_FRAC:
        clock = f"the SM clock at {med:.0f} MHz (pinned)"
    elif clk is not None and clk < CLOCK_LOW_FRAC:
        clock = f"the SM clock low at {med:.0f} MHz ({clk:.0%} {clk_ref})"
    else:
        clock = f"the SM clock at {med:.0f} MHz" + (f" ({clk:.0%} {clk_ref})" if clk is not None else "")
    power = f"{pwr:.0%} power" if pwr is not None else "power not recorded"
    evidence = f"{clock} and {power}" + (f", {util:.0f}% utilisation" if util is not None else "")
    reasons = [r for r in summary.get("throttle_reasons") or [] if r != "gpu_idle"]
    if reasons:
        evidence += f" (clock events: {', '.join(sorted(reasons))})"

    def verdict(label: str) -> Diagnosis:
        return Diagnosis(label, f"{rate} with {evidence}: {label}")

    if decode and gb_s is not None and roofline is not None and gb_s / roofline.copy_gb_s >= MEMORY_BOUND_FRAC:
        return verdict(MEMORY)
    low_power = pwr is not None and pwr < LOW_POWER_FRAC
    if low_power and (bimodal or (clk is not None and clk < CLOCK_LOW_FRAC)):
        return verdict(HOST_SYNC)
    busy = util is not None and util >= BUSY_UTIL_PCT
    if test.startswith("pp") and busy and pwr is not None and pwr >= HIGH_POWER_FRAC:
        return verdict(COMPUTE)
    pinned = not bimodal and clk is not None and clk >= CLOCK_PINNED_FRAC
    if pinned and low_power and not busy:
        return verdict(LAUNCH)
    if pinned and busy:
        return verdict(KERNEL)
    return verdict(UNCLASSIFIED)


def majority(diagnoses: list[Diagnosis]) -> tuple[str, int, int]:
    """(most common label, its count, total); ties go to the label sorting first."""
    if not diagnoses:
        return UNKNOWN, 0, 0
    counts: dict[str, int] = {}
    for d in diagnoses:
        counts[d.label] = counts.get(d.label, 0) + 1
    label = min(counts, key=lambda k: (-counts[k], k))
    return label, counts[label], len(diagnoses)
