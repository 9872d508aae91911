"""Launchers for norm.cu: RMSNorm, and the residual add fused with the norms around it."""

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


def add_rms_norm(dev: Device, x: DArray, a: DArray, w: DArray | None, y: DArray | None, eps: float,
                 a_norm: DArray | None = None, scale: DArray | None = None) -> None:
    """The residual add with the norms on either side, in place on x (the
    residual stream): x = (x + a')·scale with a' = rms_norm(a)·a_norm (a
    post-norm) or a where ``a_norm`` is None, ``scale`` a [1] weight (None: 1);
    then y = rms_norm(x)·w unless y is None."""
    launch.check_f32(x, a, w, y, a_norm, scale)
    n = x.shape[-1]
    rows = x.size // n
    assert a.size == x.size and (y is None or (y.size == x.size and y.ptr not in (x.ptr, a.ptr)))
    assert (w is None or w.size == n) and (a_norm is None or a_norm.size == n) and (scale is None or scale.size == 1)
    fn = launch.function(dev, "norm.cu", "add_rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, a, launch.null_or(a_norm), launch.null_or(scale),
                                                   launch.null_or(w), launch.null_or(y), n, float(eps)])
