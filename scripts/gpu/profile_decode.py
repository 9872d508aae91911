"""Per-kernel device time of one decode step (or, with ``--prefill N``, of
one N-token prefill), for Nsight Compute.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \\
        --csv --log-file ncu.csv python3 scripts/gpu/profile_decode.py MODEL.gguf [--prefill 512] [--depth 4096] \\
        --launches launches.json
    python3 scripts/gpu/profile_decode.py --summarize ncu.csv --launches launches.json

The step runs eagerly (every kernel launched from Python, as before graph
capture) between cuProfilerStart/Stop, after a prompt (4 tokens, or
``--depth`` tokens: decode with that much already in the cache, as
``llama-bench -d``) and two warm decode steps; the script prints the step's
kernel launch count (the captured decode graph holds the same kernels,
launched once per token) and, with ``--launches``, writes what each launch
moves (``launch_bytes``), from which the summary gives bytes and achieved
bandwidth per kernel. The cache is sized as ``harness bench`` sizes it at
that depth (engine.bench bench_ctx): the decode attention splits by it.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict


def prompt(n: int) -> list[int]:
    return [(7 * i) % 1000 + 1 for i in range(n)]


BIG = 64 << 20  # a buffer this large is a table or a cache, read in part: not counted whole


def launch_bytes(name: str, args: list, n_keys: int) -> int | None:
    """Bytes a decode launch moves to or from memory, from its arguments
    (the launchers' argument order): a GEMV's weight rows, x and y; the
    decode attention's K and V rows of the ``n_keys`` cached positions (and
    the step's new rows where it stores them); the KV store's new rows; any other kernel's arrays under BIG (activations,
    norm weights). None where
    that says nothing (the experts a MoE kernel reads are chosen on the
    device; a row gather reads one row of its table)."""
    from engine.backends.cuda.device import DArray
    from engine.backends.cuda.launch import TYPE_SUFFIX
    from engine.quants import row_bytes

    arrays = [a for a in args if isinstance(a, DArray)]
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    by_suffix = {v: k for k, v in TYPE_SUFFIX.items()}
    m = re.fullmatch(r"gemv_(glu_\w+?_)?(\w+)", name)
    if m and m.group(2) in by_suffix:
        n_in, n_out = ints[-2:]
        rows = 2 * n_out if m.group(1) else n_out
        return rows * row_bytes(by_suffix[m.group(2)], n_in) + 4 * n_in + 4 * n_out * (len(arrays) - 2)  # W, x; y (, add)
    if name == "attention_decode":
        q, kc, out = arrays[0], arrays[1], arrays[3]
        _, n_kv, d = kc.shape
        new = [a for a in args[-2:] if isinstance(a, DArray)]  # the step's K/V rows, read and stored
        return (2 * n_keys * n_kv * d * kc.dtype.itemsize + q.nbytes + out.nbytes
                + sum(a.nbytes + a.size * kc.dtype.itemsize for a in new))
    if name == "kv_store":  # this step's K and V rows, into the caches
        k, v, kc = arrays[:3]
        return k.nbytes + v.nbytes + (k.size + v.size) * kc.dtype.itemsize + arrays[4].nbytes
    if name.startswith(("moe_", "get_rows_")):
        return None
    return sum(a.nbytes for a in arrays if a.nbytes < BIG)


def profile(path: str, prefill: int = 0, depth: int = 0, launches_json: str | None = None) -> None:
    """One eager decode step (or prefill) between cuProfilerStart/Stop; with
    ``launches_json``, each launch's kernel, grid and bytes (launch_bytes) in
    launch order, for ``summarize``."""
    from cuda.bindings import driver

    from engine.backends.cuda.device import check
    from engine.bench import bench_ctx
    from engine.model import Model

    # the cache harness bench sizes at this depth: the decode attention's split plan follows it
    m = Model(path, backend="cuda", eager=True, n_ctx=bench_ctx(depth, n_prompt=max(512, prefill)))
    dev = m.backend.dev
    recorded = []
    launch = dev.launch

    def recording(fn, grid, block, args, shared=0):
        recorded.append((fn, tuple(grid), list(args)))
        return launch(fn, grid, block, args, shared)

    tok = int(m.forward(prompt(depth) if depth else [1, 2, 3, 4]).argmax())
    for _ in range(2):
        tok = m.decode_next(tok)
    dev.launch = recording
    dev.synchronize()
    n_keys = m.pos + 1  # the profiled step's position sees this many
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
        print(f"prefill of {prefill} tokens: {len(recorded)} kernel launches")
    else:
        print(f"decode step at depth {m.pos - 1}: {len(recorded)} kernel launches eagerly; one graph launch of as "
              f"many kernel nodes when captured")
    if launches_json:
        names = {int(fn): key[1] for key, fn in dev._functions.items()}
        rows = [[names.get(int(fn), "?"), "(" + ", ".join(str(g) for g in grid + (1,) * (3 - len(grid))) + ")",
                 None if prefill else launch_bytes(names.get(int(fn), "?"), args, n_keys)]
                for fn, grid, args in recorded]
        with open(launches_json, "w") as f:
            json.dump(rows, f)


def summarize(csv_path: str, launches_json: str | None = None, top: int = 30) -> None:
    """The per-kernel table of an Nsight Compute CSV: launches, time; with the
    profile's launches file, bytes and the bandwidth each kernel reached
    (launch i of the file is kernel i of the CSV: both in launch order)."""
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
    nbytes = [None] * len(rows)
    if launches_json:
        launched = json.load(open(launches_json))
        if [n for n, _, _ in launched] != [n for n, _, _ in rows]:
            sys.exit(f"{launches_json} does not list the kernels of {csv_path} in their order")
        nbytes = [b for _, _, b in launched]
    by = defaultdict(lambda: [0, 0.0, 0])
    for (name, grid, us), b in zip(rows, nbytes):
        e = by[(name, grid)]
        e[0] += 1
        e[1] += us
        e[2] = None if b is None or e[2] is None else e[2] + b
    total = sum(us for _, _, us in rows)
    print(f"{len(rows)} kernels, {total:.1f} us of kernel time in the step")
    if launches_json:
        known = sum(b for b in nbytes if b is not None)
        print(f"{known / 1e6:.1f} MB moved by the kernels whose traffic is known: {known / total / 1e3:.0f} GB/s "
              f"over the whole step")
    print(f"{'kernel':28s} {'grid':>16s} {'n':>4s} {'us total':>9s} {'us each':>8s} {'%':>5s}"
          + (f" {'MB each':>8s} {'GB/s':>6s}" if launches_json else ""))
    for (name, grid), (n, us, b) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        line = f"{name[:28]:28s} {grid[:16]:>16s} {n:4d} {us:9.1f} {us / n:8.2f} {100 * us / total:5.1f}"
        if launches_json:
            line += f" {b / n / 1e6:8.3f} {b / us / 1e3:6.0f}" if b is not None else f" {'-':>8s} {'-':>6s}"
        print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--summarize", metavar="NCU_CSV")
    ap.add_argument("--prefill", type=int, default=0, metavar="N", help="profile an N-token prefill instead")
    ap.add_argument("--depth", type=int, default=0, metavar="N", help="decode with N tokens already in the cache")
    ap.add_argument("--launches", metavar="JSON", help="profiling: write each launch's kernel, grid and bytes here; "
                    "summarizing: read them, for bytes and bandwidth per kernel")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize, a.launches)
    elif a.model:
        profile(a.model, a.prefill, a.depth, a.launches)
    else:
        sys.exit("usage: profile_decode.py MODEL.gguf | --summarize NCU_CSV")
