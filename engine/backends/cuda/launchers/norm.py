"""Launchers for norm.cu: RMSNorm, and the residual add fused with the norms around it."""

from __future__ import annotations

from .. import launch
from ..device import DArray, Device


MAX_THREADS = 1024  # a norm block's most threads (a sweep lowers it: a smaller block fits beside a GEMV's)


def _norm_threads(n: int) -> int:
    """~one float4 per thread: 32 threads for a 128-wide head, 1024 (MAX_THREADS) for n >= 4096."""
    return min(MAX_THREADS, max(32, 32 * launch.ceil_div(n, 128)))


def rms_norm(dev: Device, x: DArray, w: DArray | None, y: DArray, eps: float, yb: DArray | None = None) -> None:
    """y = x * rsqrt(mean(x², last axis) + eps) * w, for every row of x (any
    leading shape: [T, n] model norms, [T, H, D] per-head Q/K norms). y may be x.
    ``yb`` (bf16 bits, uint16), where given, gets y rounded to bf16 as f32_to_bf16 rounds it."""
    launch.check_f32(x, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert y.size == x.size and (w is None or w.size == n), (x.shape, y.shape, w and w.shape)
    launch.check_bf16_bits(yb, y.size)
    fn = launch.function(dev, "norm.cu", "rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, launch.null_or(w), y, launch.null_or(yb), n, float(eps)])


def add_rms_norm(dev: Device, x: DArray, a: DArray, w, y, eps: float, a_norm: DArray | None = None,
                 scale: DArray | None = None, x_norm: DArray | None = None, yb: DArray | None = None) -> None:
    """The residual add with the norms on either side, in place on x (the
    residual stream): x = (x'+ a')·scale with a' = rms_norm(a)·a_norm (a
    post-norm) or a where ``a_norm`` is None, x' = rms_norm(x)·x_norm or x,
    ``scale`` a [1] weight (None: 1); then y = rms_norm(x)·w unless y is None.
    ``w`` and ``y`` may be tuples (up to 3): a norm of the new x per weight.
    ``yb`` (bf16 bits), where given, gets the first y rounded to bf16 as
    f32_to_bf16 rounds it."""
    ws, ys = (w, y) if isinstance(y, tuple) else ((w,), (y,) if y is not None else ())
    launch.check_f32(x, a, a_norm, scale, x_norm, *ws, *ys)
    n = x.shape[-1]
    rows = x.size // n
    assert len(ys) <= 3 and (not ys or len(ws) == len(ys)), (len(ws), len(ys))
    assert a.size == x.size and all(yi.size == x.size and yi.ptr not in (x.ptr, a.ptr) for yi in ys)
    assert all(wi is None or wi.size == n for wi in ws) and (scale is None or scale.size == 1)
    assert all(v is None or v.size == n for v in (a_norm, x_norm))
    assert yb is None or ys, "a bf16 copy of no norm"
    launch.check_bf16_bits(yb, x.size)
    pairs = [(launch.null_or(wi), yi) for wi, yi in zip(ws, ys)]
    pairs += [(launch.null(), launch.null())] * (3 - len(pairs))
    fn = launch.function(dev, "norm.cu", "add_rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),),
               [x, a, launch.null_or(a_norm), launch.null_or(x_norm), launch.null_or(scale),
                *(p for pair in pairs for p in pair), launch.null_or(yb), n, float(eps)])
