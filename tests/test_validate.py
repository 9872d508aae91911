"""The gate bites: a perturbed engine fails validation; a flip is accepted
only as a near-tie under the threshold."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

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


def test_cli_exit_code_and_table():
    ok = subprocess.run([sys.executable, "-m", "harness.cli", "validate-catalog", "--model", MODEL, "--backend", "numpy"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "| tiny-llama-f32 | cpu | numpy | exact | 96/96 | 0 |" in ok.stdout


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
    assert "DRIFT" in capsys.readouterr().out


def test_save_appends_a_validate_record(tmp_path, monkeypatch, capsys):
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--save"]) == 0
    (rec,) = results.load_all(tmp_path, kind="validate")
    (entry,) = rec["results"]
    assert entry["model"] == MODEL and entry["passed"] and entry["mode"] == "exact" and rec["backend"] == "numpy"


def test_threshold_per_backend():
    from harness import catalog

    e = catalog.Entry("m", "synth", "cpu", "", "llama", near_tie=0.01, near_tie_cuda=0.2)
    assert e.threshold("numpy") == 0.01 and e.threshold("cuda") == 0.2
    assert catalog.Entry("m", "synth", "gpu", "", "llama", near_tie=1.5).threshold("cuda") == 1.5
    # every catalog model has a threshold for each backend it runs on
    for name, e in catalog.load().items():
        assert e.threshold("cuda") > 0 and (e.tier == "gpu" or e.threshold("numpy") > 0), name


def test_a_model_checked_against_two_reference_sets(tmp_path, monkeypatch, capsys):
    """A small real model can carry cpu-tier references (CI) and gpu-tier ones
    (llama.cpp with CUDA): each pair is validated with its own threshold."""
    import shutil

    from harness import cli, results

    for tier in ("cpu", "gpu"):  # the gpu set here is a copy: the mechanism, not the numbers
        (tmp_path / "refs" / tier).mkdir(parents=True)
        shutil.copy(refs.reference_path(MODEL, "cpu"), tmp_path / "refs" / tier / f"{MODEL}.json")
    monkeypatch.setattr(refs, "REFERENCES_DIR", tmp_path / "refs")
    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path / "results")
    real = catalog.load

    def load(path=None, near_tie_gpu=0.05):
        cat = real(path)
        cat[MODEL] = dataclasses.replace(cat[MODEL], references=("cpu", "gpu"), near_tie_gpu=near_tie_gpu)
        return cat

    monkeypatch.setattr(catalog, "load", load)
    e = catalog.entry(MODEL, load())
    assert e.reference_tiers == ("cpu", "gpu") and e.threshold("cuda", "gpu") == 0.05
    assert e.threshold("numpy", "cpu") == e.near_tie
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "gpu", "--save"]) == 0
    assert "| tiny-llama-f32 | gpu | numpy | exact | 96/96 |" in capsys.readouterr().out
    (rec,) = results.load_all(tmp_path / "results", kind="validate")
    assert [(r["tier"], r["near_tie"]) for r in rec["results"]] == [("gpu", 0.05)]
    # the NumPy default checks the cpu tier only
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy"]) == 0
    assert "| tiny-llama-f32 | cpu | numpy |" in capsys.readouterr().out
    # no gpu threshold yet: a clear error naming the key and how to calibrate it
    monkeypatch.setattr(catalog, "load", lambda path=None: load(path, near_tie_gpu=0.0))
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "gpu"]) == 1
    err = capsys.readouterr().err
    assert "near_tie_gpu" in err and "--calibrate" in err
    # calibrating both reference sets names each pair's own catalog key
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "cpu", "--calibrate"]) == 0
    assert "tiny-llama-f32 (cpu-tier references): near_tie = " in capsys.readouterr().err
    assert cli.main(["validate-catalog", "--model", MODEL, "--backend", "numpy", "--tier", "gpu", "--calibrate"]) == 0
    assert "tiny-llama-f32 (gpu-tier references): near_tie_gpu = " in capsys.readouterr().err


def test_catalog_tiers_are_checked(tmp_path):
    bad = tmp_path / "catalog.toml"
    bad.write_text('[models.m]\nsource = "synth"\npreset = "tiny-llama"\ntier = "cpu"\narch = "llama"\n'
                   'references = ["gpu"]\n')
    with pytest.raises(catalog.AnvilError, match="references a list of them that includes it"):
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
                    reason="llama-cpp-python not installed (pip install -e '.[reference]')")
def test_llama_cpp_variation_is_measured_like_the_engine(tmp_path, monkeypatch):
    """`harness reference --variation`: llama.cpp under other settings, held
    against its own reference by the engine's comparison code."""
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["reference", "--variation", "--model", MODEL, "--save"]) == 0
    (rec,) = results.load_all(tmp_path, kind="variation")
    by = {r["variant"]: r for r in rec["results"]}
    assert set(by) == {"flash-attn", "ubatch-1"} and rec["device"].startswith("cpu:")
    assert by["flash-attn"]["settings"]["flash_attn"] is True and by["ubatch-1"]["settings"]["n_ubatch"] == 1
    # F32 weights: on the CPU, one-token batches change nothing; the FA path rounds through f16
    assert by["ubatch-1"]["max_logit_diff"] < 1e-3 < by["flash-attn"]["max_logit_diff"] < 0.1


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
    assert "--save goes with --variation" in capsys.readouterr().err
