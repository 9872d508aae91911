"""The llama family: ``llama``, ``qwen2`` and ``qwen3``.

One pre-norm decoder block, written as the math (architectures.md §1, §1b, §2):

    x = x + Wo · Attn(RoPE(Wq·n + bq), RoPE(Wk·n + bk), Wv·n + bv),  n = RMSNorm(x)·attn_norm
    x = x + W_down · (SiLU(W_gate·m) ⊙ (W_up·m)),                      m = RMSNorm(x)·ffn_norm

qwen2 adds the Q/K/V biases, qwen3 a per-head RMSNorm on Q and K before RoPE;
llama rotates consecutive pairs (NORM), the Qwens rotate halves (NEOX).
"""

from __future__ import annotations


def block(ops, cfg, w, il, x, positions, cache):
    T = x.shape[0]
    n = ops.rms_norm(x, w.attn_norm, cfg.rms_eps)
    q, k, v = ops.matmuls(n, (w.wq, w.wk, w.wv), (w.bq, w.bk, w.bv))
    q = q.reshape(T, cfg.n_head, cfg.head_dim)
    k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = v.reshape(T, cfg.n_head_kv, cfg.head_dim)
    if cfg.qk_norm:
        q = ops.rms_norm(q, w.q_norm, cfg.rms_eps)
        k = ops.rms_norm(k, w.k_norm, cfg.rms_eps)
    rotation = cache.rope(il, positions)
    q, k = ops.rope(rotation, q, k)
    keys, values = cache.store(il, positions, k, v)
    a = ops.attention(q, keys, values, positions, cfg.attn_scale, cfg.swa_window[il])
    x, m = ops.add_rms_norm(x, ops.matmul(a, w.wo), w.ffn_norm, cfg.rms_eps)  # x += attn; m = RMSNorm(x)

    h = ops.swiglu(*ops.matmuls(m, (w.w_gate, w.w_up)))
    return ops.matmul(h, w.w_down, add=x)  # x + W_down·h


def llama_cpp_names(cfg) -> dict[str, tuple[str, int, int]]:
    """llama.cpp's names for this block's intermediate tensors (the
    ``cb(cur, name, il)`` of src/models/llama.cpp, qwen2.cpp, qwen3.cpp), each
    as (op, its occurrence in the layer, which output): what ``harness diff``
    lines up. ``l_out`` is the last matmul (W_down, residual added)."""
    names = {"attn_norm": ("rms_norm", 0, 0)}
    if cfg.qk_norm:
        names |= {"Qcur_normed": ("rms_norm", 1, 0), "Kcur_normed": ("rms_norm", 2, 0)}
    names |= {"Qcur": ("rope", 0, 0), "Kcur": ("rope", 0, 1), "Vcur": ("matmuls", 0, 2),
              "kqv_out": ("attention", 0, 0), "attn_out": ("matmul", 0, 0), "ffn_inp": ("add_rms_norm", 0, 0),
              "ffn_norm": ("add_rms_norm", 0, 1), "l_out": ("matmul", 1, 0)}
    return names
