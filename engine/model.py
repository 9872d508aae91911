"""A loaded model: config, weights on a backend, KV cache, and the forward pass.

``forward(tokens)`` runs the tokens at the next positions of the sequence and
returns the logits of the last one. A prompt goes through in one call
(prefill: every matmul sees all prompt tokens at once); decode calls it with
one token at a time.
"""

from __future__ import annotations

import os

import numpy as np

from .config import ModelConfig
from .errors import AnvilError, NonFiniteLogits
from .gguf_file import GGUFFile
from .models import family, weights

DEFAULT_N_CTX = 4096
# A prompt runs in micro-batches of at most the backend's ``ubatch`` tokens
# (llama.cpp's n_ubatch): each batch attends to the cache the ones before it
# filled, so the result is the same, and the backend's scratch only ever holds
# one batch's temporaries whatever the prompt's length. This is NumPy's (and
# the smallest any backend takes: `harness diff` traces one batch of both).
UBATCH = 512


def make_backend(name: str, cfg: ModelConfig, n_ctx: int, **options):
    """``name``: numpy, cuda, or auto (cuda when an NVIDIA GPU is usable and
    runs this architecture, else numpy). ``options`` are the backend's (numpy: rounding, kv_f16, lazy); with
    ``gguf`` (the file) and ``kinds`` (its layers' kinds) it refuses a model that does not fit its memory."""
    if name == "auto":
        from .backends.cuda import PENDING_ARCHS
        from .backends.cuda.device import gpu_available

        name = "cuda" if cfg.arch not in PENDING_ARCHS and gpu_available() else "numpy"
    options = {k: v for k, v in options.items() if v is not None}  # None: the backend's default
    if name == "numpy":
        from .backends.numpy import Backend

        # its own options (the rounding-faithful oracle, its KV type); the CUDA ones (graphs, workspace) mean nothing here
        options = {k: v for k, v in options.items() if k in ("rounding", "kv_f16", "lazy", "gguf", "kinds")}
    elif name == "cuda":
        from .backends.cuda import Backend

        options.pop("rounding", None)  # it rounds as it does; the NumPy backend's option
    else:
        raise AnvilError(f"unknown backend '{name}' (available: numpy, cuda, auto)")
    return Backend(cfg, n_ctx, **options)


class Model:
    def __init__(self, path: str | os.PathLike, *, n_ctx: int | None = None, backend: str = "numpy",
                 **backend_options):
        self.gguf = GGUFFile(path)
        self.config = cfg = ModelConfig.from_gguf(self.gguf)
        self.n_ctx = n_ctx if n_ctx is not None else min(DEFAULT_N_CTX, cfg.n_ctx_train)
        if not 0 < self.n_ctx <= cfg.n_ctx_train:
            # past its trained context a model's positions are out of distribution
            # (and a typo like 99999999 would try to allocate a 200 GB cache)
            raise AnvilError(f"{self.gguf.path}: context {self.n_ctx} (n_ctx) must be 1 to the model's trained "
                             f"context {cfg.n_ctx_train}")
        self.family = family(cfg.arch)
        # the backend checks the model fits its memory before anything large is allocated (memory.py)
        self.backend = make_backend(backend, cfg, self.n_ctx, gguf=self.gguf, kinds=self.family.layer_kinds(cfg),
                                    **backend_options)
        self.ops = self.backend.ops
        self.glob, self.layers = weights.load(self.gguf, cfg, self.family.layer_tensors, self.backend.upload)
        self.cache = self.backend.make_state(self.family.layer_kinds(cfg), self.glob.rope_freqs)
        self.head = self.glob.token_embd if cfg.tied_output else self.glob.output
        self.pos = 0

    @property
    def path(self):
        return self.gguf.path

    def reset(self) -> None:
        """Start a new sequence: every layer's state cleared."""
        self.cache.reset()
        self.pos = 0

    def forward(self, tokens) -> np.ndarray:
        """Logits (float32 ``[n_vocab]``) after the last of ``tokens``: any
        number that fits the context, run the backend's ``ubatch`` at a time."""
        tokens = self._check(tokens)
        step = self.backend.ubatch
        for start in range(0, tokens.size, step):
            part = tokens[start:start + step]
            logits = self.backend.prefill(self, part, self.pos)
            self.pos += part.size
        logits = self.backend.to_host(logits).reshape(-1)
        if not np.isfinite(logits).all():
            raise NonFiniteLogits(self.path, self.pos - 1)
        return logits

    def decode_next(self, token: int) -> int:
        """Feed one token; return the greedy choice for the next position.
        On the GPU this is one CUDA-graph replay and a 4-byte read. The
        backend answers -1 when the logits hold a NaN or an infinity (on the
        GPU the argmax kernel checks every value it reads)."""
        self._check([token])
        nxt = self.backend.decode_next(self, int(token), self.pos)
        if nxt < 0:
            raise NonFiniteLogits(self.path, self.pos)
        self.pos += 1
        return nxt

    @property
    def queues_steps(self) -> bool:
        """Whether decode_greedy queues its steps (the backend can), rather
        than running decode_next a step at a time."""
        return hasattr(self.backend, "decode_greedy")

    def decode_greedy(self, token: int, n: int) -> list[int]:
        """``n`` greedy steps from ``token``, each fed the one before's
        choice: the n choices, as ``decode_next`` a step at a time gives them.
        A backend that can queue the steps (CUDA: the graph's replays back to
        back, the host reading the answers once) does; else one at a time."""
        if n < 1:
            raise AnvilError(f"decode_greedy: the number of steps must be at least 1, got {n}")
        self._check([token])
        if self.pos + n > self.n_ctx:
            raise AnvilError(
                f"{self.path}: {self.pos} cached + {n} new tokens exceed the context of {self.n_ctx} (n_ctx)")
        steps = getattr(self.backend, "decode_greedy", None)
        if steps is None:
            out = []
            for _ in range(n):
                token = self.decode_next(token)
                out.append(token)
            return out
        out = steps(self, int(token), self.pos, n)
        for k, t in enumerate(out):
            if t < 0:
                self.pos += k
                raise NonFiniteLogits(self.path, self.pos)
        self.pos += n
        return out

    def decode_logits(self) -> np.ndarray:
        """The logits (float32 ``[n_vocab]``) the last ``decode_next`` chose
        from (on the GPU: read from where the graph wrote them)."""
        return self.backend.decode_logits()

    def _check(self, tokens) -> np.ndarray:
        cfg = self.config
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise AnvilError("forward() needs at least one token")
        if tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            bad = int(tokens[(tokens < 0) | (tokens >= cfg.n_vocab)][0])
            raise AnvilError(f"{self.path}: token id {bad} is outside the vocabulary (0..{cfg.n_vocab - 1})")
        if self.pos + tokens.size > self.n_ctx:
            raise AnvilError(
                f"{self.path}: {self.pos} cached + {tokens.size} new tokens exceed the context of {self.n_ctx} (n_ctx)")
        return tokens

    def run(self, tokens, positions):
        """The forward pass on backend arrays: ``tokens`` and their
        ``positions`` in, the last token's logits ``[1, n_vocab]`` out."""
        cfg, ops = self.config, self.ops
        x = ops.embed(self.glob.token_embd, tokens, cfg.embd_scale)
        for il, w in enumerate(self.layers):
            x = ops.end_layer(self.family.block(ops, cfg, w, il, x, positions, self.cache.layers[il]))
        # Only the last token's logits are needed (llama.cpp drops the other rows too).
        h = ops.rms_norm(ops.last_row(x), self.glob.output_norm, cfg.rms_eps)
        logits = ops.matmul(h, self.head, self.glob.output_bias)
        if cfg.final_softcap:
            logits = ops.softcap(logits, cfg.final_softcap)
        return logits
