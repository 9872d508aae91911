"""Mixture-of-Experts kernel benchmarks: the decode expert GEMVs and the
prefill grouped GEMM at a model's shapes, with random routing. Measurement
code, kept out of the launchers.

    from engine.backends.cuda import moe_bench
    moe_bench.bench_all(dev)   # Qwen3-30B-A3B shapes: us, GB/s (decode), TFLOPS (prefill)
"""

from __future__ import annotations

import numpy as np

from ...quants import QType, row_bytes
from .device import Device
from .gemv_bench import _Scratch, random_weights, time_graph
from .launchers import gemm as wgmma_gemm
from .launchers import moe, moe_gemm


def _random_ids(rng: np.random.Generator, n: int, n_expert: int, k: int) -> np.ndarray:
    """[n, k] int32: k distinct experts per row."""
    return np.argsort(rng.random((n, n_expert)), axis=1)[:, :k].astype(np.int32)


def bench_experts(dev: Device, kind: str, qtype, n_in: int, n_out: int, n_expert: int = 128, k: int = 8,
                  iters: int = 48, rows: int | None = None, seed: int = 0) -> dict:
    """One decode token's expert projections (``kind`` "glu": gate and up with
    SwiGLU; "down": the weighted sum), ``iters`` launches in one graph, each
    with its own random experts (the tensors are far larger than L2, so the
    weights come from HBM). Bytes: the k selected experts' matrices."""
    qt = QType(int(qtype))
    rng = np.random.default_rng(seed)
    raw = random_weights(rng, qt, n_expert * n_out, n_in)
    with _Scratch(dev) as s:
        Ws = [dev.upload(raw, s.empty(raw.shape, np.uint8)) for _ in range(2 if kind == "glu" else 1)]
        ids = dev.upload(_random_ids(rng, iters, n_expert, k), s.empty((iters, k), np.int32))
        x = dev.upload(rng.standard_normal((1, n_in), dtype=np.float32), s.empty((1, n_in), np.float32))
        wts = dev.upload(np.full((1, k), 1.0 / k, np.float32), s.empty((1, k), np.float32))
        h = dev.upload(rng.standard_normal((1, k, n_in), dtype=np.float32), s.empty((1, k, n_in), np.float32))
        out = s.empty((1, k, n_out), np.float32) if kind == "glu" else s.empty((1, n_out), np.float32)

        def one(i: int) -> None:
            ids_i = ids.rows(i, i + 1)
            if kind == "glu":
                moe.glu(dev, Ws[0], Ws[1], qt, ids_i, x, out, n_in, n_out, n_expert, rows)
            else:
                moe.down(dev, Ws[0], qt, ids_i, wts, h, out, None, n_in, n_out, n_expert, rows)

        one(0)  # compile, load, opt in
        dev.synchronize()
        ms = time_graph(dev, lambda: [one(i) for i in range(iters)])
    nbytes = k * len(Ws) * n_out * row_bytes(qt, n_in)
    us = ms * 1e3 / iters
    plan = moe.expert_plan(qt, n_in, n_out, k, 1, kind, dev.sm_count, rows)
    return dict(kind=kind, type=qt.name, n_in=n_in, n_out=n_out, rows=plan.rows, threads=plan.threads,
                us=us, gbps=nbytes / us / 1e3)


def bench_grouped(dev: Device, qtype, n_in: int, n_out: int, n_expert: int = 128, k: int = 8, T: int = 512,
                  bn: int = moe_gemm.BN, iters: int = 10, seed: int = 0, gemm: str = "bf16") -> dict:
    """One prefill projection of T tokens as the grouped GEMM (random routing,
    sorted once) with the rounding of its input, as the engine runs them: us
    per launch, TFLOPS of the T·k products, GB/s of the expert tensor (every
    expert is read). ``gemm``: "int8", the int8 GEMM (quant_q8, gemm_i8; its
    tile fixed), kind "gemm_i8"; "bf16", moe_gemm's bf16 one (gather_bf16,
    gemm), kind "gemm"; "wgmma", gemm.cu's (gather_bf16, gemm.grouped), kind
    "wgmma"."""
    qt = QType(int(qtype))
    rng = np.random.default_rng(seed)
    raw = random_weights(rng, qt, n_expert * n_out, n_in)
    P = T * k
    with _Scratch(dev) as s:
        W = dev.upload(raw, s.empty(raw.shape, np.uint8))
        g = moe_gemm.Grouping.empty(s.empty, P, n_expert)
        moe_gemm.sort(dev, dev.upload(_random_ids(rng, T, n_expert, k), s.empty((T, k), np.int32)), g)
        x = dev.upload(rng.standard_normal((T, n_in), dtype=np.float32), s.empty((T, n_in), np.float32))
        y = s.empty((P, n_out), np.float32)
        if gemm == "int8":
            xq = moe_gemm.Q8Rows.empty(s.empty, P, n_in)

            def one() -> None:
                moe_gemm.quant_q8(dev, x, xq, g, k)
                moe_gemm.gemm_i8(dev, W, qt, xq, g, y, n_in, n_out)
        elif gemm in ("bf16", "wgmma"):
            xs = s.empty((P, n_in), np.uint16)

            def one() -> None:
                moe_gemm.gather_bf16(dev, x, g, k, xs)
                if gemm == "wgmma":
                    wgmma_gemm.grouped(dev, W, qt, xs, g, y, n_in, n_out)
                else:
                    moe_gemm.gemm(dev, W, qt, xs, g, y, n_in, n_out, bn)
        else:
            raise ValueError(f"gemm {gemm!r}: bf16, int8 or wgmma")
        one()
        dev.synchronize()
        ms = time_graph(dev, lambda: [one() for _ in range(iters)])
    us = ms * 1e3 / iters
    kind, tile = {"int8": ("gemm_i8", moe_gemm.I8_BN), "bf16": ("gemm", bn), "wgmma": ("wgmma", wgmma_gemm.BN)}[gemm]
    return dict(kind=kind, type=qt.name, n_in=n_in, n_out=n_out, T=T, bn=tile, us=us,
                tflops=2.0 * P * n_in * n_out / us / 1e6, gbps=raw.nbytes / us / 1e3)


# Qwen3-30B-A3B (2048 hidden, 768 expert FFN, 128 experts, 8 used): Q4_K gate/up, Q4_K or Q6_K down
QWEN3_30B_A3B = dict(n_embd=2048, n_ff=768, n_expert=128, k=8)


def bench_all(dev: Device, shape: dict = QWEN3_30B_A3B, rows=(None,), bns=(moe_gemm.BN,),
              tokens=(512,)) -> list[dict]:
    """Decode glu/down and prefill grouped GEMMs (bf16, int8, wgmma) at ``shape``
    for each count of prompt ``tokens``, printed as a table."""
    D, F, E, k = shape["n_embd"], shape["n_ff"], shape["n_expert"], shape["k"]
    out = []
    print(f"{'kernel':7s} {'type':5s} {'n_in':>5s} {'n_out':>5s} {'cfg':>10s} {'us':>8s} {'GB/s':>7s} {'TFLOPS':>7s}")
    for r in rows:
        for kind, qt, n_in, n_out in (("glu", QType.Q4_K, D, F), ("down", QType.Q4_K, F, D),
                                      ("down", QType.Q6_K, F, D)):
            out.append(bench_experts(dev, kind, qt, n_in, n_out, E, k, rows=r))
    for T in tokens:
        for qt, n_in, n_out in ((QType.Q4_K, D, F), (QType.Q4_K, F, D), (QType.Q6_K, F, D)):
            for bn in bns:
                out.append(bench_grouped(dev, qt, n_in, n_out, E, k, T=T, bn=bn))
            out.append(bench_grouped(dev, qt, n_in, n_out, E, k, T=T, gemm="int8"))
            out.append(bench_grouped(dev, qt, n_in, n_out, E, k, T=T, gemm="wgmma"))
    for r in out:
        cfg = f"T{r['T']}bn{r['bn']}" if "T" in r else f"r{r['rows']}t{r['threads']}"
        print(f"{r['kind']:7s} {r['type']:5s} {r['n_in']:5d} {r['n_out']:5d} {cfg:>10s} {r['us']:8.2f} "
              f"{r['gbps']:7.0f} {r.get('tflops', 0.0):7.1f}", flush=True)
    return out
