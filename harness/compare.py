"""Compare an engine with a llama.cpp reference, case by case.

Free-running first: the engine decodes greedily from llama.cpp's prompt ids,
through the same decode path that generation and ``bench`` use. The length
of the prefix equal to llama.cpp's tokens is the *free-run prefix*. If every
token matches, the free run's logits are the ones judged. Otherwise the case
is re-run teacher-forced (the engine is fed llama.cpp's tokens) so every
step can still be judged, and each step where the engine's argmax differs
is a *flip*, listed with both top-2 margins, for the gate to call a near-tie
or drift.

At every judged step the logits are measured against llama.cpp's stored
top-k (token, logit) pairs:

- logit: max |engine - llama.cpp| over the k tokens;
- kl: KL(P_llama.cpp || P_engine) of the softmax over those k tokens (each
  side renormalised over the same ids; llama-perplexity's --kl-divergence
  measures the full distribution the same way);
- margin shift: the engine's margin between llama.cpp's top-1 and top-2
  tokens minus llama.cpp's own. A softcap or a scale bug moves logits
  monotonically and so never flips a token: only these measures see it.

Degenerate output is named on its own: non-finite logits, a stop token at
the first step, or a short repetition loop in the engine's choices where
llama.cpp's tokens have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.errors import NonFiniteLogits
from engine.generate import greedy

from .refs import Case

LOOP_MAX_PERIOD = 4  # a cycle of up to 4 tokens...
LOOP_MIN_SPAN = 12  # ...filling at least the last 12 tokens is a loop


@dataclass
class Flip:
    step: int
    ref_token: int
    engine_token: int
    ref_margin: float  # llama.cpp's top-1 minus top-2 logit at this step
    engine_margin: float  # the engine's top-1 minus its logit for llama.cpp's token
    ref_in_engine_top2: bool


@dataclass
class CaseResult:
    prompt: str
    n_steps: int
    matched: int  # free-run prefix: leading tokens equal to llama.cpp's
    mode: str  # "exact" | "teacher-forced"
    agreement: int = 0  # steps whose engine argmax is llama.cpp's token (of the judged run)
    flips: list[Flip] = field(default_factory=list)
    # per judged step
    logit_diffs: list[float] = field(default_factory=list)
    kls: list[float] = field(default_factory=list)
    margin_shifts: list[float] = field(default_factory=list)
    degenerate: str | None = None  # what was degenerate, if anything
    queued: tuple[int, str] | None = None  # (step, what): queued steps' tokens not the step-by-step ones

    @property
    def max_logit_diff(self) -> float:
        return max(self.logit_diffs, default=0.0)

    @property
    def max_kl(self) -> float:
        return max(self.kls, default=0.0)

    @property
    def max_margin_shift(self) -> float:
        return max((abs(m) for m in self.margin_shifts), default=0.0)


def topk_kl(ref_logits, engine_logits) -> float:
    """KL(P || Q) of the softmaxes of two logit vectors over the same ids."""
    p = np.asarray(ref_logits, np.float64)
    q = np.asarray(engine_logits, np.float64)
    lp = p - p.max() - np.log(np.sum(np.exp(p - p.max())))
    lq = q - q.max() - np.log(np.sum(np.exp(q - q.max())))
    return float(max(0.0, np.sum(np.exp(lp) * (lp - lq))))


def step_measures(logits: np.ndarray, ids, ref) -> tuple[float, float, float]:
    """(max |Δlogit|, KL, margin shift) of one step against llama.cpp's top-k."""
    ids = np.asarray(ids)
    ref = np.asarray(ref, np.float32)
    mine = logits[ids]
    return (float(np.max(np.abs(mine - ref))), topk_kl(ref, mine),
            float(mine[0] - mine[1]) - float(ref[0] - ref[1]))


def repetition_loop(tokens: list[int]) -> int:
    """The period of a cycle of at most LOOP_MAX_PERIOD tokens that fills the
    last LOOP_MIN_SPAN tokens, or 0."""
    if len(tokens) < LOOP_MIN_SPAN:
        return 0
    tail = tokens[-LOOP_MIN_SPAN:]
    for p in range(1, LOOP_MAX_PERIOD + 1):
        if all(tail[i] == tail[i - p] for i in range(p, len(tail))):
            return p
    return 0


def _degenerate(free, judged, case: Case, eos) -> str | None:
    if eos is not None and free.tokens[0] == eos != case.tokens[0]:
        return f"stop token {eos} at step 0 (llama.cpp: {case.tokens[0]})"
    # On llama.cpp's own tokens (teacher-forced, where the free run diverged)
    # a sound engine mostly predicts llama.cpp's next token, so its choices
    # cannot cycle unless llama.cpp's do; a free run may fall into a loop
    # after a legitimate near-tie (random-weight models have such attractors).
    # llama.cpp's own tail counts as that loop where it follows it but for one token: it broke
    # its loop once at a near-tie, which its own other settings do not (flash attention on
    # qwen3moe-30b-a3b, reports/notes/cuda-gate-2026-12-04.md §13)
    p = repetition_loop(judged.tokens)
    tail = slice(-LOOP_MIN_SPAN, None)
    if p and not repetition_loop(case.tokens) and sum(
            a != b for a, b in zip(judged.tokens[tail], case.tokens[tail])) > 1:
        return f"repetition loop of period {p} ({judged.tokens[-p:]}) where llama.cpp has none"
    return None


def compare_case(model, case: Case, runs: dict | None = None) -> CaseResult:
    """The engine's greedy run of ``case``'s prompt against the reference's,
    teacher-forced from the first differing token. ``runs``: a dict shared by
    the reference sets of one loaded, unchanged model (their prompts are the
    same): each prompt's free run is computed once."""
    n = len(case.tokens)
    try:
        return _compare_case(model, case, n, runs)
    except NonFiniteLogits as e:  # the engine stops at a NaN logit: a failed case, not a crashed gate
        out = CaseResult(case.prompt, n, e.step or 0, "stopped")
        out.degenerate = f"non-finite logits at step {e.step} (position {e.position})"
        return out


def _compare_case(model, case: Case, n: int, runs: dict | None) -> CaseResult:
    key = (tuple(case.prompt_ids), n)
    free, queued = runs.get(key, (None, None)) if runs is not None else (None, None)
    if free is None:
        free = greedy(model, case.prompt_ids, n, keep_logits=True)
        # an engine that queues its greedy steps (Model.decode_greedy: tg and generate run so) must give the
        # tokens it gives a step at a time, which is what the checks below judge
        queued = greedy(model, case.prompt_ids, n).tokens if getattr(model, "queues_steps", False) else None
        if runs is not None:
            runs[key] = free, queued
    matched = next((i for i, (a, b) in enumerate(zip(free.tokens, case.tokens)) if a != b), n)
    if matched == n:
        judged, mode = free, "exact"
    else:
        judged, mode = greedy(model, case.prompt_ids, n, keep_logits=True, forced=case.tokens), "teacher-forced"
    out = CaseResult(case.prompt, n, matched, mode)
    for step, (tok, logits) in enumerate(zip(judged.tokens, judged.logits)):
        ref_tok = case.tokens[step]
        if tok == ref_tok:
            out.agreement += 1
        else:
            top2 = np.argsort(-logits, kind="stable")[:2]
            out.flips.append(Flip(step, ref_tok, tok, case.margin(step), float(logits[tok] - logits[ref_tok]),
                                  bool(ref_tok in top2)))
        d, kl, shift = step_measures(logits, case.top_ids[step], case.top_logits[step])
        out.logit_diffs.append(d)
        out.kls.append(kl)
        out.margin_shifts.append(shift)
    out.degenerate = _degenerate(free, judged, case, getattr(model.config, "eos_token_id", None))
    if queued is not None and queued != free.tokens:
        i = next((i for i, (a, b) in enumerate(zip(queued, free.tokens)) if a != b), min(len(queued), len(free.tokens)))
        got = f"token {queued[i]}" if i < len(queued) else "no token"
        out.queued = (i, f"queued steps give {got} where a step at a time gives {free.tokens[i]}")
    return out
