"""Per-layer sequence state for the NumPy backend: one object per layer,
chosen by the layer's kind (``family.layer_kinds``). Softmax attention keeps
its keys and values (``KVLayer``); a recurrent (Gated DeltaNet) layer its
conv inputs and delta-rule state (``RecurrentLayer``).

K and V are kept in float32, matching a llama.cpp reference run with
``type_k = type_v = F32`` (its default f16 cache would round them), or
rounded to f16 as they are stored (``kv_f16``: the CUDA engine's cache).
"""

from __future__ import annotations

import numpy as np

from ...config import ModelConfig
from . import ops
from .faithful import f16


class KVLayer:
    """Layer ``il``'s keys and values for positions ``0..n_ctx-1``, and its RoPE."""

    def __init__(self, state: "State", il: int, n_ctx: int):
        cfg = state.cfg.layer(il)
        self.state, self.il = state, il
        self.k = np.zeros((n_ctx, cfg.n_head_kv, cfg.head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.f16 = state.kv_f16

    def rope(self, positions: np.ndarray):
        """This layer's rotation for these positions, for ``ops.rope``."""
        il = self.il
        c = self.state.cfg.layer(il)
        divisors = self.state.rope_freqs if c.has_rope_freqs else None  # gemma4: its full layers only
        cos, sin = ops.rope_angles(positions, c.n_rot, c.rope_base[il], c.rope_scale[il], divisors)
        return cos, sin, c.rope_type

    def store(self, positions: np.ndarray, k: np.ndarray, v: np.ndarray):
        """Write this step's K/V and return every cached position up to the last one."""
        p0, p1 = int(positions[0]), int(positions[-1]) + 1
        self.k[p0:p1] = f16(k) if self.f16 else k
        self.v[p0:p1] = f16(v) if self.f16 else v
        return self.k[:p1], self.v[:p1]

    def reset(self) -> None:
        self.k.fill(0)
        self.v.fill(0)


class RecurrentLayer:
    """A Gated DeltaNet layer's carried state (fp32, as llama.cpp keeps it):
    the last d_conv-1 inputs of its causal conv, ``conv [d_conv-1, conv_dim]``,
    and the delta-rule state ``s [H_v, S_k, S_v]``. ops.causal_conv and
    ops.delta_rule read and advance them."""

    def __init__(self, state: "State", il: int, n_ctx: int):
        c = state.cfg.ssm
        self.conv = np.zeros((c.d_conv - 1, c.conv_dim), np.float32)
        self.s = np.zeros((c.n_v_heads, c.head_k, c.head_v), np.float32)

    def reset(self) -> None:
        self.conv = np.zeros_like(self.conv)
        self.s = np.zeros_like(self.s)


LAYER_KINDS = {"attention": KVLayer, "recurrent": RecurrentLayer}


class State:
    """The state of one sequence: ``layers[il]`` for each layer; ``reset()`` clears all of it."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, kinds: list[str], rope_freqs: np.ndarray | None = None,
                 kv_f16: bool = False):
        self.cfg, self.rope_freqs, self.kv_f16 = cfg, rope_freqs, kv_f16
        self.layers = [LAYER_KINDS[kind](self, il, n_ctx) for il, kind in enumerate(kinds)]

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
