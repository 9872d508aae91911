"""The NumPy engine against llama.cpp (CPU, flash attention off, F32 KV) on
every cpu-tier catalog model, from the committed references: what
`harness validate-catalog` checks, plus the logit tolerance.

Tolerances live in the catalog next to each model (``logit_tol``) with the
measurement they come from: 1e-3 where the weights are F32 (llama.cpp then
multiplies in fp32 like the engine; 2e-5 measured), up to ~2 logits on
quantised weights, where llama.cpp's CPU matmuls round every activation
vector to 8 bits (Q8_0, Q8_1 or Q8_K per weight type) and the engine does not.
"""

from __future__ import annotations

import pytest

from harness import catalog, refs, validate

CPU_MODELS = sorted(n for n, e in catalog.load().items() if e.tier == "cpu")


@pytest.mark.parametrize("name", CPU_MODELS)
def test_numpy_engine_matches_llamacpp(name, loaded_model):
    e = catalog.entry(name)
    ref = refs.load(refs.reference_path(name, "cpu"))
    assert ref.model_sha256 == e.sha256, "reference made from another file: regenerate it"
    assert ref.settings["flash_attn"] is False and ref.settings["type_k"] == "f32" and ref.settings["n_gpu_layers"] == 0
    assert e.logit_tol > 0 and e.near_tie > 0, f"catalog: {name} needs logit_tol and near_tie"
    r = validate.validate_model(loaded_model(name), e, ref, "numpy")
    assert r.passed, validate.format_flips([r])
    assert r.max_logit_diff <= e.logit_tol
    if name.endswith("-f32"):  # no near-ties at this precision: every token must match
        assert r.mode == "exact" and r.matched == r.steps
