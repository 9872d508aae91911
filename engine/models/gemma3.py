"""Gemma 3 (architectures.md §4).

Differs from the llama family in five places: the embedding is scaled by
√n_embd; attention and FFN outputs are RMS-normed again before the residual
add (post-norms); the FFN is GeGLU with tanh-GELU; most layers attend over a
sliding window with their own RoPE base; the logits may be soft-capped.

    x = x + RMSNorm(Wo · Attn(RoPE(RMSNorm_h(Wq·n)), RoPE(RMSNorm_h(Wk·n)), Wv·n))·post_attn_norm
    x = x + RMSNorm(W_down · (GELU(W_gate·m) ⊙ (W_up·m)))·post_ffn_norm
"""

from __future__ import annotations


def block(ops, cfg, w, il, x, positions, cache):
    T = x.shape[0]
    n = ops.rms_norm(x, w.attn_norm, cfg.rms_eps)
    q, k, v = ops.matmuls(n, (w.wq, w.wk, w.wv), (w.bq, w.bk, w.bv))
    q = q.reshape(T, cfg.n_head, cfg.head_dim)
    k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = v.reshape(T, cfg.n_head_kv, cfg.head_dim)
    q = ops.rms_norm(q, w.q_norm, cfg.rms_eps)
    k = ops.rms_norm(k, w.k_norm, cfg.rms_eps)
    rotation = cache.rope(il, positions)  # SWA layers: their own base, no scaling
    q, k = ops.rope(rotation, q, k)
    keys, values = cache.store(il, positions, k, v)
    a = ops.attention(q, keys, values, positions, cfg.attn_scale, cfg.swa_window[il])
    a = ops.rms_norm(ops.matmul(a, w.wo), w.post_attn_norm, cfg.rms_eps)
    x, m = ops.add_rms_norm(x, a, w.ffn_norm, cfg.rms_eps)  # x += a; m = RMSNorm(x)

    h = ops.geglu(*ops.matmuls(m, (w.w_gate, w.w_up)))
    return ops.add(x, ops.rms_norm(ops.matmul(h, w.w_down), w.post_ffn_norm, cfg.rms_eps))


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediate tensors (src/models/gemma3.cpp),
    each as (op, its occurrence in the layer, which output), for ``harness diff``."""
    return {"attn_norm": ("rms_norm", 0, 0), "Qcur_normed": ("rms_norm", 1, 0), "Kcur_normed": ("rms_norm", 2, 0),
            "Qcur": ("rope", 0, 0), "Kcur": ("rope", 0, 1), "Vcur": ("matmuls", 0, 2),
            "kqv_out": ("attention", 0, 0), "attn_post_norm": ("rms_norm", 3, 0), "sa_out": ("add_rms_norm", 0, 0),
            "ffn_norm": ("add_rms_norm", 0, 1), "ffn_out": ("matmul", 1, 0), "ffn_post_norm": ("rms_norm", 4, 0),
            "l_out": ("add", 0, 0)}
