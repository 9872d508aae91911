"""The gate's rules at their edges: each comparison is strict or not on
purpose, and each threshold is the one stated (harness/validate.py,
compare.py, gates.py, stats.py, refs.py). A change of `<` to `<=`, of
top-2 to top-3, of the headroom, or of a reference's precision fails here."""

from __future__ import annotations

import math
from dataclasses import astuple
from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import AnvilError
from harness import catalog, gates, refs, stats, validate
from harness.compare import CaseResult, Flip, compare_case


def flip(ref_margin, engine_margin, in_top2):
    return Flip(step=0, ref_token=1, engine_token=2, ref_margin=ref_margin, engine_margin=engine_margin,
                ref_in_engine_top2=in_top2)


def test_a_near_tie_is_strictly_below_the_threshold_on_both_sides():
    t = 0.5
    assert validate.is_near_tie(flip(0.4999, 0.4999, True), t)    # llama.cpp's margin and the engine's gap under it
    assert not validate.is_near_tie(flip(0.5, 0.1, True), t)      # llama.cpp's margin at the threshold
    assert not validate.is_near_tie(flip(0.1, 0.5, True), t)      # the engine's gap at it, llama.cpp's token its 2nd
    assert not validate.is_near_tie(flip(0.4999, 9.0, True), t)   # a sure engine: its top 2 opens no door
    assert validate.is_near_tie(flip(0.1, 0.4999, False), t)      # not in the top 2, but within the threshold


def test_a_flip_with_a_small_llama_cpp_margin_and_a_large_engine_gap_is_drift():
    c = CaseResult("p", 4, 1, "teacher-forced", 3, flips=[flip(0.01, 3.0, True)], logit_diffs=[0.0] * 4,
                   kls=[0.0] * 4, margin_shifts=[0.0] * 4)
    (f,) = validate.judge(0, c, catalog.Gate(margin=0.5))
    assert (f.check, f.detail) == ("drift", "llama.cpp token 1 vs engine token 2: llama.cpp's top-2 margin 0.01, "
                                            "the engine's gap 3 (a near-tie needs both below 0.5)")


def _near_ties(n_flips, n_steps=8):
    """A case of ``n_steps`` with a near-tie flip at each of its first ``n_flips`` steps."""
    flips = [Flip(step=i, ref_token=1, engine_token=2, ref_margin=0.1, engine_margin=0.1, ref_in_engine_top2=True)
             for i in range(n_flips)]
    zeros = [0.0] * n_steps
    return CaseResult("p", n_steps, 0, "teacher-forced", n_steps - n_flips, flips=flips, logit_diffs=zeros,
                      kls=zeros, margin_shifts=zeros)


def test_near_tie_flips_beyond_their_share_of_the_steps_fail():
    gate = catalog.Gate(margin=0.5, flips=0.25)  # 2 of 8 steps
    assert validate.judge(0, _near_ties(2), gate) == []                  # at the share: passes
    (f,) = validate.judge(3, _near_ties(3), gate)                        # one more: fails, at that flip's step
    assert (f.case, f.step, f.check) == (3, 2, "flips")
    assert f.detail == "3 near-tie flips in 8 steps, a share of 0.375 > 0.25"
    assert validate.judge(0, _near_ties(8), catalog.Gate(margin=0.5)) == []  # no share in the catalog: not judged
    (f,) = validate.judge(0, _near_ties(1), catalog.Gate(margin=0.5, flips=0.0))  # llama.cpp never flipped
    assert (f.step, f.check) == (0, "flips")
    # a drift is not a near-tie: it fails as drift and does not count toward the share
    c = _near_ties(2)
    c.flips[1].engine_margin = 0.6
    assert [x.check for x in validate.judge(0, c, catalog.Gate(margin=0.5, flips=0.125))] == ["drift"]


def test_each_measure_passes_at_its_bound_and_fails_just_past_it():
    gate = catalog.Gate(margin=0.5, logit=1.0, kl=0.01)

    def failures(**values):
        c = CaseResult("p", 3, 3, "exact", 3, logit_diffs=values.get("logit", [0.0] * 3),
                       kls=values.get("kl", [0.0] * 3), margin_shifts=values.get("margin", [0.0] * 3))
        return [(f.check, f.step) for f in validate.judge(0, c, gate)]

    assert failures(logit=[0.2, 1.0, 0.0], kl=[0.01, 0, 0], margin=[-0.5, 0.5, 0]) == []
    assert failures(logit=[0.2, math.nextafter(1.0, 2.0), 0.0]) == [("logit", 1)]
    assert failures(kl=[0, 0, 0.0101]) == [("kl", 2)]
    assert failures(margin=[0, -0.51, 0]) == [("margin", 1)]  # a shift either way
    assert failures(logit=[float("nan"), 0, 0]) == [("logit", 0)]


class _Fixed:
    """A model whose every step's logits are given: for compare_case."""

    def __init__(self, logits):
        self.logits, self.i = [np.asarray(v, np.float32) for v in logits], 0
        self.n_ctx, self.path, self.config = 64, "fixed", SimpleNamespace(eos_token_id=None)

    def reset(self):
        self.i = 0

    def forward(self, tokens):
        self.i = 0
        return self.logits[0]

    def decode_next(self, token):
        self.i += 1
        return int(np.argmax(self.logits[self.i]))

    def decode_logits(self):
        return self.logits[self.i]


def test_a_flip_counts_llama_cpps_token_in_the_engines_top_2_not_top_3():
    engine = [[4.9, 5.0, 0.0, 0.0],   # step 0: the engine agrees (token 1)
              [5.0, 4.9, 4.8, 0.0]]   # step 1: llama.cpp's token 2 is the engine's 3rd
    case = refs.Case("p", [0], [1, 2], top_ids=[[1, 0], [2, 1]], top_logits=[[5.0, 4.9], [5.0, 4.9]])
    r = compare_case(_Fixed(engine), case)
    (f,) = r.flips
    assert (f.step, f.ref_token, f.engine_token, f.ref_in_engine_top2) == (1, 2, 0, False)
    assert f.engine_margin == pytest.approx(0.2)


def test_proposed_thresholds_are_one_and_a_quarter_times_llama_cpps_spread():
    assert gates.HEADROOM == 1.25
    e = catalog.Entry("m", "synth", "cpu", "", "llama", references=("cpu", "twin"))
    spread = [SimpleNamespace(max_margin_shift=1.0, max_logit_diff=2.0, max_kl=0.1),
              SimpleNamespace(max_margin_shift=0.2, max_logit_diff=0.4, max_kl=0.3)]
    cases = lambda *counts: [SimpleNamespace(flips=[None] * f, n_steps=n) for f, n in counts]  # noqa: E731
    spread = [SimpleNamespace(max_margin_shift=1.0, max_logit_diff=2.0, max_kl=0.1, cases=cases((3, 32), (1, 32))),
              SimpleNamespace(max_margin_shift=0.2, max_logit_diff=0.4, max_kl=0.3, cases=cases((7, 64), (0, 64)))]
    g = gates.propose(e, "cpu", spread)
    assert (g.margin, g.logit, g.kl) == (1.2, 2.5, 0.47)  # 1.25 x 1.0 (2 digits), 1.25 x 2.0, 1.5625 x 0.3
    assert g.flips == 0.14  # 1.25 x 3/32 (the largest share of one prompt's steps), 2 digits
    # an fp32 comparison never goes under its stated budget; a llama.cpp that never flipped allows no flip
    g = gates.propose(e, "twin", [SimpleNamespace(max_margin_shift=0.0, max_logit_diff=0.0, max_kl=0.0,
                                                  cases=cases((0, 32)))])
    assert (g.margin, g.logit, g.kl, g.flips) == (*astuple(gates.FP32_BUDGET)[:3], 0.0)
    assert gates.propose_flips([(30, 32)]) == 1.0  # at most every step


def test_every_gate_from_llama_cpps_spread_is_the_one_its_variation_record_supports():
    """Every gate llama.cpp's own spread sets is re-derived whole, margin,
    logit, KL and flip share, from the newest committed llama.cpp variation
    record of each variant on that model's file and set: the NumPy engine's
    against the CPU-made sets by gates.propose, the CUDA engine's against
    llama.cpp's CUDA references by gates.propose_measured with the headroom
    llama.cpp's CUDA realisations measure held out; a record made before KL
    was measured sets no KL bound, and a gate with no record is not one
    llama.cpp measured."""
    from harness import results

    cat = catalog.load()
    runs = gates.variation_records(results.DEFAULT_DIR, "llama.cpp", cat)
    headroom = gates.held_out_headroom(cat, gates.gpu_records(results.DEFAULT_DIR, cat))
    judged = 0
    for name, e in cat.items():
        for s in e.reference_sets:
            for backend in catalog.BACKENDS:
                gate = e.gate(backend, s)
                if gate is None or backend != gates.judged_backend(s):
                    continue  # the CUDA gates of CPU-made sets: the faithful oracle's (test_anchored)
                spread = runs.get((name, s))
                assert spread, f"{name}: gate.{e.gate_key(backend, s)} has no llama.cpp variation record"
                want = gates.propose_measured(e, s, spread, headroom) if backend == "cuda" else \
                    gates.propose(e, s, spread)
                assert gate == want, f"{name}: gate.{e.gate_key(backend, s)} {gate} where its record supports {want}"
                judged += 1
    assert judged >= 40
    # the most near-tie flips llama.cpp made in one of qwen3-8b's 64-step prompts (11), plus the held-out excess
    assert cat["qwen3-8b"].gate("cuda").flips == gates.ceil2((11 + headroom["flips"]) / 64)


def test_the_cuda_gates_of_llama_cpps_sets_fail_none_of_its_realisations_held_out():
    """The rule on llama.cpp's own CUDA realisations: each one, held out, passes
    the gate the others propose with the measured headroom; 1.25 x the
    largest of the others (gates.propose) failed some."""
    from harness import results
    from harness.validate import is_near_tie

    cat = catalog.load()
    measured = gates.gpu_records(results.DEFAULT_DIR, cat)
    assert any(len(v) >= len(gates.GPU_VARIANTS) for v in measured.values())
    headroom = gates.held_out_headroom(cat, measured)
    assert gates.held_out_failures(cat, measured, headroom) == []
    old = 0
    for (name, rset), spread in measured.items():
        for i, held in enumerate(spread):
            g = gates.propose(cat[name], rset, spread[:i] + spread[i + 1:])
            old += any(getattr(g, c) is not None and getattr(held, a) > getattr(g, c) for c, a in gates.CHECKS.items()) \
                or any(not is_near_tie(f, g.margin) for c in held.cases for f in c.flips)
    assert old > 0


def test_every_gate_names_measurements_of_its_models_current_file():
    """Each gate line of the catalog names the variation records it was
    derived from: they are committed, they measured that model, and of the
    file the catalog pins now (a record of a file made anew since cannot back
    the gate of the new one)."""
    import json
    import re

    from harness import fetch, results

    cat, model, named, adopt = catalog.load(), None, 0, _adopt_gates()
    for line in fetch.CATALOG.read_text().splitlines():
        if m := re.match(r"\[models\.(.+)\]", line):
            model = m.group(1)
        if not line.startswith("gate."):
            continue
        key = line.split("=")[0].strip()
        records = adopt.RECORD.findall(line)
        assert records, f"{model}: {key} names no variation record"
        for name in records:
            path = results.DEFAULT_DIR / name
            assert path.exists(), f"{model}: {key} names {name}, which is not in {results.DEFAULT_DIR}"
            measured = [r for r in json.loads(path.read_text())["results"] if r["model"] == model]
            assert measured, f"{model}: {key} names {name}, which does not measure {model}"
            assert all(gates.of_catalog_file(r, cat) for r in measured), f"{model}: {key}: {name} is of another file"
            named += 1
    assert named >= 100


def test_a_speed_verdict_needs_both_beyond_the_factor_and_p_below_alpha():
    a = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.3]
    b = [x * 1.05 for x in a]  # exactly the factor (and p ~ 2e-4): not beyond it
    same = stats.compare(a, b, factor=1.05)
    assert same.ratio == 1.05 and same.p_value < 1e-3 and same.verdict == stats.SAME
    assert stats.compare(a, [x * 1.06 for x in a], factor=1.05).verdict == stats.FASTER
    c = stats.compare(a, [x * 1.06 for x in a], factor=1.05)
    assert stats.compare(a, [x * 1.06 for x in a], factor=1.05, alpha=c.p_value).verdict == stats.SAME  # p = alpha
    assert stats.compare(a, [x / 1.06 for x in a], factor=1.05).verdict == stats.SLOWER


def test_references_keep_float32_logits_and_refuse_another_schema(tmp_path):
    v = float(np.float32(12.3456789))
    case = refs.Case("p", [1], [2], top_ids=[[2, 3]], top_logits=[[v, -0.000123456789]])
    ref = refs.Reference(model="m", model_file="m.gguf", model_sha256="x", llama_cpp={}, settings={}, device="cpu",
                         created="", top_k=2, cases=[case])
    back = refs.load(refs.save(ref, tmp_path / "r.json")).cases[0].top_logits[0]
    assert back[0] == pytest.approx(v, rel=1e-7) and back[1] == pytest.approx(-0.000123456789, rel=1e-6)
    d = ref.to_json() | {"schema_version": refs.SCHEMA_VERSION + 1}
    with pytest.raises(AnvilError, match=r"schema_version 2, this Anvil reads 1"):
        refs.Reference.from_json(d, "r.json")


def _arms(ta, tb):
    from harness.ab import ArmRuns

    return {"A": ArmRuns("A", {}, tokens=ta), "B": ArmRuns("B", {}, tokens=tb)}


def test_the_ab_token_check_names_the_first_differing_step_and_the_tokens_there():
    from harness.ab import ABConfig, _check_tokens

    allow = ABConfig(model=None, allow_token_diff=True)
    for ta, tb in ((None, [1]), ([1], None), (None, None)):  # an arm without tokens: not judged
        rec = {}
        _check_tokens(rec, _arms(ta, tb), allow)
        assert rec == {"tokens_identical": None}
    ta = list(range(20))
    tb = ta[:5] + [99] + ta[6:]
    rec = {}
    _check_tokens(rec, _arms(ta, tb), allow)
    judged = rec["token_diff"].pop("judged")  # no catalog model: the A/B budget; no top logits: not a near-tie
    assert judged == {"step": 5, "bound": 1.1, "margins": {}, "near_tie": False, "bound_from": "the A/B budget"}
    assert rec == {"tokens_identical": False, "token_diff": {"first_step": 5, "A": ta[5:13], "B": tb[5:13]}}
    for short, long_ in ((ta[:3], ta), (ta, ta[:3])):  # one arm a prefix of the other: they part at its end
        rec = {}
        _check_tokens(rec, _arms(short, long_), allow)
        assert rec["token_diff"]["first_step"] == 3
        assert rec["token_diff"]["A"] == short[3:11] and rec["token_diff"]["B"] == long_[3:11]
    with pytest.raises(AnvilError, match="from step 5") as e:
        _check_tokens({}, _arms(ta, tb), ABConfig(model=None))
    assert f"(A {ta[5:13]} vs B {tb[5:13]})" in str(e.value)  # the eight tokens from there, each arm's


def test_a_record_without_an_analysis_has_no_slower_test():
    from harness.ab import slower_tests

    assert slower_tests({}) == []
    assert slower_tests({"analysis": {"pp512": {"verdict": stats.SLOWER}, "tg128": {"verdict": stats.FASTER}}}) \
        == ["pp512"]


def test_two_samples_have_a_standard_deviation():
    assert stats.mean_sd([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)))
    assert stats.mean_sd([5.0]) == (5.0, 0.0)


def test_the_ratio_interval_is_the_bootstrap_percentiles_and_repeatable():
    """The 95% interval is the 2.5th and 97.5th percentile of median(b)/median(a)
    over 2000 resamples of each arm, seed 0: the same samples, the same interval."""
    a = [100.0, 101.0, 99.0, 102.0, 98.0, 100.5]
    b = [103.0, 104.5, 102.0, 106.0, 101.0, 103.5, 105.0]
    rng = np.random.default_rng(0)
    ma = np.median(np.asarray(a)[rng.integers(0, len(a), (2000, len(a)))], axis=1)
    mb = np.median(np.asarray(b)[rng.integers(0, len(b), (2000, len(b)))], axis=1)
    want = np.percentile(mb / ma, [2.5, 97.5])
    assert stats.bootstrap_ratio_ci(a, b) == pytest.approx(tuple(want), rel=0, abs=0)
    assert stats.bootstrap_ratio_ci(a, b) == stats.bootstrap_ratio_ci(a, b)
    c = stats.compare(a, b)
    assert (c.ci_low, c.ci_high) == stats.bootstrap_ratio_ci(a, b)
    assert (c.n_a, c.n_b, c.median_a, c.median_b, c.confidence, c.higher_is_better) == \
        (6, 7, 100.25, 103.5, 0.95, True)


def test_lower_is_better_metrics_mirror_the_rule_at_the_factor():
    # factor 1.25: these samples scaled by 1.25 or 0.8 are exact, so the ratios hit the bounds exactly
    a = [100.0, 105.0, 95.0, 110.0, 90.0, 100.0, 105.0, 95.0]
    scaled = lambda r: [x / 1.25 if r == 0.8 else x * r for x in a]  # noqa: E731
    at = lambda r: stats.compare(a, scaled(r), factor=1.25, higher_is_better=False).verdict  # noqa: E731
    assert stats.compare(a, scaled(0.8), factor=1.25).ratio == 1 / 1.25
    assert at(0.8) == stats.SAME and at(1.25) == stats.SAME  # at the factor: not beyond it
    assert at(0.75) == stats.FASTER and at(1.3) == stats.SLOWER
    assert at(1.1) == stats.SAME  # within the factor, however significant
    up = lambda r: stats.compare(a, scaled(r), factor=1.25).verdict  # noqa: E731
    assert up(0.8) == stats.SAME and up(0.75) == stats.SLOWER
    assert stats.compare(a, a, factor=1.0).verdict == stats.SAME  # a factor of exactly 1 is allowed
    with pytest.raises(ValueError):
        stats.compare(a, a, factor=0.99)


def test_all_tied_samples_have_p_one_and_split_rounds_no_majority():
    assert stats.mannwhitney_p([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]) == 1.0
    w = stats.round_wins([(1.0, 2.0), (2.0, 1.0)])  # one round each: nobody won more than half
    assert (w["A"], w["B"], w["ties"], w["majority"]) == (1, 1, 0, None)
    assert stats.round_wins([(1.0, 2.0), (2.0, 1.0), (1.0, 1.0)])["majority"] is None
    assert stats.round_wins([(2.0, 1.0), (2.0, 1.0), (1.0, 2.0)])["majority"] == "A"


def test_ab_analyses_the_tests_both_arms_ran_at_least_twice_at_the_given_factor():
    from harness.ab import ABConfig, ArmRuns, _analyse

    a = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1]
    arms = {"A": ArmRuns("A", {}, values={"pp512": [100.0], "tg128": a, "only-a": a}),
            "B": ArmRuns("B", {}, values={"pp512": [120.0], "tg128": [x * 1.1 for x in a]})}
    out = _analyse(arms, ABConfig(model=None))
    assert list(out) == ["tg128"]  # pp512 has one value per arm; only-a is not in B
    assert out["tg128"]["verdict"] == stats.FASTER and out["tg128"]["A"]["n"] == out["tg128"]["B"]["n"] == 6
    assert _analyse(arms, ABConfig(model=None, factor=1.2))["tg128"]["verdict"] == stats.SAME
    two = {"A": ArmRuns("A", {}, values={"tg128": a[:2]}), "B": ArmRuns("B", {}, values={"tg128": a[2:4]})}
    assert list(_analyse(two, ABConfig(model=None))) == ["tg128"]  # two rounds each are enough
    lopsided = {"A": ArmRuns("A", {}, values={"tg128": a[:1]}), "B": ArmRuns("B", {}, values={"tg128": a})}
    assert _analyse(lopsided, ABConfig(model=None)) == {}  # one arm with a single round: no verdict


def test_a_measure_without_a_bound_skips_only_itself_and_failures_say_where_and_what():
    c = CaseResult("p", 3, 1, "teacher-forced", 2, logit_diffs=[9.0, 9.0, 9.0], kls=[0.0, 0.5, 0.0],
                   margin_shifts=[0.0, 0.0, 0.7], degenerate="repeats one token",
                   flips=[Flip(step=2, ref_token=7, engine_token=8, ref_margin=0.9, engine_margin=1.5,
                               ref_in_engine_top2=False)])
    got = validate.judge(4, c, catalog.Gate(margin=0.5, logit=None, kl=0.1))  # the logit not judged
    assert [(f.case, f.step, f.check) for f in got] == [(4, None, "degenerate"), (4, 2, "drift"), (4, 1, "kl"),
                                                        (4, 2, "margin")]
    assert got[0].detail == "repeats one token"
    assert got[1].detail == ("llama.cpp token 7 vs engine token 8: llama.cpp's top-2 margin 0.9, the engine's gap 1.5 "
                             "(a near-tie needs both below 0.5)")
    assert got[2].detail == "top-k KL divergence 0.5 > 0.1" and got[3].detail == "top-2 margin shift 0.7 > 0.5"
    logit = validate.judge(0, c, catalog.Gate(margin=1.0, logit=1.0, kl=None))
    assert [f.detail for f in logit if f.check == "logit"] == ["max |Δlogit| over the top-k 9 > 1"]


def test_kl_is_computed_in_float64_from_float32_logits():
    """Small KLs (what the twin gates bound, 1e-6 and below) need fp64: float32
    logits that differ in one entry by 1e-3."""
    from harness.compare import topk_kl

    p = np.linspace(5.0, -3.0, 16).astype(np.float32)
    q = p.copy()
    q[3] += np.float32(1e-3)
    lp = p.astype(np.float64) - np.log(np.exp(p.astype(np.float64)).sum())
    lq = q.astype(np.float64) - np.log(np.exp(q.astype(np.float64)).sum())
    want = float(np.sum(np.exp(lp) * (lp - lq)))
    assert 1e-8 < want < 1e-6 and topk_kl(p, q) == pytest.approx(want, rel=1e-6)


def test_repetition_loops_of_every_period_up_to_the_maximum_and_no_further():
    from harness.compare import LOOP_MAX_PERIOD, LOOP_MIN_SPAN, repetition_loop

    for p in range(1, LOOP_MAX_PERIOD + 1):
        cycle = list(range(100, 100 + p))
        assert repetition_loop([1, 2, 3] + (cycle * LOOP_MIN_SPAN)[:LOOP_MIN_SPAN + 1]) == p  # any phase
    longer = list(range(100, 101 + LOOP_MAX_PERIOD))
    assert repetition_loop((longer * LOOP_MIN_SPAN)[:2 * LOOP_MIN_SPAN]) == 0
    # equal only across the wrap-around of the window (tail[0] == tail[-1]): not a loop
    assert repetition_loop([7] + list(range(LOOP_MIN_SPAN - 2)) + [7]) == 0


def test_degenerate_runs_are_named_with_their_tokens():
    from harness.compare import _degenerate

    t = lambda *v: SimpleNamespace(tokens=list(v))  # noqa: E731
    calm = t(*range(20))
    assert _degenerate(t(2, 5), calm, t(3, 2), eos=2) == "stop token 2 at step 0 (llama.cpp: 3)"
    assert _degenerate(t(5, 2), calm, t(3, 2), eos=2) is None  # the stop token later is no degeneracy
    assert _degenerate(t(2, 5), calm, t(2, 5), eos=2) is None  # llama.cpp stops at once too
    loop = t(9, 8, *[1, 2] * 6)
    assert _degenerate(t(5), loop, calm, eos=None) == "repetition loop of period 2 ([1, 2]) where llama.cpp has none"
    assert _degenerate(t(5), loop, loop, eos=None) is None
    broken = t(9, 8, *[1, 2] * 3, 7, 2, *[1, 2] * 2)  # llama.cpp left its loop at one step
    assert _degenerate(t(5), loop, broken, eos=None) is None
    twice = t(9, 8, *[1, 2] * 3, 7, 2, 1, 7, 1, 2)
    assert _degenerate(t(5), loop, twice, eos=None) == "repetition loop of period 2 ([1, 2]) where llama.cpp has none"


def _realisation(margin, logit, kl, flips_per_prompt, variant="v", n_steps=32):
    """A faithful-oracle measurement as gates.faithful_records gives it:
    flips_per_prompt, a list per prompt of (llama.cpp margin, engine gap)."""
    cases = [SimpleNamespace(n_steps=n_steps, flips=[SimpleNamespace(ref_margin=a, engine_margin=b) for a, b in p])
             for p in flips_per_prompt]
    return SimpleNamespace(variant=variant, max_margin_shift=margin, max_logit_diff=logit, max_kl=kl, cases=cases)


def test_bounds_are_rounded_up_never_under_what_they_cover():
    assert gates.ceil2(0.0625) == 0.063 and gates.ceil2(1.2) == 1.2 and gates.ceil2(1.21) == 1.3
    assert gates.ceil2(2.0 / 32) >= 2.0 / 32 and gates.ceil2(0.000301) == 0.00031 and gates.ceil2(0.0) == 0.0


def test_the_faithful_gate_covers_its_own_realisations_flips():
    """A realisation whose flip has a gap wider than any margin shift (a
    re-routed token): the near-tie bound covers it, and the flip share is
    the most a prompt had plus the measured excess."""
    e = catalog.Entry("m", "synth", "cpu", "", "qwen3moe", references=("cpu", "twin"))
    spread = [_realisation(1.0, 2.0, 0.1, [[(0.1, 2.5)], []], "a"),
              _realisation(0.8, 2.2, 0.2, [[(0.1, 0.2), (0.3, 0.1)], [(0.2, 0.2)]], "b")]
    h = {"margin": 1.6, "logit": 1.4, "kl": 1.8, "flips": 1.0}
    g = gates.propose_measured(e, "cpu", spread, h)
    assert g.margin == 4.0 and g.logit == gates.ceil2(1.4 * 2.2) and g.kl == 0.36
    assert g.flips == gates.ceil2(3 / 32)  # prompt 0: two flips at most, one more
    # judged as validate judges: neither realisation fails the gate it is part of
    assert gates.held_out_failures({"m": e}, {("m", "cpu"): spread + spread}, h) == []


def test_a_measurement_of_a_file_made_anew_sets_no_gate(tmp_path):
    """A faithful-oracle record of a model's earlier file (another sha256) is
    passed over, however new; one saved before results named their file counts."""
    import json

    cat = {"m": SimpleNamespace(sha256="new")}

    def save(name, date, **extra):
        r = {"model": "m", "tier": "cpu", "variant": "faithful", "max_logit_diff": 1.0, "cases": [], **extra}
        (tmp_path / f"variation-{name}.json").write_text(json.dumps(
            {"engine": "anvil faithful oracle", "date": date, "results": [r]}))

    save("a", "2026-12-01T00:00:00Z")                      # before results named their file
    assert gates.faithful_records(tmp_path, cat)[("m", "cpu")][0].max_logit_diff == 1.0
    save("b", "2026-12-02T00:00:00Z", model_sha256="new", max_logit_diff=2.0)
    save("c", "2026-12-03T00:00:00Z", model_sha256="old", max_logit_diff=3.0)  # newest, of the old file
    (got,) = gates.faithful_records(tmp_path, cat)[("m", "cpu")]
    assert got.max_logit_diff == 2.0


def test_the_headroom_is_the_largest_held_out_ratio_where_no_budget_binds():
    quant = catalog.Entry("q", "synth", "cpu", "", "llama", references=("cpu", "twin"))
    f32 = catalog.Entry("f", "synth", "cpu", "", "llama", references=("cpu",))
    measured = {("q", "cpu"): [_realisation(1.0, 1.0, 0.01, [[]]), _realisation(1.3, 0.9, 0.01, [[(0.1, 0.1)]]),
                               _realisation(1.1, 1.0, 0.02, [[]])],
                # an F32 file under its fp32 budget but for one realisation: the budget is the bound there
                ("f", "cpu"): [_realisation(1e-5, 1e-5, 1e-12, [[]]), _realisation(5e-3, 5e-3, 1e-8, [[]])]}
    h = gates.held_out_headroom({"q": quant, "f": f32}, measured)
    assert h == {"margin": 1.2, "logit": 1.0, "kl": 2.0, "flips": 1.0}  # 1.3/1.1, never past 1.0, 0.02/0.01
    (fail,) = gates.held_out_failures({"q": quant, "f": f32}, measured, h)
    assert fail[:2] == ("f", "cpu")  # the one realisation alone past the budget: no sample of the others


def test_the_committed_cuda_gate_rule_fails_no_held_out_realisation_where_the_spread_sets_it():
    """The rule's own false-fail rate on the committed faithful records:
    each realisation judged by the gate the other three propose. It fails
    only where a stated budget binds for the others (there a realisation is
    alone in carrying an error the budget covers)."""
    from harness import results

    cat = catalog.load()
    measured = gates.faithful_records(results.DEFAULT_DIR)
    headroom = gates.held_out_headroom(cat, measured)
    assert headroom["margin"] > 1.25  # the old factor failed one realisation in ten
    for name, rset, variant, checks in gates.held_out_failures(cat, measured, headroom):
        floor = gates.budget(cat[name], rset)
        others = [r for r in measured[(name, rset)] if r.variant != variant]
        assert floor and all(getattr(r, gates.CHECKS[c]) <= getattr(floor, c) for r in others for c in checks
                             if c in gates.CHECKS), (name, rset, variant, checks)


def _adopt_gates():
    import importlib.util

    from harness import project

    spec = importlib.util.spec_from_file_location("adopt_gates", project.ROOT / "scripts" / "adopt_gates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_adopt_gates_writes_the_catalog_the_records_support():
    """scripts/adopt_gates.py derives the same gates as the tests above: on the
    committed records it leaves the catalog as it is (the faithful CUDA gates
    word for word, llama.cpp's wherever values and records stand); a changed
    measurement replaces its line, a new set's gate goes after the model's
    last gate line."""
    from harness import fetch

    adopt, cat, text = _adopt_gates(), catalog.load(), fetch.CATALOG.read_text()
    assert adopt.rewrite(text, adopt.faithful_lines(cat)) == text
    assert adopt.rewrite(text, adopt.gpu_lines(cat)) == text
    assert adopt.rewrite(text, adopt.llama_cpp_lines(cat, list(cat))) == text
    assert not adopt.llama_cpp_lines(cat, ["llama3-8b"])  # CUDA sets only: their gates are gpu_lines'

    lines = {k: v for k, v in adopt.gpu_lines(cat).items() if k[0] == "llama3-8b"}
    (key,) = [k for _, k in lines]
    assert key == "gpu-cuda"
    g = cat["llama3-8b"].gate("cuda")
    line = lines[("llama3-8b", key)]
    moved = line.replace(f"margin = {g.margin:g}", "margin = 9.9")
    assert moved != line
    out = adopt.rewrite(text, {("llama3-8b", key): moved, ("llama3-8b", "deep-cuda"): "gate.deep-cuda = {...}\n"})
    body = out.split("[models.llama3-8b]")[1].split("[models.")[0].splitlines()
    assert body.index(moved.rstrip("\n")) + 1 == body.index("gate.deep-cuda = {...}")
    assert out.count(f"margin = 9.9, logit = {g.logit:g}") == 1 and len(out.splitlines()) == len(text.splitlines()) + 1
    with pytest.raises(SystemExit, match="no llama.cpp variation record of the catalog's file for not-measured"):
        adopt.llama_cpp_lines(cat, ["qwen3-8b", "not-measured"])


def test_adopt_gates_places_a_first_gate_in_its_section_and_refuses_an_unknown_model():
    """A section without gate lines gets the new one after its body (a multi-line array's closing
    bracket included, never inside it); a model the catalog has no section for is one line."""
    adopt = _adopt_gates()
    text = ('[models.a]\nsource = "pypi"\npackages = [\n  "x==1",\n]\n\n# the next one\n[models.b]\n'
            'tier = "cpu"\ngate.cpu = { margin = 1 }  # old\n')
    out = adopt.rewrite(text, {("a", "cpu"): "gate.cpu = { margin = 2 }  # new\n"})
    assert out == text.replace(']\n\n', ']\ngate.cpu = { margin = 2 }  # new\n\n')
    import tomllib

    assert tomllib.loads(out)["models"]["a"]["gate"]["cpu"]["margin"] == 2
    with pytest.raises(SystemExit, match=r"has no \[models.c\] section for gate.cpu"):
        adopt.rewrite(text, {("c", "cpu"): "gate.cpu = { margin = 2 }\n"})
