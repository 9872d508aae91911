"""The CUDA engine against the rounding-faithful NumPy oracle, model by model,
without references: both engines run each catalog prompt (llama.cpp's prompt
ids, from the committed cpu references) and are teacher-forced on the same
tokens for N steps; per model, the largest |Δlogit| over all logits of the
prefill's last row and of the decode steps, and how many argmaxes differ.

    python3 scripts/gpu/faithful_check.py [--steps N] [--kv f16|f32] [MODEL ...]

Where a model is over the faithful budget, `harness diff MODEL --backend cuda
--against faithful` shows the first op that parts.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import engine
from harness import catalog, refs
from harness.table import markdown


def run(model, prompt_ids, forced):
    model.reset()
    out = [model.forward(prompt_ids)]
    for tok in forced:
        out.append(model.forward([tok]))
    return np.array(out, np.float64)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16")
    args = ap.parse_args()
    cat = catalog.load()
    names = args.models or [n for n, e in cat.items() if "faithful" in e.reference_sets]
    rows, worst = [], 0.0
    for name in names:
        e = cat[name]
        path = catalog.model_path(name, catalog=cat, progress=False)
        kv16 = args.kv == "f16"
        t0 = time.time()
        cuda = engine.load(path, backend="cuda", kv_f16=kv16)
        oracle = engine.load(path, backend="numpy", rounding="cuda", kv_f16=kv16)
        pre = dec = 0.0
        flips = steps = 0
        for case in refs.for_entry(e, "cpu").cases:
            forced = case.tokens[:args.steps]
            a, b = run(cuda, case.prompt_ids, forced), run(oracle, case.prompt_ids, forced)
            d = np.abs(a - b).max(axis=1)
            pre, dec = max(pre, d[0]), max(dec, d[1:].max(initial=0.0))
            flips += int((a.argmax(1) != b.argmax(1)).sum())
            steps += len(d)
        del cuda
        worst = max(worst, pre, dec)
        rows.append([name, f"{pre:.3g}", f"{dec:.3g}", f"{flips}/{steps}", f"{time.time() - t0:.0f} s"])
        print(name, rows[-1][1:], file=sys.stderr, flush=True)
    print(markdown(["model", f"prefill max |Δ| (kv {args.kv})", "decode max |Δ|", "argmax differ", "time"], rows))
    # a measurement, not a gate: whole models part by ~0.3 logits (reports/notes/cuda-gate-2026-12-04.md);
    # the ops check (harness/anchored.py) is what holds the engine to the oracle
    print(f"worst {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
