"""Qwen3 MoE (``qwen3moe``, architectures.md §3): qwen3's attention (per-head
Q/K RMSNorm, NEOX RoPE) and a routed Mixture-of-Experts FFN on every layer.

    x = x + Wo · Attn(RoPE(RMSNorm_h(Wq·n)), RoPE(RMSNorm_h(Wk·n)), Wv·n),  n = RMSNorm(x)·attn_norm
    x = x + MoE(m),                                                        m = RMSNorm(x)·ffn_norm
"""

from __future__ import annotations

from . import attention, moe, weights

ARCHS = ("qwen3moe",)


def layer_tensors(cfg, il: int) -> dict:
    return attention.TENSORS | moe.TENSORS


layer_kinds = attention.every_layer


def block(ops, cfg, w, il, x, positions, state):
    a = attention.self_attention(ops, cfg, w, il, x, positions, state)
    x, m = ops.add_rms_norm(x, a, w.ffn_norm, cfg.rms_eps)  # x += a; m = RMSNorm(x)·ffn_norm
    return moe.moe_ffn(ops, cfg, w, m, add=x)  # x + MoE(m)


def bytes_per_token(gf, cfg) -> int:
    """Every layer's weights and the head; of the routed experts, the ``n_expert_used`` a token reads."""
    return weights.bytes_read_per_token(gf, cfg, layer_tensors)


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediates (src/models/qwen3moe.cpp),
    each as (op, its occurrence in the layer, which output), for ``harness diff``. ``l_out`` is
    the MoE output with the residual added (fused; llama.cpp's ``ffn_moe_out`` is not exposed)."""
    return {"attn_norm": ("rms_norm", 0, 0),
            "Qcur": ("qk_norm_rope", 0, 0), "Kcur": ("qk_norm_rope", 0, 1), "Vcur": ("matmuls", 0, 2),
            "kqv_out": ("attention", 0, 0), "attn_out": ("matmul", 0, 0), "ffn_inp": ("add_rms_norm", 0, 0),
            "ffn_norm": ("add_rms_norm", 0, 1), "l_out": ("moe_ffn", 0, 0)}
