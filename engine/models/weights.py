"""Tensor specs and loading: GGUF names and expected shapes, declared by
each family module (its ``layer_tensors``) from shared groups (attention.py,
ffn.py) plus the embedding and head here.

Shapes are NumPy order: a weight is ``[n_out, n_in]`` (GGUF rows), so the
projections read ``y = W·x``. Every tensor is shape-checked on load, so a
file that disagrees with its own metadata fails here with the tensor named,
not later inside a matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import GGUFError
from ..gguf_file import GGUFFile
from ..quants import QType

if TYPE_CHECKING:  # config.py lists the architectures from the families: no import cycle at run time
    from ..config import ModelConfig


@dataclass(frozen=True)
class Spec:
    gguf_name: str  # "{i}" is the layer index
    shape: Callable[[ModelConfig], tuple[int, ...]]
    required: Callable[[ModelConfig], bool] = lambda c: True
    # tensors of one group (Q/K/V, gate/up) read the same input: they are
    # uploaded back to back, so a backend may run them as one projection
    group: str | None = None


# The embedding and the head, the same for every family.
GLOBAL = {
    "token_embd": Spec("token_embd.weight", lambda c: (c.n_vocab, c.n_embd)),
    "output_norm": Spec("output_norm.weight", lambda c: (c.n_embd,)),
    "output": Spec("output.weight", lambda c: (c.n_vocab, c.n_embd), lambda c: not c.tied_output),
    "output_bias": Spec("output.bias", lambda c: (c.n_vocab,), lambda c: c.output_bias),
    "rope_freqs": Spec("rope_freqs.weight", lambda c: (c.n_rot // 2,), lambda c: c.has_rope_freqs),
}


def load(gf: GGUFFile, cfg: ModelConfig, layer_tensors, upload: Callable[[GGUFFile, str], object]):
    """Shape-check every tensor a family declares for this config (GLOBAL,
    then its ``layer_tensors(cfg, il)`` per layer, in declaration order, each
    layer's specs read against its view ``cfg.layer(il)``)
    and hand it to the backend's ``upload(gf, gguf_name)``. Optional tensors
    the config does not call for are ``None``. Returns ``(globals, [per-layer
    namespaces])``."""

    def take(spec: Spec, i: int | None = None):
        c = cfg if i is None else cfg.layer(i)
        if not spec.required(c):
            return None
        name = spec.gguf_name.format(i=i)
        shape = spec.shape(c)
        gf.check_shape(name, shape)
        if len(shape) == 1:  # norms, biases, frequency factors: a NaN here runs silently to garbage
            if gf.tensor_type(name) != QType.F32:  # llama.cpp's converter and quantizer keep them F32
                raise GGUFError(gf.path, f"tensor '{name}' has type {gf.tensor_type(name).name}; a 1-D tensor "
                                         f"(norm, bias, frequency factors) must be F32")
            values = gf.dequantize(name)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                raise GGUFError(gf.path, f"tensor '{name}' holds {bad.size} non-finite value(s) "
                                         f"(first at index {bad[0]}: {values[bad[0]]})")
        return upload(gf, name)

    glob = SimpleNamespace(**{k: take(s) for k, s in GLOBAL.items()})
    layers = [SimpleNamespace(**{k: take(s, i) for k, s in layer_tensors(cfg, i).items()})
              for i in range(cfg.n_layer)]
    return glob, layers


def _read_per_token(gf: GGUFFile, cfg: ModelConfig, layer_tensors, size) -> int:
    """``size(name)`` summed over every matrix one decode step reads, as a
    family's ``layer_tensors`` declares them: each layer's weights and the head
    (the embedding table itself when tied; the lookup of an untied embedding
    reads one row, not counted). A 3-D tensor holds routed experts, of which a
    token reads ``n_expert_used`` of ``n_expert``."""
    head = GLOBAL["output"].gguf_name if not cfg.tied_output else GLOBAL["token_embd"].gguf_name
    total = size(head)
    for il in range(cfg.n_layer):
        c = cfg.layer(il)
        for s in layer_tensors(cfg, il).values():
            dims = len(s.shape(c))
            if s.required(c) and dims >= 2:
                n = size(s.gguf_name.format(i=il))
                total += n * cfg.moe.n_expert_used // cfg.moe.n_expert if dims == 3 else n
    return total


def bytes_read_per_token(gf: GGUFFile, cfg: ModelConfig, layer_tensors) -> int:
    """Bytes of the weights one decode step reads (``_read_per_token``)."""
    return _read_per_token(gf, cfg, layer_tensors, lambda name: int(gf.raw(name).nbytes))


def params_read_per_token(gf: GGUFFile, cfg: ModelConfig, layer_tensors) -> int:
    """Weights one token multiplies by (``_read_per_token``): a prefill's FLOPs are about twice this per token."""
    return _read_per_token(gf, cfg, layer_tensors, lambda name: math.prod(gf.tensor_shape(name)))
