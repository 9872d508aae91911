"""Launchers for the weight kernels: decode GEMV (gemv.cu), whole-matrix
dequantisation to bf16 and embedding lookup (dequant.cu), for every GGUF type
in ``SUPPORTED``; plus ``bench_gemv``/``bench_all`` to measure GEMV bandwidth.

Weights are the raw GGUF bytes on the device (``DArray`` of uint8, row r at
byte ``r * row_bytes``), 16-byte aligned (device allocations are).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np

from ...errors import AnvilError
from ...quants import BLOCK, QType, row_bytes
from .device import DArray, Device, check

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


def _aligned(a: DArray, what: str, n: int = 16) -> None:
    if a.ptr % n:
        raise AnvilError(f"CUDA kernel argument {what} must be {n}-byte aligned (address {a.ptr:#x})")


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
_smem_opt_in: dict[int, int] = {}  # CUfunction handle -> dynamic shared bytes allowed


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
    _aligned(W, "W")
    _aligned(x, "x")
    name = f"gemv_{_SUFFIX[qt]}"
    fn = dev.function("gemv.cu", name, {"GEMV_ROWS": plan.rows})
    if plan.shared > 48 * 1024:
        _allow_shared(dev, fn, plan.shared)
    dev.launch(fn, (plan.blocks,), (plan.threads,),
               (W, x, y, add if add is not None else ctypes.c_void_p(0), n_in, n_out), shared=plan.shared)


def _allow_shared(dev: Device, fn, nbytes: int) -> None:
    """Opt a kernel in to more than 48 KB of dynamic shared memory (the largest
    plan: 8 warps x 16 rows x 864 B of Q6_K = 108 KB, of the H200's 227 KB)."""
    key = int(fn)  # the CUfunction handle
    if _smem_opt_in.get(key, 0) >= nbytes:
        return
    d = dev.driver
    check(d.cuFuncSetAttribute(fn, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))
    _smem_opt_in[key] = nbytes


def _grid(dev: Device, work_items: int, threads: int = 256) -> tuple[int]:
    # grid-stride kernels: enough blocks to fill the GPU, no more
    return (max(1, min(-(-work_items // threads), dev.sm_count * 16)),)


def dequant_bf16(dev: Device, W: DArray, qtype, out: DArray, n_rows: int, n_in: int) -> None:
    """out[r][c] = bf16(W[r][c]) (round to nearest even) for the whole matrix;
    ``out`` is n_rows*n_in bf16 values (e.g. a uint16 DArray)."""
    qt = _check_type(qtype, "dequant_bf16")
    need = n_rows * row_bytes(qt, n_in)
    if W.nbytes < need or out.nbytes < 2 * n_rows * n_in:
        raise AnvilError(f"CUDA dequant_bf16 {qt.name} [{n_rows} x {n_in}]: W has {W.nbytes} bytes "
                         f"(needs {need}), out {out.nbytes} bytes (needs {2 * n_rows * n_in})")
    _aligned(W, "W")
    _aligned(out, "out")
    n = n_rows * n_in
    fn = dev.function("dequant.cu", f"dequant_{_SUFFIX[qt]}_bf16")
    dev.launch(fn, _grid(dev, max(n // 8, 1)), (256,), (W, out, n_rows, n_in))


def get_rows(dev: Device, W: DArray, qtype, ids: DArray, out: DArray, n_in: int, scale: float = 1.0) -> None:
    """out[i][c] = W[ids[i]][c] * scale in fp32 (embedding lookup); ids int32,
    each in range (not checked on the device)."""
    qt = _check_type(qtype, "get_rows")
    n_ids = ids.size
    if out.size < n_ids * n_in or np.dtype(ids.dtype) != np.int32:
        raise AnvilError(f"CUDA get_rows {qt.name}: {n_ids} ids ({np.dtype(ids.dtype)}, need int32) "
                         f"of {n_in} columns need {n_ids * n_in} outputs, out has {out.size}")
    row_bytes(qt, n_in)  # raises if n_in is not a multiple of the block size
    _aligned(W, "W")
    _aligned(out, "out")
    per_thread = 8 if (BLOCK[qt][0] > 1 or n_in % 8 == 0) else 1
    fn = dev.function("dequant.cu", f"get_rows_{_SUFFIX[qt]}")
    dev.launch(fn, _grid(dev, max(n_ids * n_in // per_thread, 1)), (256,), (W, ids, out, n_ids, n_in, float(scale)))


# ---- random weights and benchmarks ------------------------------------------------
_F16_FIELDS = {QType.Q4_0: (0,), QType.Q4_1: (0, 2), QType.Q5_0: (0,), QType.Q5_1: (0, 2), QType.Q8_0: (0,),
               QType.Q4_K: (0, 2), QType.Q5_K: (0, 2), QType.Q6_K: (208,)}


def random_weights(rng: np.random.Generator, qtype, n_rows: int, n_in: int, wide: bool = False) -> np.ndarray:
    """(n_rows, row_bytes) uint8: random valid GGUF rows. Block types: random
    bytes with finite fp16 scale fields, of magnitude 0.25..1 and random sign,
    or with ``wide`` any finite fp16 (zero/denormal exponents forced on a
    quarter). Float types: standard normal values (bf16 rounded to nearest even)."""
    qt = QType(int(qtype))
    if qt in (QType.F32, QType.F16, QType.BF16):
        v = rng.standard_normal((n_rows, n_in), dtype=np.float32)
        if qt == QType.F16:
            v = v.astype(np.float16)
        elif qt == QType.BF16:
            b = v.view(np.uint32)
            v = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
        return v.view(np.uint8).reshape(n_rows, -1)
    qk, nbytes = BLOCK[qt]
    raw = rng.integers(0, 256, (n_rows * (n_in // qk), nbytes), dtype=np.uint8)
    n = len(raw)
    for off in _F16_FIELDS[qt]:
        if wide:
            exp = rng.integers(0, 31, n, dtype=np.uint16)
            exp[rng.random(n) < 0.25] = 0
            bits = (rng.integers(0, 1 << 16, n, dtype=np.uint16) & np.uint16(0x83FF)) | (exp << np.uint16(10))
        else:
            mag = rng.uniform(0.25, 1.0, n).astype(np.float32)
            bits = np.where(rng.random(n) < 0.5, -mag, mag).astype(np.float16).view(np.uint16)
        raw[:, off:off + 2] = bits.view(np.uint8).reshape(n, 2)
    return raw.reshape(n_rows, -1)


class _Scratch:
    """Device memory owned by a benchmark, freed on exit (not through Device,
    whose other allocations stay untouched)."""

    def __init__(self, dev: Device):
        self.dev, self.ptrs = dev, []

    def empty(self, shape, dtype) -> DArray:
        n = max(1, math.prod(shape)) * np.dtype(dtype).itemsize
        ptr = int(check(self.dev.driver.cuMemAlloc(n)))
        self.ptrs.append(ptr)
        return DArray(ptr, tuple(shape), np.dtype(dtype), self.dev)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.dev.synchronize()
        for p in self.ptrs:
            self.dev.driver.cuMemFree(p)


L2_DEFEAT_BYTES = 200 << 20  # H200 L2 is 50 MB: rotate over 4x that so every read comes from HBM


def bench_gemv(dev: Device, qtype, n_in: int, n_out: int, iters: int = 50, rows: int | None = None,
               seed: int = 0) -> float:
    """GB/s of weight bytes read by ``gemv`` on [n_out x n_in] ``qtype``: ``iters``
    launches captured in a CUDA graph (no host gaps), timed with CUDA events,
    cycling over enough copies of W that none is still in L2."""
    qt = _check_type(qtype, "gemv")
    rng = np.random.default_rng(seed)
    raw = random_weights(rng, qt, n_out, n_in)
    copies = max(1, min(64, -(-L2_DEFEAT_BYTES // raw.nbytes)))
    d = dev.driver
    with _Scratch(dev) as s:
        Ws = [dev.upload(raw, s.empty(raw.shape, np.uint8))]
        for _ in range(copies - 1):
            Ws.append(s.empty(raw.shape, np.uint8))
            check(d.cuMemcpyDtoDAsync(Ws[-1].ptr, Ws[0].ptr, raw.nbytes, dev.stream))
        x = dev.upload(rng.standard_normal(n_in, dtype=np.float32), s.empty((n_in,), np.float32))
        y = s.empty((n_out,), np.float32)
        gemv(dev, Ws[0], qt, x, y, n_in, n_out, rows=rows)  # compile, load, opt in
        dev.synchronize()
        graph = dev.capture(lambda: [gemv(dev, Ws[i % copies], qt, x, y, n_in, n_out, rows=rows)
                                     for i in range(iters)])
        e0, e1 = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
        try:
            dev.replay(graph)  # warm-up
            check(d.cuEventRecord(e0, dev.stream))
            dev.replay(graph)
            check(d.cuEventRecord(e1, dev.stream))
            check(d.cuEventSynchronize(e1))
            ms = check(d.cuEventElapsedTime(e0, e1))
        finally:
            d.cuEventDestroy(e0)
            d.cuEventDestroy(e1)
            d.cuGraphExecDestroy(graph)
    return raw.nbytes * iters / (ms * 1e-3) / 1e9


# Qwen3-8B decode shapes (n_in, n_out): q/o, k/v, gate/up, down, output head
QWEN3_8B_SHAPES = ((4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096), (4096, 151936))


def bench_all(dev: Device, types=SUPPORTED, shapes=QWEN3_8B_SHAPES, iters: int = 50,
              rows: int | None = None, max_bytes: int = 1 << 30) -> list[dict]:
    """``bench_gemv`` over types x shapes (skipping weights over ``max_bytes``);
    one dict per case, also printed as a table."""
    out = []
    print(f"{'type':5s} {'n_in':>6s} {'n_out':>7s} {'MB':>8s} {'rows':>4s} {'thr':>4s} {'GB/s':>8s} {'us':>8s}")
    for qt in types:
        qt = QType(int(qt))
        for n_in, n_out in shapes:
            nbytes = n_out * row_bytes(qt, n_in)
            if nbytes > max_bytes:
                continue
            plan = gemv_plan(qt, n_in, n_out, dev.sm_count, rows)
            gbs = bench_gemv(dev, qt, n_in, n_out, iters, rows)
            r = dict(type=qt.name, n_in=n_in, n_out=n_out, mbytes=nbytes / 1e6, rows=plan.rows,
                     threads=plan.threads, gbps=gbs, us=nbytes / gbs / 1e3)
            print(f"{r['type']:5s} {n_in:6d} {n_out:7d} {r['mbytes']:8.1f} {plan.rows:4d} {plan.threads:4d} "
                  f"{gbs:8.0f} {r['us']:8.2f}", flush=True)
            out.append(r)
    return out
