"""Model families: every supported architecture has one family module, and
each module declares its layers' tensors whole (groups back to back, shapes
from the config) so loading, byte counting and the block agree."""

from __future__ import annotations

import pytest

from engine import models
from engine.models import weights


def test_every_supported_architecture_has_a_family():
    for module in set(models.FAMILIES.values()):
        for attr in ("ARCHS", "layer_tensors", "block", "bytes_per_token", "llama_cpp_names"):
            assert callable(getattr(module, attr)) or attr == "ARCHS", (module.__name__, attr)
    with pytest.raises(models.AnvilError, match="no model family runs architecture 'mamba'"):
        models.family("mamba")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_declared_tensors_are_the_files_tensors(model_path, name):
    """Every tensor of the file is declared (none ignored silently), and each
    group (Q/K/V, gate/up) is declared back to back, so it is uploaded so."""
    import engine

    m = engine.load(model_path(name))
    cfg, fam = m.config, m.family
    declared = {s.gguf_name for s in weights.GLOBAL.values() if s.required(cfg)}
    for il in range(cfg.n_layer):
        specs = [s for s in fam.layer_tensors(cfg, il).values() if s.required(cfg)]
        declared |= {s.gguf_name.format(i=il) for s in specs}
        groups = [s.group for s in specs if s.group]
        for g in set(groups):  # contiguous: no other tensor between a group's members
            first = groups.index(g)
            assert groups[first:first + groups.count(g)] == [g] * groups.count(g), (name, g)
            at = [i for i, s in enumerate(specs) if s.group == g]
            assert at == list(range(at[0], at[0] + len(at))), (name, g)
    assert declared == set(m.gguf.tensor_names())
