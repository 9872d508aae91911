"""Prefill + greedy decode.

Greedy means argmax over the fp32 logits with the lowest index winning ties,
as llama.cpp's greedy sampler does (``np.argmax`` returns the first maximum).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .errors import AnvilError, NonFiniteLogits


@dataclass
class Generation:
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)  # per step, when kept
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tok_s(self) -> float:
        n = len(self.tokens) - 1  # the first token comes out of the prefill
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")

    @property
    def prefill_tok_s(self) -> float:
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else float("nan")


def greedy(model, prompt_ids, n_steps: int, *, stop_at_eos: bool = False, keep_logits: bool = False,
           forced: list[int] | None = None, on_token=None) -> Generation:
    """Generate ``n_steps`` tokens greedily after ``prompt_ids``.

    ``forced`` (teacher forcing): feed these tokens instead of the model's own
    choices, while still recording the model's argmax at every step.
    """
    prompt_ids = [int(t) for t in prompt_ids]
    if not prompt_ids:
        raise AnvilError("the prompt is empty: give at least one token id")
    if n_steps < 1:
        raise AnvilError(f"the number of steps must be at least 1, got {n_steps}")
    if len(prompt_ids) + n_steps - 1 > model.n_ctx:
        raise AnvilError(
            f"{model.path}: prompt of {len(prompt_ids)} tokens + {n_steps} steps exceeds the context of {model.n_ctx} (n_ctx)")
    out = Generation(prompt_ids)
    model.reset()
    try:
        t0 = time.perf_counter()
        logits = model.forward(prompt_ids)
        out.prefill_s = time.perf_counter() - t0
        eos = model.config.eos_token_id
        t0 = time.perf_counter()
        token = int(np.argmax(logits))
        if (forced is None and not keep_logits and on_token is None and not stop_at_eos
                and hasattr(model, "decode_greedy")):
            # nothing to do between steps: queue them (Model.decode_greedy), read the tokens once
            out.tokens = [token] + (model.decode_greedy(token, n_steps - 1) if n_steps > 1 else [])
            n_steps = 0
        for step in range(n_steps):
            out.tokens.append(token)
            if keep_logits:
                out.logits.append(logits)
            if on_token is not None:
                on_token(token)
            if step == n_steps - 1 or (stop_at_eos and token == eos):
                break
            feed = forced[step] if forced is not None else token
            # one decode path for generation, validation and bench: the backend
            # picks the token itself (on the GPU: the captured graph's argmax)
            token = model.decode_next(feed)
            if keep_logits:
                logits = model.decode_logits()
    except NonFiniteLogits as e:  # name the step the caller counts, not only the position
        raise NonFiniteLogits(e.path, e.position, e.position - len(prompt_ids) + 1) from None
    out.decode_s = time.perf_counter() - t0
    return out
