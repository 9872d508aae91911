"""The captured decode graph's timeline, kernel by kernel, as it runs: how
long each launch holds the step, over the steps of a tg run (the context
growing as it grows in ``harness bench``).

    python3 scripts/gpu/decode_trace.py MODEL.gguf [--depth N] [--ctx N] [--steps 128] [--parts 4]
        [--knob MODULE.NAME=V1,V2 ...] [--edit NAME ...]

Every kernel is compiled with ANVIL_TRACE (engine/backends/cuda/compile.py
TRACE): block 0 of each launch records the global timer when its PDL wait
returned (common.cuh trace_mark). Under PDL a kernel's wait returns when the
kernel before it has ended, so the records are the step's kernel boundaries
in launch order, and the gap from one launch's record to the next is what
that launch held the step: its own work from the moment it could start,
whatever of it the next kernel's early start did not hide. The last
launch's gap runs to the next step's first record, so it also holds the
host's turn (the token read back, the graph launched again).

Neither Nsight Systems nor a kernel timed alone gives this: the first is not
on the GPU host, the second (Nsight Compute, scripts/gpu/
attention_decode_sweep.py) flushes or cycles the caches and sees none of
the overlap. Leaving kernels out of the graph (decode_variants.py) gives
what a kernel costs in it, but not how that changes from step to step.

The record costs block 0 one atomic after its wait, so the step is a little
slower traced; the script also times the same steps untraced to say by how
much. The report gives each launch name ("kernel (grid)") its total a step,
in µs, over each of ``--parts`` consecutive parts of the steps (the
attention's cost grows with the context; the GEMVs' should not).

``--knob`` and ``--edit`` (decode_variants.py's: a launcher knob, a kernel
edit) trace the step again as each variant has it, and a second table puts
each launch's µs a step beside main's: which slots a change moves, where the
whole-step time says only by how much. One traced run a variant, so read
small differences against the run-to-run spread of the whole step (±15 µs).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_variants import Variant, applied, launch_name, parse_edit, parse_knob  # noqa: E402


def grid_word(grid) -> int:
    """A grid as common.cuh trace_mark packs it."""
    x, y, z = tuple(grid) + (1,) * (3 - len(grid))
    return x | y << 24 | z << 48


def segment(records: np.ndarray, grids: list) -> np.ndarray:
    """The records of whole steps as [steps, launches] times (ns), checked
    against the step's launch grids in order: a record missing or out of
    order is a one-line error, not a skewed table."""
    n = len(grids)
    if n == 0 or len(records) % n:
        raise SystemExit(f"trace: {len(records)} records are not whole steps of {n} launches")
    steps = records.reshape(-1, n, 2)
    want = np.array([grid_word(g) for g in grids], np.uint64)
    bad = np.argwhere(steps[:, :, 1] != want)
    if len(bad):
        s, k = bad[0]
        raise SystemExit(f"trace: step {s} launch {k}: grid word {int(steps[s, k, 1]):#x}, expected {int(want[k]):#x}")
    return steps[:, :, 0].astype(np.int64)


def held(times: np.ndarray) -> np.ndarray:
    """[steps - 1, launches] µs each launch held its step: to the next
    launch's record, the last launch to the next step's first."""
    flat = times.reshape(-1)
    gaps = np.diff(flat).astype(np.float64) / 1e3
    n = times.shape[1]
    return gaps[: (times.shape[0] - 1) * n].reshape(-1, n)


def table(us: np.ndarray, names: list[str], parts: int) -> str:
    """A markdown table: each launch name's µs a step (summed over its
    launches in the step), averaged over each of ``parts`` consecutive parts
    of the steps, then over all, and a launch's share; the step's total last."""
    from harness.table import markdown

    chunks = np.array_split(np.arange(len(us)), parts)
    by_name = collections.defaultdict(list)
    for k, name in enumerate(names):
        by_name[name].append(k)
    rows = [(name, len(ks), us[:, ks].sum(axis=1)) for name, ks in by_name.items()]
    rows.sort(key=lambda r: -r[2].mean())
    rows.append(("whole step", len(names), us.sum(axis=1)))
    return markdown(["launch", "a step", *(f"steps {c[0] + 1}-{c[-1] + 1}" for c in chunks), "all steps", "a launch"],
                    [[name, count, *(f"{per_step[c].mean():.1f}" for c in chunks), f"{per_step.mean():.1f}",
                      f"{per_step.mean() / count:.2f}" if name != "whole step" else ""]
                     for name, count, per_step in rows])


def compare(runs: dict[str, tuple[np.ndarray, list[str]]]) -> str:
    """A markdown table of each launch name's µs a step (all steps) in each
    run, beside the first run's, with the difference; the whole step last."""
    from harness.table import markdown

    first = next(iter(runs))
    totals = {label: {} for label in runs}
    for label, (us, names) in runs.items():
        for k, name in enumerate(names):
            totals[label][name] = totals[label].get(name, 0.0) + float(us[:, k].mean())
        totals[label]["whole step"] = float(us.sum(axis=1).mean())
    order = sorted({n for t in totals.values() for n in t} - {"whole step"}, key=lambda n: -totals[first].get(n, 0.0))
    others = list(runs)[1:]
    rows = []
    for name in order + ["whole step"]:
        base = totals[first].get(name)
        row = [name, "" if base is None else f"{base:.1f}"]
        for o in others:
            v = totals[o].get(name)
            row += [f"{v:.1f}" if v is not None else "", f"{v - base:+.1f}" if v is not None and base is not None else ""]
        rows.append(row)
    return markdown(["launch", first, *(c for o in others for c in (o, "Δ"))], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=None, help="cache rows (default: as harness bench at --depth)")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--knob", action="append", default=[], metavar="MODULE.NAME=V1,V2")
    ap.add_argument("--edit", action="append", default=[], metavar="NAME", help="a kernel edit of decode_variants.py")
    a = ap.parse_args()

    from engine.backends.cuda import compile as nvrtc
    from engine.bench import bench_ctx
    from engine.model import Model

    n_ctx = a.ctx or bench_ctx(a.depth, n_gen=a.steps + 8)
    prompt = [(7 * i) % 1000 + 1 for i in range(max(a.depth, 1))]
    variants = [Variant("main")]
    for spec in a.knob:
        variants += parse_knob(spec)
    for name in a.edit:
        variants += parse_edit(name)

    def run(v: Variant, trace: bool) -> tuple[float, list, np.ndarray | None]:
        """µs a step over the timed steps, the step's launches, the trace:
        the model loaded, compiled and captured as variant ``v`` has it."""
        nvrtc.TRACE = trace
        try:
            with applied(v):
                return steps(Model(a.model, backend="cuda", n_ctx=n_ctx), trace)
        finally:
            nvrtc.TRACE = False

    def steps(m, trace: bool) -> tuple[float, list, np.ndarray | None]:
        b, dev = m.backend, m.backend.dev
        launches, launch = [], dev.launch

        def listed(fn, grid, block, args, shared=0):
            launches.append((fn, tuple(grid) + (1,) * (3 - len(grid))))
            launch(fn, grid, block, args, shared)

        def step(tok: int) -> int:
            nxt = b.decode_next(m, tok, m.pos)
            m.pos += 1
            return max(nxt, 0)  # an edit's logits may be garbage (the argmax then answers -1)

        try:
            tok = int(m.forward(prompt).argmax())
            b.graph = None
            dev.launch = listed  # the eager step, then the capture: the same launches twice
            try:
                tok = step(tok)
            finally:
                dev.launch = launch
            names = {int(f): key[1] for key, f in dev._functions.items()}
            step_launches = [(launch_name(names[int(fn)], grid), grid) for fn, grid in launches[len(launches) // 2:]]
            for _ in range(4):
                tok = step(tok)
            dev.synchronize()
            if trace:
                dev.trace_records(reset=True)
            t0 = time.perf_counter()
            for _ in range(a.steps):
                tok = step(tok)
            dev.synchronize()
            us = (time.perf_counter() - t0) / a.steps * 1e6
            return us, step_launches, dev.trace_records() if trace else None
        finally:
            dev.free_all()

    plain, _, _ = run(variants[0], False)
    runs = {}
    for v in variants:
        traced, step_launches, records = run(v, True)
        names = [n for n, _ in step_launches]
        runs[v.label] = (held(segment(records, [g for _, g in step_launches])), names)
        print(f"{v.label}: {traced:.1f} us a step traced, {len(names)} launches a step", file=sys.stderr, flush=True)
        if v is variants[0]:
            print(f"decode steps {a.steps} at depth {a.depth} (cache {n_ctx or 'the default'}): "
                  f"{plain:.1f} us a step untraced, {traced:.1f} traced; {len(names)} launches a step")
            print(table(runs[v.label][0], names, a.parts), flush=True)
    if len(runs) > 1:
        print(f"\nus a step each launch held, all steps, traced: {', '.join(runs)}")
        print(compare(runs))


if __name__ == "__main__":
    main()
