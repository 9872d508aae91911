"""KV cache and RoPE tables for the NumPy backend.

K and V are kept in float32, matching a llama.cpp reference run with
``type_k = type_v = F32`` (its default f16 cache would round them).
"""

from __future__ import annotations

import numpy as np

from ...config import ModelConfig
from . import ops


class KVCache:
    def __init__(self, cfg: ModelConfig, n_ctx: int, rope_freqs: np.ndarray | None = None):
        self.cfg, self.n_ctx, self.rope_freqs = cfg, n_ctx, rope_freqs
        shape = (cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim)
        self.k = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)

    def rope(self, il: int, positions: np.ndarray):
        """Layer ``il``'s rotation for these positions, for ``ops.rope``."""
        c = self.cfg
        cos, sin = ops.rope_angles(positions, c.n_rot, c.rope_base[il], c.rope_scale[il], self.rope_freqs)
        return cos, sin, c.rope_type

    def store(self, il: int, positions: np.ndarray, k: np.ndarray, v: np.ndarray):
        """Write this step's K/V and return every cached position up to the last one."""
        p0, p1 = int(positions[0]), int(positions[-1]) + 1
        self.k[il, p0:p1] = k
        self.v[il, p0:p1] = v
        return self.k[il, :p1], self.v[il, :p1]
