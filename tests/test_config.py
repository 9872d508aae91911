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


def _metadata_config(tmp_path, preset: str, extra=(), drop=()):
    """ModelConfig of a tensor-less GGUF holding a preset's metadata (plus ``extra`` keys, minus ``drop``)."""
    import struct

    from engine import synth

    p = synth.PRESETS[preset]
    kvs = [kv for kv in synth._metadata(p, 1000) if not any(f"{p.arch}.{d}".encode() in kv[:120] for d in drop)]
    kvs += [synth._kv(*e) for e in extra]
    path = tmp_path / f"{preset}-{len(list(tmp_path.iterdir()))}.gguf"
    path.write_bytes(struct.pack("<IIQQ", synth.GGUF_MAGIC, synth.GGUF_VERSION, 0, len(kvs)) + b"".join(kvs))
    return ModelConfig.from_gguf(GGUFFile(path))


def test_gemma4_layers_have_their_own_geometry(tmp_path):
    """Gemma 4 (architectures.md §6.1): the sliding-window pattern is a bool per
    layer; sliding layers take key_length_swa, their own KV-head count from the
    per-layer array, base freq_base_swa unscaled and no frequency divisors;
    full layers key_length, base rope.freq_base and the rope_freqs divisors;
    attention scale 1 and the softcap defaulting to 30 when the key is absent."""
    import pytest

    from engine.errors import GGUFError
    from gguf import GGUFValueType as V

    c = _metadata_config(tmp_path, "gemma4-31b", drop=("final_logit_softcapping",))
    full = [il for il in range(60) if not c.swa_window[il]]
    assert full == list(range(5, 60, 6)) and {w for w in c.swa_window if w} == {1024}
    swa, glob = c.layer(0), c.layer(5)
    assert (swa.head_dim, swa.n_head_kv, swa.n_rot, swa.has_rope_freqs) == (256, 16, 256, False)
    assert (glob.head_dim, glob.n_head_kv, glob.n_rot, glob.has_rope_freqs) == (512, 4, 512, True)
    assert (c.rope_base[0], c.rope_scale[0], c.rope_base[5]) == (10000.0, 1.0, 1e6)
    assert c.attn_scale == 1.0 and c.final_softcap == 30.0 and c.v_norm and c.qk_norm and c.post_norms
    assert c.embd_scale == math.sqrt(5376) and c.activation == "gelu_tanh" and c.has_rope_freqs
    assert c.layer(0).layer(0) is c.layer(0)  # a layer's view is final
    with pytest.raises(GGUFError, match=r"missing required key 'gemma4.attention.sliding_window_pattern'"):
        _metadata_config(tmp_path, "gemma4-31b", drop=("attention.sliding_window_pattern",))
    with pytest.raises(GGUFError, match=r"key 'gemma4.attention.sliding_window_pattern' must be a bool per layer"):
        _metadata_config(tmp_path, "gemma4-31b", drop=("attention.sliding_window_pattern",),
                         extra=[("gemma4.attention.sliding_window_pattern", V.ARRAY, [1] * 60)])
    with pytest.raises(GGUFError, match=r"key 'gemma4.embedding_length_per_layer_input' = 256: only 0 is supported"):
        _metadata_config(tmp_path, "gemma4-31b", drop=("embedding_length_per_layer_input",),
                         extra=[("gemma4.embedding_length_per_layer_input", V.UINT32, 256)])
    with pytest.raises(GGUFError, match=r"must equal the head widths 512 and 256"):
        _metadata_config(tmp_path, "gemma4-31b", drop=("rope.dimension_count_swa",),
                         extra=[("gemma4.rope.dimension_count_swa", V.UINT32, 128)])
    with pytest.raises(GGUFError, match=r"key 'gemma4.attention.head_count' \(32\) is not a multiple of "
                                        r"head_count_kv \(5\) of layer 5"):
        _metadata_config(tmp_path, "gemma4-31b", drop=("attention.head_count_kv",),
                         extra=[("gemma4.attention.head_count_kv", V.ARRAY, [16, 16, 16, 16, 16, 5] * 10)])
