"""The llama family: ``llama``, ``qwen2`` and ``qwen3``.

One pre-norm decoder block, written as the math (architectures.md §1, §1b, §2):

    x = x + Wo · Attn(RoPE(Wq·n + bq), RoPE(Wk·n + bk), Wv·n + bv),  n = RMSNorm(x)·attn_norm
    x = x + W_down · (SiLU(W_gate·m) ⊙ (W_up·m)),                      m = RMSNorm(x)·ffn_norm

qwen2 adds the Q/K/V biases, qwen3 a per-head RMSNorm on Q and K before RoPE;
llama rotates consecutive pairs (NORM), the Qwens rotate halves (NEOX).
"""

from __future__ import annotations

from . import attention, ffn, weights

ARCHS = ("llama", "qwen2", "qwen3")


def layer_tensors(cfg, il: int) -> dict:
    """The tensors of layer ``il`` (every layer alike here)."""
    return attention.TENSORS | ffn.TENSORS


layer_kinds = attention.every_layer


def block(ops, cfg, w, il, x, positions, state):
    # the residual added by Wo's own kernel (as W_down's below): decode's GEMV
    # epilogue; then the norm alone
    x = attention.self_attention(ops, cfg, w, il, x, positions, state, residual=x)  # x + Wo·Attn
    m = ops.rms_norm(x, w.ffn_norm, cfg.rms_eps)
    h = ffn.gated_hidden(ops, w, m, cfg.activation)
    return ops.matmul(h, w.w_down, add=x)  # x + W_down·h


def bytes_per_token(gf, cfg) -> int:
    """Every layer's weights and the head: a dense model reads all of them."""
    return weights.bytes_read_per_token(gf, cfg, layer_tensors)


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediate tensors (the
    ``cb(cur, name, il)`` of src/models/llama.cpp, qwen2.cpp, qwen3.cpp), each
    as (op, its occurrence in the layer, which output): what ``harness diff``
    lines up. ``ffn_inp`` and ``l_out`` are the two matmuls that add the
    residual (Wo, W_down): llama.cpp's ``attn_out`` (Wo's product alone) is
    not formed."""
    rope = "qk_norm_rope" if cfg.qk_norm else "rope"  # qwen3's Qcur_normed/Kcur_normed: inside qk_norm_rope
    names = {"attn_norm": ("rms_norm", 0, 0)}
    names |= {"Qcur": (rope, 0, 0), "Kcur": (rope, 0, 1), "Vcur": ("matmuls", 0, 2),
              "kqv_out": ("attention", 0, 0), "ffn_inp": ("matmul", 0, 0),
              "ffn_norm": ("rms_norm", 1, 0), "l_out": ("matmul", 1, 0)}
    return names
