"""Launchers for moe.cu: routing on the device, the selected experts as
matrix-vector products (decode: one launch runs all k experts of a token,
reading their ids from device memory), and the grouped prefill (pairs sorted
by expert, one grouped GEMM per projection, the weighted combine).

An expert tensor is the raw 3-D GGUF tensor: ``n_expert`` matrices
``[n_out, n_in]`` back to back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ....errors import AnvilError
from ....quants import BLOCK, QType, row_bytes
from .. import launch
from ..device import DArray, Device
from . import gemv as gemv_launcher

ROW_CHOICES = (16, 8, 4, 2)  # GEMV_ROWS of the expert kernels (even: a GLU warp splits them gate/up)
# Rows per warp at most. gate/up: as the dense gemv (launchers/gemv.py max_rows). down
# (short rows: 768 wide at 30B-A3B, 24 Q6_K units for 32 lanes): Q6_K 4 (H200,
# reports/notes/gemv-rows-2026-11-30.md: down Q6_K 7.55 us at 4 rows, 8.42 at 8; Q4_K 7.66, 5.84).
DOWN_MAX_ROWS = {QType.Q6_K: 4}
MAX_WARPS = 8                # moe.cu MOE_MAX_WARPS: selected experts run side by side in a block
ROUTE_WARPS = 4              # moe.cu: tokens per moe_route block
MAX_K = 32                   # moe_route: lane j keeps pick j
MAX_EXPERTS = 32 * 16        # moe_route: ROUTE_PER_LANE experts in each lane's registers
SORT_THREADS = 32 * 32       # moe.cu SORT_WARPS
BM, BN = 32, 64              # moe.cu MOE_BM, MOE_BN: grouped GEMM tile
GEMM_THREADS = 256           # moe.cu MOE_GEMM_THREADS


def _expert_bytes(qt, n_out: int, n_in: int) -> int:
    nbytes = n_out * row_bytes(qt, n_in)
    if nbytes >= 2**31:
        raise AnvilError(f"CUDA MoE: one expert's matrix [{n_out} x {n_in}] {qt.name} is {nbytes} bytes; "
                         f"the kernels index experts with 32-bit byte offsets")
    return nbytes


def _check_experts(what: str, W: DArray, qt, n_expert: int, n_out: int, n_in: int) -> int:
    eb = _expert_bytes(qt, n_out, n_in)
    if W.nbytes < n_expert * eb:
        raise AnvilError(f"CUDA {what} {qt.name}: {n_expert} experts of [{n_out} x {n_in}] need "
                         f"{n_expert * eb} bytes, the tensor has {W.nbytes}")
    launch.aligned(W, "W")
    return eb


def _check_ids(ids: DArray, weights: DArray | None, T: int, k: int) -> None:
    if np.dtype(ids.dtype) != np.int32 or ids.size < T * k or (weights is not None and weights.size < T * k):
        raise AnvilError(f"CUDA MoE: ids must be int32 [{T}, {k}] (got {np.dtype(ids.dtype)} {ids.shape})"
                         + (f", weights [{T}, {k}] (got {weights.shape})" if weights is not None else ""))


@dataclass(frozen=True)
class ExpertPlan:
    rows: int     # GEMV_ROWS: rows per warp (gate and up halves for the GLU kernel)
    threads: int  # per block
    blocks: int   # row groups (grid.x); grid.y is the slot (gate/up) or 1 (down), grid.z the token
    shared: int   # dynamic shared memory bytes


def expert_plan(qtype, n_in: int, n_out: int, k: int, T: int, kind: str, sm_count: int = 132,
                rows: int | None = None) -> ExpertPlan:
    """Launch plan of moe_glu / moe_gemv (``kind`` "glu", "gemv": a block per
    row group, slot and token, its warps splitting a row's units as the dense
    gemv) or moe_down ("down": one warp per slot, up to MAX_WARPS). ``rows``
    overrides the rule below (tests, tuning)."""
    qt = launch.weight_type(qtype, "MoE expert")
    upb, qk, nbytes = gemv_launcher._gemv_layout(qt, n_in)
    if n_in <= 0 or n_out <= 0 or n_in % qk:
        raise AnvilError(f"CUDA MoE experts: {qt.name} needs n_in a positive multiple of {qk}, got {n_in}")
    per_block = (lambda r: r // 2) if kind == "glu" else (lambda r: r)
    slots = 1 if kind == "down" else k
    if kind == "down":
        threads = 32 * min(k, MAX_WARPS)
        cap = DOWN_MAX_ROWS.get(qt, 8)
    else:
        threads = gemv_launcher.gemv_plan(qt, n_in, n_out, sm_count, 1).threads
        cap = gemv_launcher.max_rows(qt, threads)
    if rows is None:  # the most rows (up to cap) that still give every SM a block
        rows = next((r for r in ROW_CHOICES if r <= cap and -(-n_out // per_block(r)) * slots * T >= sm_count),
                    ROW_CHOICES[-1])
    elif rows not in ROW_CHOICES:
        raise AnvilError(f"CUDA MoE experts: rows per warp must be one of {ROW_CHOICES}, got {rows}")
    shared = threads // 32 * rows * gemv_launcher.gemv_span(upb, nbytes)
    return ExpertPlan(rows, threads, -(-n_out // per_block(rows)), shared)


def route(dev: Device, logits: DArray, ids: DArray, weights: DArray, k: int, norm: bool) -> None:
    """Per row of ``logits`` [T, n_expert]: softmax, the top ``k`` (ties to the
    lower id, descending) into ``ids`` [T, k] and their probabilities into
    ``weights``, divided by max(sum, 2^-14) when ``norm``."""
    T, n_expert = logits.shape
    launch.check_f32(logits, weights)
    if not 1 <= k <= min(MAX_K, n_expert):
        raise AnvilError(f"CUDA moe_route: {k} experts per token of {n_expert} (at most {MAX_K})")
    if n_expert > MAX_EXPERTS:
        raise AnvilError(f"CUDA moe_route: {n_expert} experts (at most {MAX_EXPERTS})")
    _check_ids(ids, weights, T, k)
    fn = launch.function(dev, "moe.cu", "moe_route")
    dev.launch(fn, (launch.ceil_div(T, ROUTE_WARPS),), (32 * ROUTE_WARPS,),
               (logits, T, n_expert, k, int(norm), ids, weights))


def router_route(dev: Device, W: DArray, qtype, x: DArray, logits: DArray, ids: DArray, weights: DArray, n_in: int,
                 k: int, norm: bool, scale: float = 1.0) -> None:
    """Decode (one token): ``logits`` [1, n_expert] = W·x for an F32 router
    ``W`` [n_expert, n_in], then ``route`` of logits·scale into ``ids`` and
    ``weights`` [1, k], in one launch (the last block to finish routes)."""
    n_expert = logits.size
    if launch.weight_type(qtype, "moe_router") != QType.F32:
        raise AnvilError(f"CUDA moe_router: the fused router reads F32 weights, got {QType(qtype).name}")
    if not 1 <= k <= min(MAX_K, n_expert) or n_expert > MAX_EXPERTS:
        raise AnvilError(f"CUDA moe_router: {k} experts per token of {n_expert} (at most {MAX_K} of {MAX_EXPERTS})")
    launch.check_f32(x, logits, weights)
    _check_ids(ids, weights, 1, k)
    if W.nbytes < 4 * n_expert * n_in or x.size < n_in or ids.shape[0] != 1:
        raise AnvilError(f"CUDA moe_router: W has {W.nbytes} bytes for [{n_expert} x {n_in}], x {x.size} elements, "
                         f"{ids.shape[0]} tokens (one)")
    launch.aligned(W, "W")
    launch.aligned(x, "x")
    plan = gemv_launcher.gemv_plan(QType.F32, n_in, n_expert, dev.sm_count)
    fn = launch.function(dev, "moe.cu", "moe_router_f32", {"GEMV_ROWS": plan.rows}, shared=plan.shared)
    blocks = min(plan.blocks, launch.resident_blocks(dev, fn, plan.threads, plan.shared))
    dev.launch(fn, (blocks,), (plan.threads,), (W, x, logits, n_in, n_expert, float(scale), k, int(norm), ids, weights,
                                               launch.counter(dev, "moe_router")), shared=plan.shared)


def _expert_fn(dev, kind: str, qt, plan: ExpertPlan):
    return launch.function(dev, "moe.cu", f"moe_{kind}_{launch.TYPE_SUFFIX[qt]}",
                           {"GEMV_ROWS": plan.rows, "GEMV_XQ": int(gemv_launcher.XQ)},
                           shared=plan.shared)


def glu(dev: Device, Wg: DArray, Wu: DArray, qtype, ids: DArray, x: DArray, h: DArray, n_in: int, n_out: int,
        n_expert: int, rows: int | None = None) -> None:
    """h[t, j] = SiLU(gate[e]·x[t]) ⊙ (up[e]·x[t]), e = ids[t, j]: gate and up
    experts of one type, x [T, n_in], h [T, k, n_out]."""
    _expert_rows(dev, "glu", (Wg, Wu), qtype, ids, x, h, n_in, n_out, n_expert, rows)


def gemv(dev: Device, W: DArray, qtype, ids: DArray, x: DArray, y: DArray, n_in: int, n_out: int,
         n_expert: int, rows: int | None = None) -> None:
    """y[t, j] = W[ids[t, j]]·x[t]: x [T, n_in], y [T, k, n_out]."""
    _expert_rows(dev, "gemv", (W,), qtype, ids, x, y, n_in, n_out, n_expert, rows)


def _expert_rows(dev, kind: str, Ws: tuple, qtype, ids, x, y, n_in, n_out, n_expert, rows) -> None:
    """moe_glu / moe_gemv: one output row per selected expert and token."""
    what = f"moe_{kind}"
    qt = launch.weight_type(qtype, what)
    T, k = ids.shape
    eb = [_check_experts(what, W, qt, n_expert, n_out, n_in) for W in Ws][0]
    _check_ids(ids, None, T, k)
    launch.check_f32(x, y)
    launch.aligned(x, "x")
    if x.size < T * n_in or y.size < T * k * n_out:
        raise AnvilError(f"CUDA {what}: x {x.shape}, out {y.shape} for {T} tokens x {k} experts [{n_out} x {n_in}]")
    plan = expert_plan(qt, n_in, n_out, k, T, kind, dev.sm_count, rows)
    dev.launch(_expert_fn(dev, kind, qt, plan), (plan.blocks, k, T), (plan.threads,),
               (*Ws, ids, x, y, n_in, n_out, eb, k), shared=plan.shared)


def down(dev: Device, W: DArray, qtype, ids: DArray, weights: DArray, h: DArray, y: DArray, add: DArray | None,
         n_in: int, n_out: int, n_expert: int, rows: int | None = None) -> None:
    """y[t] = add[t] + sum_j weights[t, j] · W[ids[t, j]]·h[t, j] (selection
    order): h [T, k, n_in], y [T, n_out]; ``add`` may be ``y`` itself."""
    qt = launch.weight_type(qtype, "moe_down")
    T, k = ids.shape
    eb = _check_experts("moe_down", W, qt, n_expert, n_out, n_in)
    _check_ids(ids, weights, T, k)
    launch.check_f32(weights, h, y, add)
    launch.aligned(h, "h")
    if h.size < T * k * n_in or y.size < T * n_out or (add is not None and add.size < T * n_out):
        raise AnvilError(f"CUDA moe_down: h {h.shape}, y {y.shape} for {T} tokens x {k} experts [{n_out} x {n_in}]")
    plan = expert_plan(qt, n_in, n_out, k, T, "down", dev.sm_count, rows)
    dev.launch(_expert_fn(dev, "down", qt, plan), (plan.blocks, 1, T), (plan.threads,),
               (W, ids, weights, h, y, launch.null_or(add), n_in, n_out, eb, k), shared=plan.shared)


# ---- prefill: pairs grouped by expert ---------------------------------------------


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


def sort(dev: Device, ids: DArray, g: Grouping) -> None:
    """Group the pairs of ``ids`` [T, k] by expert, stably, into ``g``."""
    if np.dtype(ids.dtype) != np.int32 or ids.size != g.P:
        raise AnvilError(f"CUDA moe_sort: ids must be int32 with {g.P} entries, got {np.dtype(ids.dtype)} {ids.shape}")
    shared = 4 * (g.n_expert + 1 + g.P)  # the counts and the ids
    fn = launch.function(dev, "moe.cu", "moe_sort", shared=shared)
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
    fn = launch.function(dev, "moe.cu", "moe_gather_bf16")
    dev.launch(fn, launch.grid(dev, max(g.P * n // 8, 1)), (256,), (x, g.pair_at, g.P, k, n, xs))


def gemm_smem(qt, bn: int = BN) -> int:
    """Dynamic shared memory of moe_gemm (moe.cu GemmShape): two steps of the
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
    eb = _check_experts("moe_gemm", W, qt, g.n_expert, n_out, n_in)
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
    fn = launch.function(dev, "moe.cu", f"moe_gemm_{launch.TYPE_SUFFIX[qt]}", {"MOE_BN": bn}, shared=shared)
    dev.launch(fn, (launch.ceil_div(n_out, bn), g.max_tiles), (GEMM_THREADS,),
               (W, eb, xs, g.tile_e, g.tile_r0, g.offsets, y, n_out, n_in), shared=shared)


def combine(dev: Device, d: DArray, g: Grouping, weights: DArray, add: DArray | None, y: DArray) -> None:
    """y[t] = add[t] + sum_j weights[t, j] · d[position of pair (t, j)] (selection order)."""
    T, k = weights.shape
    n = y.shape[-1]
    launch.check_f32(d, weights, add, y)
    if T * k != g.P or d.size < g.P * n or y.size < T * n or (add is not None and add.size < T * n):
        raise AnvilError(f"CUDA moe_combine: d {d.shape}, weights {weights.shape}, y {y.shape} for {g.P} pairs")
    fn = launch.function(dev, "moe.cu", "moe_combine")
    dev.launch(fn, launch.grid(dev, T * n), (256,), (d, g.pos_of, weights, launch.null_or(add), y, T, k, n))
