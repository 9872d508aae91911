"""The NumPy Gated DeltaNet and gated-attention ops against direct
formulations of architectures.md §5.3-5.4 (the whole-model check is
tiny-qwen35 against llama.cpp in the catalog): the conv carries its last
K-1 inputs across calls, the delta rule in its decay-then-update form with
value head h reading key head h mod H_k, the L2 norm, the per-head [q | gate]
layout."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.backends.numpy import ops


def test_causal_conv_carries_its_inputs_across_calls():
    rng = np.random.default_rng(0)
    T, C, K = 9, 5, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    want = np.zeros((T, C))
    for t in range(T):
        for j in range(K):  # tap K-1 on the current token, zeros before the first
            src = t - (K - 1) + j
            if src >= 0:
                want[t] += x[src] * w[:, j]
    want = want / (1 + np.exp(-want))
    whole = ops.causal_conv(x, w, SimpleNamespace(conv=np.zeros((K - 1, C), np.float32)))
    state = SimpleNamespace(conv=np.zeros((K - 1, C), np.float32))
    parts = np.concatenate([ops.causal_conv(x[:4], w, state), ops.causal_conv(x[4:5], w, state),
                            ops.causal_conv(x[5:], w, state)])
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(parts, whole)
    np.testing.assert_array_equal(state.conv, x[-(K - 1):])


def test_delta_rule_decays_then_updates_with_tiled_key_heads():
    rng = np.random.default_rng(1)
    T, H_k, H_v, S = 6, 2, 4, 8
    q = ops.l2_norm(rng.standard_normal((T, H_k, S)).astype(np.float32), 1e-6)
    k = ops.l2_norm(rng.standard_normal((T, H_k, S)).astype(np.float32), 1e-6)
    v = rng.standard_normal((T, H_v, S)).astype(np.float32)
    g = -rng.uniform(0.05, 1.0, (T, H_v)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, H_v)).astype(np.float32)
    st = SimpleNamespace(s=np.zeros((H_v, S, S), np.float32))
    out = ops.delta_rule(q, k, v, g, beta, st)
    M = np.zeros((H_v, S, S))
    for t in range(T):
        for h in range(H_v):
            kk, qq = k[t, h % H_k].astype(np.float64), q[t, h % H_k].astype(np.float64)  # tiled, not grouped
            M[h] *= np.exp(g[t, h])
            M[h] += np.outer(kk, beta[t, h] * (v[t, h] - M[h].T @ kk))
            np.testing.assert_allclose(out[t, h], M[h].T @ qq / np.sqrt(S), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st.s, M, rtol=1e-5, atol=1e-6)
    # carried: the last token alone, from the state after the first five, gives the same output
    st2 = SimpleNamespace(s=np.zeros((H_v, S, S), np.float32))
    ops.delta_rule(q[:5], k[:5], v[:5], g[:5], beta[:5], st2)
    np.testing.assert_allclose(ops.delta_rule(q[5:], k[5:], v[5:], g[5:], beta[5:], st2), out[5:], rtol=1e-6)


def test_l2_norm_and_gates():
    x = np.array([[3.0, 4.0]], np.float32)
    np.testing.assert_allclose(ops.l2_norm(x, 0.0), [[0.6, 0.8]], rtol=1e-6)
    beta, g = ops.decay_gates(np.array([0.0], np.float32), np.array([30.0], np.float32),
                              np.array([-5.0], np.float32), np.array([-0.5], np.float32))
    assert beta[0] == np.float32(0.5) and g[0] == np.float32(-12.5)  # softplus(25) = 25 past its threshold
    _, g = ops.decay_gates(np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32),
                           np.full(1, -2.0, np.float32))
    np.testing.assert_allclose(g, -2.0 * np.log(2.0), rtol=1e-6)


def test_split_gate_is_per_head():
    H, D = 3, 2
    x = np.arange(2 * H * 2 * D, dtype=np.float32).reshape(2, H * 2 * D)
    q, gate = ops.split_gate(x, H, D)
    for h in range(H):
        np.testing.assert_array_equal(q[:, h], x[:, 2 * D * h:2 * D * h + D])
        np.testing.assert_array_equal(gate[:, h * D:(h + 1) * D], x[:, 2 * D * h + D:2 * D * (h + 1)])
    a, b, c = ops.split(np.arange(12, dtype=np.float32).reshape(2, 6), (1, 2, 3))
    assert a.tolist() == [[0], [6]] and b.tolist() == [[1, 2], [7, 8]] and c.tolist() == [[3, 4, 5], [9, 10, 11]]


def test_gates_of_the_gated_attention_and_the_shared_expert():
    a = np.array([[2.0, -4.0], [1.0, 1.0]], np.float32)
    np.testing.assert_allclose(ops.sigmoid_mul(a, np.array([[0.0, 100.0], [-100.0, 0.0]], np.float32)),
                               [[1.0, -4.0], [0.0, 0.5]], atol=1e-30)
    g = ops.dot(a, np.array([0.5, 0.25], np.float32))  # one gate logit per row
    assert g.shape == (2, 1) and g[:, 0].tolist() == [0.0, 0.75]
    np.testing.assert_allclose(ops.sigmoid_mul(a, g), a / (1 + np.exp(-g)), rtol=1e-6)  # one gate for the row


def chunked_delta_rule(q, k, v, g, beta, S0, C):
    """The gated delta rule a chunk of C tokens at a time (the WY / UT form
    the CUDA prefill computes; Yang et al., Gated Delta Networks), per value
    head, float64. Within a chunk, G_i = Σ_{j<=i} g_j, Γ_i = e^{G_i}:

        (I + A) Δ = diag(β) (V − diag(Γ) K S₀),  A_ij = β_i e^{G_i−G_j} k_i·k_j  (j < i)
        O   = (diag(Γ) Q S₀ + (M ⊙ Q Kᵀ) Δ) / √S_v,   M_ij = e^{G_i−G_j}  (j <= i)
        S_C = Γ_C S₀ + (e^{G_C−G} ⊙ K)ᵀ Δ

    Δ's rows are the token loop's δ_t = β_t (v_t − γ_t S_{t−1}ᵀ k_t); every
    exponent is G_i − G_j <= 0 (g <= 0), so nothing overflows. (I + A) is
    unit lower triangular: forward substitution, no general inverse."""
    T, H_v, S_v = v.shape
    kh = np.arange(H_v) % q.shape[1]
    S = S0.astype(np.float64).copy()
    out = np.empty((T, H_v, S_v))
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        n = sl.stop - sl.start
        for h in range(H_v):
            Q, K = q[sl, kh[h]].astype(np.float64), k[sl, kh[h]].astype(np.float64)  # [n, S_k]
            V, b = v[sl, h].astype(np.float64), beta[sl, h].astype(np.float64)
            G = np.cumsum(g[sl, h].astype(np.float64))
            D = G[:, None] - G[None, :]
            lower = np.tril(np.ones((n, n), bool), -1)
            A = np.where(lower, b[:, None] * np.exp(np.where(lower, D, 0.0)) * (K @ K.T), 0.0)
            rhs = b[:, None] * (V - np.exp(G)[:, None] * (K @ S[h]))
            delta = np.empty_like(rhs)
            for i in range(n):  # forward substitution through the unit lower-triangular I + A
                delta[i] = rhs[i] - A[i, :i] @ delta[:i]
            M = np.where(np.tril(np.ones((n, n), bool)), np.exp(np.where(D <= 0, D, 0.0)), 0.0)
            out[sl, h] = (np.exp(G)[:, None] * (Q @ S[h]) + (M * (Q @ K.T)) @ delta) / np.sqrt(S_v)
            S[h] = np.exp(G[-1]) * S[h] + (np.exp(G[-1] - G)[:, None] * K).T @ delta
    return out, S


def test_the_chunked_form_equals_the_token_loop():
    """The chunked prefill's algebra against the op's token loop: chunk sizes
    that divide T and do not, a carried state, key heads shared by value
    heads, and decays from none to strong (g down to -8 per token)."""
    rng = np.random.default_rng(5)
    T, H_k, H_v, S_k, S_v = 150, 2, 4, 16, 8
    q = ops.l2_norm(rng.standard_normal((T, H_k, S_k)).astype(np.float32), 1e-6)
    k = ops.l2_norm(rng.standard_normal((T, H_k, S_k)).astype(np.float32), 1e-6)
    v = rng.standard_normal((T, H_v, S_v)).astype(np.float32)
    beta = ops.sigmoid(rng.standard_normal((T, H_v)).astype(np.float32))
    g = -np.exp(rng.uniform(-6, 2, (T, H_v))).astype(np.float32)
    g[:20] = 0.0  # no decay at all for a stretch
    S0 = rng.standard_normal((H_v, S_k, S_v)).astype(np.float32)
    state = SimpleNamespace(s=S0.copy())
    want = ops.delta_rule(q, k, v, g, beta, state)
    for C in (64, 37, 1):
        got, S = chunked_delta_rule(q, k, v, g, beta, S0, C)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"outputs, chunk {C}")
        np.testing.assert_allclose(S, state.s, rtol=1e-4, atol=1e-5, err_msg=f"final state, chunk {C}")
