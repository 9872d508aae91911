"""The rounding-faithful oracle (engine/backends/numpy/faithful.py) and the
ops check that holds an engine to it op by op (harness/anchored.py), on the
CPU: the NumPy engine itself plays the engine under test."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends.numpy import faithful
from engine.backends.numpy import ops as np_ops
from engine.quants import QType
from harness import anchored, catalog, gates, refs, validate


def test_bf16_rounds_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)  # bf16's step at 1
    x = np.array([one, one + ulp / 2, one + ulp * 1.5, one + ulp / 4, one + ulp * 0.75, -3.0e38, np.inf], np.float32)
    want = np.array([1.0, 1.0, 1.0 + 2 * ulp, 1.0, 1.0 + ulp, -3.0e38, np.inf], np.float32)  # ties to even
    got = faithful.bf16(x)
    assert np.array_equal(got[:5], want[:5]) and got[6] == np.inf
    assert got[5] == np.float32(-2.9998e38) or abs(got[5] / -3.0e38 - 1) < 2 ** -8
    assert np.isnan(faithful.bf16(np.array([np.nan], np.float32)))[0]


def test_products_take_the_cuda_paths():
    rng = np.random.default_rng(1)
    w = faithful.Weight(rng.standard_normal((8, 64)).astype(np.float32), QType.Q4_K)
    x1, x3 = rng.standard_normal((1, 64)).astype(np.float32), rng.standard_normal((3, 64)).astype(np.float32)
    exact = lambda x: (x.astype(np.float64) @ w.values.T.astype(np.float64)).astype(np.float32)  # noqa: E731
    gemv, gemm = faithful.product(x1, w), faithful.product(x3, w)
    # int8 activations in decode, bf16 inputs in prefill: each near, neither equal, to the exact product
    for got, want in ((gemv, exact(x1)), (gemm, exact(x3))):
        assert not np.array_equal(got, want) and np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert np.array_equal(gemm, faithful.bf16(x3) @ faithful.bf16(w.values).T)
    f32 = faithful.Weight(w.values, QType.F32)
    assert np.array_equal(faithful.product(x3, f32), x3 @ w.values.T)


def test_tensor_core_attention_is_the_online_softmax_with_f16_p(monkeypatch):
    rng = np.random.default_rng(2)
    T, H, Hkv, D = 150, 4, 2, 64  # three query tiles, three key tiles
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    k = faithful.f16(rng.standard_normal((T, Hkv, D)).astype(np.float32))
    v = faithful.f16(rng.standard_normal((T, Hkv, D)).astype(np.float32))
    pos = np.arange(T)
    want = np_ops.attention(faithful.f16(faithful.f16(q) * faithful.f16(np.float32(0.125))), k, v, pos, 1.0)
    got = faithful.attention_tc(q, k, v, pos, 0.125)
    err = anchored.rel_error(got, want)
    assert 1e-6 < err < 1e-3  # P in f16: near, not equal
    monkeypatch.setattr(faithful, "f16", lambda a: np.asarray(a, np.float32))  # no rounding at all
    exact = np_ops.attention(q, k, v, pos, 0.125)
    assert anchored.rel_error(faithful.attention_tc(q, k, v, pos, 0.125), exact) < 1e-6
    # a window: keys from each query tile's first visible one
    assert anchored.rel_error(faithful.attention_tc(q, k, v, pos, 0.125, window=40),
                              np_ops.attention(q, k, v, pos, 0.125, window=40)) < 1e-6


def _case(name: str):
    e = catalog.entry(name)
    return catalog.model_path(name, progress=False), refs.for_entry(e, "cpu").cases[0]


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen35", "tiny-gemma3"])
def test_ops_check_passes_the_oracle_itself_and_fails_the_exact_engine(name):
    """Every op of the faithful NumPy engine equals the oracle's on its own
    inputs; the exact engine (no int8, bf16 or f16 rounding) fails where
    those roundings are: the check can fail."""
    path, case = _case(name)
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    same = anchored.check(engine.load(path, backend="numpy", rounding="cuda"), oracle, case.prompt_ids[:40],
                          case.tokens[:2])
    assert same and not anchored.over(same) and max(e.error for e in same) == 0.0
    exact = anchored.check(engine.load(path, backend="numpy"), oracle, case.prompt_ids[:40], case.tokens[:2])
    failed = {e.op for e in anchored.over(exact)}
    assert {"matmuls", "kv store"} <= failed, failed


def test_ops_check_finds_a_planted_bug_in_one_op(monkeypatch):
    """A bug in one operator of the engine under test (its RMSNorm's eps ten
    times too large) is named at that op; its neighbours, fed the engine's
    own inputs, stay within budget."""
    path, case = _case("tiny-llama")
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    model = engine.load(path, backend="numpy", rounding="cuda")
    buggy = faithful.FaithfulOps(True)
    monkeypatch.setattr(buggy, "rms_norm", lambda x, w, eps: np_ops.rms_norm(x, w, 10 * eps + 1e-2), raising=False)
    model.ops = buggy
    failed = {e.op for e in anchored.over(anchored.check(model, oracle, case.prompt_ids[:30], case.tokens[:2]))}
    assert failed == {"rms_norm"}, failed


def test_rope_budget_grows_with_the_position():
    assert gates.op_budget("matmul", 4000) == gates.OP_BUDGET_DEFAULT
    assert gates.op_budget("rope", 0) == gates.OP_BUDGET_DEFAULT
    assert gates.op_budget("qk_norm_rope", 4096) == pytest.approx(gates.OP_BUDGET_DEFAULT + 4096 * 2.0 ** -22)


def test_judge_ops_turns_errors_into_one_failure_per_op(monkeypatch):
    e = catalog.entry("tiny-llama")
    errors = [anchored.OpError("decode", 1, "matmul", 0, 2e-6, 1e-5), anchored.OpError("decode", 2, "glu", 0, 3e-3, 1e-5),
              anchored.OpError("decode", 3, "glu", 0, 5e-3, 1e-5), anchored.OpError("prefill", 0, "attention", 0,
                                                                                  float("nan"), 1e-4)]
    monkeypatch.setattr(anchored, "check_entry", lambda entry, ref, quiet=True: errors)
    out = validate.ModelResult("tiny-llama", "oracle", "cuda", e.gate("cuda", "oracle"))
    validate.judge_ops(out, e, None)
    assert [f.check for f in out.failures] == ["ops", "ops"]
    assert "layer 3 glu" in out.failures[0].detail and "attention" in out.failures[1].detail
    assert out.ops["decode glu"] == [5e-3, 1e-5] and not out.passed
    assert "ops: decode layer 3 glu" in validate.format_failures([out])


def test_cuda_gates_of_cpu_made_sets_are_the_faithful_oracles_measurement():
    """Every gate.<cpu|twin|oracle>-cuda in the catalog is what the committed
    measurements of the faithful oracle (`harness reference --variation
    --faithful --save`) support, re-derived here: the CUDA engine's model-level
    bounds come from a measurement that excludes it, never a multiple of
    another bound."""
    from harness import results

    cat = catalog.load()
    measured = gates.faithful_records(results.DEFAULT_DIR)
    headroom = gates.held_out_headroom(cat, measured)
    checked = 0
    for name, e in cat.items():
        for s in e.reference_sets:
            if catalog.REFERENCE_SETS[s] != "cpu" or e.gate("cuda", s) is None:
                continue
            spread = measured.get((name, s))
            assert spread, f"no faithful-oracle measurement of {name} against its {s} references"
            assert {r.variant for r in spread} == set(gates.FAITHFUL_VARIANTS), (name, s)  # every realisation
            assert e.gate("cuda", s) == gates.propose_measured(e, s, spread, headroom), (name, s)
            checked += 1
    assert checked >= 30


class _HostFolded:
    """cuda Folded's norm fold on the host: a one-row RMSNorm is held back
    (its output left empty), a glu reading that output takes it, anything
    else settles it first."""

    def __init__(self, inner, fold_eps_factor=1.0):
        self.inner, self.factor, self._pending = inner, fold_eps_factor, None

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def op(*args, **kw):
            self.settle()
            return fn(*args, **kw)
        return op if callable(fn) else fn

    def rms_norm(self, x, w, eps):
        self.settle()
        if x.shape[0] > 1 or w is None:
            return self.inner.rms_norm(x, w, eps)
        y = np.zeros_like(x)
        self._pending = {"x": x, "w": w, "eps": eps, "y": y}
        return y

    def glu(self, x, w_gate, w_up, activation):
        p = self._pending
        if p is not None and x is p["y"]:
            self._pending = None
            return self.inner.glu(p["x"], w_gate, w_up, activation, norm=(p["w"], p["eps"] * self.factor))
        self.settle()
        return self.inner.glu(x, w_gate, w_up, activation)

    def settle(self):
        p, self._pending = self._pending, None
        if p is not None:
            p["y"][...] = self.inner.rms_norm(p["x"], p["w"], p["eps"])


def _fold_inputs(seed: int):
    """A decode row, an RMSNorm weight and Q4_K gate/up weights for the fold tests."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 256)).astype(np.float32) * 3
    w = (1 + 0.3 * rng.standard_normal(256)).astype(np.float32)
    wg, wu = (faithful.Weight(rng.standard_normal((64, 256)).astype(np.float32), QType.Q4_K) for _ in range(2))
    return rng, faithful.FaithfulOps(True), x, w, wg, wu


def test_faithful_norm_fold_is_the_norm_then_the_glu():
    """The fold rounds x·w to int8 and scales the sums by 1/rms after: the
    same product as RMSNorm then the GEMV, up to fp32 rounding."""
    _, ops, x, w, wg, wu = _fold_inputs(4)
    folded = ops.glu(x, wg, wu, "silu", norm=(w, 1e-6))
    assert anchored.rel_error(folded, ops.glu(ops.rms_norm(x, w, 1e-6), wg, wu, "silu")) < 1e-6
    assert anchored.rel_error(ops.glu(x, wg, wu, "silu", norm=(w, 1e-2)), folded) > 1e-4


def test_ops_check_judges_the_decode_fold():
    """The folded pass: the norm an engine folds into gate/up is judged
    inside the glu ("glu norm"), a norm it does not fold on its own; a fold
    with the wrong eps fails there and nowhere else."""
    path, case = _case("tiny-llama")
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    for factor, bad in ((1.0, set()), (1e5, {"glu norm"})):
        model = engine.load(path, backend="numpy", rounding="cuda")
        model.ops = _HostFolded(model.ops, factor)
        errors = anchored.check(model, oracle, case.prompt_ids[:30], case.tokens[:2], folded=True)
        assert any(e.op == "glu norm" and e.phase == "decode" for e in errors)
        assert {e.op for e in anchored.over(errors)} == bad


def test_the_faithful_decode_folds_the_norm_the_next_glu_reads():
    """As CUDA's Folded: a decode RMSNorm read by the very next op, a glu, is
    folded into it; any op between settles it (the glu then reads the norm's
    output); prefill rows and ``unfolded`` never fold."""
    rng, ops, x, w, wg, wu = _fold_inputs(5)
    folded = ops.glu(x, wg, wu, "silu", norm=(w, 1e-6))
    plain = ops.unfolded.glu(ops.unfolded.rms_norm(x, w, 1e-6), wg, wu, "silu")
    assert not np.array_equal(folded, plain)  # the same product, rounded another way
    m = ops.rms_norm(x, w, 1e-6)
    assert np.array_equal(ops.glu(m, wg, wu, "silu"), folded)
    m = ops.rms_norm(x, w, 1e-6)
    ops.swiglu(x, x)  # an op between: the norm was launched, the glu reads it
    assert np.array_equal(ops.glu(m, wg, wu, "silu"), plain)
    x8 = rng.standard_normal((faithful.GEMV_MAX_TOKENS + 1, 256)).astype(np.float32)
    m8 = ops.rms_norm(x8, w, 1e-6)
    assert np.array_equal(ops.glu(m8, wg, wu, "silu"), ops.unfolded.glu(ops.unfolded.rms_norm(x8, w, 1e-6), wg, wu,
                                                                          "silu"))


def _staged_moe(x, ids, weights, g, u, d, add=None, activation="silu", down_scale=None, hidden=faithful.bf16,
                x8=None):
    """The prefill MoE FFN made as cuda Ops.moe_ffn makes it, stage by stage
    (the arithmetic of the faithful oracle), each GEMM's input rounded for
    the GEMM its weight takes (moe_gemm.int8): ``hidden`` the bf16 rounding
    of the GLU output, ``x8`` the int8 one of x and of the hidden (as
    quants.quantize_x_int8: int8 and scales; default that):
    (the stages as moe_watch hands them over, the output)."""
    from engine.backends.cuda.launchers import moe_gemm
    from engine.quants import quantize_x_int8

    x8 = x8 or (lambda a: quantize_x_int8(a, 32))
    T, k = ids.shape
    E = g.shape[0]
    scaled = weights if down_scale is None else weights * down_scale[ids]
    pair_at = np.argsort(ids.reshape(-1), kind="stable").astype(np.int32)
    expert = ids.reshape(-1)[pair_at]

    def grouped(rows, wt):
        out = np.zeros((rows["bf16"].shape[0] if "bf16" in rows else rows["int8"].shape[0], wt.shape[1]), np.float32)
        a = rows["int8"] if moe_gemm.int8(wt.qtype) else rows["bf16"]
        for e in range(E):
            out[expert == e] = faithful.grouped_rows(a[expert == e], wt.expert(e))
        return out

    def rounded(a, name, bf16, weights_):  # the GEMM inputs the weights ask for, as the watch sees them
        rows, stage = {}, {}
        if not all(moe_gemm.int8(w.qtype) for w in weights_):
            rows["bf16"] = bf16(a)
            stage[f"{name}s"] = faithful.bf16_bits(rows["bf16"])
        if any(moe_gemm.int8(w.qtype) for w in weights_):
            q, sc = x8(a)
            rows["int8"] = (q.reshape(len(q), -1, 32) * sc[..., None].astype(np.float64)).reshape(q.shape)
            sums = sc * q.reshape(len(q), -1, 32).astype(np.int32).sum(axis=2).astype(np.float32)
            stage |= {f"{name}q": q, f"{name}d": sc, f"{name}sum": sums}
        return rows, stage

    xrows, xstage = rounded(x[pair_at // k], "x", faithful.bf16, (g, u))
    gg, uu = grouped(xrows, g), grouped(xrows, u)
    h = (np_ops.swiglu if activation == "silu" else np_ops.geglu)(gg, uu)
    hrows, hstage = rounded(h, "h", hidden, (d,))
    dd = grouped(hrows, d)
    pos_of = np.argsort(pair_at)
    y = sum(dd[pos_of[np.arange(T) * k + j]] * scaled[:, j:j + 1] for j in range(k))
    y = y if add is None else add + y
    return {"gather": {"pair_at": pair_at, "weights": scaled, **xstage},
            "gate_up": {"g": gg, "u": uu}, "glu": {"h": h, **hstage}, "down": {"d": dd}}, y


def _truncate(a):
    return (np.asarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_moe_stages_name_the_stage_that_parts(activation):
    """anchored.moe_stage_errors on stages made as the oracle makes them:
    every stage exact; the hidden truncated to bf16 (not rounded) shows in
    that stage alone, each stage being judged on the stage before as the
    engine left it; a wrong expert scale and a wrong sort are named."""
    rng = np.random.default_rng(0)
    T, k, E, n_embd, n_ff = 9, 2, 4, 64, 32
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    weights = rng.uniform(0.1, 1, (T, k)).astype(np.float32)
    add = rng.standard_normal((T, n_embd)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, E).astype(np.float32)
    w = {n: faithful.Weight(rng.standard_normal(s).astype(np.float32), QType.F32)
         for n, s in (("g", (E, n_ff, n_embd)), ("u", (E, n_ff, n_embd)), ("d", (E, n_embd, n_ff)))}
    args = (x, ids, weights, w["g"], w["u"], w["d"], add, activation, scale)
    want = faithful.FaithfulOps(kv_f16=True).moe_ffn(*args[:6], add=add, activation=activation, down_scale=scale)
    got, y = _staged_moe(*args)
    assert anchored.rel_error(y, want) < 1e-6  # the stages make the op
    errors = anchored.moe_stage_errors(*args, got, y)
    assert max(errors.values()) == 0.0, errors
    errors = anchored.moe_stage_errors(*args, *_staged_moe(*args, hidden=_truncate))
    assert errors["bf16 hidden"] > 1e-3
    assert max(v for s, v in errors.items() if s != "bf16 hidden") == 0.0, errors
    unscaled, y = _staged_moe(*args[:8])  # the expert scale dropped
    assert anchored.moe_stage_errors(*args, unscaled, y)["expert scale"] > 1e-2
    got["gather"]["pair_at"] = got["gather"]["pair_at"][::-1].copy()
    assert anchored.moe_stage_errors(*args, got, y)["sort"] == float("inf")


def _flip_int8(q8):
    """An int8 rounding that truncates instead of rounding to nearest."""
    from engine.quants import quantize_x_int8

    def wrong(a):
        q, d = quantize_x_int8(a, 32)
        groups = np.asarray(a, np.float64).reshape(len(a), -1, 32) / np.where(d > 0, d, 1)[..., None]
        return np.trunc(groups).astype(np.int8).reshape(q.shape), d
    return wrong


@pytest.mark.parametrize("down_type", [QType.Q6_K, QType.F32])
def test_moe_stages_on_the_int8_gemm(monkeypatch, down_type):
    """With the int8 grouped GEMM switched on (moe_gemm.INT8), block-type
    experts take int8 groups of 32 and the stages check them: each rounding
    exact, its group sums, the GEMMs on the engine's own int8 rows; an int8
    rounding that truncates is named at its stage alone. A down projection of
    a type without the int8 GEMM keeps its bf16 hidden beside int8 gate/up."""
    from engine.backends.cuda.launchers import moe_gemm

    monkeypatch.setattr(moe_gemm, "INT8", True)
    rng = np.random.default_rng(1)
    T, k, E, n_embd, n_ff = 9, 2, 4, 64, 64
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    weights = rng.uniform(0.1, 1, (T, k)).astype(np.float32)
    w = {n: faithful.Weight(rng.standard_normal(sh).astype(np.float32), t)
         for n, sh, t in (("g", (E, n_ff, n_embd), QType.Q4_K), ("u", (E, n_ff, n_embd), QType.Q8_0),
                          ("d", (E, n_embd, n_ff), down_type))}
    args = (x, ids, weights, w["g"], w["u"], w["d"], None, "silu", None)
    want = faithful.FaithfulOps(kv_f16=True).moe_ffn(*args[:6])
    got, y = _staged_moe(*args)
    assert anchored.rel_error(y, want) < 1e-6
    errors = anchored.moe_stage_errors(*args, got, y)
    hidden = "int8 hidden" if down_type == QType.Q6_K else "bf16 hidden"
    assert {"gather (int8 x)", "gather (int8 x) sums", hidden} <= set(errors) and "gather (bf16 x)" not in errors
    assert max(errors.values()) == 0.0, errors
    bad = anchored.moe_stage_errors(*args, *_staged_moe(*args, x8=_flip_int8(None)))
    parted = {s for s, v in bad.items() if v > 1e-3}
    assert parted == ({"gather (int8 x)", "int8 hidden"} if down_type == QType.Q6_K else {"gather (int8 x)"}), bad
    got["gather"]["xsum"] = got["gather"]["xsum"] * np.float32(1.001)
    assert anchored.moe_stage_errors(*args, got, y)["gather (int8 x) sums"] > 1e-4


class _StagedOps(faithful.FaithfulOps):
    """The faithful operators with cuda Ops' ``moe_watch``: the prefill MoE FFN
    made stage by stage (_staged_moe), each stage handed to the watch; ``hidden``
    its rounding of the GLU output."""

    def __init__(self, hidden=faithful.bf16):
        super().__init__(kv_f16=True)
        self.moe_watch, self.hidden = None, hidden

    def moe_ffn(self, x, ids, weights, gate_exps, up_exps, down_exps, add=None, activation="silu",
                down_scale=None):
        if x.shape[0] <= faithful.GEMV_MAX_TOKENS:
            return super().moe_ffn(x, ids, weights, gate_exps, up_exps, down_exps, add, activation, down_scale)
        stages, y = _staged_moe(x, ids, weights, gate_exps, up_exps, down_exps, add, activation, down_scale,
                                self.hidden)
        for stage, arrays in stages.items():
            (self.moe_watch or (lambda *a: None))(stage, arrays)
        return y


def test_ops_check_judges_the_prefill_moe_by_its_stages():
    """Where the engine's operators hand the MoE FFN's stages to a watch (cuda
    Ops.moe_watch; here the faithful operators made to), the ops check judges
    the prefill op stage by stage against gates.OP_BUDGET_DEFAULT and not as
    a whole; decode's op as a whole. The hidden truncated is named at its
    stage."""
    path, case = _case("tiny-qwen3moe")
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    model = engine.load(path, backend="numpy", rounding="cuda")
    model.ops = _StagedOps()
    errors = anchored.check(model, oracle, case.prompt_ids[:40], case.tokens[:2])
    moe = {(e.phase, e.op) for e in errors if e.op.startswith("moe_ffn")}
    assert ("prefill", "moe_ffn") not in moe and ("decode", "moe_ffn") in moe
    stages = {op for phase, op in moe if phase == "prefill"}
    assert stages == {f"moe_ffn {s}" for s in ("sort", "expert scale", "gather (bf16 x)", "gate GEMM", "up GEMM",
                                                "GLU", "bf16 hidden", "down GEMM", "combine")}, stages
    assert not anchored.over(errors) and all(e.bound == gates.OP_BUDGET_DEFAULT for e in errors
                                             if e.op.startswith("moe_ffn "))
    model.ops = _StagedOps(hidden=_truncate)
    bad = {(e.phase, e.op) for e in anchored.over(anchored.check(model, oracle, case.prompt_ids[:40], case.tokens[:2]))}
    assert bad == {("prefill", "moe_ffn bf16 hidden")}, bad


@pytest.mark.parametrize("int8", [False, True])
def test_cuda_prefill_moe_hands_its_stages_to_the_watch(monkeypatch, int8):
    """The CUDA prefill MoE FFN, run on the recording device (no GPU), hands
    ``Ops.moe_watch`` the stages and arrays scripts/gpu/moe_stages.py gives
    moe_stage_errors, once per MoE layer, in the order it makes them: each
    GEMM's input in bf16, or as int8 groups where its experts take the int8
    GEMM (moe_gemm.INT8; tiny-qwen3moe's experts are Q4_K and Q6_K)."""
    from engine.backends.cuda.launchers import moe_gemm
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model

    monkeypatch.setattr(moe_gemm, "INT8", int8)
    dev = RecordingDevice(False)
    model = Model(catalog.model_path("tiny-qwen3moe", progress=False), backend="cuda", eager=True,
                  device=dev, cublas=RecordingCublas())
    ops = getattr(model.ops, "unfolded", model.ops)
    seen = []
    ops.moe_watch = lambda stage, arrays: seen.append((stage, sorted(arrays)))
    model.forward([1, 2, 3])
    layer = [("gather", ["pair_at", "weights", "xs"]), ("gate_up", ["g", "u"]), ("glu", ["h", "hs"]),
             ("down", ["d"])]
    if int8:
        layer[0], layer[2] = ("gather", ["pair_at", "weights", "xd", "xq", "xsum"]), ("glu", ["h", "hd", "hq", "hsum"])
    assert seen == layer * model.config.n_layer
    launched = {name for (_, name), *_ in dev.launches}
    assert ("moe_gemm_i8_q4_k" in launched) == int8 and ("moe_gemm_q4_k" in launched) != int8


def test_lazy_oracle_is_the_oracle_holding_a_few_matrices():
    """The oracle with lazy weights (faithful.LazyWeight: dequantised when
    an op reads them) judges as the eager one does, zero on the faithful
    engine, the exact engine past budget at the same ops; it never holds
    more than LAZY_KEEP matrices."""
    path, case = _case("tiny-qwen3moe")
    lazy = engine.load(path, backend="numpy", rounding="cuda", lazy=True)
    assert isinstance(lazy.layers[0].gate_exps, faithful.LazyWeight)
    same = anchored.check(engine.load(path, backend="numpy", rounding="cuda"), lazy, case.prompt_ids[:40],
                          case.tokens[:2])
    assert same and max(e.error for e in same) == 0.0
    assert len(faithful._LAZY) <= faithful.LAZY_KEEP
    eager = engine.load(path, backend="numpy", rounding="cuda")
    exact = engine.load(path, backend="numpy")
    judged = [[(e.phase, e.layer, e.op, e.output, e.error)
               for e in anchored.check(exact, o, case.prompt_ids[:40], case.tokens[:2])] for o in (lazy, eager)]
    assert judged[0] == judged[1] and any(e[-1] > 1e-4 for e in judged[0])
    with pytest.raises(engine.AnvilError, match="faithful oracle's only"):
        engine.load(path, backend="numpy", lazy=True)


def _ops_at_step():
    import importlib.util
    from pathlib import Path

    p = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "ops_at_step.py"
    spec = importlib.util.spec_from_file_location("ops_at_step", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ops_at_step_judges_the_steps_it_is_given(capsys, monkeypatch):
    """scripts/gpu/ops_at_step.py on the CPU (the faithful NumPy engine
    plays the CUDA one): the case's prompt and first STEP tokens run
    unchecked, STEPS decode steps judged, every op within budget; an engine
    with a planted bug (RMSNorm's eps) is named at that op; a case or step
    outside the set is one line and exit 2."""
    ops_at_step = _ops_at_step()
    args = ["tiny-qwen3moe", "--set", "cpu", "--case", "1", "--step", "5"]
    assert ops_at_step.main(args, backend="numpy") == 0
    out = capsys.readouterr().out
    assert "case 1, steps 5-6" in out and "decode rms_norm" in out and "every op within its budget" in out
    assert "prefill" not in out  # the prompt ran unchecked
    load = engine.load

    def buggy(path, **kw):
        m = load(path, **kw)
        if not kw.get("lazy"):
            ops = faithful.FaithfulOps(True)
            ops.rms_norm = lambda x, w, eps: np_ops.rms_norm(x, w, 10 * eps + 1e-2)
            m.ops = ops
        return m

    monkeypatch.setattr(engine, "load", buggy)
    assert ops_at_step.main(args, backend="numpy") == 1
    assert "OVER: decode layer" in capsys.readouterr().out
    monkeypatch.setattr(engine, "load", load)
    assert ops_at_step.main(["tiny-qwen3moe", "--set", "cpu", "--case", "9", "--step", "0"], backend="numpy") == 2
    assert ops_at_step.main(["tiny-qwen3moe", "--set", "cpu", "--case", "0", "--step", "999"], backend="numpy") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("ops_at_step: --") for e in err)
