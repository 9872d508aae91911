"""Weight kernels (gemv.cu, dequant.cu via engine/backends/cuda/launchers/gemv.py, dequant.py)
against engine.quants, for every GGUF type the CUDA backend supports.

CPU part: both files compile with NVRTC for sm_90 (gemv.cu for every
GEMV_ROWS the launcher uses) and export every kernel; the launcher's mirror of
the gemv work-unit layout matches gemv.cu; unsupported types are refused.

GPU part (@pytest.mark.gpu): fresh random raw blocks (finite fp16 scales),
outputs poisoned with 0xFF bytes (NaN) first, engine.quants.dequantize as the
reference. get_rows and dequant_bf16 must be bit-exact; gemv has a stated
tolerance. Every failure message states the seed; ANVIL_KERNELS_SEED=<int>
replays it.
"""

from __future__ import annotations

import os
import re
import secrets
import zlib

import numpy as np
import pytest

from engine.backends.cuda import compile as nvrtc
from engine.backends.cuda import gemv_bench
from engine.backends.cuda import launch
from engine.backends.cuda.launchers import dequant, gemv
from engine.backends.numpy.faithful import bf16_bits
from engine.backends.numpy.faithful import from_bf16_bits
from engine.errors import AnvilError
from engine.quants import BLOCK, QType, dequantize, quantize_x, row_bytes, xq_group

SEED = int(os.environ.get("ANVIL_KERNELS_SEED", secrets.randbelow(2**32)))
TYPES = list(launch.WEIGHT_TYPES)
FLOATS = (QType.F32, QType.F16, QType.BF16)


def rng(*salt) -> np.random.Generator:
    # crc32, not hash(): str hashes are salted per process, which would defeat the replay
    return np.random.default_rng([SEED, *(zlib.crc32(repr(s).encode()) for s in salt)])


def qk(t: QType) -> int:
    return BLOCK[t][0]


def suffix(t: QType) -> str:
    return t.name.lower()


# ---- CPU ------------------------------------------------------------------------


@pytest.mark.parametrize("rows,xq", [(r, 1) for r in gemv.ROW_CHOICES] + [(16, 0)])  # xq 0: fp32 x
def test_gemv_compiles(rows, xq):
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_ROWS": rows, "GEMV_XQ": xq})
    for t in TYPES:
        assert f"gemv_{suffix(t)}\0".encode() in cubin, f"gemv.cu does not export gemv_{suffix(t)}"


def test_gemv_bulk_compiles():
    # the bulk-copy ring (sm_90) at the most passes compiled; its GLU form is built by
    # test_mutants' kernel-source test (the mutant bulk-glu-up-row-shifted edits it)
    defines = {"GEMV_ROWS": 8, "GEMV_XQ": 1, "GEMV_BULK": 1, "GEMV_PASSES": gemv.MAX_PASSES}
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", defines)
    for t in TYPES:
        assert f"gemv_{suffix(t)}\0".encode() in cubin, f"gemv.cu does not export gemv_{suffix(t)} with {defines}"


def test_gemv_bulk_plan():
    """Rows per group, stages and passes of the bulk-copy GEMV: every output
    row in some group, the ring within the budget, a row's units within reach
    of the lanes; rows too long for MAX_PASSES go to gemv_impl (None)."""
    for t in TYPES:
        for n_in, n_out, glu in [(4096, 151936, False), (14336, 4096, False), (qk(t), 1, False),
                                 (4096, 1000, False), (5376, 21504, True), (2048, 768, True), (21504, 5376, False)]:
            p = gemv.bulk_plan(t, n_in, n_out, 132, glu)
            if p is None:
                continue
            h = p.rows // 2 if glu else p.rows
            assert p.blocks * h >= n_out > (p.blocks - 1) * h
            assert 1 <= p.stages <= gemv.MAX_STAGES and p.shared <= 227 * 1024
            units = n_in // (qk(t) if t not in FLOATS else 4 if t == QType.F32 else 8) * gemv._GEMV_UNITS.get(t, (1,))[0]
            assert units <= p.passes * p.threads <= gemv.MAX_PASSES * gemv.MAX_THREADS
            assert p.shared == p.stages * (2 * gemv.bulk_part(h * row_bytes(t, n_in)) if glu else gemv.bulk_part(h * row_bytes(t, n_in)))
    assert gemv.bulk_plan(QType.Q4_K, 40960, 64) is None  # 1280 units: past 4 passes of 256 lanes
    # the H200 sweep's best (reports/notes/gemv-bulk-2026-12-01.md)
    p = gemv.bulk_plan(QType.Q4_K, 4096, 4096)
    assert (p.rows, p.stages, p.passes) == (16, 1, 1)  # 256 groups, a block each: all requested at once
    p = gemv.bulk_plan(QType.Q4_K, 4096, 12288, glu=True)  # 3 blocks per SM (WARPS_PER_SM), 2 stages each
    assert (p.rows, p.stages, p.threads) == (16, 2, 128)
    p = gemv.bulk_plan(QType.Q6_K, 12288, 4096)
    assert (p.rows, p.stages, p.passes) == (4, 2, 2)


@pytest.mark.parametrize("halves", [0, 1, 2, 3])
def test_gemv_pre_stages_compile_and_reach_the_launch(halves, monkeypatch):
    """PRE_STAGES (gemv.cuh GEMV_PRE_HALVES, in half stages): the bulk GEMV
    requests that much of its ring before its wait and the rest after x's
    loads, a stage cut in halves where the count is odd (GLU: gate rows, up
    rows; else its bytes). The define goes with a launch only where the plan
    has more than that; None, the default, requests every stage before the
    wait; a count not in halves is an error."""
    for glu in (True, False):
        defines = {"GEMV_ROWS": 16, "GEMV_XQ": 1, "GEMV_BULK": 1, "GEMV_NORM": 1, "GEMV_PRE_HALVES": halves}
        name = "gemv_glu_silu_q4_k" if glu else "gemv_q4_k"
        assert f"{name}\0".encode() in nvrtc.compile_cubin("gemv.cu", "sm_90", defines | ({"GEMV_GLU": 1} if glu else {}))
    glu = gemv.bulk_plan(QType.Q4_K, 4096, 12288, glu=True)  # 2 stages
    o = gemv.bulk_plan(QType.Q4_K, 4096, 4096)                 # 1 stage
    monkeypatch.setattr(gemv, "PRE_STAGES", None)
    assert gemv._defines(glu, None).get("GEMV_PRE_HALVES") is None
    monkeypatch.setattr(gemv, "PRE_STAGES", halves / 2)
    assert gemv._defines(glu, None)["GEMV_PRE_HALVES"] == halves
    assert gemv._defines(o, None).get("GEMV_PRE_HALVES") == (halves if halves < 2 else None)
    monkeypatch.setattr(gemv, "PRE_STAGES", 0.3)
    with pytest.raises(AnvilError, match="PRE_STAGES must be a multiple of 0.5"):
        gemv._defines(glu, None)


def test_gemv_glu_compiles():
    # one GEMV_ROWS (the GLU kernels are gemv_impl's, which test_gemv_compiles builds at every rows value)
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_ROWS": 2, "GEMV_XQ": 1, "GEMV_GLU": 1})
    for t in TYPES:
        for act in ("silu", "gelu"):
            assert f"gemv_glu_{act}_{suffix(t)}\0".encode() in cubin, f"gemv.cu does not export gemv_glu_{act}"


@pytest.mark.parametrize("defines", [{"GEMV_ROWS": 16}, {"GEMV_ROWS": 8, "GEMV_BULK": 1, "GEMV_PASSES": 2},
                                     {"GEMV_ROWS": 4, "GEMV_GLU": 1}, {"GEMV_ROWS": 8, "GEMV_XQ": 0}])
def test_gemv_norm_compiles(defines):
    """The GEMVs with the RMSNorm of x folded in (GEMV_NORM), per-warp and
    bulk, plain and GLU, int8 and fp32 x: every type's kernel is there."""
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines, "GEMV_NORM": 1})
    for t in TYPES:
        names = [f"gemv_glu_{a}_{suffix(t)}" for a in ("silu", "gelu")] if "GEMV_GLU" in defines else [f"gemv_{suffix(t)}"]
        for name in names:
            assert f"{name}\0".encode() in cubin, f"gemv.cu does not export {name} with {defines}"


@pytest.mark.parametrize("defines", [{"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_PASSES": 1}, {"GEMV_ROWS": 4}])
def test_gemv_late_wait_compiles(defines):
    """The GEMVs that wait for the kernel before them only at their end
    (GEMV_LATE_WAIT), bulk and per-warp."""
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines, "GEMV_LATE_WAIT": 1})
    for t in TYPES:
        assert f"gemv_{suffix(t)}\0".encode() in cubin, f"gemv.cu does not export gemv_{suffix(t)} with {defines}"


@pytest.mark.parametrize("defines", [{"GEMV_ROWS": 4, "GEMV_HEADS": 1}, {"GEMV_ROWS": 4, "GEMV_HEADS": 2},
                                     {"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_PASSES": 1, "GEMV_HEADS": 2}])
def test_gemv_heads_compiles(defines):
    """The GEMVs that form the Q/K heads after their late wait (GEMV_HEADS,
    NORM and NEOX pairs), bulk and per-warp; and none without the late wait."""
    cubin = nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines, "GEMV_LATE_WAIT": 1})
    for t in TYPES:
        assert f"gemv_heads_{suffix(t)}\0".encode() in cubin, f"gemv.cu does not export gemv_heads_{suffix(t)}"
    with pytest.raises(AnvilError, match="GEMV_HEADS forms the heads after the late wait"):
        nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines})


def test_dequant_compiles():
    cubin = nvrtc.compile_cubin("dequant.cu", "sm_90")
    for t in TYPES:
        for fn in (f"dequant_{suffix(t)}_bf16", f"get_rows_{suffix(t)}"):
            assert f"{fn}\0".encode() in cubin, f"dequant.cu does not export {fn}"


def test_gemv_layout_mirror_matches_kernel():
    # launchers/gemv.py sizes shared memory from its own copy of the unit layout: keep them equal
    src = (nvrtc.KERNELS_DIR / "gemv.cuh").read_text()
    structs = {"Q4_0": QType.Q4_0, "Q4_1": QType.Q4_1, "Q5_0": QType.Q5_0, "Q5_1": QType.Q5_1,
               "Q8_0": QType.Q8_0, "Q4K": QType.Q4_K, "Q5K": QType.Q5_K, "Q6K": QType.Q6_K}
    found = {m[0]: tuple(int(v) for v in m[1:]) for m in re.findall(r"struct (\w+) : Layout<(\d+), (\d+), (\d+)>", src)}
    for name, t in structs.items():
        assert found[name] == gemv._GEMV_UNITS[t], name
        upb, elems, nbytes = found[name]
        assert (elems, nbytes) == BLOCK[t]
        # the staging buffer holds the worst case: 15 bytes of misalignment before the span
        assert gemv.gemv_span(upb, nbytes) >= -(-(15 + 32 // upb * nbytes) // 16) * 16


@pytest.mark.parametrize("fn", ["gemv", "dequant_bf16", "get_rows"])
def test_unsupported_type_is_refused(fn):
    call = {"gemv": lambda: gemv.gemv(None, None, QType.Q2_K, None, None, 256, 8),
            "dequant_bf16": lambda: dequant.dequant_bf16(None, None, QType.Q3_K, None, 8, 256),
            "get_rows": lambda: dequant.get_rows(None, None, 99, None, None, 256)}[fn]
    with pytest.raises(AnvilError, match=r"unsupported weight type .*supported: F32, F16, BF16"):
        call()


def test_gemv_plan_covers_rows_and_threads():
    for t in TYPES:
        for n_in, n_out in [(4096, 151936), (14336, 4096), (qk(t), 1), (4096, 1000)]:
            p = gemv.gemv_plan(t, n_in, n_out)
            assert p.blocks * p.rows >= n_out > (p.blocks - 1) * p.rows
            assert 32 <= p.threads <= gemv.MAX_THREADS and p.threads % 32 == 0
            assert p.shared <= 227 * 1024
            assert p.rows <= gemv.max_rows(t, p.threads) and (p.rows == 1 or p.blocks >= 132)
    # the rows measured best on the H200 (reports/notes/gemv-rows-2026-11-30.md)
    assert gemv.gemv_plan(QType.Q4_K, 2048, 5120).rows == 8 and gemv.gemv_plan(QType.Q4_K, 4096, 4096).rows == 16
    assert gemv.gemv_plan(QType.Q6_K, 4096, 151936).rows == 8 and gemv.gemv_plan(QType.Q4_K, 4096, 1024).rows == 4


# ---- GPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dev():
    from engine.backends.cuda.device import Device

    d = Device()
    yield d
    d.synchronize()
    d.free_all()


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    bad = got != want
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        pytest.fail(f"{what} (seed {SEED}): {int(bad.sum())} of {bad.size} differ, first at {i}: "
                    f"{got[i]!r} vs {want[i]!r}")


def row_lengths(t: QType) -> list[int]:
    # one block, a few blocks, a model width; float rows also of odd length (scalar path)
    return [1, 100, 4096] if t in FLOATS else [qk(t), 3 * qk(t), 4096]


@pytest.mark.gpu
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_get_rows_exact(dev, t):
    for n_in in row_lengths(t):
        for scale in (1.0, 45.254833995939045):  # sqrt(2048): gemma's embedding scale
            g = rng("get_rows", t, n_in, scale)
            n_rows = 64
            raw = gemv_bench.random_weights(g, t, n_rows, n_in, wide=t not in FLOATS)
            ids = g.integers(0, n_rows, 37).astype(np.int32)
            ids[:2] = [0, n_rows - 1]
            W, d_ids = dev.upload(raw), dev.upload(ids)
            out = dev.empty((ids.size, n_in), np.float32)
            dev.fill(out, 0xFF)
            dequant.get_rows(dev, W, t, d_ids, out, n_in, scale)
            # one fp32 multiply, as the kernel (no value here is denormal, so flush-to-zero cannot differ)
            want = dequantize(raw, t, (n_rows, n_in))[ids] * np.float32(scale)
            assert_bits_equal(out.numpy().view(np.uint32), want.view(np.uint32),
                              f"get_rows {t.name} n_in={n_in} scale={scale}")


@pytest.mark.gpu
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequant_bf16_exact(dev, t):
    for n_in in row_lengths(t):
        for n_rows in (3, 33):
            g = rng("dequant", t, n_in, n_rows)
            raw = gemv_bench.random_weights(g, t, n_rows, n_in, wide=t not in FLOATS)
            W = dev.upload(raw)
            out = dev.empty((n_rows, n_in), np.uint16)
            dev.fill(out, 0xFF)
            dequant.dequant_bf16(dev, W, t, out, n_rows, n_in)
            want = bf16_bits(dequantize(raw, t, (n_rows, n_in)))
            assert_bits_equal(out.numpy(), want, f"dequant_bf16 {t.name} [{n_rows} x {n_in}]")


def gemv_cases(t: QType) -> list[tuple[int, int, int | None, str]]:
    """(n_in, n_out, rows per block or None = launcher's choice, add mode)."""
    k = qk(t) if t not in FLOATS else 8
    cases = [
        (k, 37, None, "none"),             # n_in = one block
        (3 * k, 515, None, "bias"),        # n_out not a multiple of any rows-per-block
        (4096, 1000, 16, "none"),          # 16 rows per block, partial last block
        (14336, 300, None, "residual"),    # large n_in, y aliasing add
        # more row groups than resident blocks: each block streams several groups
        (4 * k, 20011, 1, "bias"),         # one step per row
        (14336, 2999, 2, "residual"),      # several steps per row, the wrap to the next group
        (21504, 300, None, "bias"),        # bulk: 3 passes (Q4_K) or 4 (Q8_0)
        (40960, 70, None, "none"),         # bulk: too many units per lane, gemv_impl instead
    ]
    cases += [(2 * 256, 77, r, "bias") for r in gemv.ROW_CHOICES]
    if t in FLOATS:
        cases += [(1, 5, None, "none"), (100, 9, None, "bias")]  # odd lengths: one element per unit
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "warp"])
@pytest.mark.parametrize("xq", [True, False], ids=["x-int8", "x-fp32"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gemv(dev, t, xq, bulk):
    """Both activation paths: int8 x (the default for block types) against
    the exact product with quantize_x's values, fp32 x against the exact
    product with x; the same tolerance (the kernel's fp32 arithmetic). Both
    streamings: bulk copies into a ring (gemv_bulk_impl), per-warp staging
    (gemv_impl)."""
    if xq and t in FLOATS:
        pytest.skip("float weights always take fp32 activations")
    for n_in, n_out, rows, mode in gemv_cases(t):
        g = rng("gemv", t, n_in, n_out, rows, mode)
        raw = gemv_bench.random_weights(g, t, n_out, n_in)
        x = g.standard_normal(n_in, dtype=np.float32)
        x[g.integers(0, n_in, max(1, n_in // 50))] *= 30  # outliers: groups of very different scales
        add = g.standard_normal(n_out, dtype=np.float32)
        W, dx = dev.upload(raw), dev.upload(x)
        if mode == "residual":  # y holds add: the one output that cannot be poisoned
            y = dev.upload(add)
            gemv.gemv(dev, W, t, dx, y, n_in, n_out, add=y, rows=rows, xq=xq, bulk=bulk)
        else:
            y = dev.empty((n_out,), np.float32)
            dev.fill(y, 0xFF)
            d_add = dev.upload(add) if mode == "bias" else None
            gemv.gemv(dev, W, t, dx, y, n_in, n_out, add=d_add, rows=rows, xq=xq, bulk=bulk)
        got = y.numpy()

        w = dequantize(raw, t, (n_out, n_in)).astype(np.float64)
        prod = w * (quantize_x(x, xq_group(t)) if xq else x.astype(np.float64))
        ref = prod.sum(axis=1) + (add.astype(np.float64) if mode != "none" else 0.0)
        # Tolerance: the GPU sums the n_in products in fp32, in another order
        # (per-thread chains of 4-32 terms, then warp and block trees). Each
        # rounding adds <= eps*|partial sum|; for 4-6-bit types the products come
        # as 256*d*sc*(sum (0.5 + q/256) x - X/2), which gives up ~5 bits to
        # that cancellation. Random-sign errors add like a random walk, so the
        # total is ~ C * eps * ||w*x||_2 (eps = 2^-24), C a few hundred at most.
        # atol = 2^-12 ||w*x||_2 (= 4096 eps) leaves room for that, yet is ~30x
        # below one wrong product at n_in = 14336 (|w_j x_j| ~ ||w*x||_2/sqrt(n_in)).
        # rtol covers the final fp32 rounding of y and of the add. With int8 x
        # the products within a group are exact integers (dp4a), scaled in fp32:
        # fewer roundings than that, so the same bound holds against quantize_x's values.
        atol = 2.0**-12 * np.sqrt((prod**2).sum(axis=1))
        rtol = 2.0**-20
        err = np.abs(got.astype(np.float64) - ref)
        bad = ~(err <= atol + rtol * np.abs(ref))  # NaN (poison left over) counts as bad
        if bad.any():
            i = int(np.argmax(bad))
            pytest.fail(f"gemv {t.name} [{n_out} x {n_in}] rows={rows} add={mode} xq={xq} bulk={bulk} (seed {SEED}): "
                        f"{int(bad.sum())} of {n_out} rows off, first row {i}: {got[i]!r} vs {ref[i]!r} "
                        f"(atol {atol[i]:.3g})")


@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "warp"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gemv_glu(dev, t, bulk):
    """The GLU GEMV (a stacked gate/up weight, the activation in the
    epilogue) against act(gate·x) ⊙ (up·x) from the exact products, with
    test_gemv's bound on each product carried through the activation
    (|SiLU'|, |GELU_tanh'| < 1.2)."""
    k = qk(t) if t not in FLOATS else 8
    for activation in ("silu", "gelu_tanh"):
        for n_in, n_ff, rows in [(k, 37, None), (3 * k, 515, 2), (4096, 1000, 16), (14336, 2999, None),
                                 (21504, 300, None)]:
            g = rng("gemv_glu", t, activation, n_in, n_ff, rows)
            raw = gemv_bench.random_weights(g, t, 2 * n_ff, n_in)  # gate rows, then up rows
            x = g.standard_normal(n_in, dtype=np.float32)
            x[g.integers(0, n_in, max(1, n_in // 50))] *= 30
            y = dev.empty((n_ff,), np.float32)
            dev.fill(y, 0xFF)
            gemv.gemv_glu(dev, dev.upload(raw), t, dev.upload(x), y, n_in, n_ff, activation, rows=rows, bulk=bulk)
            got = y.numpy().astype(np.float64)

            xs = quantize_x(x, xq_group(t)) if t not in FLOATS else x.astype(np.float64)
            prod = dequantize(raw, t, (2 * n_ff, n_in)).astype(np.float64) * xs
            gu = prod.sum(axis=1)
            tol = 2.0**-12 * np.sqrt((prod**2).sum(axis=1))
            gate, up, tg, tu = gu[:n_ff], gu[n_ff:], tol[:n_ff], tol[n_ff:]
            if activation == "silu":
                act = gate / (1 + np.exp(-gate))
            else:
                act = 0.5 * gate * (1 + np.tanh(0.7978845608 * gate * (1 + 0.044715 * gate**2)))
            ref = act * up
            bound = 1.2 * tg * np.abs(up) + (np.abs(act) + 1.2 * tg) * tu + 2.0**-20 * np.abs(ref) + 1e-30
            bad = ~(np.abs(got - ref) <= bound)
            if bad.any():
                i = int(np.argmax(bad))
                pytest.fail(f"gemv_glu {activation} {t.name} [{n_ff} x {n_in}] rows={rows} bulk={bulk} (seed {SEED}): "
                            f"{int(bad.sum())} of {n_ff} off, first {i}: {got[i]!r} vs {ref[i]!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_prefill_gemm_precision(dev, dtype):
    """The prefill GEMM (cublas.gemm) against float64 products of the same
    rounded inputs: fp32 accumulation for every input type, and an F32
    weight stays fp32 (TF32's 10-bit inputs err ~5x past this bound)."""
    from engine.backends.cuda.cublas import Cublas

    g = np.random.default_rng(7)
    T, n_in, n_out = 37, 512, 300
    x = g.standard_normal((T, n_in)).astype(np.float32)
    w = g.standard_normal((n_out, n_in)).astype(np.float32)
    if dtype == "f16":
        xs, ws = x.astype(np.float16), w.astype(np.float16)
    elif dtype == "bf16":
        xs, ws = bf16_bits(x), bf16_bits(w)
    else:
        xs, ws = x, w
    as64 = (lambda a: a.astype(np.float64)) if dtype != "bf16" else \
        (lambda a: from_bf16_bits(a).astype(np.float64))
    want = as64(xs) @ as64(ws).T
    y = dev.empty((T, n_out))
    Cublas(dev.stream).gemm(dev.upload(xs), dev.upload(ws), y, T, n_in, n_out, dtype)
    dev.synchronize()
    # fp32 accumulation over 512 terms stays near 2^-24 x sqrt(n) of |x|·|w|; 2^-16 leaves room
    bound = 2.0 ** -16 * (np.abs(as64(xs)) @ np.abs(as64(ws)).T)
    err = np.abs(y.numpy() - want)
    assert (err <= bound).all(), f"{dtype}: max error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "warp"])
@pytest.mark.parametrize("xq", [True, False], ids=["x-int8", "x-fp32"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gemv_norm(dev, t, xq, bulk):
    """The GEMV and the GLU GEMV reading RMSNorm(x)·w (norm=): the kernel
    rounds x·w (not x·w/rms) to int8 and multiplies the row sums by 1/rms,
    so the reference is 1/rms times test_gemv's exact product with
    quantize_x(x·w), within test_gemv's bound (scaled by 1/rms) and 2^-20
    for 1/rms's own fp32 rounding; a bias is added unscaled. 1/rms comes from one pass over x: rows of
    several steps per warp (14336 columns, 2 rows a block) reload x each
    group."""
    if xq and t in FLOATS:
        pytest.skip("float weights always take fp32 activations")
    k = qk(t) if t not in FLOATS else 8
    eps = 1e-6
    for n_in, n_out, rows, glu in [(3 * k, 515, None, False), (4096, 1000, 16, False), (14336, 2999, 2, False),
                                   (21504, 300, None, False), (4096, 1000, 16, True), (14336, 2999, None, True)]:
        bias = n_in == 3 * k  # a bias (or the residual) is added after the 1/rms, not scaled
        g = rng("gemv_norm", t, n_in, n_out, rows, glu)
        raw = gemv_bench.random_weights(g, t, 2 * n_out if glu else n_out, n_in)
        x = g.standard_normal(n_in, dtype=np.float32) * 3
        x[g.integers(0, n_in, max(1, n_in // 50))] *= 30
        w = (1 + g.standard_normal(n_in, dtype=np.float32) * 0.3).astype(np.float32)
        y = dev.empty((n_out,), np.float32)
        dev.fill(y, 0xFF)
        norm = (dev.upload(w), eps)
        if glu:
            gemv.gemv_glu(dev, dev.upload(raw), t, dev.upload(x), y, n_in, n_out, "silu", rows=rows, xq=xq,
                          bulk=bulk, norm=norm)
        else:
            b = g.standard_normal(n_out, dtype=np.float32) if bias else None
            gemv.gemv(dev, dev.upload(raw), t, dev.upload(x), y, n_in, n_out, rows=rows, xq=xq, bulk=bulk, norm=norm,
                      add=dev.upload(b) if bias else None)
        got = y.numpy().astype(np.float64)

        inv = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
        xw = x * w  # fp32, as the kernel forms it
        xs = quantize_x(xw, xq_group(t)) if xq else xw.astype(np.float64)
        prod = dequantize(raw, t, (2 * n_out if glu else n_out, n_in)).astype(np.float64) * xs
        s, tol = prod.sum(axis=1) * inv, 2.0**-12 * np.sqrt((prod**2).sum(axis=1)) * inv + 2.0**-20 * np.abs(
            prod.sum(axis=1) * inv)
        if glu:
            gate, up, tg, tu = s[:n_out], s[n_out:], tol[:n_out], tol[n_out:]
            ref = gate / (1 + np.exp(-gate)) * up
            bound = 1.2 * tg * np.abs(up) + (np.abs(ref / np.where(up == 0, 1, up)) + 1.2 * tg) * tu + 1e-30
        else:
            ref, bound = s + (b.astype(np.float64) if bias else 0.0), tol
        bad = ~(np.abs(got - ref) <= bound + 2.0**-20 * np.abs(ref))
        if bad.any():
            i = int(np.argmax(bad))
            pytest.fail(f"gemv norm {t.name} [{n_out} x {n_in}] rows={rows} glu={glu} xq={xq} bulk={bulk} "
                        f"(seed {SEED}): {int(bad.sum())} of {n_out} off, first {i}: {got[i]!r} vs {ref[i]!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("pre", [0, 0.5, 1, 1.5])
def test_gemv_pre_stages_change_no_bit(dev, pre, monkeypatch):
    """Ring stages (or halves of one) requested after the wait instead of
    before it (PRE_STAGES) change when the weights arrive, not the
    arithmetic: a 2-stage GLU, a 2-stage Q6_K down and a 1-stage O
    projection, each launched behind another GEMV, give the bits of the
    default launch."""
    g = rng("gemv_pre_stages", pre)
    n_embd, n_ff = 4096, 12288
    W_glu = dev.upload(gemv_bench.random_weights(g, QType.Q4_K, 2 * n_ff, n_embd))
    W_down = dev.upload(gemv_bench.random_weights(g, QType.Q6_K, n_embd, n_ff))
    W_o = dev.upload(gemv_bench.random_weights(g, QType.Q4_K, n_embd, n_embd))
    assert gemv.bulk_plan(QType.Q4_K, n_embd, n_ff, glu=True).stages == 2
    assert gemv.bulk_plan(QType.Q6_K, n_ff, n_embd).stages == 2
    assert gemv.bulk_plan(QType.Q4_K, n_embd, n_embd).stages == 1
    x = dev.upload(g.standard_normal(n_embd, dtype=np.float32))
    runs = []
    for value in (None, pre, None, pre):
        monkeypatch.setattr(gemv, "PRE_STAGES", value)
        h, y, o = dev.empty((n_ff,), np.float32), dev.empty((n_embd,), np.float32), dev.empty((n_embd,), np.float32)
        gemv.gemv_glu(dev, W_glu, QType.Q4_K, x, h, n_embd, n_ff, "silu")
        gemv.gemv(dev, W_down, QType.Q6_K, h, y, n_ff, n_embd, add=x)
        gemv.gemv(dev, W_o, QType.Q4_K, y, o, n_embd, n_embd)
        runs.append([a.numpy() for a in (h, y, o)])
    for got in runs[1:]:
        for name, a, b in zip(("glu", "down", "o"), runs[0], got):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name} differs (seed {SEED})"


@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "warp"])
def test_gemv_overlap_beside_the_gemv_before(dev, bulk):
    """Two GEMVs of one x, the second launched with overlap= (it waits for
    the first only at its end), then a third GEMV reading the first's
    output: every output has the bits of the three launched plainly, launch
    after launch (the third's wait covers both)."""
    g = rng("gemv_overlap", bulk)
    n_in, n_a, n_b = 4096, 5120, 1024
    raw_a = gemv_bench.random_weights(g, QType.Q4_K, n_a, n_in)
    raw_b = gemv_bench.random_weights(g, QType.Q6_K, n_b, n_in)
    raw_c = gemv_bench.random_weights(g, QType.Q4_K, 256, n_a)
    W_a, W_b, W_c = dev.upload(raw_a), dev.upload(raw_b), dev.upload(raw_c)
    x = dev.upload(g.standard_normal(n_in, dtype=np.float32))
    runs = []
    for overlap in (False, True, False, True):
        ya, yb, yc = (dev.empty((n,), np.float32) for n in (n_a, n_b, 256))
        for y in (ya, yb, yc):
            dev.fill(y, 0xFF)
        gemv.gemv(dev, W_a, QType.Q4_K, x, ya, n_in, n_a, bulk=bulk)
        gemv.gemv(dev, W_b, QType.Q6_K, x, yb, n_in, n_b, bulk=bulk, overlap=overlap)
        gemv.gemv(dev, W_c, QType.Q4_K, ya, yc, n_a, 256, bulk=bulk)
        runs.append([y.numpy() for y in (ya, yb, yc)])
    for got in runs[1:]:
        for name, a, b in zip("abc", runs[0], got):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"output {name} differs (seed {SEED})"



@pytest.mark.gpu
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "warp"])
@pytest.mark.parametrize("rope_type,n_rot,normed,ff", [
    ("neox", 128, True, False),   # qwen3
    ("norm", 128, False, True),   # llama3: RoPE only, frequency divisors
    ("neox", 64, True, False),    # partial rotation: the dims past n_rot normalised only
])
def test_gemv_heads_equal_their_own_launch(dev, bulk, rope_type, n_rot, normed, ff):
    """V's GEMV launched beside the Q/K GEMV, forming the Q/K heads after its
    wait (heads=), writes the bits of V's plain GEMV followed by the
    qk_norm_rope (or rope) launch it replaces: the same arithmetic (rope.cuh
    qk_head), one launch less."""
    from engine.backends.cuda.launchers import rope

    g = rng("gemv_heads", bulk, rope_type, n_rot, normed)
    n_in, H, Hkv, D = 4096, 32, 8, 128
    n_qk = (H + Hkv) * D
    # V of 8 MB on the bulk path (the 8B shapes' 3.4 MB V stays per-warp)
    n_v = 2 * gemv.BULK_MIN_BYTES // row_bytes(QType.Q6_K, n_in) if bulk else Hkv * D
    W_qk = dev.upload(gemv_bench.random_weights(g, QType.Q4_K, n_qk, n_in))
    W_v = dev.upload(gemv_bench.random_weights(g, QType.Q6_K, n_v, n_in))
    x = dev.upload(g.standard_normal(n_in, dtype=np.float32))
    pos = dev.upload(np.array([3001], np.int32))
    q_w, k_w = (dev.upload((g.standard_normal(D) * 0.3 + 1).astype(np.float32)) if normed else None for _ in "qk")
    fdiv = dev.upload(g.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)) if ff else None
    runs = []
    for fold in (False, True, False, True):
        yqk, yv = dev.empty((n_qk,), np.float32), dev.empty((n_v,), np.float32)
        heads = rope.Heads(yqk.rows(0, H * D).reshape(1, H, D), yqk.rows(H * D, n_qk).reshape(1, Hkv, D),
                           pos, rope_type, n_rot, 1e6, 1.0, fdiv, q_w, k_w, 1e-6 if normed else 0.0)
        gemv.gemv(dev, W_qk, QType.Q4_K, x, yqk, n_in, n_qk, bulk=bulk)
        gemv.gemv(dev, W_v, QType.Q6_K, x, yv, n_in, n_v, bulk=bulk, overlap=True, heads=heads if fold else None)
        if not fold and normed:
            rope.qk_norm_rope(dev, heads)
        elif not fold:
            rope.rope(dev, yqk.reshape(1, H + Hkv, D), pos, rope_type, n_rot, 1e6, 1.0, fdiv)
        runs.append([y.numpy() for y in (yqk, yv)])
    for got in runs[1:]:
        for name, a, b in zip(("q/k", "v"), runs[0], got):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name} differs (seed {SEED})"
