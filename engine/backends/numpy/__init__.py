"""The NumPy reference backend: float32 weights, float64 reductions."""

from __future__ import annotations

import numpy as np

from ... import memory
from ...config import ModelConfig
from ...errors import AnvilError
from ...gguf_file import GGUFFile
from ...model import UBATCH
from . import faithful, ops
from .cache import KVLayer, State


ROUNDINGS = ("exact", "cuda")


class Backend:
    """Host memory and NumPy operators; the oracle for the CUDA backend.

    ``rounding="exact"``: float32 throughout (the KV cache too, unless
    ``kv_f16``), as llama.cpp's CPU backend computes on F32 weights.
    ``rounding="cuda"``: the rounding-faithful oracle (faithful.py): the CUDA
    engine's int8/bf16/f16 roundings, its f16 KV cache (``kv_f16``, its
    default) and its micro-batch, so that the paths taken are the same."""

    name = "numpy"

    def __init__(self, cfg: ModelConfig, n_ctx: int, rounding: str = "exact", kv_f16: bool | None = None,
                 gguf: GGUFFile | None = None, kinds: list[str] | None = None, lazy: bool = False):
        """``gguf``/``kinds``: the model about to be loaded, refused here if
        its float32 weights and cache exceed the memory left (memory.py).
        ``lazy`` (the faithful oracle only): each matrix dequantised when an
        op reads it and not held (faithful.LazyWeight): the oracle of a model
        too large for the host, judged op by op (harness/anchored.py)."""
        if rounding not in ROUNDINGS:
            raise AnvilError(f"rounding {rounding!r}: one of {', '.join(ROUNDINGS)}")
        if lazy and rounding != "cuda":
            raise AnvilError("lazy weights: the faithful oracle's only (rounding='cuda')")
        self.lazy = lazy
        if gguf is not None and kinds is not None:
            # K and V are float32 arrays even when rounded to f16 (cache.py)
            weights = ({f"the {faithful.LAZY_KEEP} largest matrices as float32": memory.float32_bytes(
                gguf, largest=faithful.LAZY_KEEP)} if lazy else {"float32 weights": memory.float32_bytes(gguf)})
            memory.check_fits(gguf.path, "the NumPy engine", weights,
                              memory.kv_bytes_per_token(cfg, kinds, 4), n_ctx, memory.host_available(),
                              "run it on a GPU (--backend cuda) or take a smaller model")
        self.cfg, self.n_ctx, self.rounding = cfg, n_ctx, rounding
        self.kv_f16 = (rounding == "cuda") if kv_f16 is None else kv_f16
        self.ops = faithful.FaithfulOps(self.kv_f16) if rounding == "cuda" else ops
        self.ubatch = faithful.UBATCH if rounding == "cuda" else UBATCH  # a prompt's micro-batch (model.py)
        self._logits: np.ndarray | None = None

    def upload(self, gf: GGUFFile, name: str):
        """Weights are dequantised once to float32; the faithful oracle keeps
        each matrix's type beside it (it decides the rounding)."""
        if self.lazy and len(gf.tensor_shape(name)) > 1:
            return faithful.LazyWeight(gf, name)
        values = gf.dequantize(name)
        if self.rounding == "cuda" and values.ndim > 1:
            return faithful.Weight(values, gf.tensor_type(name))
        return values

    def make_state(self, kinds: list[str], rope_freqs) -> State:
        return State(self.cfg, self.n_ctx, kinds, rope_freqs, kv_f16=self.kv_f16)

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
