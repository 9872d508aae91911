"""The NumPy engine against llama.cpp on the CPU (flash attention off, F32
KV; F16 KV in the f16kv set, the engine loaded with it), on every cpu-tier catalog model and each of its reference sets, from
the committed references: exactly what `harness validate-catalog` judges.

Thresholds live in the catalog beside each model (``gate.<set>``) with the
measurement they come from (harness/gates.py): on the F32 twins and F32
models, a stated fp32 budget (llama.cpp and the engine both compute in
fp32; measured ~1e-4 logits); on the quantised files, llama.cpp's own
spread between the file and its F32 twin (its 8-bit activation rounding).
"""

from __future__ import annotations

import pytest

from harness import catalog, gates, refs, validate

CAT = catalog.load()
# the real models last: the mutant suite, which runs alongside this file
# (scripts/test.sh), needs gemma3-270m near its start (tests/conftest.py: big_model_lock)
PAIRS = sorted(((n, s) for n, e in CAT.items() for s in e.reference_sets
                if catalog.REFERENCE_SETS[s] == "cpu" and s != "oracle"),  # the oracle is the NumPy engine
               key=lambda p: (CAT[p[0]].source == "pypi", p))
MODELS = list(dict.fromkeys(n for n, _ in PAIRS))


@pytest.mark.parametrize("name", MODELS)
def test_numpy_engine_matches_llamacpp(name, loaded_model):
    """Each of the model's CPU reference sets, as `harness validate-catalog`
    judges them: their prompts are the same, so one free greedy run a prompt
    serves every set (compare.compare_case's ``runs``) and only the
    teacher-forced runs are per set."""
    e, runs = CAT[name], {}
    loaded = validate.Loaded(CAT, "numpy", quiet=True)  # a set with another KV type: the engine loaded with it
    for rset in [s for n, s in PAIRS if n == name]:
        ref = refs.for_entry(e, rset)
        kv = catalog.SET_SETTINGS.get(rset, {}).get("type_k", "f32")
        assert ref.settings["flash_attn"] is False and ref.settings["type_k"] == ref.settings["type_v"] == kv and \
            ref.settings["n_gpu_layers"] == 0
        gate = e.gate("numpy", rset)
        assert gate is not None and gate.logit and gate.kl, f"catalog: {name} needs gate.{rset} with margin, logit and kl"
        model, set_runs = (loaded_model(name), runs) if kv == "f32" else loaded.get(e, ref)
        r = validate.validate_model(model, e, ref, "numpy", tier=rset, runs=set_runs)
        assert r.passed, validate.format_failures([r])
        if gates.is_fp32(e, rset):  # no near-ties at this precision: every token must match
            assert r.mode == "exact" and r.matched == r.steps, (name, rset)
    if "oracle" in e.reference_sets:
        # The CUDA engine's reference set is what this NumPy engine computes: a change to the NumPy
        # engine's numbers shows here until `harness reference --tier oracle` makes the set again.
        ref = refs.for_entry(e, "oracle")
        assert [c.prompt_ids for c in ref.cases] == [c.prompt_ids for c in refs.for_entry(e, "cpu").cases]
        assert e.gate("cuda", "oracle") is not None and e.gate("numpy", "oracle") is None
        r = validate.validate_model(loaded_model(name), e, ref, "numpy", tier="oracle", gate=gates.FP32_BUDGET,
                                    runs=runs)
        assert r.passed and r.mode == "exact", validate.format_failures([r])


def test_every_quantised_cpu_model_has_a_twin():
    """Sharp references exist for every quantised cpu-tier model."""
    for name, e in CAT.items():
        if e.tier == "cpu" and not name.endswith("-f32"):
            assert "twin" in e.reference_sets, name
            ref = refs.for_entry(e, "twin")
            assert ref.llama_cpp_input and ref.llama_cpp_input["file"].endswith(".f32.gguf"), name


# made before the long prompt, from real files the offline H200 only gets in
# pieces (scripts/gpu/split-model.sh): to be made again there
OLD_PROMPTS = {("smollm2-135m", "gpu"), ("gemma3-270m", "gpu")}


def test_prompts_exercise_every_path():
    """A prompt longer than every sliding window (the synthetic presets' and
    gemma3-270m's 512), so every layer kind sees beyond its window, and
    decoding runs past position 1024."""
    from engine import synth

    widest = max([512] + [p.sliding_window for p in synth.PRESETS.values()])
    for name, e in CAT.items():
        for rset in e.reference_sets:
            if (name, rset) in OLD_PROMPTS:
                continue
            ref = refs.for_entry(e, rset)
            longest = max(len(c.prompt_ids) for c in ref.cases)
            assert longest > max(widest, 1024), (name, rset, longest, widest)


def test_decode_greedy_equals_decode_next_steps():
    """Model.decode_greedy (n steps, each fed the one before's choice) gives
    decode_next's tokens on a backend that cannot queue steps (NumPy), and
    refuses n < 1 and steps past the context with one line each."""
    import engine
    from engine.errors import AnvilError
    from harness import catalog

    m = engine.load(catalog.model_path("tiny-qwen3", progress=False), n_ctx=32, backend="numpy")
    m.reset()
    tok = int(m.forward([1, 2, 3]).argmax())
    queued = m.decode_greedy(tok, 6)
    m.reset()
    m.forward([1, 2, 3])
    steps = []
    for _ in range(6):
        tok = m.decode_next(tok)
        steps.append(tok)
    assert queued == steps and m.pos == 9
    with pytest.raises(AnvilError, match="at least 1, got 0"):
        m.decode_greedy(tok, 0)
    with pytest.raises(AnvilError, match="9 cached \\+ 24 new tokens exceed the context of 32"):
        m.decode_greedy(tok, 24)
