"""Decode attention alone, at depth: us per launch of ``attention_decode`` for
layer shapes x cached keys x layouts, each a CUDA graph of launches over
caches cycled past the L2 (as a decode step meets them), with PDL as the
engine launches it.

    python3 scripts/gpu/attention_decode_sweep.py [--shape qwen3-8b 30b] [--depth 128 1024 4096 16384] \\
        [--blocks-per-sm 4 8 16] [--tile-warps 0 2] [--v-early 0 1] [--heads-per-warp 0 4] \\
        [--min-chunk 0 256 512] [--merge-regs 0 80] [--wide 0 1]

A layout is (DEC_BLOCKS_PER_SM, TILE_WARPS, V_EARLY, HEADS_PER_WARP,
MIN_CHUNK, MERGE_REGS): the split count's blocks per SM, the warps across a
head's key tiles (0: attention.cu's default), whether a tile's V rows are
requested with its K rows, the query heads a warp scores from each K/V row
it loads (0: the default, one up to GQA 8; the warps of the other heads read
the same rows again, through L1), the keys a split takes at least (0: a
tile a warp; more leaves fewer, longer splits active where the context is
short, while the grid keeps its size for long ones), and the registers a
thread of the merging block holds its first O_s loads in (0: the default;
more loads at once, but the kernel's register count, and so the blocks an
SM holds, follows). --wide 1 lets the launcher's decode_plan() choose its
wide kernel (a block an SM) where it would; 0 (the default) keeps the
layout's blocks per SM and merge registers. Each
row also gives the bandwidth on the cache (K and V rows read once) and the
largest difference from the default layout's output (other splits sum in
another order: ~1e-7 expected).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

SHAPES = {  # n_head_kv, GQA, head_dim (f16 cache)
    "qwen3-8b": (8, 4, 128),
    "30b": (4, 8, 128),
    "gemma4-sliding": (8, 2, 256),
    "gemma4-full": (2, 8, 512),
}
L2_BYTES = 60 << 20  # H200: 50 MB; caches cycle past it


def prepare(dev, shape, depth, n_ctx):
    """Caches of n_ctx rows whose first ``depth`` rows (what the kernel reads)
    are distinct in each of enough copies to pass the L2: views into one
    buffer, copy i starting depth*i rows in."""
    from engine.backends.cuda.device import DArray

    Hkv, G, D = shape
    r = np.random.default_rng(0)
    copies = max(1, -(-2 * L2_BYTES // (2 * depth * Hkv * D * 2)))
    rows = copies * depth + n_ctx - depth
    k = dev.upload((r.standard_normal((rows, Hkv, D)) * 0.5).astype(np.float16))
    v = dev.upload(r.standard_normal((rows, Hkv, D)).astype(np.float16))
    row = Hkv * D * 2
    caches = [(DArray(k.ptr + i * depth * row, (n_ctx, Hkv, D), k.dtype, dev),
               DArray(v.ptr + i * depth * row, (n_ctx, Hkv, D), v.dtype, dev)) for i in range(copies)]
    q = dev.upload(r.standard_normal((1, Hkv * G, D)).astype(np.float32))
    pos = dev.upload(np.array([depth - 1], np.int32))
    return caches, q, pos, dev.empty((1, Hkv * G * D)), (k, v)  # (k, v): the buffers the views point into


def run(dev, shape, depth, bps, tile_warps, v_early, hpw, prepared, launches=40, reps=10, min_chunk=0,
        merge_regs=0, wide=0):
    from engine.backends.cuda.launchers import attention as A

    Hkv, G, D = shape
    A.DEC_BLOCKS_PER_SM, A.TILE_WARPS, A.V_EARLY = bps, (tile_warps or None), bool(v_early)
    A.HEADS_PER_WARP, A.MIN_CHUNK, A.MERGE_REGS = hpw or None, min_chunk or None, merge_regs or None
    A.WIDE = bool(wide)
    caches, q, pos, out, _ = prepared
    scale = 1.0 / np.sqrt(D)
    A.attention(dev, q, *caches[0], out, pos, scale)  # compiles, takes its scratch and tickets
    dev.synchronize()
    first = out.numpy().copy()
    graph = dev.capture(lambda: [A.attention(dev, q, *caches[i % len(caches)], out, pos, scale)
                                 for i in range(launches)])
    dev.replay(graph)
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dev.replay(graph)
    dev.synchronize()
    us = (time.perf_counter() - t0) / (reps * launches) * 1e6
    n_ctx = caches[0][0].shape[0]
    splits, _ = A.decode_plan(dev.sm_count, 1, Hkv, n_ctx, G, D, True)
    return us, 2 * depth * Hkv * D * 2 / us / 1e3, first, splits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs="+", default=["qwen3-8b", "30b"], choices=sorted(SHAPES))
    ap.add_argument("--depth", nargs="+", type=int, default=[128, 1024, 4096, 16384])
    ap.add_argument("--blocks-per-sm", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--tile-warps", nargs="+", type=int, default=[0, 2])
    ap.add_argument("--v-early", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--heads-per-warp", nargs="+", type=int, default=[0])
    ap.add_argument("--min-chunk", nargs="+", type=int, default=[0])
    ap.add_argument("--merge-regs", nargs="+", type=int, default=[0])
    ap.add_argument("--wide", nargs="+", type=int, default=[0], choices=[0, 1])
    ap.add_argument("--n-ctx", type=int, default=0, help="cache rows (default: depth + 4096, at least 4096, "
                                                         "as profile_decode.py)")
    a = ap.parse_args(argv)
    from engine.backends.cuda.device import Device
    from engine.errors import AnvilError

    dev = Device()
    print("| shape | keys | blocks/SM | tile warps | V early | heads/warp | min chunk | merge regs | wide | splits | us "
          "| GB/s | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.shape:
        for depth in a.depth:
            n_ctx = a.n_ctx or max(4096, depth + 4096)
            prepared, base = prepare(dev, SHAPES[name], depth, n_ctx), None
            for bps in a.blocks_per_sm:
                for tw, ve, hpw, mc, mb, wd in itertools.product(a.tile_warps, a.v_early, a.heads_per_warp,
                                                                 a.min_chunk, a.merge_regs, a.wide):
                    lay = (f"| {name} | {depth} | {bps} | {tw or 'default'} | {ve} | {hpw or 'default'} "
                           f"| {mc or 'default'} | {mb or 'default'} | {wd} |")
                    try:
                        us, gbs, o, splits = run(dev, SHAPES[name], depth, bps, tw, ve, hpw, prepared,
                                                 min_chunk=mc, merge_regs=mb, wide=wd)
                    except AnvilError as e:
                        print(f"{lay} | | | | {e} |")
                        continue
                    base = o if base is None else base
                    diff = float(np.max(np.abs(o - base)))
                    print(f"{lay} {splits} | {us:.2f} | {gbs:.0f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
