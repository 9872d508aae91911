"""CUDA kernels of the Gated DeltaNet layer and the gated attention
(deltanet.cu, elementwise.cu's sigmoid_mul and copy_cols, Ops.l2_norm and
Ops.dot) against their NumPy references (engine/backends/numpy/ops.py), on
the GPU; the carried conv inputs and delta-rule state across calls."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.backends.cuda.launchers import deltanet, elementwise
from engine.backends.numpy import ops

from test_kernels_core import SEED, assert_close, dev, device, poisoned, rng  # noqa: F401 (fixtures)

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("K", [4, 2])
def test_causal_conv_carries_its_inputs(dev, K):
    """Four calls (5 tokens, 1, 9, 45: several tiles of CONV_TT) against one
    NumPy pass over all 60: the outputs and, after each call, the carried
    inputs."""
    r = rng("conv", K)
    C = 1000
    x = r.standard_normal((60, C)).astype(np.float32)
    w = r.standard_normal((C, K)).astype(np.float32)
    ref_state = SimpleNamespace(conv=r.standard_normal((K - 1, C)).astype(np.float32))
    d_state, d_w = dev.upload(ref_state.conv.copy()), dev.upload(w)
    for a, b in ((0, 5), (5, 6), (6, 15), (15, 60)):
        want = ops.causal_conv(x[a:b], w, ref_state)
        y = poisoned(dev, (b - a, C))
        deltanet.causal_conv(dev, dev.upload(x[a:b]), d_w, d_state, y)
        # K products summed in fp32 (FMA-contracted here), then SiLU with __expf
        bound = 1e-6 + 2e-6 * np.abs(want) + 1e-6 * (np.abs(x[a:b]).max() * np.abs(w).sum(axis=1))
        assert_close(y.numpy(), want, bound, 0.0, f"causal_conv K={K} tokens {a}..{b}")
        np.testing.assert_array_equal(d_state.numpy(), ref_state.conv, err_msg=f"carried inputs after {b}")


@gpu
def test_decay_gates(dev):
    r = rng("gates")
    T, H = 7, 32
    b = r.standard_normal((T, H)).astype(np.float32) * 4
    a = (r.standard_normal((T, H)) * 10).astype(np.float32)  # both sides of softplus's x > 20 switch
    dt = r.standard_normal(H).astype(np.float32)
    ssm_a = -np.exp(r.standard_normal(H)).astype(np.float32)
    beta, g = poisoned(dev, (T, H)), poisoned(dev, (T, H))
    deltanet.decay_gates(dev, dev.upload(b), dev.upload(a), dev.upload(dt), dev.upload(ssm_a), beta, g)
    wb, wg = ops.decay_gates(b, a, dt, ssm_a)
    assert_close(beta.numpy(), wb, 1e-7, 1e-6, "beta")
    assert_close(g.numpy(), wg, 1e-6, 1e-5, "g")


@gpu
@pytest.mark.parametrize("path", ["tokens", "chunked"])
@pytest.mark.parametrize("T,H_k,H_v,S_k,S_v", [(1, 16, 32, 128, 128), (9, 2, 4, 128, 128), (33, 4, 4, 64, 80),
                                                (150, 2, 4, 128, 128)])
def test_delta_rule_matches_the_token_loop(dev, path, T, H_k, H_v, S_k, S_v):
    """Both kernels, two calls in a row (the state carried on the device),
    against the NumPy token loop: one token, a partial chunk, a column count
    that is not a multiple of 32, several chunks; strong and no decay."""
    r = rng("delta", path, T, H_k, H_v, S_k, S_v)
    S0 = (r.standard_normal((H_v, S_k, S_v)) * 0.5).astype(np.float32)
    ref = SimpleNamespace(s=S0.copy())
    d_S = dev.upload(S0)
    for call in range(2):
        q = ops.l2_norm(r.standard_normal((T, H_k, S_k)).astype(np.float32), 1e-6)
        k = ops.l2_norm(r.standard_normal((T, H_k, S_k)).astype(np.float32), 1e-6)
        v = r.standard_normal((T, H_v, S_v)).astype(np.float32)
        beta = ops.sigmoid(r.standard_normal((T, H_v)).astype(np.float32))
        g = -np.exp(r.uniform(-6, 1.5, (T, H_v))).astype(np.float32)
        g[:, 0] = 0.0  # value head 0: no decay at all
        want = ops.delta_rule(q, k, v, g, beta, ref)
        out = poisoned(dev, (T, H_v, S_v))
        deltanet.delta_rule(dev, dev.upload(q), dev.upload(k), dev.upload(v), dev.upload(g), dev.upload(beta),
                            d_S, out, path)
        # fp32 sums of S_k products per token (the chunked form: different sums, same rule), over T updates
        assert_close(out.numpy(), want, 2e-5, 1e-4, f"delta_rule {path} out, call {call}")
        assert_close(d_S.numpy(), ref.s, 2e-5, 1e-4, f"delta_rule {path} state, call {call}")


@gpu
def test_gated_attention_pieces(dev):
    """split_gate's per-head copies, the output gate, and split's column copies."""
    r = rng("gate_pieces")
    T, H, D = 5, 4, 64
    x = r.standard_normal((T, H * 2 * D)).astype(np.float32)
    wq, wg = ops.split_gate(x, H, D)
    q, gate = poisoned(dev, (T, H, D)), poisoned(dev, (T, H * D))
    dx = dev.upload(x)
    elementwise.copy_cols(dev, dx, q, T * H, D, 2 * D, 0)
    elementwise.copy_cols(dev, dx, gate, T * H, D, 2 * D, D)
    np.testing.assert_array_equal(q.numpy(), wq)
    np.testing.assert_array_equal(gate.numpy(), wg)
    y = poisoned(dev, (T, H * D))
    elementwise.sigmoid_mul(dev, dev.upload(wq.reshape(T, -1)), gate, y)
    assert_close(y.numpy(), ops.sigmoid_mul(wq.reshape(T, -1), wg), 1e-7, 1e-6, "sigmoid_mul")
    row_gate = r.standard_normal((T, 1)).astype(np.float32)  # qwen35moe's shared expert: one gate per row
    elementwise.sigmoid_mul(dev, dev.upload(wq.reshape(T, -1)), dev.upload(row_gate), y)
    assert_close(y.numpy(), ops.sigmoid_mul(wq.reshape(T, -1), row_gate), 1e-7, 1e-6, "sigmoid_mul per row")
    sizes = (100, 28, 384)
    for piece, off in zip(ops.split(x, sizes), np.cumsum((0,) + sizes[:-1])):
        got = poisoned(dev, piece.shape)
        elementwise.copy_cols(dev, dx, got, T, piece.shape[1], x.shape[1], int(off))
        np.testing.assert_array_equal(got.numpy(), piece)


@gpu
def test_l2_norm_is_one_launch_of_the_same_bits(dev):
    """Ops.l2_norm (the norm with a weight of 1/√S) gives the bits of the
    two launches it replaces (RMSNorm with eps/S, then the scaling), and
    llama.cpp's values (the NumPy reference) to fp32 rounding."""
    from engine.backends.cuda import Backend, Ops
    from engine.backends.cuda.device import Workspace
    from engine.backends.cuda.launchers import norm

    b = SimpleNamespace(dev=dev, workspace=Workspace(dev, 16 << 20), constants={})
    b.constant = lambda n, v: Backend.constant(b, n, v)
    cuda_ops = Ops(b)
    for T, H, S in ((1, 16, 128), (37, 4, 128), (5, 2, 64)):
        x = (rng("l2", T, H, S).standard_normal((T, H, S)) * 3).astype(np.float32)
        got = cuda_ops.l2_norm(dev.upload(x), 1e-6).numpy()
        two = poisoned(dev, (T, H, S))
        norm.rms_norm(dev, dev.upload(x), None, two, 1e-6 / S)
        elementwise.scale(dev, two, float(np.float32(1.0 / np.sqrt(S))))
        np.testing.assert_array_equal(got.view(np.uint32), two.numpy().view(np.uint32), err_msg=f"l2_norm {T}x{H}x{S}")
        assert_close(got, ops.l2_norm(x, 1e-6), 1e-7, 1e-6, f"l2_norm {T}x{H}x{S}")
