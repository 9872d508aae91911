"""A loaded model: config, weights on a backend, KV cache, and the forward pass.

``forward(tokens)`` runs the tokens at the next positions of the sequence and
returns the logits of the last one. A prompt goes through in one call
(prefill: every matmul sees all prompt tokens at once); decode calls it with
one token at a time.
"""

from __future__ import annotations

import os

import numpy as np

from .backends import numpy as numpy_backend
from .config import ModelConfig
from .errors import AnvilError
from .gguf_file import GGUFFile
from .models import gemma3, llama, weights

FAMILIES = {"llama": llama, "qwen2": llama, "qwen3": llama, "gemma3": gemma3}

DEFAULT_N_CTX = 4096


class Model:
    def __init__(self, path: str | os.PathLike, *, n_ctx: int | None = None, backend: str = "numpy"):
        if backend != "numpy":
            raise AnvilError(f"unknown backend '{backend}' (available: numpy)")
        self.gguf = GGUFFile(path)
        self.config = cfg = ModelConfig.from_gguf(self.gguf)
        self.n_ctx = n_ctx if n_ctx is not None else min(DEFAULT_N_CTX, cfg.n_ctx_train)
        if self.n_ctx <= 0:
            raise AnvilError(f"n_ctx must be positive, got {self.n_ctx}")
        self.ops = numpy_backend.ops
        self.family = FAMILIES[cfg.arch]
        self.glob, self.layers = weights.load(self.gguf, cfg, numpy_backend.upload)
        self.cache = numpy_backend.KVCache(cfg, self.n_ctx, self.glob.rope_freqs)
        self.head = self.glob.token_embd if cfg.tied_output else self.glob.output
        self.pos = 0

    @property
    def path(self):
        return self.gguf.path

    def reset(self) -> None:
        """Start a new sequence (the cache is overwritten, not cleared)."""
        self.pos = 0

    def forward(self, tokens) -> np.ndarray:
        """Logits (float32 ``[n_vocab]``) after the last of ``tokens``."""
        cfg, ops = self.config, self.ops
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise AnvilError("forward() needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            bad = int(tokens[(tokens < 0) | (tokens >= cfg.n_vocab)][0])
            raise AnvilError(f"{self.path}: token id {bad} is outside the vocabulary (0..{cfg.n_vocab - 1})")
        if self.pos + tokens.size > self.n_ctx:
            raise AnvilError(
                f"{self.path}: {self.pos} cached + {tokens.size} new tokens exceed the context of {self.n_ctx} (n_ctx)")
        positions = np.arange(self.pos, self.pos + tokens.size)

        x = self.glob.token_embd[tokens]
        if cfg.embd_scale != 1.0:
            x = x * np.float32(cfg.embd_scale)
        for il, w in enumerate(self.layers):
            x = self.family.block(ops, cfg, w, il, x, positions, self.cache)
        self.pos += tokens.size

        # Only the last token's logits are needed (llama.cpp drops the other rows too).
        h = ops.rms_norm(x[-1:], self.glob.output_norm, cfg.rms_eps)
        logits = ops.matmul(h, self.head, self.glob.output_bias)[0]
        if cfg.final_softcap:
            logits = ops.softcap(logits, cfg.final_softcap)
        return logits
