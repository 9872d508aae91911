"""Qwen3.5 / Qwen3.6 hybrids (``qwen35``, ``qwen35moe``, architectures.md §5):
three of every four layers Gated DeltaNet (deltanet.py), every fourth softmax
attention with a per-head sigmoid output gate and partial RoPE; a SwiGLU FFN
on every layer (qwen35moe: routed experts plus a gated shared expert, moe.py).

    x = x + Mixer(x)       Mixer: GatedDeltaNet(RMSNorm(x)·attn_norm), or
                           Wo · (Attn(RoPE(RMSNorm_h(Q)), RoPE(RMSNorm_h(K)), V) ⊙ sigmoid(G)),
                           [Q | G] per head = Wq·n, n = RMSNorm(x)·attn_norm
    x = x + W_down · (SiLU(W_gate·m) ⊙ (W_up·m)),   m = RMSNorm(x)·post_attention_norm
      (qwen35moe: x = x + MoE(m) + sigmoid(g·m) · SharedExpert(m))
"""

from __future__ import annotations

from . import attention, deltanet, ffn, moe, weights
from .weights import Spec

ARCHS = ("qwen35", "qwen35moe")

# the FFN's norm is stored as post_attention_norm
FFN_NORM = {"ffn_norm": Spec("blk.{i}.post_attention_norm.weight", lambda c: (c.n_embd,))}


def layer_tensors(cfg, il: int) -> dict:
    mixer = deltanet.TENSORS if cfg.recurrent[il] else attention.GATED_TENSORS
    ffn_part = moe.TENSORS | moe.SHARED_TENSORS if cfg.moe else ffn.TENSORS
    return mixer | ffn_part | FFN_NORM


def layer_kinds(cfg) -> list[str]:
    """A recurrent layer keeps its conv inputs and DeltaNet state; an attention layer its keys and values."""
    return ["recurrent" if r else "attention" for r in cfg.recurrent]


def mixer(ops, cfg, w, il, x, positions, state, residual=None):
    """The layer's token mixer: Gated DeltaNet or attention (plus ``residual``, where given)."""
    if cfg.recurrent[il]:
        return deltanet.gated_deltanet(ops, cfg, w, x, state, residual=residual)
    return attention.self_attention(ops, cfg, w, il, x, positions, state, residual=residual)


def block(ops, cfg, w, il, x, positions, state):
    if cfg.moe:
        a = mixer(ops, cfg, w, il, x, positions, state)
        x, m = ops.add_rms_norm(x, a, w.ffn_norm, cfg.rms_eps)  # x += mixer; m = RMSNorm(x)·post_attention_norm
        return ops.add(moe.moe_ffn(ops, cfg, w, m, add=x), moe.shared_expert(ops, w, m))
    # dense, as llama.py: the mixer's output projection adds the residual (decode: its GEMV's
    # epilogue), then the norm alone, which decode folds into the gate/up GEMV
    x = mixer(ops, cfg, w, il, x, positions, state, residual=x)  # x + mixer
    m = ops.rms_norm(x, w.ffn_norm, cfg.rms_eps)
    h = ffn.gated_hidden(ops, w, m, cfg.activation)
    return ops.matmul(h, w.w_down, add=x)


def bytes_per_token(gf, cfg) -> int:
    """Every layer's weights and the head; of the routed experts, the ``n_expert_used`` a token reads."""
    return weights.bytes_read_per_token(gf, cfg, layer_tensors)


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names (src/models/qwen35.cpp, qwen35moe.cpp) for intermediates both layer kinds
    share; ``l_out`` is the second matmul of either kind (W_out or Wo, then W_down with the
    residual), or qwen35moe's final add."""
    return {"attn_norm": ("rms_norm", 0, 0), "l_out": ("add", 0, 0) if cfg.moe else ("matmul", 1, 0)}
