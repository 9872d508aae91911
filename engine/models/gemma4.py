"""Gemma 4, dense and Mixture-of-Experts (architectures.md §6, llama.cpp's
``src/models/gemma4.cpp``).

Gemma 3's block (scaled embedding, post-norms, GeGLU, sliding layers, final
softcap), with these differences: sliding and full layers have their own head
width and KV heads (``cfg.layer(il)``); the full layers have no V projection
(V is the K projection); V is RMS-normed per head without a weight; Q/K norms
replace the 1/√d attention scale (scale 1); the full layers' RoPE rotates a
quarter of each head through the ``rope_freqs`` divisors; norm weights are
stored as used (no +1); a per-layer scalar may scale the layer's output. In the
MoE model every layer runs a dense GeGLU MLP and routed GeGLU experts side by
side on the same residual, each with its own norms:

    h = x + RMSNorm(Wo · Attn(...))·post_attn_norm
    f = RMSNorm(FFN(RMSNorm(h)·ffn_norm))·post_ffn_norm_1                      (dense MLP)
      + RMSNorm(MoE(RMSNorm(h)·pre_ffn_norm_2; router on RMSNorm(h)·router_scale/√n_embd))·post_ffn_norm_2
    x' = (h + RMSNorm(f)·post_ffn_norm) · layer_output_scale

(the dense model: ``f = FFN(...)``, no norm_1). The router takes softmax over
all experts, the top k renormalised, and each expert's output is scaled by its
``ffn_down_exps.scale`` before its weight.
"""

from __future__ import annotations

import math

from . import attention, ffn, moe, weights
from .weights import Spec

ARCHS = ("gemma4",)

_POST_ATTN = {"post_attn_norm": Spec("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,))}
_POST_FFN = {"post_ffn_norm": Spec("blk.{i}.post_ffw_norm.weight", lambda c: (c.n_embd,))}
_OUT_SCALE = {"out_scale": Spec("blk.{i}.layer_output_scale.weight", lambda c: (1,), lambda c: c.out_scale)}
_MOE = {
    "router": moe.TENSORS["router"],
    "router_scale": Spec("blk.{i}.ffn_gate_inp.scale", lambda c: (c.n_embd,)),
    "pre_ffn_norm_2": Spec("blk.{i}.pre_ffw_norm_2.weight", lambda c: (c.n_embd,)),
    "post_ffn_norm_1": Spec("blk.{i}.post_ffw_norm_1.weight", lambda c: (c.n_embd,)),
    "post_ffn_norm_2": Spec("blk.{i}.post_ffw_norm_2.weight", lambda c: (c.n_embd,)),
    **{k: moe.TENSORS[k] for k in moe.EXPERT_TENSORS},
    "down_exps_scale": Spec("blk.{i}.ffn_down_exps.scale", lambda c: (c.moe.n_expert,),
                            lambda c: c.moe.expert_scale),
}


def layer_tensors(cfg, il: int) -> dict:
    """Every layer alike by name; shapes come from the layer's own view (``cfg.layer(il)``)."""
    return attention.TENSORS | _POST_ATTN | ffn.TENSORS | _POST_FFN | (_MOE if cfg.moe else {}) | _OUT_SCALE


layer_kinds = attention.every_layer


def block(ops, cfg, w, il, x, positions, state):
    eps = cfg.rms_eps
    a = attention.self_attention(ops, cfg, w, il, x, positions, state)
    if not cfg.moe:
        x, m = ops.add_rms_norm(x, a, w.ffn_norm, eps, a_norm=w.post_attn_norm)  # x = h; m = RMSNorm(h)·ffn_norm
        f = ops.matmul(ffn.gated_hidden(ops, w, m, cfg.activation), w.w_down)
    else:  # the dense MLP's, the router's (its own scale) and the experts' input norms of h
        x, m, r, m2 = ops.add_rms_norm(x, a, (w.ffn_norm, w.router_scale, w.pre_ffn_norm_2), eps,
                                       a_norm=w.post_attn_norm)
        f = ops.matmul(ffn.gated_hidden(ops, w, m, cfg.activation), w.w_down)
        ids, weights_ = ops.moe_route(r, w.router, cfg.moe.n_expert_used, cfg.moe.norm_topk,
                                      scale=1.0 / math.sqrt(cfg.n_embd))
        e = ops.moe_ffn(m2, ids, weights_, w.gate_exps, w.up_exps, w.down_exps, activation=cfg.moe.activation,
                        down_scale=w.down_exps_scale)
        f = ops.norm_add(f, e, w.post_ffn_norm_2, eps, x_norm=w.post_ffn_norm_1)  # the two branches, post-normed
    return ops.norm_add(x, f, w.post_ffn_norm, eps, scale=w.out_scale)  # (x + RMSNorm(f)·post_ffn_norm)·out_scale


def bytes_per_token(gf, cfg) -> int:
    """Every layer's weights and the (tied) head; of the routed experts, the ``n_expert_used`` a token reads."""
    return weights.bytes_read_per_token(gf, cfg, layer_tensors)


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediates (src/models/gemma4.cpp), each as (op, its
    occurrence in the layer, which output), for ``harness diff``. The norms count in block order:
    attn_norm, then V's. The post-norms run inside the residual adds (add_rms_norm, norm_add), so
    attn_post_norm, ffn_mlp, ffn_moe and ffn_post_norm have no engine tensor of their own: attn_out,
    ffn_moe_combined and l_out show them; the MoE layers' three input norms are add_rms_norm's."""
    names = {"attn_norm": ("rms_norm", 0, 0), "Qcur": ("matmuls", 0, 0), "Kcur": ("matmuls", 0, 1),
             "Vcur_normed": ("rms_norm", 1, 0),
             "Qcur_pos": ("qk_norm_rope", 0, 0), "Kcur_pos": ("qk_norm_rope", 0, 1),
             "kqv_out": ("attention", 0, 0),
             "attn_out": ("add_rms_norm", 0, 0), "ffn_norm_1" if cfg.moe else "ffn_norm": ("add_rms_norm", 0, 1)}
    if cfg.moe:
        names |= {"ffn_norm_2": ("add_rms_norm", 0, 3), "ffn_moe_combined": ("norm_add", 0, 0)}
    else:
        names |= {"ffn_out": ("matmul", 1, 0)}
    names["l_out"] = ("norm_add", 1 if cfg.moe else 0, 0)
    return names
