"""What each kind of kernel costs inside the captured decode graph: the
step's time with that kernel's launches left out of the graph, against the
whole step, interleaved rounds, one model load.

    python3 scripts/gpu/decode_leave_out.py MODEL.gguf [--depth N] [--rounds 3] [--steps 128] [--each]

Nsight Compute times each kernel alone with the caches flushed, so it
overstates small kernels and cannot see what programmatic dependent launch
overlaps; leaving a kernel out of the real graph measures what the step
would save without it. The outputs are wrong in a variant (the kernels
after a dropped one read stale buffers); only the time is read, and every
kernel's work is the same whatever the values (a dense model's step has no
data-dependent branch). Each variant is captured afresh and timed as
``steps`` greedy graph replays, as ``engine bench`` times decode. A launch
is named "kernel (grid)", e.g. "gemv_q4_k (256, 1, 1)"; ``--each`` adds a
variant for every such name in the step (a GEMV's grid tells the projections
of one type apart).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time

VARIANTS = {  # label: the kernel names (regex) left out
    "whole step": None,
    "rms_norm": r"^rms_norm",
    "add_rms_norm": r"^add_rms_norm",
    "qk_norm_rope": r"^qk_norm_rope",
    "attention_decode": r"^attention_decode",
    "GEMV (not GLU)": r"^gemv_(?!glu)",
    "GLU GEMV": r"^gemv_glu",
    "every GEMV": r"^gemv_",
    "all but GEMVs": r"^(?!gemv_)",
}


def left_out(pattern: str | None, launch_name: str) -> bool:
    """Whether a variant leaves out a launch of this name ("kernel (grid)")."""
    return pattern is not None and re.search(pattern, launch_name) is not None


def launch_name(kernel: str, grid) -> str:
    return f"{kernel} {tuple(grid) + (1,) * (3 - len(grid))}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--each", action="store_true", help="also leave out each kernel-and-grid of the step alone")
    a = ap.parse_args()

    from engine.model import DEFAULT_N_CTX, Model

    m = Model(a.model, backend="cuda", n_ctx=max(DEFAULT_N_CTX, a.depth + 4096))
    b, dev = m.backend, m.backend.dev
    launch = dev.launch
    prompt = [(7 * i) % 1000 + 1 for i in range(max(a.depth, 4))]

    seen = collections.Counter()  # launches a step, by name, as captured with nothing left out

    def run(pattern: str | None) -> float:
        names = {}
        captured = collections.Counter()

        def filtered(fn, grid, block, args, shared=0):
            if int(fn) not in names:
                names.update({int(f): key[1] for key, f in dev._functions.items()})
            name = launch_name(names.get(int(fn), ""), grid)
            captured[name] += 1
            if not left_out(pattern, name):
                launch(fn, grid, block, args, shared)

        m.reset()
        tok = int(m.forward(prompt).argmax())
        b.graph = None
        dev.launch = filtered  # the eager step and the capture see the filter; replays do not launch
        tok = m.decode_next(tok)
        dev.launch = launch
        if pattern is None:
            seen.clear()
            seen.update({k: v // 2 for k, v in captured.items()})  # the eager step, then the capture
        for _ in range(4):
            tok = m.decode_next(tok)
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            tok = m.decode_next(tok)
        dev.synchronize()
        return (time.perf_counter() - t0) / a.steps * 1e6

    variants = dict(VARIANTS)
    times = {k: [] for k in variants}
    for r in range(a.rounds + 1):  # round 0 warms up and is dropped
        for label, pattern in variants.items():
            us = run(pattern)
            if r:
                times[label].append(us)
        if r == 0 and a.each:
            variants |= {name: "^" + re.escape(name) + "$" for name in sorted(seen)}
            times |= {name: [] for name in seen}
    whole = statistics.median(times["whole step"])
    print(f"decode step at depth {a.depth}, median of {a.rounds} rounds of {a.steps} graph replays")
    print("| left out | launches | us a step | saved us | saved % | saved us a launch |")
    print("|---|---|---|---|---|---|")
    for label, ts in times.items():
        t = statistics.median(ts)
        n = sum(c for name, c in seen.items() if left_out(variants[label], name))
        per = f"{(whole - t) / n:.2f}" if n else ""
        print(f"| {label} | {n} | {t:.1f} | {whole - t:.1f} | {100 * (whole - t) / whole:.1f} | {per} |")


if __name__ == "__main__":
    main()
