"""Reference operators in NumPy.

This backend is the oracle for the CUDA kernels, so it favours the obviously
correct formulation over speed: float32 storage and matmuls (BLAS sgemm),
float64 for reductions (norm sums, softmax sums, RoPE angles) as llama.cpp's
CPU backend does with its ``ggml_float`` accumulators.

Shapes: activations are ``[T, n]`` (T tokens); per-head tensors ``[T, H, D]``.
"""

from __future__ import annotations

import numpy as np

from ...config import ROPE_NEOX, ROPE_NORM

F32 = np.float32


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x²) + eps) · w`` over the last axis (the weight is used
    as stored: gemma's ``1 + w`` is already baked into its GGUF)."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    y = (x * (1.0 / np.sqrt(ms + eps))).astype(F32)
    return y if w is None else y * w


def matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, add: np.ndarray | None = None) -> np.ndarray:
    """``y = x · Wᵀ (+ bias) (+ add)`` for a weight stored as GGUF rows
    ``[n_out, n_in]``; ``add`` is a residual stream to add the result to."""
    y = x @ w.T
    if bias is not None:
        y = y + bias
    return y if add is None else add + y


def matmuls(x: np.ndarray, weights, biases=None) -> list[np.ndarray]:
    """Several projections of the same input (Q/K/V, gate/up)."""
    biases = biases or (None,) * len(weights)
    return [matmul(x, w, b) for w, b in zip(weights, biases)]


def add_rms_norm(x: np.ndarray, a: np.ndarray, w, eps: float, a_norm: np.ndarray | None = None) -> tuple:
    """The residual add and the next norm: ``x + a`` and ``RMSNorm(x + a)·w``
    (``w`` a tuple: one norm per weight); with ``a_norm``, ``a`` is first
    post-normed: ``RMSNorm(a)·a_norm``."""
    x = x + (a if a_norm is None else rms_norm(a, a_norm, eps))
    return (x, *(rms_norm(x, wi, eps) for wi in (w if isinstance(w, tuple) else (w,))))


def norm_add(x: np.ndarray, a: np.ndarray, w: np.ndarray, eps: float, scale: np.ndarray | None = None,
             x_norm: np.ndarray | None = None) -> np.ndarray:
    """A post-normed residual add: ``(x + RMSNorm(a)·w)·scale`` (``scale`` a
    ``[1]`` weight or None); with ``x_norm``, x is first normed too:
    ``RMSNorm(x)·x_norm``."""
    x = (x if x_norm is None else rms_norm(x, x_norm, eps)) + rms_norm(a, w, eps)
    return x if scale is None else x * scale


def rope_angles(positions: np.ndarray, n_rot: int, base: float, scale: float,
                freq_divisors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin ``[T, n_rot/2]`` of ``θ = scale · pos · base^(-2i/n_rot) / divisor_i``."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv_freq = base ** (-2.0 * i / n_rot)
    if freq_divisors is not None:
        inv_freq = inv_freq / freq_divisors.astype(np.float64)
    theta = scale * positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(theta), np.sin(theta)


def rope(rotation: tuple[np.ndarray, np.ndarray, str], *xs: np.ndarray) -> list[np.ndarray]:
    """Rotate each ``x [T, H, D]`` (queries, keys) by ``rotation`` (cos, sin, rope type)."""
    return [rope_one(x, rotation) for x in xs]


def qk_norm_rope(rotation, q: np.ndarray, k: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray,
                 eps: float) -> list[np.ndarray]:
    """Per-head RMSNorm of q and k with their weights, then RoPE."""
    return rope(rotation, rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps))


def rope_one(x: np.ndarray, angles: tuple[np.ndarray, np.ndarray, str]) -> np.ndarray:
    """Rotate ``x [T, H, D]`` pairwise by ``angles = (cos, sin, rope_type)``
    (from ``KVLayer.rope``). NORM pairs (2i, 2i+1); NEOX pairs (i, i+D/2)."""
    cos, sin, rope_type = angles
    half = cos.shape[1]
    if rope_type == ROPE_NORM:
        x0, x1 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    elif rope_type == ROPE_NEOX:
        x0, x1 = x[..., :half], x[..., half:2 * half]
    else:
        raise ValueError(f"unknown rope type {rope_type!r}")
    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    r0 = (x0 * c - x1 * s).astype(F32)
    r1 = (x0 * s + x1 * c).astype(F32)
    out = x.copy()
    if rope_type == ROPE_NORM:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = r0, r1
    else:
        out[..., :half], out[..., half:2 * half] = r0, r1
    return out


def attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, scale: float,
              window: int = 0) -> np.ndarray:
    """Causal multi-head attention with grouped KV heads.

    q ``[T, H, D]`` at ``positions``; keys, values ``[S, Hkv, D]`` for positions
    ``0..S-1`` (the cache). Key p is visible to a query at p' iff p <= p' and,
    with a sliding window, p' - p < window. Returns ``[T, H·D]``.
    """
    k, v, q_pos = keys, values, positions
    T, H, D = q.shape
    S, Hkv, _ = k.shape
    g = H // Hkv  # query head h reads KV head h // g (contiguous groups)
    qg = q.reshape(T, Hkv, g, D).transpose(1, 2, 0, 3)  # [Hkv, g, T, D]
    kt = k.transpose(1, 2, 0)  # [Hkv, D, S]
    scores = (qg @ kt[:, None]) * F32(scale)  # [Hkv, g, T, S]
    kpos = np.arange(S)
    visible = kpos[None, :] <= q_pos[:, None]
    if window:
        visible &= (q_pos[:, None] - kpos[None, :]) < window
    scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores.astype(np.float64))
    p = (p / p.sum(axis=-1, keepdims=True)).astype(F32)
    o = p @ v.transpose(1, 0, 2)[:, None]  # [Hkv, g, T, D]
    return o.transpose(2, 0, 1, 3).reshape(T, H * D)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives the right limit, -0
        return x / (F32(1) + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (what llama.cpp uses for gemma, not erf)."""
    return F32(0.5) * x * (F32(1) + np.tanh(F32(0.7978845608) * x * (F32(1) + F32(0.044715) * x * x)))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return silu(g) * u


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return gelu_tanh(g) * u


def glu(x: np.ndarray, w_gate, w_up, activation: str) -> np.ndarray:
    g, u = matmuls(x, (w_gate, w_up))
    return swiglu(g, u) if activation == "silu" else geglu(g, u)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)


def split_gate(x: np.ndarray, n_head: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``x [T, H·2D]`` holding ``[q | gate]`` per head: ``q [T, H, D]`` and ``gate [T, H·D]``."""
    xh = x.reshape(x.shape[0], n_head, 2 * head_dim)
    return np.ascontiguousarray(xh[..., :head_dim]), np.ascontiguousarray(xh[..., head_dim:]).reshape(x.shape[0], -1)


def sigmoid_mul(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``a ⊙ sigmoid(g)`` (the gated attention's output gate)."""
    return a * sigmoid(g)


def dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x · w`` per row for a vector ``w``: ``[T, 1]``."""
    return (x @ w)[:, None]


def split(x: np.ndarray, sizes) -> list[np.ndarray]:
    """The columns of ``x [T, Σ sizes]`` cut into consecutive ``[T, size]`` pieces."""
    cuts = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=-1)]


def softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + e^x)``, ``x`` itself above 20 (ggml's op_softplus)."""
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return np.where(x64 > 20.0, x64, np.log1p(np.exp(x64))).astype(F32)


def decay_gates(b: np.ndarray, a: np.ndarray, dt_bias: np.ndarray, ssm_a: np.ndarray):
    """DeltaNet's per-head gates: ``β = sigmoid(b)`` and the log-decay ``g = softplus(a + dt_bias) · ssm_a``."""
    return sigmoid(b), softplus(a + dt_bias) * ssm_a


def causal_conv(x: np.ndarray, w: np.ndarray, state) -> np.ndarray:
    """SiLU of the causal depthwise convolution of ``x [T, C]`` with ``w [C, K]``
    over time: ``y[t, c] = Σ_j win[t + j, c]·w[c, j]`` (tap K-1 on the current
    token, summed in tap order in fp32), ``win`` = the K-1 inputs carried in
    ``state.conv`` then ``x``; the last K-1 inputs are carried on."""
    K = w.shape[1]
    win = np.concatenate([state.conv, x.astype(F32)], axis=0)
    y = np.zeros_like(x, dtype=F32)
    for j in range(K):
        y = y + win[j:j + x.shape[0]] * w[:, j]
    state.conv = win[win.shape[0] - (K - 1):].copy()
    return silu(y)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(Σx² + eps)`` over the last axis, rounded as llama.cpp's
    ``rms_norm(x, eps/S)·(1/√S)`` (two fp32 steps)."""
    S = x.shape[-1]
    return rms_norm(x, None, eps / S) * F32(1.0 / np.sqrt(S))


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state) -> np.ndarray:
    """The gated delta rule, token by token, over ``state.s [H_v, S_k, S_v]``
    (fp32; value head h reads key head ``h mod H_k``): ``γ = e^g``,
    ``δ = β (v − γ Sᵀk)``, ``S ← γS + k δᵀ``, ``o = Sᵀq / √S_v``.
    q, k ``[T, H_k, S_k]``; v ``[T, H_v, S_v]``; g, beta ``[T, H_v]``. ``[T, H_v, S_v]``."""
    T, H_v, S_v = v.shape
    kh = np.arange(H_v) % q.shape[1]
    S = state.s.astype(np.float64)
    out = np.empty((T, H_v, S_v), F32)
    for t in range(T):
        qt, kt = q[t, kh].astype(np.float64), k[t, kh].astype(np.float64)  # [H_v, S_k]
        gamma = np.exp(g[t].astype(np.float64))[:, None]                 # [H_v, 1]
        kv = np.einsum("hic,hi->hc", S, kt)
        delta = (v[t] - gamma * kv) * beta[t].astype(np.float64)[:, None]
        S = (gamma[:, :, None] * S + kt[:, :, None] * delta[:, None, :]).astype(F32).astype(np.float64)
        out[t] = np.einsum("hic,hi->hc", S, qt) / np.sqrt(S_v)
    state.s = S.astype(F32)
    return out


MOE_NORM_CLAMP = 6.103515625e-5  # 2^-14: llama.cpp's floor on the renormalising sum


def moe_route(x: np.ndarray, router: np.ndarray, k: int, norm: bool, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` experts per row by softmax probability of ``router·(x·scale)``
    (ties to the lower id, descending) and their weights, renormalised to sum
    1 when ``norm``."""
    if scale != 1.0:
        x = x * F32(scale)
    return route(x @ router.T, k, norm)


def route(logits: np.ndarray, k: int, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """``moe_route`` from the router's logits ``[T, n_expert]``."""
    e = np.exp((logits - logits.max(axis=-1, keepdims=True)).astype(np.float64))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(F32)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=-1)
    if norm:
        w = (w / np.maximum(w.sum(axis=-1, keepdims=True, dtype=np.float64), MOE_NORM_CLAMP)).astype(F32)
    return ids, w


def moe_ffn(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate_exps: np.ndarray, up_exps: np.ndarray,
            down_exps: np.ndarray, add: np.ndarray | None = None, activation: str = "silu",
            down_scale: np.ndarray | None = None) -> np.ndarray:
    """Each row's chosen SwiGLU (or GeGLU) experts, each output times its
    expert's ``down_scale`` and then its weight (llama.cpp's order), summed in
    selection order (then ``+ add``)."""
    glu = swiglu if activation == "silu" else geglu
    out = np.zeros((x.shape[0], down_exps.shape[1]), F32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            y = down_exps[e] @ glu(gate_exps[e] @ x[t], up_exps[e] @ x[t])
            if down_scale is not None:
                y = y * down_scale[e]
            out[t] += y * weights[t, j]
    return out if add is None else add + out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def mul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x ⊙ w``, ``w`` ``[n]`` or ``[1]`` broadcast over the rows."""
    return x * w


def embed(table: np.ndarray, tokens: np.ndarray, scale: float = 1.0) -> np.ndarray:
    x = table[tokens]
    return x * np.float32(scale) if scale != 1.0 else x


def last_row(x: np.ndarray) -> np.ndarray:
    return x[-1:]


def end_layer(x: np.ndarray) -> np.ndarray:
    """A layer is done (the CUDA backend recycles its scratch memory here)."""
    return x


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return (cap * np.tanh(x.astype(np.float64) / cap)).astype(F32)
