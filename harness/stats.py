"""Statistics for A/B benchmarking: summaries, the A-vs-B verdict, per-round wins.

Conventions: ``a`` is the baseline, ``b`` the candidate; ratios are b / a
of medians (medians, not means: one cold or preempted repetition must not
move the answer). Samples are rates (tok/s, ``higher_is_better=True``) or
times (``higher_is_better=False``); either way they must be positive.

The verdict follows asv (airspeed velocity): a change is reported only when
BOTH the size threshold and the significance test agree -

- "faster": the ratio is beyond ``factor`` in the good direction
  (b/a > factor for rates, b/a < 1/factor for times) AND the two-sided
  Mann-Whitney U p-value is below ``alpha``;
- "slower": symmetrically in the bad direction;
- "no significant change" otherwise: a 2% shift that is highly significant is
  still below a 5% factor (boost-clock noise between sessions is that large),
  and a 10% shift on a noisy handful of samples is not significant.

asv's own default is p < 0.002; 0.05 here because rounds are expensive and
the round-majority rule (``round_wins``) is a second, independent gate.
Note: Mann-Whitney cannot reach p < 0.05 two-sided with 3 samples per arm
(the smallest exact p is 0.1), so a verdict needs at least 4 per arm.

``harness ab`` and ``harness bisect`` judge by ``band_verdict`` instead: a
fixed 5% factor lets a steady 4.9% regression pass, while an interleaved
A/B on one GPU resolves 1-2%. What counts as a change there is the noise
band measured for that GPU and test (harness.noise): the whole bootstrap CI
of B/A beyond it, and the same arm winning most rounds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as _st

FASTER, SLOWER, SAME = "faster", "slower", "no significant change"


def _arr(x) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    if a.size == 0:
        raise ValueError("no samples")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"samples must be positive and finite: {a.tolist()}")
    return a


def median(x) -> float:
    return float(np.median(_arr(x)))


def p90(x) -> float:
    return float(np.percentile(_arr(x), 90))


def mean_sd(x) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1, as llama-bench); sd 0 for one sample."""
    a = _arr(x)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def describe(x) -> dict:
    a = _arr(x)
    mean, sd = mean_sd(a)
    return {"n": int(a.size), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "mean": mean, "sd": sd, "min": float(a.min()), "max": float(a.max())}


@dataclass(frozen=True)
class Comparison:
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float        # median(b) / median(a)
    ci_low: float       # bootstrap CI of the ratio (percentile method)
    ci_high: float
    confidence: float
    p_value: float      # Mann-Whitney U, two-sided
    verdict: str        # FASTER, SLOWER or SAME
    factor: float
    alpha: float
    higher_is_better: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.verdict}: b/a = {self.ratio:.4f} "
                f"[{self.ci_low:.4f}, {self.ci_high:.4f}] p={self.p_value:.3g} "
                f"(n={self.n_a}/{self.n_b})")


def bootstrap_ratio_ci(a, b, *, n_boot: int = 2000, confidence: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(b)/median(a), resampling each arm
    independently. Fixed seed: the same samples always give the same interval."""
    a, b = _arr(a), _arr(b)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(mb / ma, [tail, 100 - tail])
    return float(lo), float(hi)


ALPHA = 0.05  # the verdict's significance level


def mannwhitney_p(a, b) -> float:
    """Two-sided Mann-Whitney U p-value; 1.0 when undefined (every value tied)."""
    a, b = _arr(a), _arr(b)
    p = _st.mannwhitneyu(a, b, alternative="two-sided").pvalue
    return 1.0 if math.isnan(p) else float(p)


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided Mann-Whitney p that ``n_a`` values against
    ``n_b`` can give (every b beyond every a, no ties; exact): 2 / C(n_a+n_b, n_a)."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def min_rounds(alpha: float = ALPHA) -> int:
    """The fewest rounds per arm whose smallest p is below ``alpha`` (4 at
    0.05: 3 against 3 cannot go under 0.1, so no verdict could be reached)."""
    n = 2
    while smallest_p(n, n) >= alpha:
        n += 1
    return n


def compare(a_samples, b_samples, *, factor: float = 1.05, alpha: float = ALPHA,
            higher_is_better: bool = True, n_boot: int = 2000, confidence: float = 0.95,
            seed: int = 0) -> Comparison:
    """Candidate ``b`` against baseline ``a`` (see the module docstring for the rule)."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    a, b = _arr(a_samples), _arr(b_samples)
    ratio = float(np.median(b) / np.median(a))
    lo, hi = bootstrap_ratio_ci(a, b, n_boot=n_boot, confidence=confidence, seed=seed)
    p = mannwhitney_p(a, b)
    # "good" = b better than a by more than the factor, in this metric's direction
    good = ratio > factor if higher_is_better else ratio < 1 / factor
    bad = ratio < 1 / factor if higher_is_better else ratio > factor
    significant = p < alpha
    verdict = FASTER if good and significant else SLOWER if bad and significant else SAME
    return Comparison(n_a=int(a.size), n_b=int(b.size), median_a=float(np.median(a)),
                      median_b=float(np.median(b)), ratio=ratio, ci_low=lo, ci_high=hi,
                      confidence=confidence, p_value=p, verdict=verdict, factor=factor,
                      alpha=alpha, higher_is_better=higher_is_better)


def round_wins(pairs, *, higher_is_better: bool = True) -> dict:
    """``pairs``: one (a_value, b_value) per round, e.g. each arm's median
    tok/s in that round. Interleaved rounds see the same GPU state, so the
    per-round winner is robust to slow drift (thermal, clocks) that pooled
    samples are not. Returns a JSON-ready dict (arms named as in harness.ab):

        {"rounds": ["B", "A", "tie", ...], "A": wins, "B": wins, "ties": n,
         "majority": "A" | "B" | None,  # won MORE than half of ALL rounds (ties count against)
         "p_sign": two-sided sign-test p-value on the untied rounds}
    """
    rounds = []
    for a, b in pairs:
        if a == b:
            rounds.append("tie")
        else:
            rounds.append("B" if (b > a) == higher_is_better else "A")
    na, nb, n = rounds.count("A"), rounds.count("B"), len(rounds)
    majority = "A" if na * 2 > n else "B" if nb * 2 > n else None
    p = float(_st.binomtest(nb, na + nb, 0.5).pvalue) if na + nb else 1.0
    return {"rounds": rounds, "A": na, "B": nb, "ties": n - na - nb, "majority": majority, "p_sign": p}


def ratio_spread(pairs) -> float:
    """The sample standard deviation of the per-round ratio b/a (``pairs``:
    one (a, b) per round), a fraction of 1: how far one round's ratio
    scatters. 0.0 for fewer than two rounds."""
    r = np.array([b / a for a, b in pairs], dtype=float)
    return float(r.std(ddof=1)) if r.size > 1 else 0.0


def band_verdict(ci_low: float, ci_high: float, band: float, majority: str | None,
                 factor: float | None = None) -> str:
    """The verdict of an A/B of rates (b/a above 1: b is faster): SLOWER when
    the whole CI of b/a lies below 1 - ``band`` and "A" won the majority of
    rounds (``round_wins``), FASTER when it lies above 1 + ``band`` and "B"
    did, else SAME. ``band``: how far b/a strays from 1 when nothing changed
    (a fraction). ``factor``, if given: the CI must also lie beyond it (asv's
    size threshold, for when only large changes matter)."""
    low, high = 1 - band, 1 + band
    if factor:
        low, high = min(low, 1 / factor), max(high, factor)
    if ci_high < low and majority == "A":
        return SLOWER
    if ci_low > high and majority == "B":
        return FASTER
    return SAME
