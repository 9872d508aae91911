"""Compare an engine with a llama.cpp reference, case by case.

Free-running first: the engine decodes greedily from llama.cpp's prompt ids.
If every token matches, that is an exact pass. Otherwise the case is re-run
teacher-forced (the engine is fed llama.cpp's tokens) so every step can still
be compared, and each step where the engine's argmax differs is listed with
both top-2 margins, to be judged as a near-tie flip or drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.generate import greedy

from .refs import Case


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
    matched: int  # free-running: leading tokens equal to llama.cpp's
    mode: str  # "exact" | "teacher-forced"
    flips: list[Flip] = field(default_factory=list)
    max_logit_diff: float = 0.0  # over llama.cpp's stored top-k, every step
    logit_diffs: list[float] = field(default_factory=list)  # per step
    # per step: the engine's margin between llama.cpp's top-1 and top-2 tokens
    # minus llama.cpp's own margin; a flip happens where this is below -margin
    margin_shifts: list[float] = field(default_factory=list)


def _logit_diffs(logits: list[np.ndarray], case: Case) -> list[float]:
    return [float(np.max(np.abs(l[ids] - np.asarray(ref, np.float32))))
            for l, ids, ref in zip(logits, case.top_ids, case.top_logits)]


def _margin_shifts(logits: list[np.ndarray], case: Case) -> list[float]:
    return [float(l[ids[0]] - l[ids[1]]) - (ref[0] - ref[1])
            for l, ids, ref in zip(logits, case.top_ids, case.top_logits)]


def compare_case(model, case: Case) -> CaseResult:
    n = len(case.tokens)
    free = greedy(model, case.prompt_ids, n, keep_logits=True)
    matched = next((i for i, (a, b) in enumerate(zip(free.tokens, case.tokens)) if a != b), n)
    if matched == n:
        diffs = _logit_diffs(free.logits, case)
        return CaseResult(case.prompt, n, matched, "exact", [], max(diffs), diffs, _margin_shifts(free.logits, case))

    forced = greedy(model, case.prompt_ids, n, keep_logits=True, forced=case.tokens)
    flips = []
    for step, (tok, logits) in enumerate(zip(forced.tokens, forced.logits)):
        ref_tok = case.tokens[step]
        if tok != ref_tok:
            top2 = np.argsort(-logits, kind="stable")[:2]
            flips.append(Flip(step, ref_tok, tok, case.margin(step), float(logits[tok] - logits[ref_tok]),
                              bool(ref_tok in top2)))
    diffs = _logit_diffs(forced.logits, case)
    return CaseResult(case.prompt, n, matched, "teacher-forced", flips, max(diffs), diffs,
                      _margin_shifts(forced.logits, case))
