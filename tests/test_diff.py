"""`harness diff`: per-layer, per-op errors, and the first op that diverges."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from harness import diff

PROMPT = [1, 400, 1234, 7, 99, 2048, 5, 17]


def _tensors(path, **change):
    import engine

    m = engine.load(path)
    if change:
        m.config = dataclasses.replace(m.config, **change)
        m.cache.cfg = m.config
    return m, diff.engine_tensors(m, PROMPT)


@pytest.mark.parametrize("name,change,where", [
    ("tiny-llama-f32", {"attn_scale": None}, (0, "kqv_out")),        # attention scale: the attention output
    ("tiny-qwen3-f32", {"rope_type": None}, (0, "Qcur")),            # RoPE pairing: the rotated queries
    ("tiny-gemma3-f32", {"rms_eps": None}, (0, "attn_norm")),        # epsilon: the first norm
])
def test_a_planted_bug_is_localised_to_its_layer_and_op(name, change, where, model_path):
    path = model_path(name)
    base, ref = _tensors(path)
    cfg = base.config
    values = {"attn_scale": cfg.attn_scale * 1.05, "rope_type": "norm" if cfg.rope_type == "neox" else "neox",
              "rms_eps": cfg.rms_eps * 1e4}  # 1e-6 -> 1e-2: a 0.5% change of a unit-RMS norm
    model, test = _tensors(path, **{k: values[k] for k in change})
    names = list(model.family.llama_cpp_names(model.config))
    rows, first = diff.compare(test, ref, names, cfg.n_layer, 1e-3)
    assert first is not None and first[:2] == where, first
    # before it, nothing differs at all: the same engine
    errs = dict(rows[0][1])
    assert all(errs[n] == 0.0 for n in names[:names.index(where[1])])
    table = diff.format_rows(rows, first, 1e-3, "numpy + bug", "numpy")
    assert f"first divergence past 0.001: layer 0, {where[1]}" in table and "◀" in table


def test_identical_runs_do_not_diverge(model_path):
    _, a = _tensors(model_path("tiny-gemma3"))
    _, b = _tensors(model_path("tiny-gemma3"))
    assert set(a) >= {"attn_norm-0", "Qcur-0", "kqv_out-5", "sa_out-5", "ffn_out-5", "l_out-5", "result_output"}
    rows, first = diff.compare(a, b, list(a), 6, 0.0)
    assert first is None and all(e == 0.0 for _, errs in rows for _, e in errs)


def test_rel_error_aligns_rows_from_the_end():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert diff.rel_error(a, a[-1:]) == 0.0  # llama.cpp's last layer keeps only the last row
    assert diff.rel_error(a, a * 1.01) == pytest.approx(0.01 / 1.01, rel=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python not installed (scripts/llamacpp-python.sh)")
def test_engine_against_llama_cpp_and_a_mutant_localised(capsys):
    from harness import cli

    args = ["diff", "tiny-llama", "--prompt", "The capital of France is a city of"]
    assert cli.main(args) == 0
    assert "no op differs by more than 0.001" in capsys.readouterr().out
    assert cli.main(args + ["--mutant", "attn-scale"]) == 1
    assert "first divergence past 0.001: layer 0, kqv_out" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny-llama-f32", "tiny-gemma3-f32"])
def test_cuda_against_numpy_op_by_op(name, model_path):
    """The CUDA engine traced like the NumPy one: on F32 weights both compute
    in fp32 (prefill GEMM in fp32), so no op differs by more than 1e-3, and
    every named tensor is there on both sides."""
    import engine

    path = model_path(name)
    ref = diff.engine_tensors(engine.load(path), PROMPT)
    cuda = engine.load(path, backend="cuda", kv_f16=False)
    test = diff.engine_tensors(cuda, PROMPT)
    assert set(test) == set(ref)
    rows, first = diff.compare(test, ref, list(cuda.family.llama_cpp_names(cuda.config)), cuda.config.n_layer, 1e-3)
    assert first is None, diff.format_rows(rows, first, 1e-3, "cuda", "numpy")


@pytest.mark.gpu
def test_cuda_diff_of_a_full_micro_batch(capsys):
    """A prompt of exactly one NumPy micro-batch (model.UBATCH tokens) traced
    on CUDA: the model runs eagerly (a captured prefill graph could not hold
    the tracer's copies to the host), and every op agrees with NumPy."""
    from engine.gguf_file import GGUFFile
    from engine.model import UBATCH
    from engine.tokenizer import Tokenizer
    from harness import catalog, cli

    tok = Tokenizer.from_gguf(GGUFFile(catalog.model_path("tiny-llama-f32", progress=False)))
    words = ["The capital of France is a city of"] + ["light"] * UBATCH
    while len(tok.encode(" ".join(words))) > UBATCH:
        words.pop()
    prompt = " ".join(words)
    assert len(tok.encode(prompt)) == UBATCH, "the filler word must add one token"
    assert cli.main(["diff", "tiny-llama-f32", "--prompt", prompt, "--backend", "cuda", "--against", "numpy"]) == 0
    assert "no op differs by more than" in capsys.readouterr().out
