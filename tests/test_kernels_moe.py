"""Mixture-of-Experts kernels (moe.cu via launchers/moe.py, moe_gemm.cu via
launchers/moe_gemm.py, and the CUDA ``Ops.moe_route`` / ``Ops.moe_ffn``)
against the NumPy ops.

CPU part: moe.cu compiles for every GEMV_ROWS the launcher uses, moe_gemm.cu
for every tile width, and each exports every kernel; every launcher passes each kernel the parameters it declares
(through the real argument packing); the launch plans stay in limits; bad
shapes are refused in one line.

GPU part (@pytest.mark.gpu): random raw expert tensors of every weight type,
outputs poisoned with NaN first. Routing must pick exactly the NumPy ops'
experts (inputs with no near-ties); the expert products and sums have the
stated fp32 tolerance (decode) or bf16 tolerance (the grouped prefill GEMM).
Every failure message states the seed; ANVIL_KERNELS_SEED=<int> replays it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.backends.cuda import compile as nvrtc
from engine.backends.cuda import gemv_bench, launch
from engine.backends.cuda.launchers import gemv as gemv_launcher
from engine.backends.cuda.launchers import moe, moe_gemm
from engine.backends.cuda.recording import RecordingDevice
from engine.backends.numpy import ops as np_ops
from engine.backends.numpy.faithful import bf16, from_bf16_bits
from engine.errors import AnvilError
from engine.quants import BLOCK, QType, dequantize, quantize_x, xq_group

from test_kernels_core import SEED, assert_close, dev, device, poisoned, rng  # noqa: F401 (fixtures)

TYPES = list(launch.WEIGHT_TYPES)
FLOATS = (QType.F32, QType.F16, QType.BF16)
KINDS = {"moe.cu": ("glu", "gemv", "down"), "moe_gemm.cu": ("gemm", "gemm_i8")}
PLAIN = {"moe.cu": ["moe_route", "moe_router_f32"],
         "moe_gemm.cu": ["moe_sort", "moe_gather_bf16", "moe_quant_q8", "moe_combine"]}
I8_TYPES = sorted(moe_gemm.INT8_TYPES)


def kernel_names(t: QType, file: str | None = None) -> list[str]:
    kinds = KINDS[file] if file else [k for ks in KINDS.values() for k in ks]
    return [f"moe_{k}_{launch.TYPE_SUFFIX[t]}" for k in kinds if k != "gemm_i8" or t in moe_gemm.INT8_TYPES]


# ---- CPU ---------------------------------------------------------------------------


@pytest.mark.parametrize("file,defines", [("moe.cu", {"GEMV_ROWS": r}) for r in moe.ROW_CHOICES]
                         + [("moe_gemm.cu", {})])
def test_moe_compiles(file, defines):
    cubin = nvrtc.compile_cubin(file, "sm_90", defines)
    no_down = defines.get("GEMV_ROWS", 0) > moe.DOWN_ROWS_LIMIT  # the down kernels' rows are capped
    for fn in PLAIN[file] + [n for t in TYPES for n in kernel_names(t, file)]:
        absent = no_down and fn.startswith("moe_down_")
        assert (f"\0{fn}\0".encode() in cubin) != absent, f"{file} {defines}: {fn} {'built' if absent else 'missing'}"
    with pytest.raises(AnvilError, match="at most 8 for down"):
        moe.expert_plan(QType.Q4_K, 768, 2048, 8, 1, "down", rows=16)


def moe_signatures() -> dict[str, list[str]]:
    """kernel -> parameter kinds, from moe.cu and moe_gemm.cu, per-type macros expanded."""
    sig = re.compile(r'extern "C" __global__ void\s*(?:__launch_bounds__\([^)]*\)\s*)?(\w+?)(?:##name)?\s*\(([^)]*)\)')
    out = {}
    for file in PLAIN:
        src = (nvrtc.KERNELS_DIR / file).read_text()
        for fn, params in sig.findall(src.replace("\\\n", " ")):
            kinds = ["ptr" if "*" in p else "int" if p.strip().startswith("int") else "float" for p in params.split(",")]
            types = I8_TYPES if fn.startswith("moe_gemm_i8_") else TYPES
            names = [fn] if fn in PLAIN[file] else [fn + launch.TYPE_SUFFIX[t] for t in types]
            out |= {n: kinds for n in names}
    return out


def test_moe_launchers_match_kernels(monkeypatch):
    sigs = moe_signatures()
    assert set(sigs) == {n for names in PLAIN.values() for n in names} | {n for t in TYPES for n in kernel_names(t)}
    fd = RecordingDevice()
    monkeypatch.setattr(launch, "resident_blocks", lambda dev, fn, threads, shared: 2 * dev.sm_count)
    i32, u16 = np.int32, np.uint16
    T, E, k, D, F = 5, 128, 8, 2048, 768
    ids, w = fd.empty((T, k), i32), fd.empty((T, k))
    moe.route(fd, fd.empty((T, E)), ids, w, k, True)
    moe.router_route(fd, fd.empty((E * D,)), QType.F32, fd.empty((1, D)), fd.empty((1, E)), fd.empty((1, k), i32),
                     fd.empty((1, k)), D, k, True, 0.5)
    for t in TYPES:
        n_el = lambda rows, cols: rows * (cols // BLOCK[t][0]) * BLOCK[t][1]  # noqa: E731
        We, Wd = fd.empty((E * n_el(F, D),), np.uint8), fd.empty((E * n_el(D, F),), np.uint8)
        moe.glu(fd, We, We, t, ids, fd.empty((T, D)), fd.empty((T, k, F)), D, F, E)
        moe.gemv(fd, We, t, ids, fd.empty((T, D)), fd.empty((T, k, F)), D, F, E)
        moe.down(fd, Wd, t, ids, w, fd.empty((T, k, F)), fd.empty((T, D)), fd.empty((T, D)), F, D, E)
        g = moe_gemm.Grouping.empty(fd.empty, T * k, E)
        moe_gemm.gemm(fd, We, t, fd.empty((T * k, D), u16), g, fd.empty((T * k, F)), D, F)
        if t in moe_gemm.INT8_TYPES:
            moe_gemm.gemm_i8(fd, We, t, moe_gemm.Q8Rows.empty(fd.empty, T * k, D), g, fd.empty((T * k, F)), D, F)
    g = moe_gemm.Grouping.empty(fd.empty, T * k, E)
    moe_gemm.sort(fd, ids, g)
    moe_gemm.gather_bf16(fd, fd.empty((T, D)), g, k, fd.empty((T * k, D), u16))
    moe_gemm.quant_q8(fd, fd.empty((T, D)), moe_gemm.Q8Rows.empty(fd.empty, T * k, D), g, k)
    moe_gemm.quant_q8(fd, fd.empty((T * k, F)), moe_gemm.Q8Rows.empty(fd.empty, T * k, F))
    moe_gemm.combine(fd, fd.empty((T * k, D)), g, w, None, fd.empty((T, D)))
    launched = {name for (_, name), *_ in fd.launches}
    assert launched == set(sigs), f"not launched: {set(sigs) - launched}"
    for (_, fn), grid, block, shared, kinds in fd.launches:
        assert kinds == sigs[fn], f"{fn}: launcher passes {kinds}, kernel takes {sigs[fn]}"
        assert all(g >= 1 for g in grid) and grid[1] <= 65535 and grid[2] <= 65535, (fn, grid)
        assert block[0] % 32 == 0 and block[0] <= 1024, (fn, block)
        assert shared <= 227 * 1024, (fn, shared)


def test_expert_plans():
    for t in TYPES:
        for n_in, n_out, k, T, kind in [(2048, 768, 8, 1, "glu"), (768, 2048, 8, 1, "down"), (256, 256, 2, 1, "glu"),
                                        (2048, 768, 16, 3, "glu"), (2048, 768, 8, 1, "gemv")]:
            p = moe.expert_plan(t, n_in, n_out, k, T, kind)
            per = p.rows // 2 if kind == "glu" else p.rows
            assert p.blocks * per >= n_out > (p.blocks - 1) * per
            if kind == "down":
                assert p.threads == 32 * min(k, moe.MAX_WARPS)
            else:  # the dense gemv's warps per row
                assert p.threads == gemv_launcher.gemv_plan(t, n_in, n_out, rows=p.rows).threads
            assert p.shared <= 227 * 1024
    # the real 30B-A3B decode shapes: the rows measured best on the H200, a block per SM at least
    assert moe.expert_plan(QType.Q4_K, 2048, 768, 8, 1, "glu").rows == 8
    assert moe.expert_plan(QType.Q4_K, 768, 2048, 8, 1, "down").rows == 8
    assert moe.expert_plan(QType.Q6_K, 768, 2048, 8, 1, "down").rows == 4
    assert moe.expert_plan(QType.Q4_K, 2048, 768, 8, 1, "glu").blocks * 8 >= 132


def test_bad_shapes_are_refused_in_one_line():
    fd = RecordingDevice()
    with pytest.raises(AnvilError, match=r"moe_route: 9 experts per token of 8"):
        moe.route(fd, fd.empty((1, 8)), fd.empty((1, 9), np.int32), fd.empty((1, 9)), 9, True)
    with pytest.raises(AnvilError, match=r"ids must be int32"):
        moe.route(fd, fd.empty((1, 8)), fd.empty((1, 2)), fd.empty((1, 2)), 2, True)
    with pytest.raises(AnvilError, match=r"moe_route: 513 experts \(at most 512\)"):
        moe.route(fd, fd.empty((1, 513)), fd.empty((1, 2), np.int32), fd.empty((1, 2)), 2, True)
    with pytest.raises(AnvilError, match=r"moe_glu Q4_K: 4 experts of \[256 x 256\] need 147456 bytes"):
        moe.glu(fd, fd.empty((100,), np.uint8), fd.empty((100,), np.uint8), QType.Q4_K, fd.empty((1, 2), np.int32),
                fd.empty((1, 256)), fd.empty((1, 2, 256)), 256, 256, 4)
    with pytest.raises(AnvilError, match=r"moe_gemm: the grouped GEMM needs n_in a multiple of 32 and of F32's block, got 40"):
        moe_gemm.gemm(fd, fd.empty((4 * 40 * 8 * 4,), np.uint8), QType.F32, fd.empty((4, 40), np.uint16),
                 moe_gemm.Grouping.empty(fd.empty, 4, 4), fd.empty((4, 8)), 40, 8)
    with pytest.raises(AnvilError, match=r"moe_gemm_i8: no int8 GEMM for Q5_0 weights \(it has Q4_0, Q4_K, "):
        moe_gemm.gemm_i8(fd, fd.empty((4 * 64 * 22 * 2,), np.uint8), QType.Q5_0, moe_gemm.Q8Rows.empty(fd.empty, 4, 64),
                         moe_gemm.Grouping.empty(fd.empty, 4, 4), fd.empty((4, 64)), 64, 64)
    with pytest.raises(AnvilError, match=r"moe_quant_q8: x \(4, 48\) \(rows a multiple of 32 long\)"):
        moe_gemm.quant_q8(fd, fd.empty((4, 48)), moe_gemm.Q8Rows.empty(fd.empty, 4, 48))
    P = 8192 * 8  # an 8192-token micro-batch of top-8: the ids alone are 256 KB, over a block's 227 KB
    with pytest.raises(AnvilError, match=r"moe_sort: 65536 \(token, expert\) pairs need 263172 bytes of shared memory, "
                                         r"more than a block's 232448: load the model with a smaller ubatch"):
        moe_gemm.sort(fd, fd.empty((P,), np.int32), moe_gemm.Grouping.empty(fd.empty, P, 256))


# ---- GPU ---------------------------------------------------------------------------

gpu = pytest.mark.gpu


def decisive_logits(g, T, E):
    """Router logits 0.25 apart, shuffled per row: no fp32 rounding can
    reorder the top k."""
    base = np.arange(E, dtype=np.float32) * 0.25
    return np.stack([g.permutation(base) for _ in range(T)])


@gpu
@pytest.mark.parametrize("T,E,k,norm", [(1, 128, 8, True), (7, 8, 2, True), (5, 64, 4, False), (3, 256, 32, True), (2, 40, 3, True), (2, 512, 8, True)])
def test_route(dev, T, E, k, norm):
    g = rng("route", T, E, k, norm)
    logits = decisive_logits(g, T, E)
    # the op's reference from the same logits (router = identity on the logits)
    ids_ref, w_ref = np_ops.moe_route(logits, np.eye(E, dtype=np.float32), k, norm)
    ids, w = poisoned(dev, (T, k), np.int32), poisoned(dev, (T, k))
    moe.route(dev, dev.upload(logits), ids, w, k, norm)
    assert ids.numpy().tolist() == ids_ref.tolist(), f"seed {SEED}"
    # __expf (fast math) and a different summation order than float64: 1e-6 relative
    assert_close(w.numpy(), w_ref, 1e-7, 1e-5, "moe_route weights")


@gpu
@pytest.mark.parametrize("E,k,D,scale", [(128, 8, 2048, 1.0), (8, 2, 256, 1.0), (40, 3, 260, 0.5), (512, 8, 64, 1.0)])
def test_router_route(dev, E, k, D, scale):
    """The fused router (logits and routing in one launch) routes as the NumPy
    op, and as the two launches it replaces bit for bit; the last block's
    ticket counter is back at 0 after every launch (repeated launches route)."""
    g = rng("router", E, k, D)
    x = g.standard_normal((1, D)).astype(np.float32)
    # router rows along x, so the logits are the shuffled decisive values (0.25 apart) up to rounding
    router = (decisive_logits(g, 1, E)[0][:, None] * x / float(np.dot(x[0], x[0]))).astype(np.float32)
    ids_ref, _ = np_ops.moe_route(x, router, k, True, scale)
    dW, dx = dev.upload(router), dev.upload(x)
    logits = dev.empty((1, E))
    for _ in range(3):
        ids, w = poisoned(dev, (1, k), np.int32), poisoned(dev, (1, k))
        moe.router_route(dev, dW, QType.F32, dx, logits, ids, w, D, k, True, scale)
        assert ids.numpy().tolist() == ids_ref.tolist(), f"seed {SEED}"
        # The logits: an fp32 dot of D terms of one sign, in another order than
        # NumPy's, is within D ulps of the sum (E=512 reaches 128, an ulp 7.6e-6,
        # and a weight moves by its logit's error relative: so the weights are
        # checked against the op on these logits, at test_route's tolerance).
        got_logits = logits.numpy()
        assert_close(got_logits, x @ router.T, 0.0, D * 2.0 ** -23, "moe_router logits")
        _, w_ref = np_ops.moe_route(got_logits * scale, np.eye(E, dtype=np.float32), k, True)
        assert_close(w.numpy(), w_ref, 1e-7, 1e-5, "moe_router weights")
    assert launch.counter(dev, "moe_router").numpy().tolist() == [0]
    if scale == 1.0:
        ids2, w2 = poisoned(dev, (1, k), np.int32), poisoned(dev, (1, k))
        gemv_launcher.gemv(dev, dW, QType.F32, dx, logits, D, E)
        moe.route(dev, logits, ids2, w2, k, True)
        assert ids2.numpy().tolist() == ids.numpy().tolist() and np.array_equal(w2.numpy(), w.numpy())


@gpu
def test_route_ties_and_non_finite(dev):
    logits = np.zeros((2, 8), np.float32)
    logits[0, [6, 2, 5]] = 1.0  # three-way tie: ids 2, 5 (lower first), then 6 is left out
    logits[1, 3] = np.nan
    ids, w = dev.empty((2, 2), np.int32), dev.empty((2, 2))
    moe.route(dev, dev.upload(logits), ids, w, 2, True)
    assert ids.numpy()[0].tolist() == [2, 5] and np.allclose(w.numpy()[0], 0.5)
    assert np.isnan(w.numpy()[1]).all() and ((ids.numpy()[1] >= 0) & (ids.numpy()[1] < 8)).all()


def expert_tensor(g, t, E, n_out, n_in):
    raw = gemv_bench.random_weights(g, t, E * n_out, n_in)
    return raw, dequantize(raw, t, (E * n_out, n_in)).reshape(E, n_out, n_in).astype(np.float64)


def xs(t, x):
    """The activations the expert kernels multiply with: int8 groups for
    block types (quants.quantize_x), fp32 for float weights, as float64."""
    group = xq_group(t) if gemv_launcher.XQ else None
    return x.astype(np.float64) if group is None else quantize_x(x, group)


def gemv_atol(w, x):
    """gemv's tolerance (test_kernels_quant): 2^-12 of the product vector's norm, per output."""
    return 2.0**-12 * np.sqrt(((w * x) ** 2).sum(axis=-1))


def decode_cases():
    """(type, n_in, n_out, n_expert, k, T): each case runs glu, gemv and down
    on experts [n_out x n_in] (n_out not a multiple of the rows per block)."""
    for t in TYPES:
        k_in = 8 if t in FLOATS else BLOCK[t][0]
        yield t, 4 * max(k_in, 64), 3 * 64 + 5, 6, 3, 2
    yield QType.Q4_K, 2048, 768, 16, 8, 1                 # the 30B-A3B gate/up shape (fewer experts)
    yield QType.Q6_K, 768, 2048, 16, 8, 1                 # its down shape
    yield QType.Q4_K, 512, 67, 20, 12, 2                  # k > MAX_WARPS: warps loop over slots


@gpu
@pytest.mark.parametrize("t,n_in,n_out,E,k,T", list(decode_cases()), ids=lambda v: getattr(v, "name", str(v)))
def test_expert_gemvs(dev, t, n_in, n_out, E, k, T):
    g = rng("experts", t, n_in, n_out, E, k, T)
    rawg, wg = expert_tensor(g, t, E, n_out, n_in)
    rawu, wu = expert_tensor(g, t, E, n_out, n_in)
    x = g.standard_normal((T, n_in), dtype=np.float32)
    ids = np.stack([g.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    w = g.dirichlet(np.ones(k), T).astype(np.float32)
    Wg, Wu = dev.upload(rawg), dev.upload(rawu)
    d_ids, d_x = dev.upload(ids), dev.upload(x)

    h = poisoned(dev, (T, k, n_out))
    moe.glu(dev, Wg, Wu, t, d_ids, d_x, h, n_in, n_out, E)
    gate, up = poisoned(dev, (T, k, n_out)), poisoned(dev, (T, k, n_out))
    moe.gemv(dev, Wg, t, d_ids, d_x, gate, n_in, n_out, E)
    moe.gemv(dev, Wu, t, d_ids, d_x, up, n_in, n_out, E)
    x64 = xs(t, x)
    G = np.stack([np.stack([wg[ids[i, j]] @ x64[i] for j in range(k)]) for i in range(T)])
    Uu = np.stack([np.stack([wu[ids[i, j]] @ x64[i] for j in range(k)]) for i in range(T)])
    tol_g = np.stack([np.stack([gemv_atol(wg[ids[i, j]], x64[i]) for j in range(k)]) for i in range(T)])
    tol_u = np.stack([np.stack([gemv_atol(wu[ids[i, j]], x64[i]) for j in range(k)]) for i in range(T)])
    assert_close(gate.numpy(), G, tol_g, 2.0**-20, f"moe_gemv {t.name}")
    assert_close(up.numpy(), Uu, tol_u, 2.0**-20, f"moe_gemv {t.name} (up)")
    silu = G / (1 + np.exp(-G))
    # SwiGLU of the two sums: their errors carried through (|d silu| <= 1.1), fast-math exp ~2 ulp
    assert_close(h.numpy(), silu * Uu, 1.1 * tol_g * np.abs(Uu) + np.abs(silu) * tol_u, 1e-5, f"moe_glu {t.name}")
    # the tanh-GELU form (gemma4's experts), its own module (|d gelu_tanh| <= 1.2)
    h = poisoned(dev, (T, k, n_out))
    moe.glu(dev, Wg, Wu, t, d_ids, d_x, h, n_in, n_out, E, activation="gelu_tanh")
    gelu = 0.5 * G * (1 + np.tanh(0.7978845608 * G * (1 + 0.044715 * G**2)))
    assert_close(h.numpy(), gelu * Uu, 1.2 * tol_g * np.abs(Uu) + np.abs(gelu) * tol_u, 1e-5,
                 f"moe_glu gelu_tanh {t.name}")

    # down over the same experts: y = res + sum_j w_j W[e_j]·h_j, the residual fused in place
    hh = g.standard_normal((T, k, n_in), dtype=np.float32)
    res = g.standard_normal((T, n_out), dtype=np.float32)
    y = dev.upload(res.copy())
    moe.down(dev, Wg, t, d_ids, dev.upload(w), dev.upload(hh), y, y, n_in, n_out, E)
    want = res.astype(np.float64).copy()
    tol = np.zeros_like(want)
    for i in range(T):
        for j in range(k):
            want[i] += w[i, j] * (wg[ids[i, j]] @ xs(t, hh[i, j]))
            tol[i] += w[i, j] * gemv_atol(wg[ids[i, j]], xs(t, hh[i, j]))
    assert_close(y.numpy(), want, tol, 2.0**-20, f"moe_down {t.name}")


@gpu
def test_sort_of_a_full_micro_batch(dev):
    """moe_sort (one block, the ids in shared memory) on a 4096-token
    micro-batch of top-8 from 256 experts: 32768 pairs, 132 KB of shared
    memory; the stable order, offsets and tiles as NumPy has them."""
    g = rng("sort4096")
    T, E, k = 4096, 256, 8
    ids = np.stack([g.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    P = T * k
    grouping = moe_gemm.Grouping.empty(dev.empty, P, E)
    moe_gemm.sort(dev, dev.upload(ids), grouping)
    flat, pair_at = ids.reshape(-1), grouping.pair_at.numpy()
    assert pair_at.tolist() == np.argsort(flat, kind="stable").tolist()
    assert (grouping.pos_of.numpy()[pair_at] == np.arange(P)).all()
    counts = np.bincount(flat, minlength=E)
    assert grouping.offsets.numpy().tolist() == [0, *np.cumsum(counts).tolist()]
    te = grouping.tile_e.numpy()
    assert int((te >= 0).sum()) == sum(-(-c // moe_gemm.BM) for c in counts)


@gpu
@pytest.mark.parametrize("t", [QType.Q4_K, QType.Q6_K, QType.Q8_0, QType.Q4_0, QType.Q5_K, QType.F16, QType.F32,
                               QType.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("bn", [moe_gemm.BN, 128])
def test_grouped_prefill(dev, t, bn):
    """sort + gather + grouped GEMM + combine: every pair's product with its
    expert, from bf16 inputs with fp32 sums; experts with no tokens, with
    more than one tile, and the tile tail; several k-steps of the GEMM's
    pipeline (256 columns for K-quants), and a short last step for the others."""
    g = rng("grouped", t, bn)
    T, E, k, n_out = 45, 12, 3, 160
    n_in = 768 if BLOCK[t][0] == 256 else 352
    raw, w3 = expert_tensor(g, t, E, n_out, n_in)
    x = g.standard_normal((T, n_in), dtype=np.float32)
    ids = np.stack([g.choice(E - 2, k, replace=False) for _ in range(T)]).astype(np.int32)  # experts 10, 11 idle
    ids[:40, 0] = 3  # expert 3: 40 pairs, two tiles
    for i in range(T):  # keep each token's experts distinct
        if 3 in ids[i, 1:]:
            ids[i, 1:][ids[i, 1:] == 3] = 9
    w = g.dirichlet(np.ones(k), T).astype(np.float32)
    P = T * k
    d_ids = dev.upload(ids)
    grouping = moe_gemm.Grouping.empty(dev.empty, P, E)
    moe_gemm.sort(dev, d_ids, grouping)
    pair_at, pos_of = grouping.pair_at.numpy(), grouping.pos_of.numpy()
    flat = ids.reshape(-1)
    want_order = np.argsort(flat, kind="stable")
    assert pair_at.tolist() == want_order.tolist() and (pos_of[pair_at] == np.arange(P)).all()
    counts = np.bincount(flat, minlength=E)
    assert grouping.offsets.numpy().tolist() == [0, *np.cumsum(counts).tolist()]
    te, tr = grouping.tile_e.numpy(), grouping.tile_r0.numpy()
    assert all(flat[pair_at[r]] == e for e, r in zip(te, tr) if e >= 0)  # each tile starts in its expert
    n_tiles = int((te >= 0).sum())
    assert (te[n_tiles:] == -1).all() and n_tiles == sum(-(-c // moe_gemm.BM) for c in counts)

    xs = poisoned(dev, (P, n_in), np.uint16)
    moe_gemm.gather_bf16(dev, dev.upload(x), grouping, k, xs)
    xs_f = from_bf16_bits(xs.numpy())
    np.testing.assert_array_equal(xs_f, bf16(x[pair_at // k]))
    y = poisoned(dev, (P, n_out))
    moe_gemm.gemm(dev, dev.upload(raw), t, xs, grouping, y, n_in, n_out, bn)
    wb = bf16(w3.astype(np.float32)).astype(np.float64)  # the kernel's bf16 weights, exactly
    want = np.stack([wb[flat[p]] @ xs_f[i].astype(np.float64) for i, p in enumerate(pair_at)])
    # exact bf16 products, fp32 accumulation over n_in terms: 2^-16 of sum |w x| leaves room
    bound = 2.0**-16 * np.stack([np.abs(wb[flat[p]]) @ np.abs(xs_f[i]) for i, p in enumerate(pair_at)])
    assert_close(y.numpy(), want, bound, 0.0, f"moe_gemm {t.name}")

    res = g.standard_normal((T, n_out), dtype=np.float32)
    out = poisoned(dev, (T, n_out))
    moe_gemm.combine(dev, y, grouping, dev.upload(w), dev.upload(res), out)
    yd = y.numpy().astype(np.float64)
    terms = np.stack([np.stack([w[i, j] * yd[pos_of[i * k + j]] for j in range(k)]) for i in range(T)])
    want = res + terms.sum(axis=1)
    # k fp32 multiply-adds and the residual add: a few ulps of the largest term
    assert_close(out.numpy(), want, 2.0**-21 * (np.abs(terms).sum(axis=1) + np.abs(res)), 0.0, "moe_combine")


@gpu
@pytest.mark.parametrize("t", I8_TYPES, ids=lambda t: t.name)
def test_grouped_prefill_int8(dev, t):
    """The int8 grouped GEMM (moe_gemm.gemm_i8): x gathered and rounded to
    int8 groups of 32 exactly as quants.quantize_x_int8 rounds (the scales
    and group sums too, and without a gathering for the hidden); then every
    pair's product with its expert's exact values, integer products per group
    and fp32 sums of the scaled groups. Experts with no tokens, with two
    tiles, the tile tail; several GEMM steps, a short last one for the
    32-column blocks; output features past a whole tile."""
    from engine.quants import quantize_x_int8

    g = rng("grouped-int8", t)
    T, E, k, n_out = 45, 12, 3, 160
    n_in = 768 if BLOCK[t][0] == 256 else 352
    raw, w3 = expert_tensor(g, t, E, n_out, n_in)
    x = g.standard_normal((T, n_in), dtype=np.float32)
    x[3, :32] = 0.0  # a group of zeros: scale 0, no division by it
    ids = np.stack([g.choice(E - 2, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids[:40, 0] = 3
    for i in range(T):
        if 3 in ids[i, 1:]:
            ids[i, 1:][ids[i, 1:] == 3] = 9
    P = T * k
    grouping = moe_gemm.Grouping.empty(dev.empty, P, E)
    moe_gemm.sort(dev, dev.upload(ids), grouping)
    pair_at = grouping.pair_at.numpy()
    flat = ids.reshape(-1)

    def rows_check(xq, a):
        q, d = quantize_x_int8(a, 32)
        groups = n_in // 32
        got_q, got_d, got_s = xq.q.numpy()[:, :n_in], xq.d.numpy()[:, :groups], xq.s.numpy()[:, :groups]
        np.testing.assert_array_equal(got_q, q)
        np.testing.assert_array_equal(got_d, d)
        np.testing.assert_array_equal(got_s, d * q.reshape(len(q), groups, 32).astype(np.int32).sum(axis=2)
                                      .astype(np.float32))
        return (q.reshape(len(q), groups, 32) * d[..., None].astype(np.float64)).reshape(q.shape)

    xq = moe_gemm.Q8Rows.empty(lambda shape, dt: poisoned(dev, shape, dt), P, n_in)
    moe_gemm.quant_q8(dev, dev.upload(x), xq, grouping, k)
    xv = rows_check(xq, x[pair_at // k])
    h = g.standard_normal((P, n_in), dtype=np.float32)
    hq = moe_gemm.Q8Rows.empty(lambda shape, dt: poisoned(dev, shape, dt), P, n_in)
    moe_gemm.quant_q8(dev, dev.upload(h), hq)
    rows_check(hq, h)

    y = poisoned(dev, (P, n_out))
    moe_gemm.gemm_i8(dev, dev.upload(raw), t, xq, grouping, y, n_in, n_out)
    want = np.stack([w3[flat[p]] @ xv[i] for i, p in enumerate(pair_at)])
    # exact integer products; each group's scaled sum and the sum over groups in
    # fp32, with the min's cancellation: 2^-16 of sum |w x| leaves room, a wrong
    # value, scale or group is of the order of the sum itself
    bound = 2.0**-16 * np.stack([np.abs(w3[flat[p]]) @ np.abs(xv[i]) for i, p in enumerate(pair_at)])
    assert_close(y.numpy(), want, bound, 0.0, f"moe_gemm_i8 {t.name}")


@gpu
@pytest.mark.parametrize("T", [1, 40])
@pytest.mark.parametrize("gemma4", [False, True])
@pytest.mark.parametrize("gemm", ["bf16", "int8", "wgmma"])
def test_ops_moe_against_numpy(T, gemma4, gemm, monkeypatch):
    """The CUDA Ops (router matmul + route, then the decode or the grouped
    path) against the NumPy ops on a tiny-qwen3moe-like layer: the same
    experts, outputs within bf16 (prefill) or fp32 (decode) tolerance.
    gemma4: GeGLU experts, a scale on the router's input and one per expert.
    The grouped GEMMs: moe_gemm's on the bf16 tensor cores, on the int8 ones
    (moe_gemm.INT8), or gemm.cu's by wgmma (gemm.WGMMA)."""
    from engine.backends.cuda.launchers import gemm as gemm_launcher

    monkeypatch.setattr(moe_gemm, "INT8", gemm == "int8")
    monkeypatch.setattr(gemm_launcher, "WGMMA_GROUPED", gemm == "wgmma")
    from types import SimpleNamespace

    from engine.backends.cuda import Ops, QWeight
    from engine.backends.cuda.device import Device, Workspace

    dev = Device()
    g = rng("ops", T)
    D, F, E, k = 256, 256, 8, 2
    b = SimpleNamespace(dev=dev, workspace=Workspace(dev, 64 << 20), cublas=None, stacked={})
    from engine.backends.cuda.cublas import Cublas

    b.cublas = Cublas(dev.stream)
    ops = Ops(b)
    router = (g.standard_normal((E, D)) * 0.5).astype(np.float32)
    tensors = {}
    for name, (n_out, n_in), t in (("gate", (F, D), QType.Q4_K), ("up", (F, D), QType.Q5_K),
                                   ("down", (D, F), QType.Q6_K)):
        raw, w = expert_tensor(g, t, E, n_out, n_in)
        tensors[name] = (QWeight(dev.upload(raw), t, n_out, n_in, n_expert=E), w.astype(np.float32))
    x = g.standard_normal((T, D), dtype=np.float32)
    for _ in range(100):  # no near-tie at the k-th expert: fp32 sums in another order cannot re-route
        logp = np.sort(x.astype(np.float64) @ router.T.astype(np.float64), axis=1)[:, ::-1]
        near = logp[:, k - 1] - logp[:, k] < 1e-3
        if not near.any():
            break
        x[near] = g.standard_normal((int(near.sum()), D), dtype=np.float32)
    res = g.standard_normal((T, D), dtype=np.float32)
    scale, act = (2.0, "gelu_tanh") if gemma4 else (1.0, "silu")
    down_scale = (g.random(E) + 0.5).astype(np.float32) if gemma4 else None
    ids_ref, w_ref = np_ops.moe_route(x, router, k, True, scale)
    want = np_ops.moe_ffn(x, ids_ref, w_ref, tensors["gate"][1], tensors["up"][1], tensors["down"][1], add=res,
                          activation=act, down_scale=down_scale)
    b.workspace.reset()
    d_x = dev.upload(x)
    ids, w = ops.moe_route(d_x, QWeight(dev.upload(router.view(np.uint8)), QType.F32, E, D), k, True, scale)
    y = ops.moe_ffn(d_x, ids, w, tensors["gate"][0], tensors["up"][0], tensors["down"][0], add=dev.upload(res),
                    activation=act, down_scale=None if down_scale is None else dev.upload(down_scale))
    assert ids.numpy().tolist() == ids_ref.tolist(), f"seed {SEED}"
    got = y.numpy()
    scale = np.abs(want - res).max()
    # decode and the int8 GEMM: int8 activations (2^-8 of a group's largest |x|);
    # the bf16 GEMM: bf16 activations and weights (2^-8 relative each): the same class
    rel = 2e-2
    assert np.abs(got - want).max() <= rel * scale, (np.abs(got - want).max(), scale, SEED)
    dev.synchronize()
    dev.free_all()
