"""Launcher for rope.cu: rotary position embedding in place (NORM and NEOX pairs)."""

from __future__ import annotations

import numpy as np

from ....config import ROPE_NEOX, ROPE_NORM
from .. import launch
from ..device import DArray, Device


def rope_theta_scale(base: float, n_rot: int) -> float:
    """``powf(freq_base, -2.0f/n_rot)`` in float32, as llama.cpp computes it on the host."""
    return float(np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot)))


def rope(dev: Device, x: DArray, pos: DArray, rope_type: str, n_rot: int, base: float,
         scale: float = 1.0, freq_div: DArray | None = None) -> None:
    """Rotate x [T, n_heads, head_dim] in place; token t at position pos[t]
    (int32, device). freq_div: optional [n_rot/2] divisors (llama3 rope_freqs)."""
    launch.check_f32(x, freq_div)
    T, n_heads, head_dim = x.shape
    assert pos.dtype == np.int32 and pos.size >= T
    assert n_rot % 2 == 0 and n_rot <= head_dim and (freq_div is None or freq_div.size >= n_rot // 2)
    name = {ROPE_NORM: "rope_norm", ROPE_NEOX: "rope_neox"}[rope_type]
    fn = launch.function(dev, "rope.cu", name)
    dev.launch(fn, (T, n_heads), (32 * launch.ceil_div(n_rot // 2, 32),),
               [x, pos, n_heads, head_dim, n_rot, rope_theta_scale(base, n_rot), float(scale),
                launch.null_or(freq_div)])
