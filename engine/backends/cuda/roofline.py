"""The GPU's two ceilings, measured on it: device-to-device copy bandwidth
and the bf16 tensor-core GEMM rate (``harness roofline --save`` keeps them
as a record; the scoreboard reads decode against the first and prefill
against the second, what this GPU does rather than its datasheet's).

- Copy: ``cuMemcpyDtoDAsync`` of COPY_BYTES (far beyond any L2), counted
  as bytes read plus bytes written, as CUDA's bandwidthTest and nvbandwidth
  count it. A decode step reads its weights once: a copy's read+write rate
  is the closest plain stream to that.
- GEMM: ``cublasGemmEx`` with bf16 inputs and fp32 accumulation, the
  prefill's own call (cublas.py), at M = N = K = GEMM_N on random normal
  values (zeros run ~13% faster on Hopper: less switching power), 2·M·N·K
  FLOPs each.

Each is timed in REPS batches of a few operations between CUDA events,
after a warm-up; the record keeps every batch and the median is the figure:
what the GPU sustains. On the H200 (2026-12-04) the copy held 4226-4238 GB/s
over every batch; the GEMM's first batch ran at 768 TFLOP/s and the rest at
667-721 once the power cap (sw_power_cap) set in, so its median is 677.
"""

from __future__ import annotations

import statistics

import numpy as np

from .device import Device, check
from .gemv_bench import _Scratch

COPY_BYTES = 2 << 30   # 2 GiB: ~40x the H200's L2
GEMM_N = 8192          # 1.1 TFLOP a product: ~1.4 ms at 790 TFLOP/s, far above launch overhead
REPS = 10
COPY_ITERS, GEMM_ITERS = 5, 10


def _seconds_per_op(dev: Device, fn, iters: int, reps: int) -> list[float]:
    d = dev.driver
    e0, e1 = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    try:
        for _ in range(iters):  # warm-up: clocks up, cuBLAS's kernel chosen and loaded
            fn()
        dev.synchronize()
        out = []
        for _ in range(reps):
            check(d.cuEventRecord(e0, dev.stream))
            for _ in range(iters):
                fn()
            check(d.cuEventRecord(e1, dev.stream))
            check(d.cuEventSynchronize(e1))
            out.append(check(d.cuEventElapsedTime(e0, e1)) * 1e-3 / iters)
    finally:
        d.cuEventDestroy(e0)
        d.cuEventDestroy(e1)
    return out


def _bf16(rng: np.random.Generator, shape) -> np.ndarray:
    """Random normal values as bf16 bit patterns (uint16), rounded to nearest even."""
    b = rng.standard_normal(shape, dtype=np.float32).view(np.uint32)
    return ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def copy_gb_s(dev: Device, nbytes: int = COPY_BYTES, reps: int = REPS) -> list[float]:
    """GB/s (read + written) of each timed batch of device-to-device copies."""
    with _Scratch(dev) as s:
        src, dst = s.empty((nbytes,), np.uint8), s.empty((nbytes,), np.uint8)
        dev.fill(src, 0x5A)
        copy = lambda: check(dev.driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, dev.stream))  # noqa: E731
        return [2 * nbytes / t / 1e9 for t in _seconds_per_op(dev, copy, COPY_ITERS, reps)]


def bf16_tflops(dev: Device, n: int = GEMM_N, reps: int = REPS) -> list[float]:
    """TFLOP/s of each timed batch of n x n x n bf16 GEMMs (fp32 accumulation)."""
    from .cublas import Cublas

    rng = np.random.default_rng(0)
    blas = Cublas(dev.stream)
    with _Scratch(dev) as s:
        x = dev.upload(_bf16(rng, (n, n)), s.empty((n, n), np.uint16))
        w = dev.upload(_bf16(rng, (n, n)), s.empty((n, n), np.uint16))
        y = s.empty((n, n), np.float32)
        gemm = lambda: blas.gemm(x, w, y, n, n, n, "bf16")  # noqa: E731
        return [2 * n ** 3 / t / 1e12 for t in _seconds_per_op(dev, gemm, GEMM_ITERS, reps)]


def measure(dev: Device | None = None) -> dict:
    """Both ceilings on ``dev`` (default: GPU 0): the medians, every batch, and how they were taken."""
    dev = dev or Device()
    copies, gemms = copy_gb_s(dev), bf16_tflops(dev)
    return {"gpu": dev.name, "arch": dev.arch, "sm_count": dev.sm_count,
            "copy_gb_s": statistics.median(copies), "bf16_tflops": statistics.median(gemms),
            "copy": {"bytes": COPY_BYTES, "iters": COPY_ITERS, "samples_gb_s": copies,
                     "method": "cuMemcpyDtoDAsync, bytes read + bytes written per second"},
            "gemm": {"m": GEMM_N, "n": GEMM_N, "k": GEMM_N, "iters": GEMM_ITERS, "samples_tflops": gemms,
                     "method": "cublasGemmEx bf16 x bf16, fp32 accumulation and output, random normal inputs, "
                               "2 M N K FLOPs"}}
