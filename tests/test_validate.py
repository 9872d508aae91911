"""The gate bites: a perturbed engine fails validation; a flip is accepted
only as a near-tie under the threshold."""

from __future__ import annotations

import dataclasses
import types
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from harness import catalog, refs, validate
from harness.compare import Flip

MODEL = "tiny-llama-f32"  # exact parity: any real perturbation shows


@pytest.fixture
def fresh_model(model_path):
    import engine

    return engine.load(model_path(MODEL))


def _validate(model):
    e = catalog.entry(MODEL)
    return validate.validate_model(model, e, refs.load(refs.reference_path(MODEL, e.tier)), "numpy")


def test_unperturbed_engine_passes(fresh_model):
    r = _validate(fresh_model)
    assert r.passed and r.mode == "exact"
    assert r.to_json()["model_sha256"] == catalog.entry(MODEL).sha256  # the file judged, for the scoreboard


def test_wrong_rope_base_fails(fresh_model):
    cfg = fresh_model.config
    fresh_model.config = dataclasses.replace(cfg, rope_base=tuple(b * 1.5 for b in cfg.rope_base))
    fresh_model.cache.cfg = fresh_model.config
    r = _validate(fresh_model)
    assert not r.passed and r.drift


def test_skipped_norm_fails(fresh_model, monkeypatch):
    for w in fresh_model.layers:  # an FFN norm that does nothing: RMSNorm skipped, weight 1
        monkeypatch.setattr(w, "ffn_norm", None)
    import engine.backends.numpy.ops as ops

    real = ops.add_rms_norm
    monkeypatch.setattr(ops, "add_rms_norm", lambda x, a, w, eps: (x + a, x + a) if w is None else real(x, a, w, eps))
    r = _validate(fresh_model)
    assert not r.passed


def _flip(ref_margin, engine_gap, in_top2):
    return Flip(step=3, ref_token=1, engine_token=2, ref_margin=ref_margin, engine_margin=engine_gap,
                ref_in_engine_top2=in_top2)


def test_near_tie_only_under_threshold():
    assert validate.is_near_tie(_flip(0.05, 0.02, True), near_tie=0.1)
    assert not validate.is_near_tie(_flip(0.15, 0.02, True), near_tie=0.1)  # llama.cpp was sure
    # llama.cpp's token third in the engine, but within the threshold: a three-way tie
    assert validate.is_near_tie(_flip(0.05, 0.08, False), near_tie=0.1)
    assert not validate.is_near_tie(_flip(0.05, 0.5, False), near_tie=0.1)  # the engine was sure
    assert not validate.is_near_tie(_flip(0.05, 0.5, True), near_tie=0.1)  # ...with llama.cpp's token its 2nd too


def test_cli_exit_code_and_table():
    ok = subprocess.run([sys.executable, "-m", "harness.cli", "validate-catalog", "--model", MODEL, "--backend", "numpy"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "| tiny-llama-f32 | cpu | 128/128 | 128/128 | 0 | 0 / 0 |" in ok.stdout  # flips, their share / bound


def test_missing_reference_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from harness import cli

    monkeypatch.setattr(refs, "REFERENCES_DIR", tmp_path)
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy"]) == 1
    err = capsys.readouterr().err
    assert "no llama.cpp reference" in err and f"harness reference --tier cpu --model {MODEL}" in err


def test_drift_exits_nonzero(monkeypatch, capsys):
    """The CLI's exit code follows the verdict (a perturbed RoPE base)."""
    from engine import config
    from harness import cli

    real = config.ModelConfig.from_gguf
    monkeypatch.setattr(config.ModelConfig, "from_gguf", classmethod(
        lambda cls, gf: dataclasses.replace(real(gf), rope_base=tuple(2 * b for b in real(gf).rope_base))))
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy"]) == 1
    assert "FAIL: " in capsys.readouterr().out


def test_save_appends_a_validate_record(tmp_path, monkeypatch, capsys):
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--save"]) == 0
    (rec,) = results.load_all(tmp_path, kind="validate")
    (entry,) = rec["results"]
    assert entry["model"] == MODEL and entry["passed"] and entry["mode"] == "exact" and rec["backend"] == "numpy"
    import platform

    from engine.bench import build_hash

    # what ties a speed figure to it (harness/report/validated.py): build, host, date
    assert (rec["build"], rec["host"]) == (build_hash(), platform.node()) and rec["date"]


def test_several_models_in_one_run(tmp_path, monkeypatch):
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["validate-catalog", "--model", MODEL, "--model", "tiny-qwen3-f32", "--model", MODEL,
                     "--backend", "numpy", "--save"]) == 0
    (rec,) = results.load_all(tmp_path, kind="validate")
    assert [r["model"] for r in rec["results"]] == [MODEL, "tiny-qwen3-f32"]  # in order, each once


def test_gate_per_backend_and_reference_set():
    g, gc = catalog.Gate(0.01, 1e-3, 1e-6), catalog.Gate(0.2)
    e = catalog.Entry("m", "synth", "cpu", "", "llama", gates={"cpu": g, "cpu-cuda": gc})
    assert e.gate("numpy") == g and e.gate("cuda") == gc and e.gate("cuda", "gpu") is None
    # every cpu-tier reference set is judged on all three measures for the NumPy engine
    # (the oracle set is the NumPy engine's own: only the CUDA engine is judged against it)
    from engine.backends.cuda import PENDING_ARCHS  # not run by the CUDA engine yet: no CUDA gates

    for name, e in catalog.load().items():
        for s in e.reference_sets:
            if catalog.REFERENCE_SETS[s] == "cpu":
                for backend in ("numpy", "cuda") if s != "oracle" else ("cuda",):
                    if backend == "cuda" and e.arch in PENDING_ARCHS:
                        continue
                    gate = e.gate(backend, s)
                    assert gate and gate.margin > 0 and gate.logit > 0 and gate.kl > 0, (name, s, backend)


def test_a_model_checked_against_two_reference_sets(tmp_path, monkeypatch, capsys):
    """A small real model can carry cpu-tier references (CI) and gpu-tier ones
    (llama.cpp with CUDA): each pair is validated with its own gate, and a
    set without a gate for the backend is reported, not silently skipped."""
    import shutil

    from harness import cli, results

    for tier in ("cpu", "gpu"):  # the gpu set here is a copy: the mechanism, not the numbers
        (tmp_path / "refs" / tier).mkdir(parents=True)
        shutil.copy(refs.reference_path(MODEL, "cpu"), tmp_path / "refs" / tier / f"{MODEL}.json")
    monkeypatch.setattr(refs, "REFERENCES_DIR", tmp_path / "refs")
    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path / "results")
    real = catalog.load

    def load(path=None, gpu_gate=catalog.Gate(0.05, 0.01, 1e-6)):
        cat = real(path)
        gates = dict(cat[MODEL].gates)
        if gpu_gate:
            gates["gpu"] = gpu_gate
        cat[MODEL] = dataclasses.replace(cat[MODEL], references=("cpu", "gpu"), gates=gates)
        return cat

    monkeypatch.setattr(catalog, "load", load)
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "gpu", "--save"]) == 0
    assert "| tiny-llama-f32 | gpu | 128/128 |" in capsys.readouterr().out
    (rec,) = results.load_all(tmp_path / "results", kind="validate")
    assert [(r["tier"], r["near_tie"], r["gate"]["logit"]) for r in rec["results"]] == [("gpu", 0.05, 0.01)]
    # the NumPy default checks the cpu tier only
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy"]) == 0
    assert "| tiny-llama-f32 | cpu | 128/128 |" in capsys.readouterr().out
    # no gate for the gpu set: nothing to judge is an error naming the catalog key
    monkeypatch.setattr(catalog, "load", lambda path=None: load(path, gpu_gate=None))
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "gpu"]) == 1
    assert "gate.<set>" in capsys.readouterr().err
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "cpu"]) == 0


def test_catalog_flip_shares_are_shares(tmp_path):
    bad = tmp_path / "catalog.toml"
    bad.write_text('[models.m]\nsource = "synth"\npreset = "tiny-llama"\ntier = "cpu"\narch = "llama"\n'
                   'gate.cpu = { margin = 0.5, flips = 3 }\n')
    with pytest.raises(catalog.AnvilError, match=r"flips are a share of a prompt's steps, 0 to 1 \(got \{'cpu': 3.0\}\)"):
        catalog.load(bad)
    bad.write_text(bad.read_text().replace("flips = 3", "flips = 0.25"))
    assert catalog.load(bad)["m"].gate("numpy").flips == 0.25


def test_catalog_tiers_are_checked(tmp_path):
    bad = tmp_path / "catalog.toml"
    bad.write_text('[models.m]\nsource = "synth"\npreset = "tiny-llama"\ntier = "cpu"\narch = "llama"\n'
                   'references = ["gpu"]\n')
    with pytest.raises(catalog.AnvilError, match="that includes it"):
        catalog.load(bad)


def test_gpu_references_refuse_a_cpu_only_llama_cpp(monkeypatch):
    """A llama.cpp build without CUDA ignores n_gpu_layers: its output must
    not be stored as a gpu-tier (llama.cpp CUDA) reference."""
    import types

    from harness import reference

    fake = types.SimpleNamespace(__version__="0.0-test", llama_supports_gpu_offload=lambda: False,
                                 Llama=lambda **kw: pytest.fail("llama.cpp should not have been started"))
    monkeypatch.setattr(reference, "llama_cpp", fake)
    with pytest.raises(reference.AnvilError, match="built with CUDA"):
        reference.make_reference("m", "m.gguf", "", ["hi"], 2, settings=reference.GPU_SETTINGS)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python not installed (scripts/llamacpp-python.sh)")
def test_llama_cpp_variation_is_measured_like_the_engine(tmp_path, monkeypatch, capsys):
    """`harness reference --variation`: llama.cpp under other settings, held
    against its own reference by the engine's comparison code; the gate it
    supports is printed beside the catalog's, nothing written."""
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["reference", "--variation", "--model", MODEL, "--save"]) == 0
    (rec,) = results.load_all(tmp_path, kind="variation")
    by = {r["variant"]: r for r in rec["results"]}
    # an fp32 comparison: only settings that keep fp32 count as noise (flash attention rounds K/V to f16)
    assert set(by) == {"ubatch-1", "threads-1"} and rec["device"].startswith("cpu:")
    assert by["ubatch-1"]["settings"]["n_ubatch"] == 1 and by["threads-1"]["settings"]["n_threads"] == 1
    assert all(r["max_logit_diff"] < 1e-3 for r in by.values())
    out = capsys.readouterr().out
    assert "| tiny-llama-f32 | gate.cpu.logit |" in out and "| 0.001 | 0.001 | same |" in out


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python not installed (scripts/llamacpp-python.sh)")
def test_the_f16kv_set_is_made_and_judged_with_an_f16_kv_cache(tmp_path, monkeypatch):
    """`harness reference --tier f16kv`: llama.cpp on the CPU with the set's
    own settings (catalog.SET_SETTINGS: an F16 KV cache), the cpu set's
    otherwise; validate-catalog loads either engine with the KV type a
    reference states (validate.Loaded): F16 against this set, F32 against cpu."""
    import engine
    from harness import cli

    e = catalog.entry("tiny-llama")
    cpu = refs.for_entry(e, "cpu")
    committed = refs.for_entry(e, "f16kv")
    assert committed.settings == {**cpu.settings, "type_k": "f16", "type_v": "f16"}
    monkeypatch.setattr(refs, "REFERENCES_DIR", tmp_path)
    assert cli.main(["reference", "--tier", "f16kv", "--model", e.name]) == 0
    made = refs.load(refs.reference_path(e.name, "f16kv"))
    assert made.settings == committed.settings
    assert [c.prompt_ids for c in made.cases] == [c.prompt_ids for c in cpu.cases]

    loaded = validate.Loaded(catalog.load(), "numpy", quiet=True)
    assert loaded.get(e, made)[0].backend.kv_f16 is True
    assert loaded.get(e, cpu)[0].backend.kv_f16 is False
    asked = []
    monkeypatch.setattr(engine, "load", lambda path, **kw: asked.append(kw) or types.SimpleNamespace())
    for ref in (made, cpu):
        validate.Loaded(catalog.load(), "cuda", quiet=True).get(e, ref)
    assert [kw["kv_f16"] for kw in asked] == [True, False] and {kw["backend"] for kw in asked} == {"cuda"}


def test_variation_refuses_a_reference_of_another_file(monkeypatch, capsys):
    """llama.cpp run on a new file against outputs of an old one would pass
    for its own spread: refused, as validate-catalog refuses it."""
    from harness import cli

    real = catalog.load

    def load(path=None):
        cat = real(path)
        cat[MODEL] = dataclasses.replace(cat[MODEL], sha256="0" * 64)
        return cat

    monkeypatch.setattr(catalog, "load", load)
    assert cli.main(["reference", "--variation", "--model", MODEL]) == 1
    assert "different file than the catalog pins" in capsys.readouterr().err
    assert cli.main(["reference", "--model", MODEL, "--save"]) == 1
    assert "--save and --faithful go with --variation" in capsys.readouterr().err


# ---- the logit-level verdict and degenerate output ---------------------------------

def test_topk_kl():
    from harness.compare import topk_kl

    assert topk_kl([3.0, 1.0, 0.0], [3.0, 1.0, 0.0]) == 0.0
    assert topk_kl([3.0, 1.0, 0.0], [13.0, 11.0, 10.0]) < 1e-12  # a constant shift is the same distribution
    p = np.exp([3.0, 1.0, 0.0]) / np.exp([3.0, 1.0, 0.0]).sum()
    q = np.exp([1.0, 3.0, 0.0]) / np.exp([1.0, 3.0, 0.0]).sum()
    assert topk_kl([3.0, 1.0, 0.0], [1.0, 3.0, 0.0]) == pytest.approx(float(np.sum(p * np.log(p / q))))


def test_repetition_loop():
    from harness.compare import repetition_loop

    assert repetition_loop([5, 6, 7] + [1, 2] * 6) == 2
    assert repetition_loop([9] * 12) == 1
    assert repetition_loop(list(range(32))) == 0
    assert repetition_loop([1, 2] * 5) == 0  # too short to call a loop


class _Scripted:
    """A model whose logits are scripted per position: a fake engine for the gate."""

    def __init__(self, fn, n_vocab=8, eos=7):
        self.fn, self.n_ctx, self.pos = fn, 64, 0
        self.config = types.SimpleNamespace(eos_token_id=eos, n_vocab=n_vocab)
        self._logits = None

    def reset(self):
        self.pos = 0

    def forward(self, tokens):
        from engine.errors import NonFiniteLogits

        self.pos += len(tokens)
        self._logits = np.asarray(self.fn(self.pos), np.float32)
        if not np.isfinite(self._logits).all():  # as the engine does
            raise NonFiniteLogits("scripted", self.pos - 1)
        return self._logits

    def decode_next(self, token):
        return int(np.argmax(self.forward([token])))

    def decode_logits(self):
        return self._logits


def _case(logits_at, n=14):
    from harness.refs import Case

    rows = [np.asarray(logits_at(3 + i), np.float32) for i in range(n)]
    order = [np.argsort(-r, kind="stable")[:4] for r in rows]
    return Case("p", [1, 2, 3], [int(o[0]) for o in order], [o.tolist() for o in order],
                [r[o].tolist() for r, o in zip(rows, order)])


def _ref_logits(pos):
    r = np.zeros(8, np.float32)
    r[pos % 6] = 4.0  # a decisive, never-repeating-within-period-4 sequence
    r[(pos + 1) % 6] = 1.0
    return r


def test_a_monotonic_change_fails_on_logits_not_tokens():
    """A softcap-like squash never changes the argmax: only the logit-level checks see it."""
    from harness.compare import compare_case

    e = catalog.Entry("m", "synth", "cpu", "", "llama")
    gate = catalog.Gate(margin=0.1, logit=0.05, kl=1e-4)
    case = _case(_ref_logits)
    ref = types.SimpleNamespace(cases=[case], model_sha256="")
    ok = validate.validate_model(_Scripted(_ref_logits), e, ref, "numpy", gate=gate)
    assert ok.passed and ok.mode == "exact"
    squashed = _Scripted(lambda pos: 3.0 * np.tanh(_ref_logits(pos) / 3.0))
    r = validate.validate_model(squashed, e, ref, "numpy", gate=gate)
    assert compare_case(squashed, case).matched == len(case.tokens)  # every token still right
    assert not r.passed and {f.check for f in r.failures} == {"logit", "kl", "margin"}
    line = validate.format_failures([r]).splitlines()[0]
    assert line.startswith("FAIL m (cpu references, numpy) prompt 0 'p' step 0:")
    assert "where:" not in validate.format_failures([r])  # the NumPy engine is the oracle itself
    r.backend = "cuda"  # a CUDA run's failures say where the ops check looks, once, after them
    lines = validate.format_failures([r]).splitlines()
    assert lines[0].startswith("FAIL m (cpu references, cuda) prompt 0 'p' step 0:")
    assert [ln for ln in lines if "where:" in ln] == [lines[-1]]
    assert lines[-1].startswith("  where: python3 scripts/gpu/ops_at_step.py m --set cpu --case 0 --step 0 ")


def test_degenerate_output_fails_with_its_own_message():
    e = catalog.Entry("m", "synth", "cpu", "", "llama")
    gate = catalog.Gate(margin=100.0, logit=100.0, kl=100.0)  # only the degenerate check can fail
    ref = types.SimpleNamespace(cases=[_case(_ref_logits)], model_sha256="")
    nan = _Scripted(lambda pos: np.full(8, np.nan))
    stop = _Scripted(lambda pos: np.eye(8)[7] * 5)
    loop = _Scripted(lambda pos: _ref_logits(pos) if pos < 5 else np.eye(8)[pos % 2] * 5)
    for model, words in ((nan, "non-finite logits"), (stop, "stop token 7 at step 0"), (loop, "repetition loop")):
        r = validate.validate_model(model, e, ref, "numpy", gate=gate)
        assert not r.passed and any(f.check == "degenerate" and words in f.detail for f in r.failures), words


def test_first_failure_stops_after_the_first_failing_prompt():
    """`harness mutants` judges a pair only up to the first prompt that fails:
    the same verdict, the prompts after it not run; a passing run is judged whole."""
    e = catalog.Entry("m", "synth", "cpu", "", "llama")
    gate = catalog.Gate(margin=0.1, logit=0.05, kl=1e-4)
    ref = types.SimpleNamespace(cases=[_case(_ref_logits)] * 3, model_sha256="")
    squashed = lambda pos: 3.0 * np.tanh(_ref_logits(pos) / 3.0)  # noqa: E731 (fails every prompt)
    whole = validate.validate_model(_Scripted(squashed), e, ref, "numpy", gate=gate)
    first = validate.validate_model(_Scripted(squashed), e, ref, "numpy", gate=gate, first_failure=True)
    assert not whole.passed and not first.passed
    assert len(whole.cases) == 3 and len(first.cases) == 1
    assert {f.case for f in whole.failures} == {0, 1, 2} and {f.case for f in first.failures} == {0}
    assert validate.format_failures([first]).splitlines()[0] == validate.format_failures([whole]).splitlines()[0]
    ok = validate.validate_model(_Scripted(_ref_logits), e, ref, "numpy", gate=gate, first_failure=True)
    assert ok.passed and len(ok.cases) == 3


def test_validation_and_bench_run_the_same_decode_code(fresh_model, monkeypatch):
    """The gate judges what users run: every decode step of validation goes
    through Model.decode_next (on the GPU: the captured graph, its argmax
    and its own logits buffer), as bench's and generate's do; forward runs
    only the prefill."""
    from engine import bench

    calls = []
    real_next, real_fwd = type(fresh_model).decode_next, type(fresh_model).forward
    monkeypatch.setattr(type(fresh_model), "decode_next", lambda self, t: calls.append("decode") or real_next(self, t))
    monkeypatch.setattr(type(fresh_model), "forward", lambda self, t: calls.append(f"forward {len(t)}") or real_fwd(self, t))
    e = catalog.entry(MODEL)
    case = refs.for_entry(e, "cpu").cases[0]
    from harness.compare import compare_case

    compare_case(fresh_model, case)
    assert calls == [f"forward {len(case.prompt_ids)}"] + ["decode"] * (len(case.tokens) - 1)
    calls.clear()
    bench.run_tg(fresh_model, 5, 1)
    assert calls == ["decode"] * 5


def test_a_long_prompt_runs_in_micro_batches_to_the_same_logits(fresh_model):
    """forward() splits a prompt into model.UBATCH-token batches: the same
    logits as the prompt fed in two calls at any cut."""
    from engine.model import UBATCH

    prompt = np.random.default_rng(1).integers(0, fresh_model.config.n_vocab, UBATCH + 300).tolist()
    fresh_model.reset()
    whole = fresh_model.forward(prompt)
    assert fresh_model.pos == len(prompt)
    fresh_model.reset()
    fresh_model.forward(prompt[:700])
    parts = fresh_model.forward(prompt[700:])
    assert np.abs(whole - parts).max() < 1e-4


def test_queued_steps_that_differ_from_a_step_at_a_time_fail():
    """An engine that queues its greedy steps (Model.queues_steps) is held to
    its own step-by-step tokens: the queued check fails at the first step
    where they differ, and only there; a model that does not queue is not
    asked."""
    e = catalog.Entry("m", "synth", "cpu", "", "llama")
    gate = catalog.Gate(margin=0.1, logit=0.05, kl=1e-4)
    ref = types.SimpleNamespace(cases=[_case(_ref_logits)], model_sha256="")

    class Queued(_Scripted):
        queues_steps = True

        def __init__(self, fn, wrong_at=None):
            super().__init__(fn)
            self.wrong_at = wrong_at

        def decode_greedy(self, token, n):
            out = [self.decode_next(token)]
            while len(out) < n:
                out.append(self.decode_next(out[-1]))
            if self.wrong_at is not None:
                out[self.wrong_at] = (out[self.wrong_at] + 1) % 8
            return out

    assert validate.validate_model(Queued(_ref_logits), e, ref, "cuda", gate=gate).passed
    r = validate.validate_model(Queued(_ref_logits, wrong_at=4), e, ref, "cuda", gate=gate)
    assert [(f.check, f.step) for f in r.failures] == [("queued", 5)]  # decode_greedy's 4th answer: step 5
    assert "queued steps give token" in r.failures[0].detail and r.to_json()["cases"][0]["queued"]
    assert validate.validate_model(_Scripted(_ref_logits), e, ref, "numpy", gate=gate).passed
