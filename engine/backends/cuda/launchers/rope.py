"""Launchers for rope.cu: rotary position embedding in place (NORM and NEOX
pairs), alone or after the per-head Q/K RMSNorm."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Heads:
    """The Q/K heads of a pass, to form in place (rope.cuh qk_head): q [T,
    n_head, D] and k [T, n_head_kv, D], per-head RMSNorm with weights q_w, k_w
    [D] where given (both or neither), then rotated as ``rope``. Formed by
    ``qk_norm_rope``'s launch, or by a decode GEMV after its wait
    (launchers/gemv.py heads=)."""
    q: DArray
    k: DArray
    pos: DArray
    rope_type: str
    n_rot: int
    base: float
    scale: float = 1.0
    freq_div: DArray | None = None
    q_w: DArray | None = None
    k_w: DArray | None = None
    eps: float = 0.0

    def __post_init__(self):
        q, k = self.q, self.k
        launch.check_f32(q, k, self.q_w, self.k_w, self.freq_div)
        T, _, head_dim = q.shape
        assert k.shape[0] == T and k.shape[2] == head_dim
        assert (self.q_w is None) == (self.k_w is None) and (self.q_w is None or self.q_w.size == self.k_w.size == head_dim)
        assert self.pos.dtype == np.int32 and self.pos.size >= T
        assert self.n_rot % 2 == 0 and self.n_rot <= head_dim
        assert self.freq_div is None or self.freq_div.size >= self.n_rot // 2
        assert self.rope_type in (ROPE_NORM, ROPE_NEOX)

    @property
    def count(self) -> int:
        """Heads a token has (one warp each)."""
        return self.q.shape[1] + self.k.shape[1]

    @property
    def neox(self) -> bool:
        return self.rope_type == ROPE_NEOX

    def args(self) -> list:
        """rope.cuh QK_HEADS_PARAMS."""
        q, k = self.q, self.k
        return [q, k, self.pos, q.shape[1], k.shape[1], q.shape[2], self.n_rot,
                rope_theta_scale(self.base, self.n_rot), float(self.scale), launch.null_or(self.freq_div),
                launch.null_or(self.q_w), launch.null_or(self.k_w), float(self.eps)]


def qk_norm_rope(dev: Device, heads: Heads) -> None:
    """Form ``heads`` (with their norm: q_w and k_w given), one launch."""
    assert heads.q_w is not None, "qk_norm_rope: the norm's weights"
    fn = launch.function(dev, "rope.cu", "qk_norm_rope_neox" if heads.neox else "qk_norm_rope_norm")
    per_block = min(QKNR_HEADS, heads.count)  # one warp a head (rope.cu)
    dev.launch(fn, (heads.q.shape[0], launch.ceil_div(heads.count, per_block)), (32 * per_block,), heads.args())
