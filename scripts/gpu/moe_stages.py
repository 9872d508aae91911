#!/usr/bin/env python3
"""Runs on the GPU host: where the CUDA prefill MoE FFN parts from the
faithful oracle, stage by stage (harness/anchored.py moe_stage_errors).

    python3 scripts/gpu/moe_stages.py MODEL [--set oracle]

Runs each prompt of MODEL's reference set through the CUDA engine eagerly,
as the ops check does (f16 KV cache); at every prefill MoE FFN the
engine's stages are copied to the host as they are made (cuda Ops
``moe_watch``), and the whole op and each stage, on the engine's own output of
the stage before, are held to the rounding-faithful oracle's. Prints one
row per prompt and layer. Source the host set-up first
(scripts/gpu/host-env.sh) and generate the model (`harness models MODEL`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import engine  # noqa: E402
from engine.backends import cuda  # noqa: E402
from engine.errors import AnvilError  # noqa: E402
from harness import anchored, catalog, refs  # noqa: E402
from harness.table import show  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--set", default="oracle", help="the reference set whose prompts run (default oracle)")
    a = ap.parse_args()
    try:
        ref = refs.for_entry(catalog.entry(a.model), a.set)
    except AnvilError as e:
        sys.exit(f"moe_stages: {e}")
    path = catalog.model_path(a.model, progress=False)
    model = engine.load(path, backend="cuda", kv_f16=True, eager=True)
    oracle = engine.load(path, backend="numpy", rounding="cuda", kv_f16=True)
    host = anchored.Anchored(model, oracle).host  # device arrays -> host, weights -> the oracle's
    run = cuda.Ops.moe_ffn
    rows, layer = [], [0]

    def moe_ffn(self, x, ids, weights, gate_exps, up_exps, down_exps, add=None, activation="silu",
                down_scale=None):
        if ids.shape[0] <= cuda.GEMV_MAX_TOKENS:  # decode: no grouped stages
            return run(self, x, ids, weights, gate_exps, up_exps, down_exps, add, activation, down_scale)
        args = host((x, ids, weights, gate_exps, up_exps, down_exps, add, down_scale))
        stages = {}
        self.moe_watch = lambda stage, arrays: stages.update({stage: {k: host(v) for k, v in arrays.items()}})
        try:
            y = run(self, x, ids, weights, gate_exps, up_exps, down_exps, add, activation, down_scale)
        finally:
            self.moe_watch = None
        hy = host(y)
        hx, hids, hw, hg, hu, hd, hadd, hscale = args
        whole = oracle.ops.moe_ffn(hx, hids, hw, hg, hu, hd, add=hadd, activation=activation, down_scale=hscale)
        errors = anchored.moe_stage_errors(hx, hids, hw, hg, hu, hd, hadd, activation, hscale, stages, hy)
        rows.append([str(hx.shape[0]), str(layer[0]), f"{anchored.rel_error(hy, whole):.3g}",
                     *(f"{v:.3g}" for v in errors.values())])
        header[:] = ["T", "MoE layer", "whole op", *errors]
        layer[0] += 1
        return y

    header: list[str] = []
    cuda.Ops.moe_ffn = moe_ffn
    for case in ref.cases:
        layer[0] = 0
        model.reset()
        model.forward(case.prompt_ids)
    print(f"{a.model} ({a.set} prompts): the CUDA prefill MoE FFN against the faithful oracle, "
          f"|cuda - oracle| / |oracle|, each stage on the engine's own output of the stage before")
    show(header, rows)


if __name__ == "__main__":
    main()
