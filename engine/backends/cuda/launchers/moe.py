"""Launchers for moe.cu: routing on the device, and the selected experts as
matrix-vector products (decode: one launch runs all k experts of a token,
reading their ids from device memory). The grouped prefill is moe_gemm.py's.

An expert tensor is the raw 3-D GGUF tensor: ``n_expert`` matrices
``[n_out, n_in]`` back to back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....errors import AnvilError
from ....quants import QType, row_bytes
from .. import launch
from ..device import DArray, Device
from . import gemv as gemv_launcher

ROW_CHOICES = (16, 8, 4, 2)  # GEMV_ROWS of the expert kernels (even: a GLU warp splits them gate/up)
# Rows per warp at most. gate/up: as the dense gemv (launchers/gemv.py max_rows). down
# (short rows: 768 wide at 30B-A3B, 24 Q6_K units for 32 lanes): Q6_K 4 (H200,
# reports/notes/gemv-rows-2026-11-30.md: down Q6_K 7.55 us at 4 rows, 8.42 at 8; Q4_K 7.66, 5.84);
# moe.cu builds moe_down for at most DOWN_ROWS_LIMIT rows.
DOWN_MAX_ROWS = {QType.Q6_K: 4}
DOWN_ROWS_LIMIT = 8
MAX_WARPS = 8                # moe.cu MOE_MAX_WARPS: selected experts run side by side in a block
ROUTE_WARPS = 4              # moe.cu: tokens per moe_route block
MAX_K = 32                   # moe_route: lane j keeps pick j
MAX_EXPERTS = 32 * 16        # moe_route: ROUTE_PER_LANE experts in each lane's registers


def _expert_bytes(qt, n_out: int, n_in: int) -> int:
    nbytes = n_out * row_bytes(qt, n_in)
    if nbytes >= 2**31:
        raise AnvilError(f"CUDA MoE: one expert's matrix [{n_out} x {n_in}] {qt.name} is {nbytes} bytes; "
                         f"the kernels index experts with 32-bit byte offsets")
    return nbytes


def check_experts(what: str, W: DArray, qt, n_expert: int, n_out: int, n_in: int) -> int:
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
        cap = DOWN_MAX_ROWS.get(qt, DOWN_ROWS_LIMIT)
    else:
        threads = gemv_launcher.gemv_plan(qt, n_in, n_out, sm_count, 1).threads
        cap = gemv_launcher.max_rows(qt, threads)
    if rows is None:  # the most rows (up to cap) that still give every SM a block
        rows = next((r for r in ROW_CHOICES if r <= cap and -(-n_out // per_block(r)) * slots * T >= sm_count),
                    ROW_CHOICES[-1])
    elif rows not in ROW_CHOICES or (kind == "down" and rows > DOWN_ROWS_LIMIT):
        raise AnvilError(f"CUDA MoE experts: rows per warp must be one of {ROW_CHOICES}"
                         f"{f' and at most {DOWN_ROWS_LIMIT} for down' if kind == 'down' else ''}, got {rows}")
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


def _expert_fn(dev, kind: str, qt, plan: ExpertPlan, gelu: bool = False):
    defines = {"GEMV_ROWS": plan.rows, "GEMV_XQ": int(gemv_launcher.XQ)}
    if gelu:  # a module of its own: only gemma4's experts need it
        defines["MOE_GELU"] = 1
    return launch.function(dev, "moe.cu", f"moe_{kind}_{launch.TYPE_SUFFIX[qt]}", defines, shared=plan.shared)


def glu(dev: Device, Wg: DArray, Wu: DArray, qtype, ids: DArray, x: DArray, h: DArray, n_in: int, n_out: int,
        n_expert: int, rows: int | None = None, activation: str = "silu") -> None:
    """h[t, j] = act(gate[e]·x[t]) ⊙ (up[e]·x[t]), e = ids[t, j]: gate and up
    experts of one type, x [T, n_in], h [T, k, n_out]; ``activation`` "silu"
    or "gelu_tanh"."""
    if activation not in ("silu", "gelu_tanh"):
        raise AnvilError(f"CUDA moe_glu: activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    _expert_rows(dev, "glu", (Wg, Wu), qtype, ids, x, h, n_in, n_out, n_expert, rows,
                 gelu=activation == "gelu_tanh")


def gemv(dev: Device, W: DArray, qtype, ids: DArray, x: DArray, y: DArray, n_in: int, n_out: int,
         n_expert: int, rows: int | None = None) -> None:
    """y[t, j] = W[ids[t, j]]·x[t]: x [T, n_in], y [T, k, n_out]."""
    _expert_rows(dev, "gemv", (W,), qtype, ids, x, y, n_in, n_out, n_expert, rows)


def _expert_rows(dev, kind: str, Ws: tuple, qtype, ids, x, y, n_in, n_out, n_expert, rows, gelu=False) -> None:
    """moe_glu / moe_gemv: one output row per selected expert and token."""
    what = f"moe_{kind}"
    qt = launch.weight_type(qtype, what)
    T, k = ids.shape
    eb = [check_experts(what, W, qt, n_expert, n_out, n_in) for W in Ws][0]
    _check_ids(ids, None, T, k)
    launch.check_f32(x, y)
    launch.aligned(x, "x")
    if x.size < T * n_in or y.size < T * k * n_out:
        raise AnvilError(f"CUDA {what}: x {x.shape}, out {y.shape} for {T} tokens x {k} experts [{n_out} x {n_in}]")
    plan = expert_plan(qt, n_in, n_out, k, T, kind, dev.sm_count, rows)
    dev.launch(_expert_fn(dev, kind, qt, plan, gelu), (plan.blocks, k, T), (plan.threads,),
               (*Ws, ids, x, y, n_in, n_out, eb, k), shared=plan.shared)


def down(dev: Device, W: DArray, qtype, ids: DArray, weights: DArray, h: DArray, y: DArray, add: DArray | None,
         n_in: int, n_out: int, n_expert: int, rows: int | None = None) -> None:
    """y[t] = add[t] + sum_j weights[t, j] · W[ids[t, j]]·h[t, j] (selection
    order): h [T, k, n_in], y [T, n_out]; ``add`` may be ``y`` itself."""
    qt = launch.weight_type(qtype, "moe_down")
    T, k = ids.shape
    eb = check_experts("moe_down", W, qt, n_expert, n_out, n_in)
    _check_ids(ids, weights, T, k)
    launch.check_f32(weights, h, y, add)
    launch.aligned(h, "h")
    if h.size < T * k * n_in or y.size < T * n_out or (add is not None and add.size < T * n_out):
        raise AnvilError(f"CUDA moe_down: h {h.shape}, y {y.shape} for {T} tokens x {k} experts [{n_out} x {n_in}]")
    plan = expert_plan(qt, n_in, n_out, k, T, "down", dev.sm_count, rows)
    dev.launch(_expert_fn(dev, "down", qt, plan), (plan.blocks, 1, T), (plan.threads,),
               (W, ids, weights, h, y, launch.null_or(add), n_in, n_out, eb, k), shared=plan.shared)
