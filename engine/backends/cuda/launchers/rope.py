"""Launchers for rope.cu: rotary position embedding in place (NORM and NEOX
pairs), alone or after the per-head Q/K RMSNorm."""

from __future__ import annotations

import numpy as np

from ....config import ROPE_NEOX, ROPE_NORM
from .. import launch
from ..device import DArray, Device

QKNR_HEADS = 4  # rope.cu: the most heads (warps) a qk_norm_rope block takes


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


def qk_norm_rope(dev: Device, q: DArray, k: DArray, pos: DArray, rope_type: str, n_rot: int, base: float,
                 scale: float, freq_div: DArray | None, q_w: DArray, k_w: DArray, eps: float) -> None:
    """q [T, n_head, D] and k [T, n_head_kv, D] in place: RMSNorm over each
    head (weights q_w, k_w [D]), then rotated as ``rope``; one launch."""
    launch.check_f32(q, k, q_w, k_w, freq_div)
    T, n_head, head_dim = q.shape
    assert k.shape[0] == T and k.shape[2] == head_dim and head_dim <= 512 and q_w.size == k_w.size == head_dim
    assert pos.dtype == np.int32 and pos.size >= T
    assert n_rot % 2 == 0 and n_rot <= head_dim and (freq_div is None or freq_div.size >= n_rot // 2)
    name = {ROPE_NORM: "qk_norm_rope_norm", ROPE_NEOX: "qk_norm_rope_neox"}[rope_type]
    fn = launch.function(dev, "rope.cu", name)
    heads = n_head + k.shape[1]
    per_block = min(QKNR_HEADS, heads)  # one warp a head (rope.cu)
    dev.launch(fn, (T, launch.ceil_div(heads, per_block)), (32 * per_block,),
               [q, k, pos, n_head, k.shape[1], head_dim, n_rot, rope_theta_scale(base, n_rot), float(scale),
                launch.null_or(freq_div), q_w, k_w, float(eps)])
