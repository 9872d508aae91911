"""The NumPy MoE ops against the rules of llama.cpp's build_moe_ffn, on
hand-made cases (the whole-model check is tiny-qwen3moe in the catalog):
top-k by softmax probability, ties to the lower expert id, in descending
order; renormalised by max(Σw, 2^-14); each chosen expert's SwiGLU output
weighted and summed in selection order."""

from __future__ import annotations

import numpy as np

from engine.backends.numpy import ops


def test_route_ties_go_to_the_lower_expert_in_descending_order():
    router = np.array([[1.0], [3.0], [3.0], [2.0], [3.0]], np.float32)  # 5 experts, n_embd 1
    ids, w = ops.moe_route(np.array([[1.0]], np.float32), router, 3, norm=False)
    assert ids.tolist() == [[1, 2, 4]] and ids.dtype == np.int32
    p = np.exp(router[:, 0] - 3.0) / np.exp(router[:, 0] - 3.0).sum()
    np.testing.assert_allclose(w[0], p[[1, 2, 4]], rtol=1e-6)


def test_route_renormalises_with_llama_cpps_floor():
    router = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    ids, w = ops.moe_route(np.array([[1.0], [-1.0]], np.float32), router, 2, norm=True)
    assert ids.tolist() == [[3, 2], [0, 1]]
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    p = np.exp(router[:, 0] - 3.0) / np.exp(router[:, 0] - 3.0).sum()
    np.testing.assert_allclose(w[0], p[[3, 2]] / p[[3, 2]].sum(), rtol=1e-6)
    # llama.cpp's floor on the divisor (a softmax's top-k never sums below it
    # unless there are more than 2^14 experts, so it is only stated here)
    assert ops.MOE_NORM_CLAMP == 2.0 ** -14


def test_ffn_sums_the_chosen_experts_weighted_in_selection_order():
    rng = np.random.default_rng(0)
    E, F, n_exp = 8, 16, 4
    g, u = rng.standard_normal((n_exp, F, E), np.float32), rng.standard_normal((n_exp, F, E), np.float32)
    d = rng.standard_normal((n_exp, E, F), np.float32)
    x = rng.standard_normal((3, E), np.float32)
    ids = np.array([[2, 0], [1, 3], [3, 3]], np.int32)
    w = np.array([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]], np.float32)
    out = ops.moe_ffn(x, ids, w, g, u, d)
    for t in range(3):
        want = np.float32(0)
        for j in range(2):
            e = ids[t, j]
            h = ops.silu(g[e] @ x[t]) * (u[e] @ x[t])
            want = want + (d[e] @ h) * w[t, j]
        np.testing.assert_array_equal(out[t], want)  # the same operations in the same order: exact
