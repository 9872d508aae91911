"""Causal softmax self-attention: the half of the block every family here
shares (architectures.md §0.3, §0.4; llama.cpp's ``build_qkv`` and
``build_attn``).

    n = RMSNorm(x)·attn_norm
    Q, K, V = Wq·n + bq, Wk·n + bk, Wv·n + bv             (biases: qwen2)
    V = Wk·n                                               (no attn_v: gemma4's full layers)
    Q, K = RMSNorm_head(Q)·q_norm, RMSNorm_head(K)·k_norm  (qwen3, gemma3, gemma4, qwen35)
    V = RMSNorm_head(V)                                    (no weight: gemma4)
    out = Wo · Attn(RoPE(Q), RoPE(K), V)                   (window: sliding layers)
    out = Wo · (Attn(...) ⊙ sigmoid(G)), [Q | G] per head  (gated: qwen35, partial RoPE)

The caller adds ``out`` to the residual stream (after its own post-norm, if any).
Each layer reads its own view of the config (``cfg.layer(il)``): gemma4's
sliding and full layers differ in head width, KV heads and RoPE.
"""

from __future__ import annotations

from .weights import Spec


def _q(c):
    return c.n_head * c.head_dim


def _kv(c):
    return c.n_head_kv * c.head_dim


# The tensors of one attention layer; Q, K and V are one group: the backend
# may run them as one stacked projection (they are loaded back to back).
TENSORS = {
    "attn_norm": Spec("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    "wq": Spec("blk.{i}.attn_q.weight", lambda c: (_q(c), c.n_embd), group="qkv"),
    "wk": Spec("blk.{i}.attn_k.weight", lambda c: (_kv(c), c.n_embd), group="qkv"),
    "wv": Spec("blk.{i}.attn_v.weight", lambda c: (_kv(c), c.n_embd), lambda c: not c.v_from_k, group="qkv"),
    "bq": Spec("blk.{i}.attn_q.bias", lambda c: (_q(c),), lambda c: c.qkv_bias),
    "bk": Spec("blk.{i}.attn_k.bias", lambda c: (_kv(c),), lambda c: c.qkv_bias),
    "bv": Spec("blk.{i}.attn_v.bias", lambda c: (_kv(c),), lambda c: c.qkv_bias),
    "q_norm": Spec("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,), lambda c: c.qk_norm),
    "k_norm": Spec("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), lambda c: c.qk_norm),
    "wo": Spec("blk.{i}.attn_output.weight", lambda c: (c.n_embd, _q(c))),
}


# Gated attention (qwen35): the Q projection yields [q | gate] per head, twice the rows.
GATED_TENSORS = TENSORS | {"wq": Spec("blk.{i}.attn_q.weight", lambda c: (2 * _q(c), c.n_embd), group="qkv")}


def every_layer(cfg) -> list[str]:
    """``layer_kinds`` of a family whose every layer is softmax attention
    (each layer's state: its keys and values)."""
    return ["attention"] * cfg.n_layer


def self_attention(ops, cfg, w, il, x, positions, kv, residual=None):
    """``Wo · Attn(...)`` of layer ``il`` for the rows of ``x`` at ``positions``
    (plus ``residual`` where given: the projection adds it); the layer's keys
    and values are stored in its state ``kv`` on the way."""
    cfg, T = cfg.layer(il), x.shape[0]
    n = ops.rms_norm(x, w.attn_norm, cfg.rms_eps)
    if cfg.v_from_k:
        q, k = ops.matmuls(n, (w.wq, w.wk), (w.bq, w.bk))
        v = k
    else:
        q, k, v = ops.matmuls(n, (w.wq, w.wk, w.wv), (w.bq, w.bk, w.bv))
    if cfg.attn_gate:
        q, gate = ops.split_gate(q, cfg.n_head, cfg.head_dim)
    q = q.reshape(T, cfg.n_head, cfg.head_dim)
    k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = v.reshape(T, cfg.n_head_kv, cfg.head_dim)
    if cfg.v_norm:  # before K's norm and RoPE, which may work in place on the shared projection
        v = ops.rms_norm(v, None, cfg.rms_eps)
    rotation = kv.rope(positions)  # per layer: gemma3's sliding layers have their own base
    if cfg.qk_norm:  # RMSNorm per head, then RoPE
        q, k = ops.qk_norm_rope(rotation, q, k, w.q_norm, w.k_norm, cfg.rms_eps)
    else:
        q, k = ops.rope(rotation, q, k)
    keys, values = kv.store(positions, k, v)
    a = ops.attention(q, keys, values, positions, cfg.attn_scale, cfg.swa_window[il])
    if cfg.attn_gate:
        a = ops.sigmoid_mul(a, gate)  # the output gate, per element
    return ops.matmul(a, w.wo, add=residual)
