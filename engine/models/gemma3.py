"""Gemma 3 (architectures.md §4).

Differs from the llama family in five places: the embedding is scaled by
√n_embd; attention and FFN outputs are RMS-normed again before the residual
add (post-norms); the FFN is GeGLU with tanh-GELU; most layers attend over a
sliding window with their own RoPE base; the logits may be soft-capped.

    x = x + RMSNorm(Wo · Attn(RoPE(RMSNorm_h(Wq·n)), RoPE(RMSNorm_h(Wk·n)), Wv·n))·post_attn_norm
    x = x + RMSNorm(W_down · (GELU(W_gate·m) ⊙ (W_up·m)))·post_ffn_norm
"""

from __future__ import annotations

from . import attention, ffn, weights
from .weights import Spec

ARCHS = ("gemma3",)

_POST_NORMS = {
    "post_attn_norm": Spec("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,)),
    "post_ffn_norm": Spec("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,)),
}


def layer_tensors(cfg, il: int) -> dict:
    """The tensors of layer ``il``: sliding and global layers alike (the window is config)."""
    return attention.TENSORS | {"post_attn_norm": _POST_NORMS["post_attn_norm"]} | ffn.TENSORS | \
        {"post_ffn_norm": _POST_NORMS["post_ffn_norm"]}


layer_kinds = attention.every_layer


def block(ops, cfg, w, il, x, positions, state):
    eps = cfg.rms_eps
    a = attention.self_attention(ops, cfg, w, il, x, positions, state)
    # x += RMSNorm(a)·post_attn_norm; m = RMSNorm(x)·ffn_norm
    x, m = ops.add_rms_norm(x, a, w.ffn_norm, eps, a_norm=w.post_attn_norm)
    h = ffn.gated_hidden(ops, w, m, cfg.activation)
    return ops.norm_add(x, ops.matmul(h, w.w_down), w.post_ffn_norm, eps)  # x + RMSNorm(ffn)·post_ffn_norm


def bytes_per_token(gf, cfg) -> int:
    """Every layer's weights and the head: a dense model reads all of them."""
    return weights.bytes_read_per_token(gf, cfg, layer_tensors)


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediate tensors (src/models/gemma3.cpp),
    each as (op, its occurrence in the layer, which output), for ``harness diff``. The post-norms
    run inside the residual adds (add_rms_norm, norm_add), so attn_post_norm and ffn_post_norm have
    no engine tensor of their own: sa_out and l_out show them."""
    return {"attn_norm": ("rms_norm", 0, 0),
            "Qcur": ("qk_norm_rope", 0, 0), "Kcur": ("qk_norm_rope", 0, 1), "Vcur": ("matmuls", 0, 2),
            "kqv_out": ("attention", 0, 0), "sa_out": ("add_rms_norm", 0, 0),
            "ffn_norm": ("add_rms_norm", 0, 1), "ffn_out": ("matmul", 1, 0), "l_out": ("norm_add", 0, 0)}
