"""ModelConfig read from real GGUF files, checked against the values their
model cards and llama.cpp's loader give."""

from __future__ import annotations

import math

from engine.config import ROPE_NEOX, ROPE_NORM, ModelConfig
from engine.gguf_file import GGUFFile


def test_smollm2(smollm2_path):
    c = ModelConfig.from_gguf(GGUFFile(smollm2_path))
    assert (c.arch, c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == \
        ("llama", 49152, 576, 30, 9, 3, 64, 1536)
    assert c.rope_type == ROPE_NORM and set(c.rope_base) == {100000.0} and set(c.rope_scale) == {1.0}
    assert c.tied_output and not c.qk_norm and not c.qkv_bias and not c.post_norms
    assert c.swa_window == (0,) * 30 and c.attn_scale == 1 / 8 and c.activation == "silu"
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)


def test_gemma3(gemma3_path):
    c = ModelConfig.from_gguf(GGUFFile(gemma3_path))
    assert (c.arch, c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == \
        ("gemma3", 262144, 640, 18, 4, 1, 256, 2048)
    # no pattern key in the file: llama.cpp's default period 6 -> layers 5, 11, 17 are global
    assert [il for il, w in enumerate(c.swa_window) if w == 0] == [5, 11, 17]
    assert {w for w in c.swa_window if w} == {512}
    # global layers: the file's base; SWA layers: 10000 (default freq_base_swa), never scaled
    assert [c.rope_base[il] for il in (0, 5)] == [10000.0, 1e6]
    assert c.rope_type == ROPE_NEOX and c.qk_norm and c.post_norms and c.tied_output
    assert c.embd_scale == math.sqrt(640) and c.attn_scale == 1 / 16 and c.final_softcap == 0.0
    assert c.activation == "gelu_tanh"
