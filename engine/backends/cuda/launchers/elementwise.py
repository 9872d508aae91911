"""Launchers for elementwise.cu: gated activations, adds, scales, softcap, casts, bias rows, column copies."""

from __future__ import annotations

import numpy as np

from .. import launch
from ..device import DArray, Device


def _ew_launch(dev: Device, name: str, n: int, args: list) -> None:
    """~one float4 per thread per pass, at most 8 waves of 256-thread blocks."""
    blocks = max(1, min(launch.ceil_div(n, 1024), 8 * dev.sm_count))
    dev.launch(launch.function(dev, "elementwise.cu", name), (blocks,), (256,), args)


def silu_mul(dev: Device, g: DArray, u: DArray, y: DArray, yb: DArray | None = None) -> None:
    """y = silu(g) * u (SwiGLU); ``yb`` (bf16 bits), where given, gets y
    rounded to bf16 as f32_to_bf16 rounds it."""
    launch.check_f32(g, u, y)
    assert g.size == u.size == y.size
    launch.check_bf16_bits(yb, y.size)
    _ew_launch(dev, "silu_mul", g.size, [g, u, y, launch.null_or(yb), g.size])


def gelu_tanh_mul(dev: Device, g: DArray, u: DArray, y: DArray, yb: DArray | None = None) -> None:
    """y = gelu_tanh(g) * u (GeGLU, gemma); ``yb`` as silu_mul's."""
    launch.check_f32(g, u, y)
    assert g.size == u.size == y.size
    launch.check_bf16_bits(yb, y.size)
    _ew_launch(dev, "gelu_tanh_mul", g.size, [g, u, y, launch.null_or(yb), g.size])


def sigmoid_mul(dev: Device, a: DArray, g: DArray, y: DArray) -> None:
    """y = a * sigmoid(g): elementwise (the gated attention's output gate), or
    one gate per row when g has one value per row of a [rows, n]."""
    launch.check_f32(a, g, y)
    assert a.size == y.size
    if g.size == a.size:
        _ew_launch(dev, "sigmoid_mul", a.size, [a, g, y, a.size])
        return
    rows = g.size
    n = a.size // rows
    assert rows * n == a.size, (a.shape, g.shape)
    fn = launch.function(dev, "elementwise.cu", "sigmoid_mul_rows")
    dev.launch(fn, (min(launch.ceil_div(n, 256), 64), min(rows, 65535)), (256,), [a, g, y, rows, n])


def add(dev: Device, a: DArray, b: DArray, y: DArray) -> None:
    """y = a + b (y may be a or b)."""
    launch.check_f32(a, b, y)
    assert a.size == b.size == y.size
    _ew_launch(dev, "add", a.size, [a, b, y, a.size])


def scale(dev: Device, x: DArray, s: float) -> None:
    """x *= s in place."""
    launch.check_f32(x)
    _ew_launch(dev, "scale", x.size, [x, float(s), x.size])


def softcap(dev: Device, x: DArray, cap: float) -> None:
    """x = cap * tanh(x / cap) in place."""
    launch.check_f32(x)
    _ew_launch(dev, "softcap", x.size, [x, float(cap), x.size])


def f32_to_bf16(dev: Device, x: DArray, y: DArray) -> None:
    """y (any 2-byte dtype, e.g. uint16 holding bf16 bits) = bf16(x), round to nearest even."""
    launch.check_f32(x)
    assert y.size == x.size and np.dtype(y.dtype).itemsize == 2
    _ew_launch(dev, "f32_to_bf16", x.size, [x, y, x.size])


def f32_to_f16(dev: Device, x: DArray, y: DArray) -> None:
    """y (float16, or any 2-byte dtype) = f16(x), round to nearest even."""
    launch.check_f32(x)
    assert y.size == x.size and np.dtype(y.dtype).itemsize == 2
    _ew_launch(dev, "f32_to_f16", x.size, [x, y, x.size])


def bias_add_rows(dev: Device, y: DArray, b: DArray) -> None:
    """y[r, :] += b for every row of y (row length b.size)."""
    launch.check_f32(y, b)
    n = b.size
    rows = y.size // n
    assert rows * n == y.size
    fn = launch.function(dev, "elementwise.cu", "bias_add_rows")
    dev.launch(fn, (min(launch.ceil_div(n, 256), 64), min(rows, 65535)), (256,), [y, b, rows, n])


def copy_cols(dev: Device, x: DArray, y: DArray, rows: int, cols: int, x_stride: int, x_off: int) -> None:
    """y [rows, cols] = columns x_off..x_off+cols of each row of x (rows x_stride apart)."""
    launch.check_f32(x, y)
    assert y.size >= rows * cols and x_off + cols <= x_stride and x.size >= (rows - 1) * x_stride + x_off + cols
    fn = launch.function(dev, "elementwise.cu", "copy_cols")
    dev.launch(fn, (min(launch.ceil_div(cols, 256), 64), min(rows, 65535)), (256,), [x, y, rows, cols, x_stride, x_off])


def mul_rows(dev: Device, x: DArray, w: DArray, y: DArray) -> None:
    """y[r, :] = x[r, :] * w for every row of x (row length w.size), or x * w[0] for a one-element w."""
    launch.check_f32(x, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert w.size in (1, n) and y.size == x.size, (x.shape, w.shape)
    fn = launch.function(dev, "elementwise.cu", "mul_rows")
    dev.launch(fn, (min(launch.ceil_div(n, 256), 64), min(rows, 65535)), (256,), [x, w, y, rows, n, w.size])


def mul_gather(dev: Device, w: DArray, ids: DArray, s: DArray, y: DArray) -> None:
    """y = w * s[ids] elementwise (ids int32, any shape of w's size)."""
    launch.check_f32(w, s, y)
    assert ids.size == w.size == y.size and np.dtype(ids.dtype) == np.int32
    _ew_launch(dev, "mul_gather", w.size, [w, ids, s, y, w.size])
