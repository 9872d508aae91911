"""Launchers for moe_gemm.cu: the Mixture-of-Experts prefill. The (token,
slot) pairs are sorted by expert on the device, each projection is one
grouped GEMM over all experts, and the weighted combine adds the experts'
outputs per token. Expert tensors as in moe.py.

Two grouped GEMMs: bf16 activations and weights on the bf16 tensor cores
(``gemm``, every type), or int8 activations in groups of 32 and the weights'
own integers on the int8 tensor cores (``gemm_i8``, the types of
``INT8_TYPES``, as llama.cpp's MMQ). ``int8(qtype)`` says which a weight
takes; the faithful oracle reads the same switch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ....errors import AnvilError
from ....quants import BLOCK, QType
from .. import launch
from ..device import DArray, Device
from .moe import check_experts

SORT_THREADS = 32 * 32       # moe_gemm.cu SORT_WARPS
BM, BN = 32, 64              # moe_gemm.cu MOE_BM, MOE_BN: grouped GEMM tile
GEMM_THREADS = 256           # moe_gemm.cu MOE_GEMM_THREADS
I8_BN, I8_THREADS = 64, 128  # moe_gemm.cu I8_BN, I8_THREADS: the int8 GEMM's tile width and block
Q8_GROUP, Q8_ALIGN = 32, 256 # int8 activations: a scale per 32; rows padded to a GEMM step

# The int8 grouped GEMM, for these types (their values are small integers
# times a scale per 32 or 16 columns). Off: on an H100 it measured no faster
# than the bf16 GEMM (reports/notes/moe-prefill-int8-2026-12-05.md).
INT8 = launch.switched_on("int8")
INT8_TYPES = frozenset({QType.Q4_0, QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K})


def int8(qtype) -> bool:
    """Whether the grouped GEMM of a ``qtype`` weight runs on the int8 tensor cores."""
    return INT8 and QType(int(qtype)) in INT8_TYPES


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


@dataclass(frozen=True)
class Q8Rows:
    """Rows of activations as int8 in groups of 32 (moe_quant_q8): ``q`` int8
    [P, ld], ``d`` the groups' scales and ``s`` each group's d·sum(q), both
    float32 [P, ld/32]; ld is the row length ``n`` rounded up to a GEMM step."""
    q: DArray
    d: DArray
    s: DArray
    n: int

    @property
    def ld(self) -> int:
        return self.q.shape[1]

    @classmethod
    def empty(cls, alloc: Callable[[tuple, type], DArray], P: int, n: int) -> "Q8Rows":
        ld = launch.ceil_div(n, Q8_ALIGN) * Q8_ALIGN
        return cls(alloc((P, ld), np.int8), alloc((P, ld // Q8_GROUP), np.float32),
                   alloc((P, ld // Q8_GROUP), np.float32), n)


def quant_q8(dev: Device, x: DArray, out: Q8Rows, g: Grouping | None = None, k: int = 1) -> None:
    """``out``'s row i: x[token of the pair at sorted position i] (with the
    grouping ``g`` of x's tokens' k pairs), or x[i] (without), as int8 groups
    of 32 (the decode GEMV's rounding: d = amax/127, q = rint(x/d))."""
    n = x.shape[-1]
    launch.check_f32(x, out.d, out.s)
    P = out.q.shape[0]
    rows = x.size // n
    if n % Q8_GROUP or n != out.n or (g is not None and (rows * k != g.P or P != g.P)) or (g is None and rows != P):
        raise AnvilError(f"CUDA moe_quant_q8: x {x.shape} (rows a multiple of {Q8_GROUP} long) into {P} rows of "
                         f"{out.n}" + (f" for {g.P} pairs" if g is not None else ""))
    for a, what in ((x, "x"), (out.q, "xq"), (out.d, "xd"), (out.s, "xsum")):
        launch.aligned(a, what)
    fn = launch.function(dev, "moe_gemm.cu", "moe_quant_q8")
    dev.launch(fn, launch.grid(dev, max(P * n // Q8_GROUP, 1)), (256,),
               (x, launch.null_or(g.pair_at if g is not None else None), P, k, n, out.ld, out.q, out.d, out.s))


def gemm_i8_smem(qt) -> int:
    """Dynamic shared memory of moe_gemm_i8 (moe_gemm.cu I8Shape): two steps of
    the raw weight rows, the int8 activations and their scales; the unpacked
    weight tile and its scales and mins."""
    qk, nbytes = BLOCK[qt]
    span = (256 // qk * nbytes + 30) // 16 * 16
    ld, groups = 256 + 16, 256 // Q8_GROUP
    return (2 * I8_BN * span + 2 * BM * ld + 2 * 2 * BM * 12 * 4 + I8_BN * ld
            + I8_BN * (2 * groups + 1 + groups + 1) * 4)


def gemm_i8(dev: Device, W: DArray, qtype, xq: Q8Rows, g: Grouping, y: DArray, n_in: int, n_out: int) -> None:
    """y[i] = W[expert of sorted pair i]·x[i] for all P pairs at once, x as
    int8 groups (``xq``, rows in expert order), y [P, n_out] f32: exact
    integer products per group of 32 columns, scaled and summed in fp32."""
    qt = launch.weight_type(qtype, "moe_gemm_i8")
    if qt not in INT8_TYPES:
        raise AnvilError(f"CUDA moe_gemm_i8: no int8 GEMM for {qt.name} weights (it has "
                         f"{', '.join(sorted(t.name for t in INT8_TYPES))})")
    eb = check_experts("moe_gemm_i8", W, qt, g.n_expert, n_out, n_in)
    if n_in % BLOCK[qt][0] or n_in % Q8_GROUP:
        raise AnvilError(f"CUDA moe_gemm_i8: n_in {n_in} is not a multiple of {qt.name}'s block of "
                         f"{BLOCK[qt][0]}")
    launch.check_f32(y)
    if xq.n != n_in or xq.q.shape[0] < g.P or y.size < g.P * n_out:
        raise AnvilError(f"CUDA moe_gemm_i8: x {xq.q.shape[0]} rows of {xq.n}, y {y.shape} for {g.P} pairs "
                         f"[{n_out} x {n_in}]")
    shared = gemm_i8_smem(qt)
    fn = launch.function(dev, "moe_gemm.cu", f"moe_gemm_i8_{launch.TYPE_SUFFIX[qt]}", shared=shared)
    dev.launch(fn, (launch.ceil_div(n_out, I8_BN), g.max_tiles), (I8_THREADS,),
               (W, eb, xq.q, xq.d, xq.s, xq.ld, g.tile_e, g.tile_r0, g.offsets, y, n_out, n_in), shared=shared)
