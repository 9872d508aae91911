"""The gate's rules at their edges: each comparison is strict or not on
purpose, and each threshold is the one stated (harness/validate.py,
compare.py, gates.py, stats.py, refs.py). A change of `<` to `<=`, of
top-2 to top-3, of the headroom, or of a reference's precision fails here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import AnvilError
from harness import catalog, gates, refs, stats, validate
from harness.compare import CaseResult, Flip, compare_case


def flip(ref_margin, engine_margin, in_top2):
    return Flip(step=0, ref_token=1, engine_token=2, ref_margin=ref_margin, engine_margin=engine_margin,
                ref_in_engine_top2=in_top2)


def test_a_near_tie_is_strictly_below_the_threshold():
    t = 0.5
    assert validate.is_near_tie(flip(0.4999, 9.0, True), t)       # llama.cpp's margin under it, its token 2nd
    assert not validate.is_near_tie(flip(0.5, 9.0, True), t)      # at the threshold: not a near-tie
    assert validate.is_near_tie(flip(0.1, 0.4999, False), t)      # not in the top 2, but within the threshold
    assert not validate.is_near_tie(flip(0.1, 0.5, False), t)     # ...at it: a drift


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
    g = gates.propose(e, "cpu", spread)
    assert (g.margin, g.logit, g.kl) == (1.2, 2.5, 0.47)  # 1.25 x 1.0 (2 digits), 1.25 x 2.0, 1.5625 x 0.3
    # an fp32 comparison never goes under its stated budget
    assert gates.propose(e, "twin", [SimpleNamespace(max_margin_shift=0.0, max_logit_diff=0.0, max_kl=0.0)]) == \
        gates.FP32_BUDGET


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
