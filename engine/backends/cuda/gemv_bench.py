"""GEMV bandwidth benchmarks and the random weight rows they (and the
kernel tests) use: measurement code, kept out of the launchers.

    from engine.backends.cuda import gemv_bench
    gemv_bench.bench_all(dev)          # GB/s per type x Qwen3-8B decode shape
"""

from __future__ import annotations

import math

import numpy as np

from ...quants import BLOCK, QType, row_bytes
from .device import DArray, Device, check
from .launch import WEIGHT_TYPES
from .launchers.gemv import gemv, gemv_glu, gemv_plan

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
               seed: int = 0, glu: str | None = None, **kw) -> float:
    """GB/s of weight bytes read by ``gemv`` on [n_out x n_in] ``qtype``: ``iters``
    launches captured in a CUDA graph (no host gaps), timed with CUDA events,
    cycling over enough copies of W that none is still in L2. ``glu`` (an
    activation) times ``gemv_glu`` over the n_out rows as a stacked gate/up
    weight instead. ``kw`` goes to the launcher (tuning knobs)."""
    qt = QType(int(qtype))
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

        def run(W):
            if glu:
                gemv_glu(dev, W, qt, x, y, n_in, n_out // 2, glu, rows=rows, **kw)
            else:
                gemv(dev, W, qt, x, y, n_in, n_out, rows=rows, **kw)

        run(Ws[0])  # compile, load, opt in
        dev.synchronize()
        ms = time_graph(dev, lambda: [run(Ws[i % copies]) for i in range(iters)])
    return raw.nbytes * iters / (ms * 1e-3) / 1e9


def time_graph(dev: Device, fn, reps: int = 3) -> float:
    """Milliseconds of one replay of the graph captured from ``fn`` (best of
    ``reps``, after a warm-up replay), timed with CUDA events: the benchmarks'
    one clock (no host gaps between the launches it holds)."""
    d = dev.driver
    graph = dev.capture(fn)
    e0, e1 = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    try:
        dev.replay(graph)
        best = float("inf")
        for _ in range(reps):
            check(d.cuEventRecord(e0, dev.stream))
            dev.replay(graph)
            check(d.cuEventRecord(e1, dev.stream))
            check(d.cuEventSynchronize(e1))
            best = min(best, check(d.cuEventElapsedTime(e0, e1)))
    finally:
        d.cuEventDestroy(e0)
        d.cuEventDestroy(e1)
        d.cuGraphExecDestroy(graph)
    return best


# Qwen3-8B decode shapes (n_in, n_out): q/o, k/v, gate/up, down, output head
QWEN3_8B_SHAPES = ((4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096), (4096, 151936))


def bench_all(dev: Device, types=WEIGHT_TYPES, shapes=QWEN3_8B_SHAPES, iters: int = 50,
              rows: int | None = None, max_bytes: int = 1 << 30, **kw) -> list[dict]:
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
            gbs = bench_gemv(dev, qt, n_in, n_out, iters, rows, **kw)
            r = dict(type=qt.name, n_in=n_in, n_out=n_out, mbytes=nbytes / 1e6, rows=plan.rows,
                     threads=plan.threads, gbps=gbs, us=nbytes / gbs / 1e3)
            print(f"{r['type']:5s} {n_in:6d} {n_out:7d} {r['mbytes']:8.1f} {plan.rows:4d} {plan.threads:4d} "
                  f"{gbs:8.0f} {r['us']:8.2f}", flush=True)
            out.append(r)
    return out
