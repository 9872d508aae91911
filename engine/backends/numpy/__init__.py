"""The NumPy reference backend: float32 weights, float64 reductions."""

from __future__ import annotations

import numpy as np

from ...config import ModelConfig
from ...gguf_file import GGUFFile
from ...model import UBATCH
from . import ops
from .cache import KVLayer, State


class Backend:
    """Host memory and NumPy operators; the oracle for the CUDA backend."""

    name = "numpy"
    ops = ops
    ubatch = UBATCH  # a prompt's micro-batch (model.py)

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        self.cfg, self.n_ctx = cfg, n_ctx
        self._logits: np.ndarray | None = None

    def upload(self, gf: GGUFFile, name: str) -> np.ndarray:
        """Weights are dequantised once to float32."""
        return gf.dequantize(name)

    def make_state(self, kinds: list[str], rope_freqs) -> State:
        return State(self.cfg, self.n_ctx, kinds, rope_freqs)

    def inputs(self, tokens: np.ndarray, start: int):
        return tokens, np.arange(start, start + tokens.size)

    def prefill(self, model, tokens: np.ndarray, start: int):
        """A prompt micro-batch at positions ``start``...: the last token's logits."""
        return model.run(*self.inputs(tokens, start))

    def to_host(self, x) -> np.ndarray:
        return x

    def decode_next(self, model, token: int, pos: int) -> int:
        """One decode step: ``token`` at ``pos``; the greedy next token, or
        -1 when a logit is not finite."""
        self._logits = model.run(*self.inputs(np.array([token]), pos)).reshape(-1)
        return int(np.argmax(self._logits)) if np.isfinite(self._logits).all() else -1

    def decode_logits(self) -> np.ndarray:
        return self._logits


__all__ = ["Backend", "KVLayer", "State", "ops"]
