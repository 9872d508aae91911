"""The op set: every operation a family's block may use, with its math and
shapes. Both backends implement exactly these (``backends/numpy/ops.py`` as
functions, the oracle; ``backends/cuda.Ops`` as methods over device arrays),
and model code calls nothing else. A new op is added here first, then to
both backends, with a kernel test against the NumPy reference.

Shapes: activations ``[T, n]`` for T tokens; per-head tensors ``[T, H, D]``.
A weight is GGUF rows ``[n_out, n_in]`` (on the GPU: a ``QWeight`` of any
supported type); a 1-D weight (norm, bias) is ``[n]`` F32.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Ops(Protocol):
    def embed(self, table, tokens, scale=1.0):
        """``table[tokens] · scale``: ``[T, n_embd]`` rows of the embedding ``[n_vocab, n_embd]``."""

    def rms_norm(self, x, w, eps):
        """``x / sqrt(mean(x², last axis) + eps) · w`` (``w`` None: no weight); any leading shape."""

    def matmul(self, x, w, bias=None, add=None):
        """``x · Wᵀ (+ bias) (+ add)``: ``[T, n_in] → [T, n_out]``; ``add`` is a residual to add to (the
        residual stream: it may be updated in place and returned)."""

    def matmuls(self, x, weights, biases=None):
        """Several projections of one input (a declared group: Q/K/V, gate/up): ``[matmul(x, w_i, b_i)]``."""

    def glu(self, x, w_gate, w_up, activation):
        """The gated hidden layer of a GLU FFN: ``act(x·W_gateᵀ) ⊙ (x·W_upᵀ)``, ``act`` SiLU (``"silu"``,
        as ``swiglu``) or tanh-GELU (``"gelu_tanh"``, as ``geglu``); ``[T, n_in] → [T, n_ff]``."""

    def add_rms_norm(self, x, a, w, eps, a_norm=None):
        """The residual add and the next norm: ``(x + a, RMSNorm(x + a)·w)``; ``w`` a tuple of weights:
        ``(x + a, RMSNorm(x + a)·w_0, RMSNorm(x + a)·w_1, ...)`` (up to 3); with ``a_norm``, ``a`` is
        first post-normed, ``RMSNorm(a)·a_norm`` (gemma's post-attention norm); may update ``x`` in place."""

    def norm_add(self, x, a, w, eps, scale=None, x_norm=None):
        """A post-normed residual add: ``(x + RMSNorm(a)·w)·scale`` (``scale`` a ``[1]`` weight, gemma4's
        layer_output_scale, or None); with ``x_norm``, ``RMSNorm(x)·x_norm`` in place of ``x`` (two
        post-normed branches summed: gemma4's dense MLP and experts); may update ``x`` in place."""

    def rope(self, rotation, *xs):
        """Each ``x [T, H, D]`` rotated by ``rotation`` (from the layer state's ``rope(positions)``): pairs
        (2i, 2i+1) for NORM, (i, i + D/2) for NEOX, angle ``scale·pos·base^(-2i/n_rot)/divisor_i``."""

    def qk_norm_rope(self, rotation, q, k, q_norm, k_norm, eps):
        """``rope(rotation, RMSNorm(q)·q_norm, RMSNorm(k)·k_norm)``, each norm over a head's ``D`` values
        (qwen3-style Q/K norms); q ``[T, H, D]``, k ``[T, H_kv, D]``."""

    def attention(self, q, keys, values, positions, scale, window=0):
        """Causal GQA softmax attention: q ``[T, H, D]`` at ``positions``, the cache's keys/values
        ``[S, H_kv, D]``; key p visible to query p' iff p <= p' (and p' - p < window if window);
        query head h reads KV head ``h // (H / H_kv)``. ``[T, H·D]``."""

    def add(self, a, b):
        """``a + b`` elementwise."""

    def swiglu(self, g, u):
        """``SiLU(g) ⊙ u``, ``SiLU(x) = x / (1 + exp(-x))``."""

    def geglu(self, g, u):
        """``GELU_tanh(g) ⊙ u``, ``GELU_tanh(x) = 0.5x(1 + tanh(0.7978845608·x·(1 + 0.044715x²)))``."""

    def moe_route(self, x, router, k, norm, scale=1.0):
        """Per row of x ``[T, n_embd]``: ``p = softmax(router·(x·scale))`` over the ``[n_expert, n_embd]``
        router's experts, the top ``k`` by p (ties to the lower id, in descending order) and their
        weights ``p[ids]``, divided by ``max(Σ, 2^-14)`` when ``norm``. (ids int32 ``[T, k]``,
        weights ``[T, k]``)."""

    def moe_ffn(self, x, ids, weights, gate_exps, up_exps, down_exps, add=None, activation="silu",
                down_scale=None):
        """``Σ_j weights[t, j] · s[e] · down[e]·(act(gate[e]·x_t) ⊙ (up[e]·x_t))``, ``e = ids[t, j]``, summed
        in selection order (``+ add``, a residual); ``act`` SiLU or tanh-GELU (``activation`` "silu" or
        "gelu_tanh"), ``s = down_scale [n_expert]`` (1 if None); expert tensors ``[n_expert, n_out, n_in]``.
        ``[T, n_embd]``."""

    def split(self, x, sizes):
        """The columns of ``x [T, Σ sizes]`` as consecutive ``[T, size]`` pieces."""

    def split_gate(self, x, n_head, head_dim):
        """``x [T, H·2D]`` holding ``[q | gate]`` per head: ``(q [T, H, D], gate [T, H·D])``."""

    def sigmoid_mul(self, a, g):
        """``a ⊙ sigmoid(g)``, ``sigmoid(x) = 1 / (1 + exp(-x))`` (``g [T, 1]``: one gate per row)."""

    def dot(self, x, w):
        """``x · w`` per row, for a vector ``w [n]``: ``[T, 1]``."""

    def decay_gates(self, b, a, dt_bias, ssm_a):
        """DeltaNet's per-head gates from ``[T, H_v]`` projections: ``(sigmoid(b), softplus(a + dt_bias)·ssm_a)``,
        ``softplus(x) = log(1 + e^x)`` (``x`` above 20)."""

    def causal_conv(self, x, w, state):
        """``SiLU(y)``, ``y[t, c] = Σ_j win[t + j, c]·w[c, j]``: the causal depthwise conv of ``x [T, C]`` with
        ``w [C, K]``, ``win`` = the K-1 inputs the layer ``state`` carries, then ``x``; carries the last K-1 on."""

    def l2_norm(self, x, eps):
        """``x / sqrt(Σx² + eps)`` over the last axis (as ``rms_norm(x, eps/S)·(1/√S)``)."""

    def delta_rule(self, q, k, v, g, beta, state):
        """The gated delta rule over the layer ``state``'s ``S [H_v, S_k, S_v]``, token by token: value head h
        with key head ``h mod H_k``, ``S ← e^g S``, ``S ← S + k (β (v − Sᵀk))ᵀ``, out ``Sᵀq / √S_v``.
        q, k ``[T, H_k, S_k]``, v ``[T, H_v, S_v]``, g, beta ``[T, H_v]``; ``[T, H_v, S_v]``."""

    def mul(self, x, w):
        """``x ⊙ w`` for a 1-D weight ``w`` broadcast over the rows: ``[n]``, or ``[1]`` (a scalar:
        gemma4's layer_output_scale)."""

    def softcap(self, x, cap):
        """``cap · tanh(x / cap)`` (gemma's final logit softcap)."""

    def last_row(self, x):
        """``x[-1:]``: the last token's row (only its logits are computed)."""

    def end_layer(self, x):
        """A layer's output; the backend may recycle the layer's temporaries here."""


OP_NAMES = tuple(n for n in Ops.__dict__ if not n.startswith("_") and callable(Ops.__dict__[n]))
