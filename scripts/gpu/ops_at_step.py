#!/usr/bin/env python3
"""Runs on the GPU host: the ops check at one decode step of a reference
set, on a model of any size (harness/anchored.py, the faithful oracle with
lazy weights: faithful.LazyWeight).

    python3 scripts/gpu/ops_at_step.py MODEL --set gpu --case 2 --step 55 [--steps 2]

Where `validate-catalog` failed a step (its record names the case, from 0,
and the step), this says whether the CUDA engine's operators there are
still the rounding-faithful oracle's, each on the engine's own inputs: the
case's prompt and its first STEP reference tokens run through the engine
unchecked (teacher-forced, as validation runs them), then STEPS decode
steps from STEP on are judged op by op (phase "decode"), each against
gates.OP_BUDGET. Every op within budget: the step's distance from llama.cpp
is the roundings' (the engine's against llama.cpp's), not a bug; an op
past it is named. Prints each op's largest error and its bound. Source the
host set-up first (scripts/gpu/host-env.sh) and generate the model
(`harness models MODEL`)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import engine  # noqa: E402
from engine.errors import AnvilError  # noqa: E402
from harness import anchored, catalog, refs  # noqa: E402
from harness.table import show  # noqa: E402


def main(argv: list[str] | None = None, backend: str = "cuda") -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--set", default="gpu", help="the reference set (default gpu)")
    ap.add_argument("--case", type=int, required=True, help="the case (prompt) of the set, from 0")
    ap.add_argument("--step", type=int, required=True, help="the first decode step judged, from 0")
    ap.add_argument("--steps", type=int, default=2, help="decode steps judged (default 2)")
    a = ap.parse_args(argv)
    try:
        ref = refs.for_entry(catalog.entry(a.model), a.set)
        if not 0 <= a.case < len(ref.cases):
            raise AnvilError(f"--case {a.case}: the {a.set} set of {a.model} has cases 0 to {len(ref.cases) - 1}")
        case = ref.cases[a.case]
        if not 0 <= a.step < a.step + a.steps <= len(case.tokens):
            raise AnvilError(f"--step {a.step} --steps {a.steps}: case {a.case} has {len(case.tokens)} steps")
        path = catalog.model_path(a.model, progress=False)
        t0 = time.perf_counter()
        model = engine.load(path, backend=backend, kv_f16=True, **({"eager": True} if backend == "cuda" else
                                                                   {"rounding": "cuda"}))
        oracle = engine.load(path, backend="numpy", rounding="cuda", kv_f16=True, lazy=True)
        errors = anchored.check(model, oracle, [*case.prompt_ids, *case.tokens[:a.step]],
                                case.tokens[a.step:a.step + a.steps], prefill=False)
    except AnvilError as e:
        print(f"ops_at_step: {e}", file=sys.stderr)
        return 2
    for e in errors:  # every op judged is a decode step's (the embedding's table reads as a prompt: check_deep)
        e.phase = "decode"
    worst = anchored.worst(errors)
    bad = anchored.over(errors)
    print(f"{a.model} ({a.set} set, case {a.case}, steps {a.step}-{a.step + a.steps - 1}): {backend} ops against "
          f"the faithful oracle, |engine - oracle| / |oracle| ({time.perf_counter() - t0:.0f} s)")
    show(["op", "largest error", "bound"], [[k, f"{e:.3g}", f"{b:.3g}"] for k, (e, b) in sorted(worst.items())])
    for e in bad:
        print(f"OVER: {e.phase} layer {e.layer} {e.op} output {e.output}: {e.error:.3g} > {e.bound:.3g}")
    print(f"{len(bad)} op(s) past their budget" if bad else "every op within its budget")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
