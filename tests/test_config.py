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


def test_mtp_blocks_are_not_layers(tmp_path):
    """A Qwen3.5 GGUF may carry multi-token-prediction blocks after its layers
    (``nextn_predict_layers``, counted in ``block_count``): llama.cpp's forward
    pass skips them, and so does the engine; a count past the blocks is refused."""
    import struct

    import pytest

    from engine import synth
    from engine.config import ModelConfig
    from engine.errors import GGUFError
    from engine.gguf_file import GGUFFile
    from gguf import GGUFValueType as V

    def config(extra):
        p = synth.PRESETS["tiny-qwen35"]
        kvs = synth._metadata(p, 1000) + [synth._kv("qwen35.nextn_predict_layers", V.UINT32, extra)]
        path = tmp_path / f"mtp{extra}.gguf"
        path.write_bytes(struct.pack("<IIQQ", synth.GGUF_MAGIC, synth.GGUF_VERSION, 0, len(kvs)) + b"".join(kvs))
        return ModelConfig.from_gguf(GGUFFile(path))

    assert config(0).n_layer == 4 and config(0).recurrent == (True, True, True, False)
    c = config(1)
    assert c.n_layer == 3 and c.recurrent == (True, True, True)
    with pytest.raises(GGUFError, match=r"key 'qwen35.nextn_predict_layers' must be an integer in 0..3"):
        config(4)
