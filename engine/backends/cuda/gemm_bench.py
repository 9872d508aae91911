"""Prefill GEMM benchmarks: a run of quantised projections of T tokens, the
two ways the CUDA backend can multiply it (dequantise to bf16 + cuBLAS, or
gemm.cu reading the blocks itself), at a model's shapes. Measurement code,
kept out of the launchers.

    from engine.backends.cuda import gemm_bench
    gemm_bench.bench_all(dev)   # Qwen3-8B shapes: us and TFLOPS of both paths
"""

from __future__ import annotations

import numpy as np

from ...quants import QType
from . import CUBLAS_WORKSPACE
from .cublas import Cublas
from .device import Device
from .gemv_bench import _Scratch, random_weights, time_graph
from .launchers import dequant, gemm


def bench_gemm(dev: Device, qtype, T: int, n_in: int, widths, path: str, iters: int = 10, seed: int = 0,
               cublas: Cublas | None = None, bm: int = 128) -> dict:
    """One prefill run (``widths``: the output widths of the projections stored
    back to back) of T tokens, ``iters`` times in one graph: us per run and
    TFLOPS. ``path`` "cublas": one dequant_bf16 of the run, then a cuBLAS bf16
    GEMM per projection (Ops._gemms's other path); "wgmma": one gemm.cu launch
    of ``bm`` tokens a block."""
    qt = QType(int(qtype))
    N = sum(widths)
    rng = np.random.default_rng(seed)
    raw = random_weights(rng, qt, N, n_in)
    with _Scratch(dev) as s:
        W = dev.upload(raw, s.empty(raw.shape, np.uint8))
        xb = (rng.standard_normal((T, n_in), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        x = dev.upload(xb, s.empty((T, n_in), np.uint16))
        ys = [s.empty((T, w), np.float32) for w in widths]
        if path == "cublas":
            blas = cublas
            if blas is None:  # a workspace set before the capture: cuBLAS allocates none inside it
                blas = Cublas(dev.stream)
                blas.set_workspace(s.empty((CUBLAS_WORKSPACE,), np.uint8))
            wb = s.empty((N, n_in), np.uint16)

            def one() -> None:
                dequant.dequant_bf16(dev, W, qt, wb, N, n_in)
                r0 = 0
                for y, w in zip(ys, widths):
                    blas.gemm(x, wb.rows(r0, r0 + w), y, T, n_in, w, "bf16")
                    r0 += w
        elif path == "wgmma":
            def one() -> None:
                gemm.gemm(dev, W, qt, x, ys, T, n_in, bm=bm)
        else:
            raise ValueError(f"path {path!r}: cublas or wgmma")
        one()
        dev.synchronize()
        ms = time_graph(dev, lambda: [one() for _ in range(iters)])
    us = ms * 1e3 / iters
    return dict(path=path if path == "cublas" else f"{path}{bm}", type=qt.name, T=T, n_in=n_in,
                widths=list(widths), us=us, tflops=2.0 * T * n_in * N / us / 1e6)


# Qwen3-8B's prefill runs (n_in, widths): Q/K/V, the output projection, gate/up, down
QWEN3_8B_RUNS = ((4096, (4096, 1024, 1024)), (4096, (4096,)), (4096, (12288, 12288)), (12288, (4096,)))


def bench_all(dev: Device, runs=QWEN3_8B_RUNS, tokens=(512, 4096), types=(QType.Q4_K, QType.Q6_K)) -> list[dict]:
    """Both paths for every run, token count and type, the wgmma GEMM with
    each tile height its type has, printed as a table (each one's time over
    cuBLAS's)."""
    out = []
    print(f"{'type':5s} {'T':>5s} {'n_in':>6s} {'widths':>18s} {'path':>9s} {'us':>9s} {'TFLOPS':>7s} {'ratio':>6s}")
    for T in tokens:
        for qt in types:
            for n_in, widths in runs:
                a = bench_gemm(dev, qt, T, n_in, widths, "cublas")
                rows = [a] + [bench_gemm(dev, qt, T, n_in, widths, "wgmma", bm=bm)
                              for bm in gemm.BMS if bm == 128 or qt in gemm.TYPES256]
                out += rows
                for r in rows:
                    print(f"{qt.name:5s} {T:5d} {n_in:6d} {'+'.join(map(str, widths)):>18s} {r['path']:>9s} "
                          f"{r['us']:9.1f} {r['tflops']:7.1f} {r['us'] / a['us']:6.3f}", flush=True)
    return out
