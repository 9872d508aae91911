"""Launchers for the weight kernels: decode GEMV (gemv.cu), whole-matrix
dequantisation to bf16 and embedding lookup (dequant.cu), for every GGUF type
in ``SUPPORTED``, in the convention of ``launch.py`` (GEMV bandwidth
benchmarks: ``gemv_bench.py``).

Weights are the raw GGUF bytes on the device (``DArray`` of uint8, row r at
byte ``r * row_bytes``), 16-byte aligned (device allocations are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import AnvilError
from ...quants import BLOCK, QType, row_bytes
from . import launch
from .device import DArray, Device

SUPPORTED: tuple[QType, ...] = (
    QType.F32, QType.F16, QType.BF16, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1,
    QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K,
)
_SUFFIX = {QType.F32: "f32", QType.F16: "f16", QType.BF16: "bf16", QType.Q4_0: "q4_0", QType.Q4_1: "q4_1",
           QType.Q5_0: "q5_0", QType.Q5_1: "q5_1", QType.Q8_0: "q8_0", QType.Q4_K: "q4_k", QType.Q5_K: "q5_k",
           QType.Q6_K: "q6_k"}

# gemv.cu work units, mirrored here to size the launch: qtype -> (units per
# block, elements per block, bytes per block). Float rows are 16-byte vectors
# when n_in is a multiple of the vector, else single elements (_gemv_layout).
_GEMV_UNITS = {
    QType.Q4_0: (1, 32, 18), QType.Q4_1: (1, 32, 20), QType.Q5_0: (1, 32, 22), QType.Q5_1: (1, 32, 24),
    QType.Q8_0: (2, 32, 34), QType.Q4_K: (8, 256, 144), QType.Q5_K: (8, 256, 176), QType.Q6_K: (8, 256, 210),
}
ROW_CHOICES = (16, 8, 4, 2, 1)  # GEMV_ROWS values compiled (one module each)
MIN_BLOCKS_PER_SM = 2           # rows per block: the largest choice that still gives this many blocks per SM
MAX_THREADS = 256               # gemv.cu GEMV_MAX_THREADS


def _check_type(qtype, what: str) -> QType:
    try:
        qt = QType(int(qtype))
    except ValueError:
        qt = None
    if qt not in _SUFFIX:
        name = qt.name if qt is not None else f"ggml type {int(qtype)}"
        raise AnvilError(f"CUDA {what}: unsupported weight type {name}; "
                         f"supported: {', '.join(t.name for t in SUPPORTED)}")
    return qt


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
    rows: int     # GEMV_ROWS: rows per block
    threads: int  # per block, a multiple of 32
    blocks: int
    shared: int   # dynamic shared memory bytes


_plans: dict[tuple, GemvPlan] = {}


def gemv_plan(qtype, n_in: int, n_out: int, sm_count: int = 132, rows: int | None = None) -> GemvPlan:
    key = (qtype, n_in, n_out, sm_count, rows)
    plan = _plans.get(key)
    if plan is None:
        qt = _check_type(qtype, "gemv")
        upb, qk, nbytes = _gemv_layout(qt, n_in)
        if n_in <= 0 or n_out <= 0 or n_in % qk:
            raise AnvilError(f"CUDA gemv: {qt.name} needs n_in a positive multiple of {qk}, got {n_in} (n_out {n_out})")
        if rows is None:
            rows = next((r for r in ROW_CHOICES if -(-n_out // r) >= MIN_BLOCKS_PER_SM * sm_count), 1)
        elif rows not in ROW_CHOICES:
            raise AnvilError(f"CUDA gemv: rows per block must be one of {ROW_CHOICES}, got {rows}")
        units = n_in // qk * upb
        # as few passes as possible, then the fewest warps that cover a row in that many
        passes = -(-units // MAX_THREADS)
        per_pass = -(-units // passes)
        threads = min(MAX_THREADS, max(32, (per_pass + 31) // 32 * 32))
        shared = threads // 32 * rows * gemv_span(upb, nbytes)
        plan = GemvPlan(rows, threads, -(-n_out // rows), shared)
        _plans[key] = plan
    return plan


def gemv(dev: Device, W: DArray, qtype, x: DArray, y: DArray, n_in: int, n_out: int,
         add: DArray | None = None, rows: int | None = None) -> None:
    """y[r] = sum_c W[r][c] * x[c] (+ add[r]), r < n_out, c < n_in. ``add`` may be
    ``y`` itself (residual add); ``y`` must not alias ``x``. ``rows`` overrides
    the rows per block (tests, tuning)."""
    qt = _check_type(qtype, "gemv")
    plan = gemv_plan(qt, n_in, n_out, dev.sm_count, rows)
    need = n_out * row_bytes(qt, n_in)
    if W.nbytes < need or x.size < n_in or y.size < n_out or (add is not None and add.size < n_out):
        raise AnvilError(f"CUDA gemv {qt.name} [{n_out} x {n_in}]: W has {W.nbytes} bytes (needs {need}), "
                         f"x {x.size}, y {y.size}" + (f", add {add.size}" if add is not None else "") + " elements")
    launch.aligned(W, "W")
    launch.aligned(x, "x")
    name = f"gemv_{_SUFFIX[qt]}"
    fn = launch.function(dev, "gemv.cu", name, {"GEMV_ROWS": plan.rows}, shared=plan.shared)
    dev.launch(fn, (plan.blocks,), (plan.threads,), (W, x, y, launch.null_or(add), n_in, n_out), shared=plan.shared)


def dequant_bf16(dev: Device, W: DArray, qtype, out: DArray, n_rows: int, n_in: int) -> None:
    """out[r][c] = bf16(W[r][c]) (round to nearest even) for the whole matrix;
    ``out`` is n_rows*n_in bf16 values (e.g. a uint16 DArray)."""
    qt = _check_type(qtype, "dequant_bf16")
    need = n_rows * row_bytes(qt, n_in)
    if W.nbytes < need or out.nbytes < 2 * n_rows * n_in:
        raise AnvilError(f"CUDA dequant_bf16 {qt.name} [{n_rows} x {n_in}]: W has {W.nbytes} bytes "
                         f"(needs {need}), out {out.nbytes} bytes (needs {2 * n_rows * n_in})")
    launch.aligned(W, "W")
    launch.aligned(out, "out")
    n = n_rows * n_in
    fn = launch.function(dev, "dequant.cu", f"dequant_{_SUFFIX[qt]}_bf16")
    dev.launch(fn, launch.grid(dev, max(n // 8, 1)), (256,), (W, out, n_rows, n_in))


def get_rows(dev: Device, W: DArray, qtype, ids: DArray, out: DArray, n_in: int, scale: float = 1.0) -> None:
    """out[i][c] = W[ids[i]][c] * scale in fp32 (embedding lookup); ids int32,
    each in range (not checked on the device)."""
    qt = _check_type(qtype, "get_rows")
    n_ids = ids.size
    if out.size < n_ids * n_in or np.dtype(ids.dtype) != np.int32:
        raise AnvilError(f"CUDA get_rows {qt.name}: {n_ids} ids ({np.dtype(ids.dtype)}, need int32) "
                         f"of {n_in} columns need {n_ids * n_in} outputs, out has {out.size}")
    row_bytes(qt, n_in)  # raises if n_in is not a multiple of the block size
    launch.aligned(W, "W")
    launch.aligned(out, "out")
    per_thread = 8 if (BLOCK[qt][0] > 1 or n_in % 8 == 0) else 1
    fn = launch.function(dev, "dequant.cu", f"get_rows_{_SUFFIX[qt]}")
    dev.launch(fn, launch.grid(dev, max(n_ids * n_in // per_thread, 1)), (256,), (W, ids, out, n_ids, n_in, float(scale)))
