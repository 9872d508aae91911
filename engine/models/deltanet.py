"""Gated DeltaNet linear attention: the recurrent half of the hybrid
families (architectures.md §5.4; llama.cpp's ``build_layer_attn_linear``,
``build_conv_state``, ``build_recurrent_attn``). Per token, with
u = RMSNorm(x)·attn_norm:

    mix, z = W_qkv·u, W_gate·u                       mix = [q | k | v] over all heads
    β = sigmoid(W_beta·u),  g = softplus(W_alpha·u + dt_bias) · a     (a = -exp(A_log) < 0)
    q, k, v = SiLU(causal depthwise conv of mix, d_conv taps, carried over tokens)
    q, k = q/‖q‖, k/‖k‖                              per head
    per value head h (key head h mod H_k), state S ∈ R^{S_k×S_v}:
        S ← e^g S;  S ← S + k (β (v − Sᵀk))ᵀ;  o = Sᵀq / √S_v
    out = W_out · (RMSNorm_head(o)·ssm_norm ⊙ SiLU(z))

The layer's state (the last d_conv-1 inputs of the conv, and S) lives in its
``recurrent`` state object and is carried from one call to the next.
"""

from __future__ import annotations

from .weights import Spec

TENSORS = {
    "attn_norm": Spec("blk.{i}.attn_norm.weight", lambda c: (c.n_embd,)),
    # four projections of u, back to back
    "w_qkv": Spec("blk.{i}.attn_qkv.weight", lambda c: (c.ssm.conv_dim, c.n_embd), group="in"),
    "w_z": Spec("blk.{i}.attn_gate.weight", lambda c: (c.ssm.value_dim, c.n_embd), group="in"),
    "w_beta": Spec("blk.{i}.ssm_beta.weight", lambda c: (c.ssm.n_v_heads, c.n_embd), group="in"),
    "w_alpha": Spec("blk.{i}.ssm_alpha.weight", lambda c: (c.ssm.n_v_heads, c.n_embd), group="in"),
    "conv": Spec("blk.{i}.ssm_conv1d.weight", lambda c: (c.ssm.conv_dim, c.ssm.d_conv)),
    "dt_bias": Spec("blk.{i}.ssm_dt.bias", lambda c: (c.ssm.n_v_heads,)),
    "a": Spec("blk.{i}.ssm_a", lambda c: (c.ssm.n_v_heads,)),  # -exp(A_log), as the converter writes it
    "norm": Spec("blk.{i}.ssm_norm.weight", lambda c: (c.ssm.head_v,)),
    "w_out": Spec("blk.{i}.ssm_out.weight", lambda c: (c.n_embd, c.ssm.value_dim)),
}


def gated_deltanet(ops, cfg, w, x, state, residual=None):
    """The layer's output for the rows of ``x`` (the caller adds it to the residual, or the output
    projection adds ``residual`` where given)."""
    s, T = cfg.ssm, x.shape[0]
    u = ops.rms_norm(x, w.attn_norm, cfg.rms_eps)
    mix, z, b, a = ops.matmuls(u, (w.w_qkv, w.w_z, w.w_beta, w.w_alpha))
    beta, g = ops.decay_gates(b, a, w.dt_bias, w.a)
    q, k, v = ops.split(ops.causal_conv(mix, w.conv, state), (s.key_dim, s.key_dim, s.value_dim))
    q = ops.l2_norm(q.reshape(T, s.n_k_heads, s.head_k), cfg.rms_eps)
    k = ops.l2_norm(k.reshape(T, s.n_k_heads, s.head_k), cfg.rms_eps)
    o = ops.delta_rule(q, k, v.reshape(T, s.n_v_heads, s.head_v), g, beta, state)
    o = ops.swiglu(z.reshape(T, s.n_v_heads, s.head_v), ops.rms_norm(o, w.norm, cfg.rms_eps))  # SiLU(z) ⊙ norm(o)
    return ops.matmul(o.reshape(T, s.value_dim), w.w_out, add=residual)
