"""Per-kernel device time of one decode step (or, with ``--prefill N``, of
one N-token prefill), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \\
        --csv --log-file ncu.csv python3 scripts/gpu/profile_decode.py MODEL.gguf [--prefill 512] [--depth 4096]
    python3 scripts/gpu/profile_decode.py --summarize ncu.csv

The step runs eagerly (every kernel launched from Python, as before graph
capture) between cuProfilerStart/Stop, after a prompt (4 tokens, or
``--depth`` tokens: decode with that much already in the cache, as
``llama-bench -d``) and two warm decode steps; the script prints the step's
kernel launch count (the captured decode graph holds the same kernels,
launched once per token). The context is the engine's default, or the depth
plus 4096 where that is more (the decode kernels split the cache by it).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict


def prompt(n: int) -> list[int]:
    return [(7 * i) % 1000 + 1 for i in range(n)]


def profile(path: str, prefill: int = 0, depth: int = 0) -> None:
    from cuda.bindings import driver

    from engine.backends.cuda.device import check
    from engine.model import Model

    from engine.model import DEFAULT_N_CTX

    m = Model(path, backend="cuda", eager=True, n_ctx=max(DEFAULT_N_CTX, depth + 4096) if depth else None)
    dev = m.backend.dev
    launches = 0
    launch = dev.launch

    def counting(*a, **k):
        nonlocal launches
        launches += 1
        return launch(*a, **k)

    tok = int(m.forward(prompt(depth) if depth else [1, 2, 3, 4]).argmax())
    for _ in range(2):
        tok = m.decode_next(tok)
    dev.launch = counting
    dev.synchronize()
    check(driver.cuProfilerStart())
    if prefill:
        m.reset()
        m.forward(prompt(prefill))
    else:
        tok = m.decode_next(tok)
    dev.synchronize()
    check(driver.cuProfilerStop())
    dev.launch = launch
    if prefill:
        print(f"prefill of {prefill} tokens: {launches} kernel launches")
    else:
        print(f"decode step at depth {m.pos - 1}: {launches} kernel launches eagerly; one graph launch of as many "
              f"kernel nodes when captured")


def summarize(csv_path: str, top: int = 30) -> None:
    rows = []
    with open(csv_path) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1000 if unit.startswith("n") else v if unit.startswith("u") else v * 1000
        name = re.sub(r"\(.*", "", r["Kernel Name"])
        rows.append((name, r.get("Grid Size", ""), us))
    by = defaultdict(lambda: [0, 0.0])
    for name, grid, us in rows:
        by[(name, grid)][0] += 1
        by[(name, grid)][1] += us
    total = sum(us for _, _, us in rows)
    print(f"{len(rows)} kernels, {total:.1f} us of kernel time in the step")
    print(f"{'kernel':28s} {'grid':>16s} {'n':>4s} {'us total':>9s} {'us each':>8s} {'%':>5s}")
    for (name, grid), (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name[:28]:28s} {grid[:16]:>16s} {n:4d} {us:9.1f} {us / n:8.2f} {100 * us / total:5.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--summarize", metavar="NCU_CSV")
    ap.add_argument("--prefill", type=int, default=0, metavar="N", help="profile an N-token prefill instead")
    ap.add_argument("--depth", type=int, default=0, metavar="N", help="decode with N tokens already in the cache")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize)
    elif a.model:
        profile(a.model, a.prefill, a.depth)
    else:
        sys.exit("usage: profile_decode.py MODEL.gguf | --summarize NCU_CSV")
