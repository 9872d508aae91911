"""Which tensors a model has, their GGUF names and expected shapes.

Shapes are NumPy order: a weight is ``[n_out, n_in]`` (GGUF rows), so the
projections read ``y = W·x``. Every tensor is shape-checked on load, so a
file that disagrees with its own metadata fails here with the tensor named,
not later inside a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..config import ModelConfig
from ..errors import GGUFError
from ..gguf_file import GGUFFile
from ..quants import QType


@dataclass(frozen=True)
class Spec:
    gguf_name: str  # "{i}" is the layer index
    shape: Callable[[ModelConfig], tuple[int, ...]]
    required: Callable[[ModelConfig], bool] = lambda c: True


def _q(c): return c.n_head * c.head_dim
def _kv(c): return c.n_head_kv * c.head_dim


GLOBAL = {
    "token_embd": Spec("token_embd.weight", lambda c: (c.n_vocab, c.n_embd)),
    "output_norm": Spec("output_norm.weight", lambda c: (c.n_embd,)),
    "output": Spec("output.weight", lambda c: (c.n_vocab, c.n_embd), lambda c: not c.tied_output),
    "output_bias": Spec("output.bias", lambda c: (c.n_vocab,), lambda c: c.output_bias),
    "rope_freqs": Spec("rope_freqs.weight", lambda c: (c.n_rot // 2,), lambda c: c.has_rope_freqs),
}

LAYER = {
    "attn_norm": Spec("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    "wq": Spec("blk.{i}.attn_q.weight", lambda c: (_q(c), c.n_embd)),
    "wk": Spec("blk.{i}.attn_k.weight", lambda c: (_kv(c), c.n_embd)),
    "wv": Spec("blk.{i}.attn_v.weight", lambda c: (_kv(c), c.n_embd)),
    "bq": Spec("blk.{i}.attn_q.bias", lambda c: (_q(c),), lambda c: c.qkv_bias),
    "bk": Spec("blk.{i}.attn_k.bias", lambda c: (_kv(c),), lambda c: c.qkv_bias),
    "bv": Spec("blk.{i}.attn_v.bias", lambda c: (_kv(c),), lambda c: c.qkv_bias),
    "q_norm": Spec("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,), lambda c: c.qk_norm),
    "k_norm": Spec("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), lambda c: c.qk_norm),
    "wo": Spec("blk.{i}.attn_output.weight", lambda c: (c.n_embd, _q(c))),
    "post_attn_norm": Spec("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,), lambda c: c.post_norms),
    "ffn_norm": Spec("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    "w_gate": Spec("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd)),
    "w_up": Spec("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd)),
    "w_down": Spec("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
    "post_ffn_norm": Spec("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,), lambda c: c.post_norms),
}


def load(gf: GGUFFile, cfg: ModelConfig, upload: Callable[[GGUFFile, str], object]):
    """Shape-check every tensor the config calls for and hand it to the
    backend's ``upload(gf, gguf_name)``. Optional tensors that the config does
    not call for are ``None``. Returns ``(globals, [per-layer namespaces])``."""

    def take(spec: Spec, i: int | None = None):
        if not spec.required(cfg):
            return None
        name = spec.gguf_name.format(i=i)
        shape = spec.shape(cfg)
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
    layers = [SimpleNamespace(**{k: take(s, i) for k, s in LAYER.items()}) for i in range(cfg.n_layer)]
    return glob, layers
