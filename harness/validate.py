"""``harness validate-catalog``: the correctness gate.

For each catalog model and each reference prompt, the engine decodes
greedily from llama.cpp's prompt ids (``compare.compare_case``):

- every token equal to llama.cpp's: **exact** pass;
- otherwise teacher-forced on llama.cpp's tokens, and every step where the
  engine's argmax differs is a *flip*. A flip is a **near-tie** only if
  llama.cpp's own top-2 margin there is below the model's ``near_tie``
  threshold and the engine nearly chose llama.cpp's token too: it is in the
  engine's top-2, or within ``near_tie`` of the engine's top logit (a
  three-way tie, where llama.cpp's token ranks third by a hair). Any other
  flip is **drift** and fails the model.

``near_tie`` is calibrated per model (``--calibrate``), and apart for the
CUDA engine where it differs (``near_tie_cuda``): the largest change
of llama.cpp's top-1/top-2 margin as the engine sees it, over every step of
the model's references, times 1.25. Two engines within that noise of each
other can disagree only where the margin is smaller.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import catalog, refs
from .compare import CaseResult, compare_case

CALIBRATION_HEADROOM = 1.25
MIN_NEAR_TIE = 0.01  # F32-weight models agree to ~1e-5: still allow exact ties in printing precision


@dataclass
class ModelResult:
    model: str
    tier: str
    backend: str
    near_tie: float
    cases: list[CaseResult] = field(default_factory=list)
    drift: list[tuple[int, int]] = field(default_factory=list)  # (case index, step)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return sum(c.n_steps for c in self.cases)

    @property
    def matched(self) -> int:
        return sum(c.matched for c in self.cases)

    @property
    def n_flips(self) -> int:
        return sum(len(c.flips) for c in self.cases)

    @property
    def max_logit_diff(self) -> float:
        return max((c.max_logit_diff for c in self.cases), default=0.0)

    @property
    def max_margin_shift(self) -> float:
        """The largest change of llama.cpp's top-1/top-2 margin as this model sees it."""
        return max((abs(m) for c in self.cases for m in c.margin_shifts), default=0.0)

    @property
    def mode(self) -> str:
        return "exact" if all(c.mode == "exact" for c in self.cases) else "teacher-forced"

    @property
    def passed(self) -> bool:
        return not self.drift

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "cases"}
        d.update(mode=self.mode, steps=self.steps, matched=self.matched, flips=self.n_flips,
                 max_logit_diff=self.max_logit_diff, max_margin_shift=self.max_margin_shift, passed=self.passed,
                 cases=[{k: v for k, v in asdict(c).items() if k not in ("logit_diffs", "margin_shifts")}
                        for c in self.cases])
        return d


def is_near_tie(flip, near_tie: float) -> bool:
    engine_gap_to_ref = flip.engine_margin  # engine top-1 logit minus its logit for llama.cpp's token
    return flip.ref_margin < near_tie and (flip.ref_in_engine_top2 or engine_gap_to_ref < near_tie)


def validate_model(model, entry: catalog.Entry, ref: refs.Reference, backend: str, progress=None,
                   tier: str | None = None) -> ModelResult:
    """``model`` against ``ref``, the model's references of ``tier`` (default: its own tier)."""
    t0 = time.perf_counter()
    tier = tier or entry.tier
    near_tie = entry.threshold(backend, tier)
    out = ModelResult(entry.name, tier, backend, near_tie)
    for i, case in enumerate(ref.cases):
        r = compare_case(model, case)
        out.cases.append(r)
        out.drift += [(i, f.step) for f in r.flips if not is_near_tie(f, near_tie)]
        if progress:
            progress()
    out.seconds = time.perf_counter() - t0
    return out


def calibrate(results: list[ModelResult]) -> dict[tuple[str, str], tuple[float, int]]:
    """Per (model, reference tier): suggested near-tie threshold and the
    number of steps it rests on."""
    return {(r.model, r.tier): (max(MIN_NEAR_TIE, r.max_margin_shift * CALIBRATION_HEADROOM), r.steps)
            for r in results}


def format_table(results: list[ModelResult]) -> str:
    lines = ["| model | tier | backend | mode | matched/steps | near-tie flips | max Δlogit | verdict | time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = "pass" if r.passed else f"DRIFT ({len(r.drift)})"
        lines.append(f"| {r.model} | {r.tier} | {r.backend} | {r.mode} | {r.matched}/{r.steps} | "
                     f"{r.n_flips - len(r.drift)} | {r.max_logit_diff:.4f} | {verdict} | {r.seconds:.1f} s |")
    return "\n".join(lines)


def format_flips(results: list[ModelResult]) -> str:
    lines = []
    for r in results:
        for i, c in enumerate(r.cases):
            for f in c.flips:
                kind = "drift" if (i, f.step) in r.drift else "near-tie"
                lines.append(f"{r.model} prompt {i} step {f.step}: llama.cpp {f.ref_token} vs engine {f.engine_token}, "
                             f"llama.cpp margin {f.ref_margin:.4f}, engine gap {f.engine_margin:.4f} "
                             f"(threshold {r.near_tie:g}) -> {kind}")
    return "\n".join(lines)
