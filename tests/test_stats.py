"""harness.stats: summaries, the asv-style verdict, bootstrap CI, round wins."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness import stats


def normal(mu, sd, n, seed):
    return np.random.default_rng(seed).normal(mu, sd, n)


def test_summaries():
    x = [10.0, 12.0, 11.0, 13.0, 9.0]
    assert stats.median(x) == 11.0
    assert stats.p90(x) == pytest.approx(12.6)
    mean, sd = stats.mean_sd(x)
    assert mean == 11.0 and sd == pytest.approx(np.std(x, ddof=1))
    assert stats.mean_sd([5.0]) == (5.0, 0.0)
    d = stats.describe(x)
    assert d == {"n": 5, "median": 11.0, "p90": pytest.approx(12.6), "mean": 11.0,
                 "sd": pytest.approx(sd), "min": 9.0, "max": 13.0}


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [1.0, -2.0], [1.0, float("nan")]])
def test_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        stats.compare([1.0, 2.0], bad)


def test_clearly_faster_and_slower():
    a = normal(240, 1.0, 10, 1)
    up = stats.compare(a, normal(264, 1.0, 10, 2))
    assert up.verdict == stats.FASTER and up.ratio == pytest.approx(1.10, abs=0.01)
    assert up.p_value < 1e-3 and up.ci_low > 1.05 and up.ci_low <= up.ratio <= up.ci_high
    down = stats.compare(a, normal(216, 1.0, 10, 3))
    assert down.verdict == stats.SLOWER and down.ratio == pytest.approx(0.90, abs=0.01)


def test_identical_distributions():
    c = stats.compare(normal(240, 1.0, 10, 4), normal(240, 1.0, 10, 5))
    assert c.verdict == stats.SAME and c.p_value > 0.05 and c.ci_low < 1 < c.ci_high
    same = stats.compare([5.0] * 6, [5.0] * 6)  # every value tied: p undefined -> 1
    assert same.verdict == stats.SAME and same.p_value == 1.0 and same.ratio == 1.0


def test_factor_threshold():
    # 2% faster, very significant, but below the 5% factor: not a change (asv's rule)
    a, b = normal(240, 0.2, 10, 6), normal(244.8, 0.2, 10, 7)
    c = stats.compare(a, b, factor=1.05)
    assert c.p_value < 1e-3 and c.ratio == pytest.approx(1.02, abs=0.002)
    assert c.verdict == stats.SAME
    assert stats.compare(a, b, factor=1.01).verdict == stats.FASTER


def test_big_but_not_significant():
    # +10% in the medians, but samples overlap heavily
    a, b = [100.0, 140.0, 90.0, 120.0, 80.0], [110.0, 85.0, 150.0, 95.0, 132.0]
    c = stats.compare(a, b)
    assert c.ratio == pytest.approx(1.10) and c.p_value > 0.05 and c.verdict == stats.SAME


def test_lower_is_better():
    times_a, times_b = normal(10.0, 0.05, 8, 8), normal(9.0, 0.05, 8, 9)  # b takes less time
    c = stats.compare(times_a, times_b, higher_is_better=False)
    assert c.ratio < 1 / 1.05 and c.verdict == stats.FASTER
    assert stats.compare(times_b, times_a, higher_is_better=False).verdict == stats.SLOWER


def test_small_samples():
    # Mann-Whitney's smallest two-sided p with 3 per arm is 0.1: never significant
    c3 = stats.compare([100.0, 101.0, 102.0], [200.0, 201.0, 202.0])
    assert c3.p_value == pytest.approx(0.1) and c3.verdict == stats.SAME
    c4 = stats.compare([100.0, 101.0, 102.0, 103.0], [200.0, 201.0, 202.0, 203.0])
    assert c4.p_value == pytest.approx(2 / 70) and c4.verdict == stats.FASTER
    c1 = stats.compare([100.0], [200.0])
    assert c1.n_a == c1.n_b == 1 and c1.ratio == 2.0 and c1.ci_low == c1.ci_high == 2.0
    assert c1.verdict == stats.SAME


def test_reproducible_and_serialisable():
    a, b = normal(100, 3, 7, 10), normal(104, 3, 7, 11)
    c1, c2 = stats.compare(a, b), stats.compare(a, b)
    assert c1 == c2
    d = c1.to_dict()
    assert d["verdict"] == c1.verdict and set(d) >= {"ratio", "ci_low", "ci_high", "p_value"}
    assert "b/a" in str(c1)


def test_ci_covers_true_ratio():
    # lognormal samples (skewed, like timings): true ratio of medians = 1.1
    rng = np.random.default_rng(12)
    hits, trials = 0, 40
    for i in range(trials):
        a = 200 * rng.lognormal(0, 0.05, 25)
        b = 220 * rng.lognormal(0, 0.05, 25)
        lo, hi = stats.bootstrap_ratio_ci(a, b, seed=i)
        hits += lo <= 1.1 <= hi
    assert hits >= 0.8 * trials  # nominal 95%; percentile bootstrap of a median runs a bit short


def test_round_wins():
    pairs = [(240, 250), (241, 249), (245, 244), (242, 242), (240, 251)]
    w = stats.round_wins(pairs)
    assert w == {"rounds": ["B", "B", "A", "tie", "B"], "A": 1, "B": 3, "ties": 1,
                 "majority": "B", "p_sign": pytest.approx(0.625)}
    # lower is better: the same numbers as times flip every winner
    wt = stats.round_wins(pairs, higher_is_better=False)
    assert wt["rounds"] == ["A", "A", "B", "tie", "A"] and wt["majority"] == "A"
    # ties count against a majority: 2 of 4 is not more than half
    assert stats.round_wins([(1, 2), (1, 2), (3, 3), (3, 3)])["majority"] is None
    empty = stats.round_wins([])
    assert empty["majority"] is None and empty["p_sign"] == 1.0
    assert stats.round_wins([(1, 2)] * 8)["p_sign"] == pytest.approx(2 / 256)
    json.dumps(w)


def test_an_ab_needs_rounds_that_can_reach_a_verdict():
    """3 rounds against 3 cannot give p < 0.05 (smallest 0.1): such an A/B
    could never say "slower", so a CI gate built on it could never fail."""
    from scipy.stats import mannwhitneyu

    from harness import cli

    for n in (3, 4, 5):  # the bound is the one scipy's exact test reaches
        assert stats.smallest_p(n, n) == pytest.approx(mannwhitneyu(range(n), range(n, 2 * n)).pvalue)
    assert stats.smallest_p(3, 3) == pytest.approx(0.1) and stats.smallest_p(4, 4) < 0.05
    assert stats.min_rounds() == 4 and stats.min_rounds(0.01) == 5
    with pytest.raises(SystemExit):
        cli.main(["ab", "a.whl", "b.whl", "--rounds", "3"])
