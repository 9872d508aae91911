"""Prefill's weight dequantisation to bf16 (dequant.cu) on qwen3-8b's prefill
shapes: µs per launch and the bandwidth of the bytes read and written.

    python3 scripts/gpu/dequant_sweep.py [--iters 20]

Each case captures ``iters`` launches in one graph and times its replays
(gemv_bench.time_graph: CUDA events, the best of three after a warm-up). Each
matrix and its output together are larger than the L2, so every launch reads
and writes DRAM. The engine imported is whichever is first on the path: run it
with PYTHONPATH set to an unpacked wheel to time another build's kernels.
"""

from __future__ import annotations

import argparse

import numpy as np

# (type, rows, columns): qwen3-8b's stacked Q and K, O, stacked gate and up, down (Q4_K and Q6_K layers)
SHAPES = (("Q4_K", 5120, 4096), ("Q4_K", 4096, 4096), ("Q4_K", 24576, 4096), ("Q4_K", 4096, 12288),
          ("Q6_K", 4096, 12288), ("Q6_K", 1024, 4096))


def time_us(dev, fn, iters: int) -> float:
    from engine.backends.cuda.gemv_bench import time_graph

    fn()  # compile, load
    dev.synchronize()
    return time_graph(dev, lambda: [fn() for _ in range(iters)]) * 1e3 / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()

    import engine
    from engine.backends.cuda.device import Device
    from engine.backends.cuda.gemv_bench import random_weights
    from engine.backends.cuda.launchers.dequant import dequant_bf16
    from engine.quants import QType

    dev = Device()
    rng = np.random.default_rng(0)
    print(f"engine: {engine.__file__}")
    print("| type | rows x cols | MB in | MB out | us | TB/s |")
    print("|---|---|---|---|---|---|")
    for name, rows, cols in SHAPES:
        qt = QType[name]
        raw = random_weights(rng, qt, rows, cols)
        W = dev.upload(raw)
        out = dev.empty((rows, cols), np.uint16)
        moved = raw.nbytes + out.nbytes
        us = time_us(dev, lambda: dequant_bf16(dev, W, qt, out, rows, cols), a.iters)
        print(f"| {name} | {rows} x {cols} | {raw.nbytes / 1e6:.1f} | {out.nbytes / 1e6:.1f} | {us:.1f} | "
              f"{moved / us / 1e6:.2f} |")
        dev.free_all()


if __name__ == "__main__":
    main()
