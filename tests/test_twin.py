"""The dequantised F32 twin: every tensor bit-exactly Anvil's dequantisation,
every metadata key identical; written atomically."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_file import GGUFFile
from harness import twin


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma3"])  # K-quants, Q5/Q6, BF16 and F32 tensors
def test_twin_holds_the_dequantised_weights(name, model_path, tmp_path):
    src = model_path(name)
    sha = twin.write_f32_twin(src, tmp_path / "t.gguf")
    a, b = GGUFFile(tmp_path / "t.gguf"), GGUFFile(src)
    assert len(sha) == 64 and a.keys() == b.keys()
    assert all(a.get(k) == b.get(k) for k in a.keys() if not k.startswith("tokenizer."))
    assert a.get("tokenizer.ggml.tokens") == b.get("tokenizer.ggml.tokens")
    assert a.tensor_names() == b.tensor_names()
    for n in b.tensor_names():
        assert a.tensor_type(n).name == "F32" and a.tensor_shape(n) == b.tensor_shape(n)
        assert np.array_equal(a.dequantize(n), b.dequantize(n)), n  # bit for bit
    assert [p.name for p in tmp_path.iterdir()] == ["t.gguf"]  # no temporary file left


def test_twin_runs_like_the_original(model_path, tmp_path):
    import engine

    twin.write_f32_twin(model_path("tiny-llama"), tmp_path / "t.gguf")
    a = engine.load(tmp_path / "t.gguf").forward([1, 2, 3, 4])
    b = engine.load(model_path("tiny-llama")).forward([1, 2, 3, 4])
    assert np.array_equal(a, b)
