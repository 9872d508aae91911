"""The ops check's deep pass (harness/anchored.py check_deep): decode steps
past the position where `attn-merge-deep-last-split` bites, on the CPU with
the NumPy engine playing the engine under test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import engine
from engine.backends.cuda.launchers import attention as cuda_attention
from engine.backends.numpy import faithful
from engine.backends.numpy import ops as np_ops
from engine.config import ROPE_NEOX, ModelConfig
from engine.gguf_file import GGUFFile
from engine.model import DEFAULT_N_CTX
from engine.models import family
from engine.tokenizer import Tokenizer
from harness import anchored, catalog, gates, mutants, refs

H200_SMS = 132  # the H200's SMs: the decode kernel's split count follows them (launchers/attention.py)


def _deep_positions() -> range:
    return range(anchored.DEEP_PROMPT_TOKENS, anchored.DEEP_PROMPT_TOKENS + anchored.STEPS)


def _ops_check_models() -> list[catalog.Entry]:
    return [e for e in catalog.load().values() if "oracle" in e.reference_sets]


def test_the_deep_pass_decodes_past_the_mutants_position_and_the_shallow_passes_do_not():
    assert min(_deep_positions()) > mutants.DEEP_POSITION
    # the other passes decode after each reference prompt of the oracle sets: all short of it
    for e in _ops_check_models():
        deepest = max(len(c.prompt_ids) for c in refs.for_entry(e, "oracle").cases) + anchored.STEPS - 1
        assert deepest < mutants.DEEP_POSITION, (e.name, deepest)


def _splits(cfg: ModelConfig, il: int, qp: int, n_ctx: int) -> tuple[int, int]:
    """(active splits, keys of the last) of the CUDA decode attention for one
    query at ``qp`` on layer ``il`` (launchers/attention.py decode_plan and
    decode_layout; attention.cu DEC_MIN_CHUNK and split_range), on the H200."""
    c = cfg.layer(il)
    gqa = c.n_head // c.n_head_kv
    n_splits, _ = cuda_attention.decode_plan(H200_SMS, 1, c.n_head_kv, n_ctx, gqa, c.head_dim, kv_f16=True)
    warps, hpw = cuda_attention.decode_layout(gqa)
    min_chunk = 32 * (warps // math.ceil(gqa / hpw))  # 32 x the warps across a head's tiles
    window = cfg.swa_window[il]
    n_keys = qp + 1 - (max(0, qp - window + 1) if window else 0)
    chunk = (max(math.ceil(n_keys / n_splits), min_chunk) + 31) // 32 * 32
    n_active = math.ceil(n_keys / chunk)
    return n_active, n_keys - (n_active - 1) * chunk


@pytest.mark.parametrize("entry", _ops_check_models(), ids=lambda e: e.name)
def test_the_deep_pass_merges_many_splits_on_every_full_attention_layer(entry):
    """Each full-attention layer of every model the ops check runs decodes
    the deep steps in 9 or more splits of the H200's decode attention, the
    newest of them holding 61 keys or more: what the deep mutant drops."""
    path = catalog.model_path(entry.name, progress=False)
    cfg = ModelConfig.from_gguf(GGUFFile(path))
    n_ctx = min(DEFAULT_N_CTX, cfg.n_ctx_train)  # check_entry loads with the default context
    assert n_ctx >= anchored.DEEP_PROMPT_TOKENS + anchored.STEPS
    full = [il for il, kind in enumerate(family(cfg.arch).layer_kinds(cfg))
            if kind == "attention" and not cfg.swa_window[il]]
    assert full, entry.name
    for il in full:
        for qp in _deep_positions():
            n_active, last = _splits(cfg, il, qp, n_ctx)
            assert n_active >= 9 and last >= 61, (entry.name, il, qp, n_active, last)


@pytest.mark.parametrize("name, long_case", [("tiny-llama", 3), ("tiny-qwen3", 3), ("tiny-gemma3", 3)])
def test_the_deep_prompt_is_the_models_own_tokens_of_the_deep_text(name, long_case):
    """The model's tokenizer on the deep set's text (the passage six times),
    cut at DEEP_PROMPT_TOKENS, the next STEPS tokens forced; its first
    passage is tokenized as llama.cpp tokenized the long reference prompt
    (the passage twice)."""
    path = catalog.model_path(name, progress=False)
    model = engine.load(path, backend="numpy", rounding="cuda")
    prompt, forced = anchored.deep_case(model)
    ids = Tokenizer.from_gguf(model.gguf).encode(catalog.deep_prompts()[0])
    assert len(prompt) == anchored.DEEP_PROMPT_TOKENS and len(forced) == anchored.STEPS
    assert prompt + forced == ids[:anchored.DEEP_PROMPT_TOKENS + anchored.STEPS]
    llama_cpp = refs.for_entry(catalog.entry(name), "oracle").cases[long_case].prompt_ids
    half = len(llama_cpp) // 2 - 8  # clear of the seam between the two copies
    assert prompt[:half] == list(llama_cpp[:half])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3moe", "tiny-qwen35", "tiny-gemma3"])
def test_the_deep_pass_passes_the_oracle_itself(name):
    """The faithful NumPy engine under test: every op of every deep decode
    step equals the oracle's, each attention layer judged at each step."""
    path = catalog.model_path(name, progress=False)
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    model = engine.load(path, backend="numpy", rounding="cuda")
    errors = anchored.check_deep(model, oracle)
    assert errors and {e.phase for e in errors} == {"decode deep"}
    assert max(e.error for e in errors) == 0.0 and not anchored.over(errors)
    cfg = model.config
    n_attention = sum(kind == "attention" for kind in family(cfg.arch).layer_kinds(cfg))
    assert sum(e.op == "attention" for e in errors) == n_attention * anchored.STEPS


def _drops_the_newest_keys(split: int = 128):
    """The NumPy analogue of attn-merge-deep-last-split: a decode query
    (the split-K path's few rows) at DEEP_POSITION or later does not see
    the keys of its last split of ``split`` (the newest, its own among
    them). Full-attention layers only: a window is one split or a few."""
    ops = faithful.FaithfulOps(True)
    real = ops.attention

    def attention(q, keys, values, positions, scale, window=0):
        qp = int(np.max(positions))
        if q.shape[0] <= cuda_attention.DECODE_MAX_T and qp >= mutants.DEEP_POSITION and not window:
            cut = qp // split * split
            return real(q, keys[:cut], values[:cut], positions, scale, window)
        return real(q, keys, values, positions, scale, window)

    ops.attention = attention
    return ops


def test_a_bug_at_depth_is_named_by_the_deep_pass_only():
    """The ops check's passes (check_model, as check_entry runs them on the
    CUDA engine) on an engine whose decode attention drops the newest keys
    from DEEP_POSITION on: the deep pass names attention, percent-level
    errors against a budget of 1e-4, and nothing else; the other passes,
    none of whose queries gets there, see no attention error at all."""
    name = "tiny-llama"
    path = catalog.model_path(name, progress=False)
    oracle = engine.load(path, backend="numpy", rounding="cuda")
    model = engine.load(path, backend="numpy", rounding="cuda")
    model.ops = _drops_the_newest_keys()
    errors = anchored.check_model(model, oracle, refs.for_entry(catalog.entry(name), "oracle"))
    assert {(e.phase, e.op) for e in anchored.over(errors)} == {("decode deep", "attention")}
    deep = [e for e in errors if e.phase == "decode deep" and e.op == "attention"]
    assert min(e.error for e in deep) > 100 * gates.op_budget("attention")  # every layer, every step
    shallow = [e for e in errors if e.phase != "decode deep"]
    assert {"prefill", "decode", "decode bulk", "decode folded"} <= {e.phase for e in shallow}
    assert max(e.error for e in shallow if e.op == "attention") == 0.0


def test_rope_at_depth_is_held_to_the_bound_of_its_position():
    """A rotation the size of the kernels' fast-math angle error at the deep
    steps' positions passes there: the bound is read from the rotation's own
    positions (as cuda.Rotation carries them); held to the bound of position
    0 it would fail."""
    path = catalog.model_path("tiny-llama", progress=False)
    model = engine.load(path, backend="numpy", rounding="cuda")
    checker = anchored.Anchored(model, engine.load(path, backend="numpy", rounding="cuda"))
    qp = max(_deep_positions())
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((1, n, 64)).astype(np.float32) for n in (4, 2))
    positions = np.array([qp])
    exact = (*np_ops.rope_angles(positions, 64, 5e5, 1.0), ROPE_NEOX)
    fast = (*gates.rope_angles_fast(positions, 64, 5e5, 1.0), ROPE_NEOX)
    got, want = np_ops.rope(fast, q, k), np_ops.rope(exact, q, k)
    rotation = SimpleNamespace(positions=positions)
    checker._compare("rope", got, want, (rotation, q, k), (None, q, k))
    assert [e.bound for e in checker.errors] == [gates.op_budget("rope", qp)] * 2
    assert not anchored.over(checker.errors)
    assert max(e.error for e in checker.errors) > gates.op_budget("rope", 0)
