"""Change-points of one engine's history on one benchmark spec: where the
build changed between two records, did the speed change?

Each change compares the repetitions of every record of the build before
with those of the build after (one spec: same model file, test and KV type,
on one GPU), by the A/B's own rule (harness/stats.py: a ratio of medians
beyond FACTOR and a Mann-Whitney p below ALPHA), and is labelled:

- "regression": slower beyond the factor, and significant;
- "improvement": faster beyond the factor, and significant;
- "suspicious": beyond the factor but not significant, or significantly
  slower by less than the factor (real in these samples, but within the
  noise between sittings, which a history mixes): worth an interleaved
  ``harness ab --commits`` of the two builds;
- "no change": anything else;
- "insufficient data": fewer than stats.min_rounds() repetitions on a side,
  so no p could fall below ALPHA.

Repetitions within one sitting share its clocks, so a history's p-values
flatter: a label here is a pointer to an A/B, never a verdict on a build.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import stats

FACTOR = 1.05  # the A/B's default (harness ab --factor): boost-clock noise between sessions is that large
REGRESSION, IMPROVEMENT, SUSPICIOUS = "regression", "improvement", "suspicious"
NO_CHANGE, INSUFFICIENT = "no change", "insufficient data"
LABELS = (REGRESSION, SUSPICIOUS, IMPROVEMENT, NO_CHANGE, INSUFFICIENT)


@dataclass(frozen=True)
class Change:
    date: str     # the first record of the build after
    before: str   # build
    after: str
    ratio: float  # median after / median before, of the pooled repetitions
    p_value: float | None
    n: tuple[int, int]  # repetitions before, after
    label: str

    @property
    def css(self) -> str:
        return {REGRESSION: "bad", SUSPICIOUS: "warn", IMPROVEMENT: "ok"}.get(self.label, "")

    @property
    def text(self) -> str:
        p = "" if self.p_value is None else f", p {self.p_value:.2g}"
        return f"{self.label}: {self.ratio:.3f}× ({self.n[0]} vs {self.n[1]} repetitions{p})"


def label(before: list[float], after: list[float], factor: float = FACTOR) -> tuple[str, float | None]:
    """The label of a change from the ``before`` repetitions to the ``after`` ones, and its p."""
    if min(len(before), len(after)) < stats.min_rounds():
        return INSUFFICIENT, None
    ratio = stats.median(after) / stats.median(before)
    p = stats.mannwhitney_p(before, after)
    beyond = ratio > factor or ratio < 1 / factor
    if beyond and p < stats.ALPHA:
        return (IMPROVEMENT if ratio > 1 else REGRESSION), p
    if beyond or (ratio < 1 and p < stats.ALPHA):
        return SUSPICIOUS, p
    return NO_CHANGE, p


def change_points(points) -> list[Change]:
    """The change-points of ``points`` (Measures of one engine and spec,
    oldest first, each with ``build``, ``date`` and ``samples``): one per
    change of build between neighbours."""
    runs: list[tuple[str, str, list[float]]] = []  # (build, first date, pooled repetitions)
    for m in points:
        if runs and runs[-1][0] == m.build:
            runs[-1][2].extend(m.samples)
        else:
            runs.append((m.build, m.date, list(m.samples)))
    out = []
    for (b0, _, s0), (b1, d1, s1) in zip(runs, runs[1:]):
        if not s0 or not s1:
            out.append(Change(d1, b0, b1, float("nan"), None, (len(s0), len(s1)), INSUFFICIENT))
            continue
        lab, p = label(s0, s1)
        out.append(Change(d1, b0, b1, stats.median(s1) / stats.median(s0), p, (len(s0), len(s1)), lab))
    return out
