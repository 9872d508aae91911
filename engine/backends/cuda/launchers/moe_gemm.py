"""Launchers for moe_gemm.cu: the Mixture-of-Experts prefill. The (token,
slot) pairs are sorted by expert on the device, each projection is one
grouped GEMM over all experts, and the weighted combine adds the experts'
outputs per token. Expert tensors as in moe.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ....errors import AnvilError
from ....quants import BLOCK
from .. import launch
from ..device import DArray, Device
from .moe import check_experts

SORT_THREADS = 32 * 32       # moe_gemm.cu SORT_WARPS
BM, BN = 32, 64              # moe_gemm.cu MOE_BM, MOE_BN: grouped GEMM tile
GEMM_THREADS = 256           # moe_gemm.cu MOE_GEMM_THREADS


@dataclass(frozen=True)
class Grouping:
    """The P = T·k (token, slot) pairs sorted by expert (moe_sort)."""
    P: int
    n_expert: int
    offsets: DArray   # int32 [n_expert + 1]: expert e's pairs are sorted positions offsets[e]..offsets[e+1]-1
    pair_at: DArray   # int32 [P]: the pair t·k + j at each sorted position
    pos_of: DArray    # int32 [P]: each pair's sorted position
    tile_e: DArray    # int32 [max_tiles]: a GEMM tile's expert (-1: no tile)
    tile_r0: DArray   # int32 [max_tiles]: its first sorted position

    @property
    def max_tiles(self) -> int:
        return self.tile_e.size

    @classmethod
    def empty(cls, alloc: Callable[[tuple, type], DArray], P: int, n_expert: int) -> "Grouping":
        tiles = launch.ceil_div(P, BM) + n_expert  # each expert adds at most one partial tile
        i32 = np.int32
        return cls(P, n_expert, alloc((n_expert + 1,), i32), alloc((P,), i32), alloc((P,), i32),
                   alloc((tiles,), i32), alloc((tiles,), i32))


def sort_shared(n_expert: int, P: int) -> int:
    """moe_sort's dynamic shared memory: the counts and the ids (one block sorts them all)."""
    return 4 * (n_expert + 1 + P)


def sort(dev: Device, ids: DArray, g: Grouping) -> None:
    """Group the pairs of ``ids`` [T, k] by expert, stably, into ``g``."""
    if np.dtype(ids.dtype) != np.int32 or ids.size != g.P:
        raise AnvilError(f"CUDA moe_sort: ids must be int32 with {g.P} entries, got {np.dtype(ids.dtype)} {ids.shape}")
    shared = sort_shared(g.n_expert, g.P)
    if shared > dev.max_shared:
        raise AnvilError(f"CUDA moe_sort: {g.P} (token, expert) pairs need {shared} bytes of shared memory, more "
                         f"than a block's {dev.max_shared}: load the model with a smaller ubatch")
    fn = launch.function(dev, "moe_gemm.cu", "moe_sort", shared=shared)
    dev.launch(fn, (1,), (SORT_THREADS,), (ids, g.P, g.n_expert, g.max_tiles, g.offsets, g.pair_at, g.pos_of,
                                           g.tile_e, g.tile_r0), shared=shared)


def gather_bf16(dev: Device, x: DArray, g: Grouping, k: int, xs: DArray) -> None:
    """xs[i] = bf16(x[token of the pair at sorted position i]): x [T, n] f32, xs [P, n] bf16 bits."""
    n = x.shape[-1]
    launch.check_f32(x)
    if n % 8 or x.size * k != g.P * n or xs.nbytes < 2 * g.P * n:
        raise AnvilError(f"CUDA moe_gather_bf16: x {x.shape} (row length a multiple of 8), {g.P} pairs, "
                         f"xs {xs.nbytes} bytes")
    launch.aligned(x, "x")
    launch.aligned(xs, "xs")
    fn = launch.function(dev, "moe_gemm.cu", "moe_gather_bf16")
    dev.launch(fn, launch.grid(dev, max(g.P * n // 8, 1)), (256,), (x, g.pair_at, g.P, k, n, xs))


def gemm_smem(qt, bn: int = BN) -> int:
    """Dynamic shared memory of moe_gemm (moe_gemm.cu GemmShape): two steps of the
    tile's raw weight rows and activations, and the bf16 weight tile."""
    qk, nbytes = BLOCK[qt]
    bk = 64 if qk == 1 else 256
    span = (bk // qk * nbytes + 30) // 16 * 16
    lds = bk + 8
    return 2 * bn * span + 2 * BM * lds * 2 + bn * lds * 2


def gemm(dev: Device, W: DArray, qtype, xs: DArray, g: Grouping, y: DArray, n_in: int, n_out: int,
         bn: int = BN) -> None:
    """y[i] = W[expert of sorted pair i]·xs[i] for all P pairs at once: xs
    [P, n_in] bf16 bits, y [P, n_out] f32; bf16 products, fp32 sums. ``bn``:
    output features per tile (a multiple of 64)."""
    qt = launch.weight_type(qtype, "moe_gemm")
    eb = check_experts("moe_gemm", W, qt, g.n_expert, n_out, n_in)
    if n_in % 32 or n_in % BLOCK[qt][0]:
        raise AnvilError(f"CUDA moe_gemm: the grouped GEMM needs n_in a multiple of 32 and of {qt.name}'s "
                         f"block, got {n_in}")
    if BLOCK[qt][0] == 1:  # float rows: deq8 reads 16-byte vectors
        launch.aligned(W, "W", 32)
    launch.check_f32(y)
    if xs.nbytes < 2 * g.P * n_in or y.size < g.P * n_out:
        raise AnvilError(f"CUDA moe_gemm: xs {xs.nbytes} bytes, y {y.shape} for {g.P} pairs [{n_out} x {n_in}]")
    launch.aligned(xs, "xs")
    shared = gemm_smem(qt, bn)
    fn = launch.function(dev, "moe_gemm.cu", f"moe_gemm_{launch.TYPE_SUFFIX[qt]}", {"MOE_BN": bn}, shared=shared)
    dev.launch(fn, (launch.ceil_div(n_out, bn), g.max_tiles), (GEMM_THREADS,),
               (W, eb, xs, g.tile_e, g.tile_r0, g.offsets, y, n_out, n_in), shared=shared)


def combine(dev: Device, d: DArray, g: Grouping, weights: DArray, add: DArray | None, y: DArray) -> None:
    """y[t] = add[t] + sum_j weights[t, j] · d[position of pair (t, j)] (selection order)."""
    T, k = weights.shape
    n = y.shape[-1]
    launch.check_f32(d, weights, add, y)
    if T * k != g.P or d.size < g.P * n or y.size < T * n or (add is not None and add.size < T * n):
        raise AnvilError(f"CUDA moe_combine: d {d.shape}, weights {weights.shape}, y {y.shape} for {g.P} pairs")
    fn = launch.function(dev, "moe_gemm.cu", "moe_combine")
    dev.launch(fn, launch.grid(dev, T * n), (256,), (d, g.pos_of, weights, launch.null_or(add), y, T, k, n))
