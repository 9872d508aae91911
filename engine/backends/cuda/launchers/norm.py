"""Launchers for norm.cu: RMSNorm, and the residual add fused with the next RMSNorm."""

from __future__ import annotations

from .. import launch
from ..device import DArray, Device


def _norm_threads(n: int) -> int:
    """~one float4 per thread: 32 threads for a 128-wide head, 1024 for n >= 4096."""
    return min(1024, max(32, 32 * launch.ceil_div(n, 128)))


def rms_norm(dev: Device, x: DArray, w: DArray | None, y: DArray, eps: float) -> None:
    """y = x * rsqrt(mean(x², last axis) + eps) * w, for every row of x (any
    leading shape: [T, n] model norms, [T, H, D] per-head Q/K norms). y may be x."""
    launch.check_f32(x, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert y.size == x.size and (w is None or w.size == n), (x.shape, y.shape, w and w.shape)
    fn = launch.function(dev, "norm.cu", "rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, launch.null_or(w), y, n, float(eps)])


def add_rms_norm(dev: Device, x: DArray, a: DArray, w: DArray | None, y: DArray, eps: float) -> None:
    """x += a (in place: the residual stream), then y = rms_norm(x) * w."""
    launch.check_f32(x, a, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert a.size == x.size and y.size == x.size and y.ptr != x.ptr
    fn = launch.function(dev, "norm.cu", "add_rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, a, launch.null_or(w), y, n, float(eps)])
