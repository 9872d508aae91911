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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-gemma3",
                                  "tiny-qwen35", "tiny-qwen35moe", "tiny-gemma4", "tiny-gemma4moe"])
def test_declared_tensors_are_the_files_tensors(model_path, name):
    """Every tensor of the file is declared (none ignored silently), and each
    group (Q/K/V, gate/up) is declared back to back, so it is uploaded so."""
    import engine

    m = engine.load(model_path(name))
    cfg, fam = m.config, m.family
    declared = {s.gguf_name for s in weights.GLOBAL.values() if s.required(cfg)}
    for il in range(cfg.n_layer):
        specs = [s for s in fam.layer_tensors(cfg, il).values() if s.required(cfg.layer(il))]
        declared |= {s.gguf_name.format(i=il) for s in specs}
        groups = [s.group for s in specs if s.group]
        for g in set(groups):  # contiguous: no other tensor between a group's members
            first = groups.index(g)
            assert groups[first:first + groups.count(g)] == [g] * groups.count(g), (name, g)
            at = [i for i, s in enumerate(specs) if s.group == g]
            assert at == list(range(at[0], at[0] + len(at))), (name, g)
    assert declared == set(m.gguf.tensor_names())


def test_both_backends_implement_exactly_the_op_set():
    """The op protocol (engine/ops.py) is the contract: the NumPy functions
    and the CUDA methods take the same parameters, and the model code calls
    no op outside it."""
    import inspect
    import re
    from pathlib import Path

    from engine import ops as protocol
    from engine.backends.cuda import Ops as CudaOps
    from engine.backends.numpy import ops as numpy_ops

    def params(fn, drop_self=False):
        names = list(inspect.signature(fn).parameters)
        return names[1:] if drop_self else names

    for name in protocol.OP_NAMES:
        want = params(getattr(protocol.Ops, name), drop_self=True)
        assert params(getattr(numpy_ops, name)) == want, ("numpy", name)
        assert params(getattr(CudaOps, name), drop_self=True) == want, ("cuda", name)
    engine_dir = Path(protocol.__file__).parent
    used = set()
    for f in [engine_dir / "model.py", *sorted((engine_dir / "models").glob("*.py"))]:
        used |= set(re.findall(r"\bops\.([a-z_]+)\(", f.read_text()))
    assert used and used <= set(protocol.OP_NAMES), used - set(protocol.OP_NAMES)


def test_reset_clears_every_layer_state(model_path):
    """One state object per layer, of the layer's kind; reset() really
    clears them (a recurrent layer's state would otherwise leak into the
    next sequence), and a sequence after reset equals a fresh model's."""
    import numpy as np

    import engine
    from engine.backends.numpy import KVLayer

    m = engine.load(model_path("tiny-gemma3"))
    assert len(m.cache.layers) == m.config.n_layer and all(isinstance(s, KVLayer) for s in m.cache.layers)
    first = m.forward([5, 6, 7])
    assert any(np.any(s.k) for s in m.cache.layers)
    m.reset()
    assert m.pos == 0 and not any(np.any(s.k) or np.any(s.v) for s in m.cache.layers)
    np.testing.assert_array_equal(m.forward([5, 6, 7]), first)


def test_the_cuda_backend_refuses_what_it_cannot_run_in_one_line(model_path, monkeypatch):
    """An architecture whose ops have no CUDA kernels yet is refused before
    any device work, in one line; --backend auto runs it on NumPy."""
    import engine
    from engine import model
    from engine.backends import cuda

    monkeypatch.setattr(cuda, "PENDING_ARCHS", frozenset({"qwen3"}))
    with pytest.raises(models.AnvilError, match=r"^the CUDA backend does not run qwen3 models yet: use --backend numpy$"):
        engine.load(model_path("tiny-qwen3"), backend="cuda")
    monkeypatch.setattr(cuda.device, "gpu_available", lambda: True)
    assert model.make_backend("auto", engine.load(model_path("tiny-qwen3")).config, 64).name == "numpy"


def test_per_token_counts_take_only_the_routed_experts(model_path):
    """A decode step reads, and a token is multiplied by, every matrix but the
    untied embedding table, and of the routed experts only the k it is sent
    to: the bench's GB/s and the scoreboard's prefill FLOPs stand on these."""
    import math

    import engine
    from engine import bench

    for name in ("tiny-qwen3", "tiny-qwen3moe"):
        m = engine.load(model_path(name))
        gf, cfg = m.gguf, m.config
        matrices = [n for n in gf.tensor_names() if len(gf.tensor_shape(n)) >= 2
                    and (n != "token_embd.weight" or cfg.tied_output)]
        share = (lambda n: cfg.moe.n_expert_used / cfg.moe.n_expert if "_exps." in n else 1) if cfg.moe else \
            (lambda n: 1)
        assert bench.params_per_token(m) == sum(math.prod(gf.tensor_shape(n)) * share(n) for n in matrices)
        assert bench.weight_bytes_per_token(m) == sum(int(gf.raw(n).nbytes) * share(n) for n in matrices)
