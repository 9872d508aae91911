"""Launcher for gemv.cu: the decode matrix-vector product over raw GGUF
weight rows of every type in ``launch.WEIGHT_TYPES``, with its launch plan
(rows per block, threads, shared memory). Weights are 16-byte aligned raw
GGUF bytes on the device (row r at byte ``r * row_bytes``)."""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import AnvilError
from ....quants import BLOCK, QType, row_bytes
from .. import launch
from ..device import DArray, Device


# gemv.cu work units, mirrored here to size the launch: qtype -> (units per
# block, elements per block, bytes per block). Float rows are 16-byte vectors
# when n_in is a multiple of the vector, else single elements (_gemv_layout).
_GEMV_UNITS = {
    QType.Q4_0: (1, 32, 18), QType.Q4_1: (1, 32, 20), QType.Q5_0: (1, 32, 22), QType.Q5_1: (1, 32, 24),
    QType.Q8_0: (2, 32, 34), QType.Q4_K: (8, 256, 144), QType.Q5_K: (8, 256, 176), QType.Q6_K: (8, 256, 210),
}
ROW_CHOICES = (16, 8, 4, 2, 1)  # GEMV_ROWS values compiled (one module each)
MAX_THREADS = 256               # gemv.cu GEMV_MAX_THREADS


def max_rows(qt: QType, threads: int) -> int:
    """Rows per block at most: 16 only where a row spans 4+ warps and the type
    decodes cheaply. The kernel is bound by its decode instructions as much as
    by memory at these sizes, and more rows per warp lengthen the tail after
    the last load lands (H200, reports/notes/gemv-rows-2026-11-30.md: Q4_K
    [5120 x 2048] 5.85 us with 16 rows, 4.79 with 8; Q6_K [151936 x 4096]
    221 us, 195)."""
    return 16 if threads >= 128 and qt != QType.Q6_K else 8


def _gemv_layout(qt: QType, n_in: int) -> tuple[int, int, int]:
    if qt in _GEMV_UNITS:
        return _GEMV_UNITS[qt]
    esize = BLOCK[qt][1]
    vec = 16 // esize
    return (1, vec, 16) if n_in % vec == 0 else (1, 1, esize)


def gemv_span(upb: int, block_bytes: int) -> int:
    """Per-row staging bytes of one warp step (gemv.cu Layout::SPAN)."""
    return ((32 // upb) * block_bytes + 15 + 15) // 16 * 16


@dataclass(frozen=True)
class GemvPlan:
    rows: int        # GEMV_ROWS: rows per block
    threads: int     # per block, a multiple of 32
    blocks: int      # row groups (the grid is at most what stays resident: gemv.cu streams)
    shared: int      # dynamic shared memory bytes
    stages: int = 0  # bulk-copy ring stages (GEMV_BULK=1; 0: gemv_impl's per-warp staging)
    passes: int = 1  # GEMV_PASSES: units per lane and row (bulk only)


_plans: dict[tuple, GemvPlan] = {}


XQ = True  # gemv.cuh GEMV_XQ: block-type weights meet int8 activations (quants.quantize_x) in dp4a


def _lanes(qt: QType, n_in: int, n_out: int) -> tuple[int, int, int, int]:
    """(units per block, block bytes, passes, threads) of a row of n_in: as
    few passes over the row's work units as possible, then the fewest warps
    that cover the row in that many."""
    upb, qk, nbytes = _gemv_layout(qt, n_in)
    if n_in <= 0 or n_out <= 0 or n_in % qk:
        raise AnvilError(f"CUDA gemv: {qt.name} needs n_in a positive multiple of {qk}, got {n_in} (n_out {n_out})")
    units = n_in // qk * upb
    passes = -(-units // MAX_THREADS)
    return upb, nbytes, passes, min(MAX_THREADS, max(32, (-(-units // passes) + 31) // 32 * 32))


def gemv_plan(qtype, n_in: int, n_out: int, sm_count: int = 132, rows: int | None = None) -> GemvPlan:
    key = (qtype, n_in, n_out, sm_count, rows)
    plan = _plans.get(key)
    if plan is None:
        qt = launch.weight_type(qtype, "gemv")
        upb, nbytes, _, threads = _lanes(qt, n_in, n_out)
        if rows is None:  # the most rows (up to max_rows) that still give every SM a block
            rows = next((r for r in ROW_CHOICES if r <= max_rows(qt, threads) and -(-n_out // r) >= sm_count), 1)
        elif rows not in ROW_CHOICES:
            raise AnvilError(f"CUDA gemv: rows per block must be one of {ROW_CHOICES}, got {rows}")
        shared = threads // 32 * rows * gemv_span(upb, nbytes)
        plan = GemvPlan(rows, threads, -(-n_out // rows), shared)
        _plans[key] = plan
    return plan


BULK = True  # gemv.cuh gemv_bulk_impl on sm_90+ (bulk copies into a ring of stages)
BULK_MIN_BYTES = 8 << 20  # smaller matrices stay with gemv_impl (H200: 2.4 MB 2.45 -> 2.79 us with bulk; the 30B lost ~2% with its 4.7 MB projections on bulk)
SM_SHARED = 227 * 1024    # shared memory an SM gives its blocks
# Warps an SM keeps resident: enough to keep up with the copies (Q6_K: 8 were too few), and no more, since every
# block reads all of x from L2 after its wait (the sweep in the decode graph and the A/B against 16:
# reports/notes/decode-in-graph-2026-12-01.md, ab-20261202T060308Z-f089fa7b)
WARPS_PER_SM = 12
MAX_STAGES = 8            # gemv.cuh GEMV_MAX_STAGES
# gemv.cuh GEMV_PRE_HALVES / 2: ring stages (in halves) requested before the wait, the rest after x's loads, whose
# responses then queue behind fewer weights (qwen3-8b's decode step in the graph: -72 us,
# reports/notes/decode-pre-stages-2026-12-04.md); None: all of them
PRE_STAGES = 1.5
MAX_PASSES = 4            # GEMV_PASSES values compiled (1..4)


def bulk_part(nbytes: int) -> int:
    """Ring bytes of a stage part holding ``nbytes`` that start anywhere (gemv.cuh bulk_part)."""
    return (nbytes + 30) // 16 * 16


def bulk_plan(qtype, n_in: int, n_out: int, sm_count: int = 132, glu: bool = False,
              rows: int | None = None) -> GemvPlan | None:
    """The plan of gemv_bulk_impl for [n_out x n_in] (GLU: a stacked weight of
    2*n_out rows, n_out outputs), or None where it does not apply: a matrix
    under BULK_MIN_BYTES, a row of more units than MAX_PASSES * MAX_THREADS,
    or rows too long for 4 groups in flight per SM. Blocks per SM: enough for WARPS_PER_SM
    warps (at least 2), each with an equal share of the SM's shared memory
    for its ring. Rows per group: the most (up to 16, any type) that leave
    every SM a group and room for 4 groups in flight (over its blocks'
    rings); then as many stages as fit, but no more than a block has groups.
    (H200 sweep, reports/notes/gemv-bulk-2026-12-01.md: the most rows win
    where that much is in flight: Q4_K [4096 x 4096] 3.79 us with 16 rows, 4
    blocks of one stage per SM, 5.0-5.5 with 4-8 rows.)"""
    key = ("bulk", qtype, n_in, n_out, sm_count, glu, rows, BULK_MIN_BYTES)  # tests lower the threshold
    if key in _plans:
        return _plans[key]
    qt = launch.weight_type(qtype, "gemv")
    _, _, passes, threads = _lanes(qt, n_in, n_out)
    rb = row_bytes(qt, n_in)
    per_sm = max(2, WARPS_PER_SM // (threads // 32))
    budget = SM_SHARED // per_sm - 2048  # less the block's static shared memory and reserve
    rmin = 2 if glu else 1

    def stage(r):  # ring bytes of one group of r rows (GLU: r/2 gate rows, r/2 up rows)
        return 2 * bulk_part(r // 2 * rb) if glu else bulk_part(r * rb)

    plan = None
    if passes <= MAX_PASSES and (2 if glu else 1) * n_out * rb >= BULK_MIN_BYTES:
        if rows is None:
            fits = [r for r in ROW_CHOICES if r >= rmin and per_sm * (budget // stage(r)) >= 4]
            enough = [r for r in fits if -(-n_out // (r // 2 if glu else r)) >= sm_count]
            rows = (enough or fits[-1:] or [None])[0]
        elif rows not in ROW_CHOICES or rows < rmin:
            raise AnvilError(f"CUDA gemv: rows per block must be one of {ROW_CHOICES} (GLU: at least 2), got {rows}")
        if rows is not None:
            groups = -(-n_out // (rows // 2 if glu else rows))
            stages = max(1, min(MAX_STAGES, budget // stage(rows), -(-groups // (per_sm * sm_count))))
            if stages * stage(rows) <= SM_SHARED - 2048:
                plan = GemvPlan(rows, threads, groups, stages * stage(rows), stages, passes)
    _plans[key] = plan
    return plan


def _bulk(dev: Device, bulk: bool | None) -> bool:
    return (BULK if bulk is None else bulk) and int(dev.arch[3:].rstrip("af")) >= 90


def gemv(dev: Device, W: DArray, qtype, x: DArray, y: DArray, n_in: int, n_out: int,
         add: DArray | None = None, rows: int | None = None, xq: bool | None = None,
         bulk: bool | None = None, norm: tuple[DArray, float] | None = None, overlap: bool = False,
         heads: Heads | None = None) -> None:
    """y[r] = sum_c W[r][c] * x[c] (+ add[r]), r < n_out, c < n_in. ``add`` may be
    ``y`` itself (residual add); ``y`` must not alias ``x``. ``norm`` (w, eps):
    x is RMSNorm(x)·w (norm.rms_norm's), formed as the kernel reads x, one
    launch instead of two. ``overlap``: the launch before this one is a GEMV
    of the same x (and writes nothing this one reads or writes): this one
    runs beside it and waits for it only at its end (gemv.cuh
    GEMV_LATE_WAIT). ``heads`` (launchers/rope.py, one token; with ``overlap``):
    after that wait the launch forms them as well (gemv.cu GEMV_HEADS),
    where a ``qk_norm_rope`` or ``rope`` launch would next; they are
    written by the kernels before it, not read by this one's product.
    ``rows`` overrides
    the rows per block, ``xq`` False fp32 activations for every type (tests,
    tuning; default ``XQ``), ``bulk`` False gemv_impl's per-warp staging
    (default ``BULK`` on sm_90+). The grid is at most the blocks that stay
    resident: gemv.cu's blocks loop over the row groups."""
    qt = launch.weight_type(qtype, "gemv")
    plan = (bulk_plan(qt, n_in, n_out, dev.sm_count, False, rows) if _bulk(dev, bulk) else None) \
        or gemv_plan(qt, n_in, n_out, dev.sm_count, rows)
    need = n_out * row_bytes(qt, n_in)
    if W.nbytes < need or x.size < n_in or y.size < n_out or (add is not None and add.size < n_out):
        raise AnvilError(f"CUDA gemv {qt.name} [{n_out} x {n_in}]: W has {W.nbytes} bytes (needs {need}), "
                         f"x {x.size}, y {y.size}" + (f", add {add.size}" if add is not None else "") + " elements")
    launch.aligned(W, "W")
    launch.aligned(x, "x")
    nw, eps = _norm_args(norm, n_in)
    name = f"gemv_{launch.TYPE_SUFFIX[qt]}"
    defines = _defines(plan, xq, norm=norm is not None)
    if overlap:
        defines["GEMV_LATE_WAIT"] = 1
    args = [W, x, y, launch.null_or(add), n_in, n_out, nw, eps]
    if heads is not None:
        if not overlap or heads.q.shape[0] != 1:
            raise AnvilError("CUDA gemv: heads are formed after the late wait (overlap=True), of one token")
        defines["GEMV_HEADS"] = 2 if heads.neox else 1
        name = f"gemv_heads_{launch.TYPE_SUFFIX[qt]}"
        args += heads.args()
    fn = launch.function(dev, "gemv.cu", name, defines, shared=plan.shared)
    blocks = min(plan.blocks, launch.resident_blocks(dev, fn, plan.threads, plan.shared))
    if heads is not None:  # a warp a head: blocks past the row groups' only form heads
        blocks = max(blocks, launch.ceil_div(heads.count, plan.threads // 32))
    dev.launch(fn, (blocks,), (plan.threads,), args, shared=plan.shared)


def _norm_args(norm: tuple[DArray, float] | None, n_in: int) -> tuple:
    """The kernels' (nw, eps): the norm's weight and epsilon, or a null pointer."""
    if norm is None:
        return launch.null(), 0.0
    w, eps = norm
    launch.check_f32(w)
    if w.size != n_in:
        raise AnvilError(f"CUDA gemv: the norm weight has {w.size} elements, x {n_in}")
    launch.aligned(w, "norm weight")
    return w, float(eps)


def _defines(plan: GemvPlan, xq: bool | None, glu: bool = False, norm: bool = False) -> dict:
    d = {"GEMV_ROWS": plan.rows, "GEMV_XQ": int(XQ if xq is None else xq)}
    if plan.stages:
        d.update(GEMV_BULK=1, GEMV_PASSES=plan.passes)
        if PRE_STAGES is not None and PRE_STAGES < plan.stages:
            halves = 2 * PRE_STAGES
            if halves != int(halves) or halves < 0:
                raise AnvilError(f"CUDA gemv: PRE_STAGES must be a multiple of 0.5, at least 0, got {PRE_STAGES}")
            d["GEMV_PRE_HALVES"] = int(halves)
    if glu:
        d["GEMV_GLU"] = 1
    if norm:
        d["GEMV_NORM"] = 1
    return d


GLU_KERNELS = {"silu": "gemv_glu_silu", "gelu_tanh": "gemv_glu_gelu"}


def gemv_glu(dev: Device, W: DArray, qtype, x: DArray, y: DArray, n_in: int, n_out: int, activation: str,
             rows: int | None = None, xq: bool | None = None, bulk: bool | None = None,
             norm: tuple[DArray, float] | None = None) -> None:
    """y[r] = act(gate_r·x) * (up_r·x), r < n_out, for a stacked gate/up
    weight W of 2*n_out rows (the gate's, then the up projection's) of one
    type: the GEMV and the GLU in one launch. ``activation`` "silu" or
    "gelu_tanh"; ``rows`` (at least 2), ``xq``, ``bulk`` and ``norm`` as for
    ``gemv``."""
    qt = launch.weight_type(qtype, "gemv")
    if activation not in GLU_KERNELS:
        raise AnvilError(f"CUDA gemv_glu: activation must be one of {sorted(GLU_KERNELS)}, got {activation!r}")
    plan = bulk_plan(qt, n_in, n_out, dev.sm_count, True, rows) if _bulk(dev, bulk) else None
    if plan is None:
        plan = gemv_plan(qt, n_in, 2 * n_out, dev.sm_count, rows)
        if plan.rows < 2:  # a group pairs R/2 gate rows with their R/2 up rows
            plan = gemv_plan(qt, n_in, 2 * n_out, dev.sm_count, 2)
    need = 2 * n_out * row_bytes(qt, n_in)
    if W.nbytes < need or x.size < n_in or y.size < n_out:
        raise AnvilError(f"CUDA gemv_glu {qt.name} [2 x {n_out} x {n_in}]: W has {W.nbytes} bytes (needs {need}), "
                         f"x {x.size}, y {y.size} elements")
    launch.aligned(W, "W")
    launch.aligned(x, "x")
    nw, eps = _norm_args(norm, n_in)
    name = f"{GLU_KERNELS[activation]}_{launch.TYPE_SUFFIX[qt]}"
    fn = launch.function(dev, "gemv.cu", name, _defines(plan, xq, glu=True, norm=norm is not None),
                         shared=plan.shared)
    blocks = min(plan.blocks, launch.resident_blocks(dev, fn, plan.threads, plan.shared))
    dev.launch(fn, (blocks,), (plan.threads,), (W, x, y, n_in, n_out, nw, eps), shared=plan.shared)
