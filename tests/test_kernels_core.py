"""Core CUDA kernels (norm, rope, attention, elementwise, argmax) against the
NumPy reference ops.

CPU part: every kernel file compiles with NVRTC for sm_90 (attention for
f16 and f32 caches at the head dims / GQA ratios the GPU tests use) and
exports the kernels the launchers launch, so a syntax error fails without a GPU;
and every launcher, run against a fake device through the real
argument packing, passes each kernel the parameter kinds it declares.

GPU part (@pytest.mark.gpu): fresh random inputs (never zeros), outputs
poisoned with 0xFF bytes (NaN) first, and a stated tolerance
``|gpu - ref| <= atol + rtol*|ref|`` with the reason next to it. Every
failure message states the seed; ANVIL_KERNELS_SEED=<int> replays it.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import zlib

import numpy as np
import pytest

from engine.backends.cuda import compile as nvrtc
from engine.backends.cuda.launchers import argmax, attention, deltanet, elementwise, gemv, norm, rope
from engine.backends.cuda.recording import RecordingDevice
from engine.backends.numpy import ops
from engine.backends.numpy.faithful import bf16_bits
from engine.config import ROPE_NEOX, ROPE_NORM
from engine.errors import AnvilError
from engine.quants import QType

SEED = int(os.environ.get("ANVIL_KERNELS_SEED", secrets.randbelow(2**32)))

KERNELS = {
    "norm.cu": ["rms_norm", "add_rms_norm"],
    "rope.cu": ["rope_norm", "rope_neox", "qk_norm_rope_norm", "qk_norm_rope_neox"],
    "elementwise.cu": ["silu_mul", "gelu_tanh_mul", "sigmoid_mul", "add", "scale", "softcap", "f32_to_bf16",
                       "f32_to_f16", "bias_add_rows", "sigmoid_mul_rows", "copy_cols"],
    "deltanet.cu": ["causal_conv", "decay_gates", "delta_rule", "delta_rule_chunked"],
    "argmax.cu": ["argmax", "argmax_blocks"],
}
ATTN_KERNELS = ["kv_store", "attention_decode", "attention_prefill"]
ATTN_SHAPES = list(itertools.product([0, 1], [64, 128, 256, 512], [1, 4, 8, 9]))  # KV_F16, HEAD_DIM, GQA (9: a short head group)


def rng(*salt) -> np.random.Generator:
    # crc32, not hash(): str hashes are salted per process, which would defeat the replay
    return np.random.default_rng([SEED, *(zlib.crc32(repr(s).encode()) for s in salt)])


# ---- CPU: compile ------------------------------------------------------------------


def exports(cubin: bytes, name: str) -> bool:
    """The ELF string table holds the (extern "C", unmangled) kernel name, NUL-delimited."""
    return b"\0" + name.encode() + b"\0" in cubin


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_compiles(name):
    cubin = nvrtc.compile_cubin(name, "sm_90")
    for fn in KERNELS[name]:
        assert exports(cubin, fn), f"{name} does not export {fn}"


@pytest.mark.parametrize("kv_f16,head_dim,gqa", ATTN_SHAPES)
def test_attention_compiles(kv_f16, head_dim, gqa):
    cubin = nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": kv_f16, "HEAD_DIM": head_dim, "GQA": gqa})
    for fn in ATTN_KERNELS:
        assert exports(cubin, fn), f"attention.cu does not export {fn}"
    # the tensor-core prefill: f16 caches, heads of 64, 128 or 256
    assert exports(cubin, "attention_prefill_tc") == (kv_f16 == 1 and head_dim in attention.TC_HEAD_DIMS)
    # kv_store is launched from the module built with KV_F16 alone (defaults for the rest)
    assert exports(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": kv_f16}), "kv_store")


def test_launch_shapes():
    """Shape-only launch decisions (no GPU): split counts and shared memory."""
    # 8B-like decode (132 SMs, 8 KV heads): ~2 blocks per SM, no chunk under 128 keys
    assert attention.decode_splits(132, 1, 8, 4096) == 32
    assert attention.decode_splits(132, 1, 8, 131072) == 33
    assert attention.decode_splits(132, 1, 1, 100) == 1
    # the wide kernel (a block an SM) where a full cache leaves a split at most 256 keys, at f16 heads of 128
    # from GQA 4: qwen3-8b's layer up to 4352 rows (17 splits), the 30B MoE's up to 8448 (33 splits)
    assert attention.decode_plan(132, 1, 8, 4096, 4, 128, True) == (17, attention.WIDE_MERGE_REGS)
    assert attention.decode_plan(132, 1, 8, 4224, 4, 128, True) == (17, attention.WIDE_MERGE_REGS)
    assert attention.decode_plan(132, 1, 8, 4400, 4, 128, True) == (33, None)
    assert attention.decode_plan(132, 1, 4, 8192, 8, 128, True) == (33, attention.WIDE_MERGE_REGS)
    assert attention.decode_plan(132, 1, 4, 16384, 8, 128, True) == (66, None)
    # not measured there: f32 caches, other heads, GQA under 4
    assert attention.decode_plan(132, 1, 8, 4096, 4, 128, False) == (32, None)
    assert attention.decode_plan(132, 1, 8, 4096, 4, 64, True) == (32, None)
    assert attention.decode_plan(132, 1, 8, 4096, 2, 128, True) == (32, None)
    # decode warps: two query heads each from GQA 4 (one below), then key tiles up to 8 warps
    assert [attention.decode_layout(g) for g in (1, 2, 3, 4, 7, 8, 12, 16)] == [
        (8, 1), (8, 1), (6, 1), (8, 2), (8, 2), (8, 2), (6, 2), (8, 2)]
    for _, d, g in ATTN_SHAPES:
        assert attention.decode_shared(g, d) <= 227 * 1024
        assert 4 * (3 * 32 * (d + 4) + 32 * 36) <= 227 * 1024
    # llama.cpp's host-side powf(base, -2/n_dims) in float32
    assert rope.rope_theta_scale(10000.0, 128) == float(np.float32(10000.0) ** np.float32(-2 / 128))


def kernel_signatures() -> dict[tuple[str, str], list[str]]:
    """(file, kernel) -> parameter kinds ('ptr', 'int', 'float') parsed from the .cu sources."""
    # bounds as __launch_bounds__(...) or an upper-case macro for them (attention.cu DEC_BOUNDS)
    sig = re.compile(r'extern "C" __global__ void\s*(?:__launch_bounds__\([^)]*\)\s*|[A-Z][A-Z_]*\s+)?(\w+)\s*\(([^)]*)\)')
    out = {}
    for name in list(KERNELS) + ["attention.cu"]:
        for fn, params in sig.findall((nvrtc.KERNELS_DIR / name).read_text()):
            out[(name, fn)] = param_kinds(params)
    return out


def param_kinds(params: str) -> list[str]:
    """'ptr', 'int' or 'float' for each parameter of a declaration, the headers'
    ``*_PARAMS`` macros (rope.cuh QK_HEADS_PARAMS) expanded."""
    macros = {}
    for h in nvrtc.KERNELS_DIR.glob("*.cuh"):
        text = h.read_text().replace("\\\n", " ")
        macros.update(re.findall(r"^#define (\w+_PARAMS)\s+(.*)$", text, re.M))
    kinds = []
    for p in params.split(","):
        p = p.strip()
        if p in macros:
            kinds += param_kinds(macros[p])
        else:
            kinds.append("ptr" if "*" in p else "int" if p.startswith("int") else "float")
    return kinds


def test_launchers_match_kernels():
    """Every launcher passes each kernel the parameters it declares (count and
    kind), within launch limits, through the real argument packing."""
    sigs = kernel_signatures()
    fd = RecordingDevice()
    f32, i32, f16 = np.float32, np.int32, np.float16
    T, H, Hkv, D, n = 5, 32, 8, 128, 4096
    x, w, y = fd.empty((T, n)), fd.empty((n,)), fd.empty((T, n))
    pos = fd.empty((T,), i32)
    norm.rms_norm(fd, x, w, y, 1e-5)
    norm.rms_norm(fd, fd.empty((T, H, D)), None, fd.empty((T, H, D)), 1e-5)
    norm.add_rms_norm(fd, x, fd.empty((T, n)), w, y, 1e-5)
    norm.add_rms_norm(fd, x, fd.empty((T, n)), w, y, 1e-5, a_norm=w)
    norm.add_rms_norm(fd, x, fd.empty((T, n)), None, None, 1e-5, a_norm=w, scale=fd.empty((1,)))
    norm.add_rms_norm(fd, x, fd.empty((T, n)), None, None, 1e-5, a_norm=w, x_norm=w)
    norm.add_rms_norm(fd, x, fd.empty((T, n)), (w, None, w), (y, fd.empty((T, n)), fd.empty((T, n))), 1e-5)
    rope.rope(fd, fd.empty((T, H, D)), pos, ROPE_NEOX, D, 1e6)
    rope.rope(fd, fd.empty((T, H, D)), pos, ROPE_NORM, D, 5e5, 1.0, fd.empty((D // 2,)))
    for rt in (ROPE_NEOX, ROPE_NORM):
        rope.qk_norm_rope(fd, rope.Heads(fd.empty((T, H, D)), fd.empty((T, Hkv, D)), pos, rt, D // 2, 1e6, 1.0,
                                         None, fd.empty((D,)), fd.empty((D,)), 1e-6))
    for dt, hd in ((f16, 128), (f32, 256), (f16, 64), (f16, 512), (f16, 256)):
        kc, vc = fd.empty((4096, Hkv, hd), dt), fd.empty((4096, Hkv, hd), dt)
        attention.kv_store(fd, fd.empty((T, Hkv * hd)), fd.empty((T, Hkv * hd)), kc, vc, pos)
        tc = ((T, "prefill_tc"),) if dt == f16 and hd in attention.TC_HEAD_DIMS else ()
        for t, path in ((1, None), (T, "decode"), (T, "prefill"), *tc, (600, None)):
            attention.attention(fd, fd.empty((t, H, hd)), kc, vc, fd.empty((t, H * hd)), fd.empty((t,), i32),
                               0.1, 0, path=path)
    attention.attention(fd, fd.empty((1, 4, 256)), fd.empty((64, 1, 256), f16), fd.empty((64, 1, 256), f16),
                       fd.empty((1, 1024)), pos, 1.0, 512)  # one split: no combine, NULL partials
    for op in (elementwise.silu_mul, elementwise.gelu_tanh_mul, elementwise.sigmoid_mul, elementwise.add):
        op(fd, x, y, fd.empty((T, n)))
    elementwise.sigmoid_mul(fd, x, fd.empty((T, 1)), fd.empty((T, n)))
    elementwise.copy_cols(fd, x, fd.empty((T * H, 64)), T * H, 64, 128, 64)
    C, Hv = 8192, 32
    deltanet.causal_conv(fd, fd.empty((T, C)), fd.empty((C, 4)), fd.empty((3, C)), fd.empty((T, C)))
    deltanet.decay_gates(fd, fd.empty((T, Hv)), fd.empty((T, Hv)), fd.empty((Hv,)), fd.empty((Hv,)),
                         fd.empty((T, Hv)), fd.empty((T, Hv)))
    for path in ("tokens", "chunked"):
        deltanet.delta_rule(fd, fd.empty((T, 16, 128)), fd.empty((T, 16, 128)), fd.empty((T, Hv, 128)),
                            fd.empty((T, Hv)), fd.empty((T, Hv)), fd.empty((Hv, 128, 128)), fd.empty((T, Hv, 128)),
                            path)
    elementwise.scale(fd, x, 0.5)
    elementwise.softcap(fd, x, 30.0)
    elementwise.f32_to_bf16(fd, x, fd.empty((T, n), np.uint16))
    elementwise.f32_to_f16(fd, x, fd.empty((T, n), np.float16))
    elementwise.bias_add_rows(fd, x, w)
    elementwise.mul_rows(fd, x, w, y)
    elementwise.mul_gather(fd, fd.empty((T, 8)), fd.empty((T, 8), i32), fd.empty((128,)), fd.empty((T, 8)))
    argmax.argmax(fd, fd.empty((1000,)), fd.empty((1,), i32))
    argmax.argmax(fd, fd.empty((151936,)), fd.empty((1,), i32))
    # the GEMV that forms the heads after its wait (gemv.cu's kernels are macro-made: its declaration here)
    qk = rope.Heads(fd.empty((1, H, D)), fd.empty((1, Hkv, D)), pos, ROPE_NEOX, D, 1e6)
    gemv.gemv(fd, fd.empty((1024 * 4096 // 256 * 210,), np.uint8), QType.Q6_K, fd.empty((1, 4096)),
              fd.empty((1, 1024)), 4096, 1024, overlap=True, heads=qk)
    fn, grid, block, shared, kinds = fd.launches.pop()
    assert fn == ("gemv.cu", "gemv_heads_q6_k") and grid[0] * block[0] // 32 >= H + Hkv
    assert kinds == param_kinds("const void* W, const float* x, float* y, const float* add, int n_in, int n_out, "
                                "const float* nw, float eps, QK_HEADS_PARAMS")

    launched = {fn for fn, *_ in fd.launches}
    assert launched == set(sigs), f"not launched: {set(sigs) - launched}"
    for fn, grid, block, shared, kinds in fd.launches:
        assert kinds == sigs[fn], f"{fn}: launcher passes {kinds}, kernel takes {sigs[fn]}"
        assert all(g >= 1 for g in grid) and grid[1] <= 65535 and grid[2] <= 65535, (fn, grid)
        assert block[0] % 32 == 0 and block[0] * block[1] * block[2] <= 1024, (fn, block)
        assert shared <= 227 * 1024, (fn, shared)


# ---- GPU helpers ---------------------------------------------------------------------

gpu = pytest.mark.gpu


def test_workspace_keep_moves_the_residual_from_either_side_of_the_mark():
    """end_layer's keep: a layer's output lies after the mark (a new result),
    at it (updated in place), or before it (layer 0 updating the embedding in
    place, as gemma's post-normed residual add does); each lands at the mark
    with one non-overlapping copy or none, and a partial overlap is refused."""
    from engine.backends.cuda.device import DArray, Workspace

    copies = []

    class Dev:
        stream = None

        def alloc_raw(self, nbytes):
            return 1 << 20

        class driver:  # noqa: N801 (cuda-python's name)
            @staticmethod
            def cuMemcpyDtoDAsync(dst, src, n, stream):  # noqa: N802
                copies.append((dst, src, n))
                return (0,)

    ws = Workspace(Dev(), 1 << 20)
    emb = ws.empty((4, 64))                 # before the mark
    ws.set_mark()
    mark = ws.base + ws.mark
    kept = ws.keep(emb)                     # layer 0: the embedding updated in place
    assert kept.ptr == mark and copies == [(mark, emb.ptr, emb.nbytes)]
    new = ws.empty((4, 64))                 # after the mark
    assert ws.keep(new).ptr == mark and copies[-1] == (mark, new.ptr, new.nbytes)
    n = len(copies)
    assert ws.keep(kept).ptr == mark and len(copies) == n  # at the mark: no copy
    ws.empty((1, 16))
    half = DArray(mark + 128, (4, 64), np.dtype(np.float32), Dev())  # overlaps the mark's rows
    with pytest.raises(AssertionError, match="overlapping keep"):
        ws.keep(half)


@pytest.fixture(scope="module")
def device():
    from engine.backends.cuda.device import Device

    return Device()


@pytest.fixture
def dev(device):
    yield device
    device.synchronize()
    device.free_all()


def poisoned(dev, shape, dtype=np.float32):
    a = dev.empty(shape, dtype)
    dev.fill(a, 0xFF)  # NaN for f32/f16: an unwritten element fails any comparison
    return a


def assert_close(got, ref, atol, rtol, what):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref)
    bad = ~(err <= atol + rtol * np.abs(ref))  # NaN counts as bad
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(err, nan=np.inf), -1)), bad.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.size} outside {np.max(atol):g} + {rtol:g}*|ref|; worst at {i}: "
            f"gpu {got[i]!r} ref {ref[i]!r} (seed {SEED}, replay with ANVIL_KERNELS_SEED={SEED})")


# ---- norms ---------------------------------------------------------------------------

# fp32 sum of squares in a different order than the float64 reference (rel.
# error ~log2(n)·2^-24), rsqrt.approx (~2 ulp), approximate division by n,
# then two float32 multiplies: a few 1e-7 relative; 1e-5 leaves margin.
NORM_ATOL, NORM_RTOL = 1e-6, 1e-5


@gpu
@pytest.mark.parametrize("rows,n", [(1, 4096), (7, 8192), (3, 576), (5, 1001), (160, 128), (12, 256)])
@pytest.mark.parametrize("weight", [True, False])
def test_rms_norm(dev, rows, n, weight):
    r = rng("rms", rows, n, weight)
    x = (r.standard_normal((rows, n)) * 2 + 0.5).astype(np.float32)
    w = (r.standard_normal(n) * 0.5 + 1).astype(np.float32) if weight else None
    eps = 1e-6
    dx = dev.upload(x)
    dw = dev.upload(w) if weight else None
    dy = poisoned(dev, (rows, n))
    norm.rms_norm(dev, dx, dw, dy, eps)
    assert_close(dy.numpy(), ops.rms_norm(x, w, eps), NORM_ATOL, NORM_RTOL, f"rms_norm {rows}x{n}")
    norm.rms_norm(dev, dx, dw, dx, eps)  # in place (y aliases x)
    assert_close(dx.numpy(), ops.rms_norm(x, w, eps), NORM_ATOL, NORM_RTOL, "rms_norm in place")
    # with a bf16 copy (a prefill GEMM's input): y's bits unchanged, the copy y rounded to nearest even
    dx, yb = dev.upload(x), poisoned(dev, (rows, n), np.uint16)
    dy2 = poisoned(dev, (rows, n))
    norm.rms_norm(dev, dx, dw, dy2, eps, yb=yb)
    np.testing.assert_array_equal(dy2.numpy(), dy.numpy(), err_msg=f"rms_norm with yb (seed {SEED})")
    np.testing.assert_array_equal(yb.numpy(), bf16_bits(dy.numpy()), err_msg=f"rms_norm yb (seed {SEED})")


@gpu
def test_rms_norm_per_head(dev):
    """Q/K norm: every (token, head) row of [T, H, D] normalised on its own."""
    r = rng("rms_head")
    T, H, D = 9, 32, 128
    x = r.standard_normal((T, H, D)).astype(np.float32) * 3
    w = (r.standard_normal(D) * 0.3 + 1).astype(np.float32)
    dx = dev.upload(x)
    norm.rms_norm(dev, dx, dev.upload(w), dx, 1e-6)
    assert_close(dx.numpy(), ops.rms_norm(x, w, 1e-6), NORM_ATOL, NORM_RTOL, "per-head rms_norm")


@gpu
@pytest.mark.parametrize("rows,n", [(1, 4096), (6, 2048), (4, 1001)])
def test_add_rms_norm(dev, rows, n):
    r = rng("add_rms", rows, n)
    x = r.standard_normal((rows, n)).astype(np.float32)
    a = r.standard_normal((rows, n)).astype(np.float32)
    w = (r.standard_normal(n) * 0.5 + 1).astype(np.float32)
    dx, dy = dev.upload(x), poisoned(dev, (rows, n))
    norm.add_rms_norm(dev, dx, dev.upload(a), dev.upload(w), dy, 1e-5)
    s = x + a  # one float32 rounding, same as the kernel's: exact
    np.testing.assert_array_equal(dx.numpy(), s, err_msg=f"residual x += a (seed {SEED})")
    assert_close(dy.numpy(), ops.rms_norm(s, w, 1e-5), NORM_ATOL, NORM_RTOL, "add_rms_norm")
    # with a bf16 copy of y (a prefill GEMM's input): the same bits, and the copy rounded to nearest even
    dx, dy2, yb = dev.upload(x), poisoned(dev, (rows, n)), poisoned(dev, (rows, n), np.uint16)
    norm.add_rms_norm(dev, dx, dev.upload(a), dev.upload(w), dy2, 1e-5, yb=yb)
    np.testing.assert_array_equal(dy2.numpy(), dy.numpy(), err_msg=f"add_rms_norm with yb (seed {SEED})")
    np.testing.assert_array_equal(yb.numpy(), bf16_bits(dy.numpy()), err_msg=f"add_rms_norm yb (seed {SEED})")


@gpu
@pytest.mark.parametrize("rows,n", [(1, 5376), (6, 2048), (4, 1001)])
def test_add_rms_norm_post_normed(dev, rows, n):
    """Gemma's post-norms inside the residual add, bit for bit the separate
    launches they replace (rms_norm, then add_rms_norm / add and mul), and
    within the norm tolerance of the NumPy ops."""
    r = rng("post_norm", rows, n)
    x = r.standard_normal((rows, n)).astype(np.float32)
    a = (r.standard_normal((rows, n)) * 40).astype(np.float32)
    wa, w = ((r.standard_normal(n) * 0.5 + 1).astype(np.float32) for _ in range(2))
    scale = np.array([0.37], np.float32)
    da, dwa, dw, ds = dev.upload(a), dev.upload(wa), dev.upload(w), dev.upload(scale)

    # x += RMSNorm(a)·wa, then the next norm
    dx, dy = dev.upload(x), poisoned(dev, (rows, n))
    norm.add_rms_norm(dev, dx, da, dw, dy, 1e-6, a_norm=dwa)
    sx, sy, sa = dev.upload(x), poisoned(dev, (rows, n)), poisoned(dev, (rows, n))
    norm.rms_norm(dev, da, dwa, sa, 1e-6)
    norm.add_rms_norm(dev, sx, sa, dw, sy, 1e-6)
    np.testing.assert_array_equal(dx.numpy(), sx.numpy(), err_msg=f"fused post-norm residual (seed {SEED})")
    np.testing.assert_array_equal(dy.numpy(), sy.numpy(), err_msg=f"fused post-norm, next norm (seed {SEED})")
    ex, ey = ops.add_rms_norm(x, a, w, 1e-6, a_norm=wa)
    assert_close(dx.numpy(), ex, NORM_ATOL, NORM_RTOL, "add_rms_norm a_norm: x")
    assert_close(dy.numpy(), ey, NORM_ATOL, NORM_RTOL, "add_rms_norm a_norm: norm")

    # (x + RMSNorm(a)·wa)·scale, no next norm
    dx = dev.upload(x)
    norm.add_rms_norm(dev, dx, da, None, None, 1e-6, a_norm=dwa, scale=ds)
    sx = dev.upload(x)
    norm.rms_norm(dev, da, dwa, sa, 1e-6)
    s1, s2 = poisoned(dev, (rows, n)), poisoned(dev, (rows, n))
    elementwise.add(dev, sx, sa, s1)
    elementwise.mul_rows(dev, s1, ds, s2)
    np.testing.assert_array_equal(dx.numpy(), s2.numpy(), err_msg=f"fused norm_add with scale (seed {SEED})")
    assert_close(dx.numpy(), ops.norm_add(x, a, wa, 1e-6, scale), NORM_ATOL, NORM_RTOL, "norm_add")

    # gemma4's MoE layers: RMSNorm(x)·wx + RMSNorm(a)·wa (two post-normed branches summed)
    wx = (r.standard_normal(n) * 0.5 + 1).astype(np.float32)
    dx = dev.upload(x)
    norm.add_rms_norm(dev, dx, da, None, None, 1e-6, a_norm=dwa, x_norm=dev.upload(wx))
    sx = dev.upload(x)
    norm.rms_norm(dev, sx, dev.upload(wx), sx, 1e-6)
    norm.rms_norm(dev, da, dwa, sa, 1e-6)
    elementwise.add(dev, sx, sa, s1)
    np.testing.assert_array_equal(dx.numpy(), s1.numpy(), err_msg=f"fused norm_add with x_norm (seed {SEED})")
    assert_close(dx.numpy(), ops.norm_add(x, a, wa, 1e-6, x_norm=wx), NORM_ATOL, NORM_RTOL, "norm_add x_norm")

    # several norms of the new x (gemma4's MoE input norms), each the bits of a launch with that one weight
    ws = [dw, None, dev.upload(wx)]
    dx, ys = dev.upload(x), [poisoned(dev, (rows, n)) for _ in ws]
    norm.add_rms_norm(dev, dx, da, tuple(ws), tuple(ys), 1e-6, a_norm=dwa)
    for wi, yi in zip(ws, ys):
        sx, want = dev.upload(x), poisoned(dev, (rows, n))
        norm.add_rms_norm(dev, sx, da, wi, want, 1e-6, a_norm=dwa)
        np.testing.assert_array_equal(dx.numpy(), sx.numpy(), err_msg=f"add_rms_norm with 3 norms: x (seed {SEED})")
        np.testing.assert_array_equal(yi.numpy(), want.numpy(), err_msg=f"add_rms_norm, one of 3 norms (seed {SEED})")


# ---- RoPE ----------------------------------------------------------------------------

def rope_tolerance(x, pos, rope_type, n_rot):
    """Per-element bound. The kernel (as llama.cpp) builds θ in float32 from
    __powf(theta_scale, i): ~(2..8)e-7·pos rad of error at high positions
    (float32 rounding of pos·θ_i and lg2/ex2.approx inside __powf; a float32
    emulation measured ≤ 8.3e-7·pos for head dims 64..256), plus
    __sinf/__cosf (sin/cos.approx: ~2^-21 near 0, growing ~|θ|·2^-24 with
    range reduction) and the approximate division by freq_div. An angle
    error δ moves x0', x1' by ≤ δ(|x0|+|x1|). Bound: δ ≤ 2e-6 + 1.5e-6·pos
    (~2x margin). A wrong pairing or frequency gives O(1) errors instead."""
    half = n_rot // 2
    if rope_type == ROPE_NORM:
        i0, i1 = np.arange(0, n_rot, 2), np.arange(1, n_rot, 2)
    else:
        i0, i1 = np.arange(half), np.arange(half, n_rot)
    mag = np.abs(x[..., i0]) + np.abs(x[..., i1])
    delta = (2e-6 + 1.5e-6 * pos.astype(np.float64))[:, None, None]
    tol = np.zeros(x.shape)
    tol[..., i0] = tol[..., i1] = mag * delta
    return tol + 1e-6


@gpu
@pytest.mark.parametrize("rope_type", [ROPE_NORM, ROPE_NEOX])
@pytest.mark.parametrize("T,p0,H,D,n_rot,base,scale,ff", [
    (1, 0, 32, 128, 128, 10000.0, 1.0, False),
    (7, 0, 8, 64, 64, 10000.0, 1.0, False),
    (5, 3000, 32, 128, 128, 500000.0, 1.0, True),   # llama3: rope_freqs divisors
    (3, 7000, 4, 256, 256, 1e6, 1.0, False),        # gemma3-like head dim
    (33, 100, 8, 128, 64, 10000.0, 0.25, False),    # partial rotation, linear scaling
    (600, 0, 2, 128, 128, 1e6, 1.0, False),         # prefill length
])
def test_rope(dev, rope_type, T, p0, H, D, n_rot, base, scale, ff):
    r = rng("rope", rope_type, T, p0, H, D, n_rot)
    x = r.standard_normal((T, H, D)).astype(np.float32)
    pos = (p0 + np.arange(T)).astype(np.int32)
    if T > 1:
        pos[-1] = p0 + 4 * T + 17  # positions need not be consecutive: each token reads its own
    fdiv = r.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if ff else None
    if ff and D == 512:  # gemma4's proportional RoPE: a quarter of the pairs rotate, the rest divided by 1e30
        fdiv = np.array([1.0] * 64 + [1e30] * 192, np.float32)
    dx = dev.upload(x)
    rope.rope(dev, dx, dev.upload(pos), rope_type, n_rot, base, scale, dev.upload(fdiv) if ff else None)
    got = dx.numpy()
    cos, sin = ops.rope_angles(pos, n_rot, base, scale, fdiv)
    ref = ops.rope_one(x, (cos, sin, rope_type))
    if n_rot < D:
        np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:], err_msg="dims >= n_rot must be untouched")
    err = np.abs(got.astype(np.float64) - ref)
    tol = rope_tolerance(x, pos, rope_type, n_rot)
    bad = ~(err <= tol)
    assert not bad.any(), (f"rope {rope_type}: {int(bad.sum())} outside tolerance, worst err/tol "
                           f"{np.nanmax(err / tol):.3g} at {np.unravel_index(np.argmax(err / tol), err.shape)} (seed {SEED})")


@gpu
@pytest.mark.parametrize("rope_type", [ROPE_NORM, ROPE_NEOX])
@pytest.mark.parametrize("T,p0,H,Hkv,D,n_rot,ff", [
    (1, 37, 32, 4, 128, 128, False),    # qwen3moe decode
    (5, 3000, 16, 8, 128, 128, True),   # frequency divisors
    (3, 7000, 8, 4, 256, 64, False),    # partial rotation (qwen35: 64 of 256)
    (40, 0, 4, 1, 64, 64, False),       # prefill rows
    (3, 900, 8, 1, 512, 512, True),     # gemma4's full layers: heads of 512, frequency divisors
])
def test_qk_norm_rope(dev, rope_type, T, p0, H, Hkv, D, n_rot, ff):
    """The fused per-head Q/K RMSNorm and RoPE against the NumPy ops it fuses."""
    r = rng("qk_norm_rope", rope_type, T, p0, H, D, n_rot)
    q = (r.standard_normal((T, H, D)) * 3).astype(np.float32)
    k = (r.standard_normal((T, Hkv, D)) * 3).astype(np.float32)
    qw, kw = ((r.standard_normal(D) * 0.3 + 1).astype(np.float32) for _ in range(2))
    pos = (p0 + np.arange(T)).astype(np.int32)
    fdiv = r.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if ff else None
    if ff and D == 512:  # gemma4's proportional RoPE: a quarter of the pairs rotate, the rest divided by 1e30
        fdiv = np.array([1.0] * 64 + [1e30] * 192, np.float32)
    base, scale, eps = 1e6, 1.0, 1e-6
    dq, dk = dev.upload(q), dev.upload(k)
    rope.qk_norm_rope(dev, rope.Heads(dq, dk, dev.upload(pos), rope_type, n_rot, base, scale,
                                      dev.upload(fdiv) if ff else None, dev.upload(qw), dev.upload(kw), eps))
    rotation = (*ops.rope_angles(pos, n_rot, base, scale, fdiv), rope_type)
    for name, got, x, w in (("q", dq.numpy(), q, qw), ("k", dk.numpy(), k, kw)):
        xn = ops.rms_norm(x, w, eps)
        ref = ops.rope_one(xn, rotation)
        # the rotation's bound on the normalised values, plus the norm's error carried through a pair
        tol = rope_tolerance(xn, pos, rope_type, n_rot) + 2 * (NORM_ATOL + NORM_RTOL * np.abs(xn).max())
        err = np.abs(got.astype(np.float64) - ref)
        assert (err <= tol).all(), f"qk_norm_rope {rope_type} {name}: worst err/tol {np.max(err / tol):.3g} (seed {SEED})"


# ---- KV cache and attention ------------------------------------------------------------

def f16_round(a):
    return a.astype(np.float16).astype(np.float32)


@gpu
@pytest.mark.parametrize("kv_f16", [1, 0])
@pytest.mark.parametrize("Hkv,D", [(4, 128), (16, 256), (5, 320)])  # rows of 1/2, 4 and 1 9/16 blocks' span
def test_kv_store(dev, kv_f16, Hkv, D):
    r = rng("kv_store", kv_f16, Hkv, D)
    n_ctx, T = 64, 9
    dt = np.float16 if kv_f16 else np.float32
    k = r.standard_normal((T, Hkv * D)).astype(np.float32)
    v = r.standard_normal((T, Hkv * D)).astype(np.float32)
    pos = r.permutation(n_ctx)[:T].astype(np.int32)  # scattered rows: row t goes to pos[t]
    kc, vc = poisoned(dev, (n_ctx, Hkv, D), dt), poisoned(dev, (n_ctx, Hkv, D), dt)
    attention.kv_store(dev, dev.upload(k), dev.upload(v), kc, vc, dev.upload(pos))
    for got, src in ((kc.numpy(), k), (vc.numpy(), v)):
        # f16: __float2half_rn and NumPy's astype both round to nearest even: exact
        np.testing.assert_array_equal(got[pos].reshape(T, -1), src.astype(dt), err_msg=f"seed {SEED}")
        rest = np.setdiff1d(np.arange(n_ctx), pos)
        assert np.isnan(got[rest]).all(), "kv_store wrote rows it was not given"


def make_cache(dev, r, n_ctx, n_valid, Hkv, D, kv_f16):
    """Random K/V in rows [0, n_valid); rows past it are NaN (never to be read).
    Returns device caches and the float32 values the kernel sees."""
    dt = np.float16 if kv_f16 else np.float32
    k = r.standard_normal((n_ctx, Hkv, D)).astype(dt)
    v = r.standard_normal((n_ctx, Hkv, D)).astype(dt)
    k[n_valid:] = np.nan
    v[n_valid:] = np.nan
    return dev.upload(k), dev.upload(v), k[:n_valid].astype(np.float32), v[:n_valid].astype(np.float32)


# Both paths: fp32 dot products in another order than the float64 reference
# (~1e-6 relative on scores of magnitude ≲10), __expf (ex2.approx: ≲ 2+1.2|x|
# ulp, x down to about -30 here: ~3e-6 relative on each weight) and fp32
# accumulation of up to ~4000 weighted V rows. Outputs are weighted means of
# |v| ≲ 5: expected errors ~1e-5. The reference sees the same f16-rounded
# K/V, so the f16 cache itself costs nothing here. A key wrongly in or out
# of the mask shifts outputs by ~p_key·|v| (checked exactly in
# test_attention_mask_exact).
ATTN_ATOL, ATTN_RTOL = 1e-4, 1e-4
# The tensor-core prefill rounds Q to f16 and scales it in f16 (two roundings
# of 2^-11 relative), and P to f16, as llama.cpp's tensor-core attention does:
# a score of D products of |q·k| ≲ 2 errs by ≲ sqrt(D)·2·2·2^-11·scale ~ 2e-3
# relative through its exp, and each weight by 2^-11 more; outputs, weighted
# means of |v| ≲ 5, by ~7e-3 at worst.
ATTN_TC_ATOL, ATTN_TC_RTOL = 1e-2, 1e-2


def run_attention(dev, r, T, p0, n_ctx, Hkv, G, D, kv_f16, window, path, q_gain=2.0):
    H = Hkv * G
    n_valid = p0 + T
    kc, vc, k, v = make_cache(dev, r, n_ctx, n_valid, Hkv, D, kv_f16)
    q = (r.standard_normal((T, H, D)) * q_gain).astype(np.float32)  # gain: peakier softmax than N(0,1) scores
    pos = (p0 + np.arange(T)).astype(np.int32)
    scale = 1.0 / np.sqrt(D)
    out = poisoned(dev, (T, H * D))
    outb = poisoned(dev, (T, H * D), np.uint16) if path == "prefill_tc" else None  # its bf16 copy (Wo's input)
    attention.attention(dev, dev.upload(q), kc, vc, out, dev.upload(pos), scale, window, path=path, outb=outb)
    ref = ops.attention(q, k, v, pos, scale, window)
    atol, rtol = (ATTN_TC_ATOL, ATTN_TC_RTOL) if path == "prefill_tc" else (ATTN_ATOL, ATTN_RTOL)
    assert_close(out.numpy(), ref, atol, rtol,
                 f"attention {path} T={T} p0={p0} Hkv={Hkv} G={G} D={D} f16={kv_f16} window={window}")
    if outb is not None:
        np.testing.assert_array_equal(outb.numpy(), bf16_bits(out.numpy()), err_msg=f"attention outb (seed {SEED})")


@gpu
@pytest.mark.parametrize("kv_f16", [1, 0])
@pytest.mark.parametrize("D,G", [(64, 1), (128, 2), (128, 4), (128, 8), (128, 9), (64, 16), (256, 4), (512, 8)])
@pytest.mark.parametrize("L", [1, 37, 100, 150, 1000, 2049])
@pytest.mark.parametrize("window", [0, 8])
def test_attention_decode(dev, kv_f16, D, G, L, window):
    """T=1 at L cached positions (the query's own K/V included); n_ctx 4096,
    so the split count is that of a real 4k-context decode graph. Chunks are
    at least 32 keys: L=1 has one active split (it writes the output), 37,
    100 and 150 a few (merged in one round trip up to MERGE_FEW, 2 to 8 by
    the shape; 150's 5 are more than GQA 8's 4), 1000 and 2049 many."""
    run_attention(dev, rng("dec", kv_f16, D, G, L, window), 1, L - 1, 4096, 2, G, D, kv_f16, window, "decode")


@gpu
@pytest.mark.parametrize("kv_f16", [1, 0])
@pytest.mark.parametrize("G,D", [(4, 128), (8, 128), (2, 256), (8, 512)])
@pytest.mark.parametrize("L", [1, 37, 1000])
@pytest.mark.parametrize("window", [0, 8])
def test_attention_decode_stores_the_step_row(dev, kv_f16, G, D, L, window):
    """Decode with the step's own K/V rows (k_new, v_new): the cache row at
    the query's position starts as NaN and the kernel stores it, rounded as
    kv_store rounds it, before reading it; the output is attention over all
    L keys, and no other row is written."""
    r = rng("dec-store", kv_f16, G, D, L, window)
    Hkv, n_ctx = 2, 4096
    kc, vc, k, v = make_cache(dev, r, n_ctx, L - 1, Hkv, D, kv_f16)  # rows [0, L-1); the rest NaN
    dt = np.float16 if kv_f16 else np.float32
    k_row = r.standard_normal((1, Hkv * D)).astype(np.float32)
    v_row = r.standard_normal((1, Hkv * D)).astype(np.float32)
    q = (r.standard_normal((1, Hkv * G, D)) * 2.0).astype(np.float32)
    pos = np.array([L - 1], np.int32)
    out = poisoned(dev, (1, Hkv * G * D))
    scale = 1.0 / np.sqrt(D)
    attention.attention(dev, dev.upload(q), kc, vc, out, dev.upload(pos), scale, window,
                        k_new=dev.upload(k_row), v_new=dev.upload(v_row))
    keys = np.concatenate([k, k_row.astype(dt).astype(np.float32).reshape(1, Hkv, D)])
    values = np.concatenate([v, v_row.astype(dt).astype(np.float32).reshape(1, Hkv, D)])
    ref = ops.attention(q, keys, values, pos, scale, window)
    assert_close(out.numpy(), ref, ATTN_ATOL, ATTN_RTOL, f"decode storing its row G={G} D={D} L={L} window={window}")
    for got, src in ((kc.numpy(), k_row), (vc.numpy(), v_row)):
        np.testing.assert_array_equal(got[L - 1].reshape(1, -1), src.astype(dt), err_msg=f"seed {SEED}")
        assert np.isnan(got[L:]).all(), "the decode kernel wrote rows past the step's"


@gpu
@pytest.mark.parametrize("tile_warps,v_early,hpw", [(None, False, None), (2, False, 1), (None, True, 1), (2, True, 1),
                                                   (None, False, 4), (4, True, 2), (8, True, 8)])
@pytest.mark.parametrize("L", [37, 1000, 4096])
@pytest.mark.parametrize("G,D", [(4, 128), (8, 128), (4, 64)])
def test_attention_decode_sweep_layouts(dev, monkeypatch, tile_warps, v_early, hpw, L, G, D):
    """The layouts scripts/gpu/attention_decode_sweep.py times (warps per
    head; V requested with K or after the scores; the heads a warp scores
    from each row it loads) compute the same attention; more than 8 warps is
    refused."""
    monkeypatch.setattr(attention, "TILE_WARPS", tile_warps)
    monkeypatch.setattr(attention, "V_EARLY", v_early)
    monkeypatch.setattr(attention, "HEADS_PER_WARP", hpw)
    try:
        attention.decode_layout(G)
    except AnvilError:  # the launch is refused alike
        with pytest.raises(AnvilError, match="over 8"):
            run_attention(dev, rng("dec-tw"), 1, L - 1, 8192, 8, G, D, 1, 0, "decode")
        return
    run_attention(dev, rng("dec-tw", tile_warps, v_early, hpw, L, G, D), 1, L - 1, 8192, 8, G, D, 1, 0, "decode")


@gpu
@pytest.mark.parametrize("min_chunk,merge_regs", [(256, None), (512, None), (None, 80), (256, 80)])
@pytest.mark.parametrize("L", [37, 1000, 4096])
@pytest.mark.parametrize("G,D", [(4, 128), (8, 128)])
def test_attention_decode_min_chunk_and_merge_regs(dev, monkeypatch, min_chunk, merge_regs, L, G, D):
    """The split lengths and merge batches the sweep times (launchers/
    attention.py MIN_CHUNK, MERGE_REGS) compute the same attention: fewer,
    longer splits active at a short context (one at 37 keys), the grid's at a
    long one; more of the merge's loads before M is known."""
    monkeypatch.setattr(attention, "MIN_CHUNK", min_chunk)
    monkeypatch.setattr(attention, "MERGE_REGS", merge_regs)
    run_attention(dev, rng("dec-mc", min_chunk, merge_regs, L, G, D), 1, L - 1, 8192, 8, G, D, 1, 0, "decode")


@gpu
@pytest.mark.parametrize("L", [37, 4096])
def test_attention_decode_register_cap(dev, monkeypatch, L):
    """The long-cache kernel under a register cap (launchers/attention.py
    MAX_REGS, a sweep's: ptxas spills to local memory) computes the same
    attention, on the 4608-row cache that does not take the wide kernel."""
    monkeypatch.setattr(attention, "MAX_REGS", 104)
    assert attention.decode_plan(dev.sm_count, 1, 8, 4608, 4, 128, True)[1] is None
    run_attention(dev, rng("dec-cap", L), 1, L - 1, 4608, 8, 4, 128, 1, 0, "decode")


@gpu
@pytest.mark.parametrize("L", [1, 37, 1000, 4096])
@pytest.mark.parametrize("Hkv,G,n_ctx", [(8, 4, 4096), (4, 8, 8192)])
def test_attention_decode_wide(dev, L, Hkv, G, n_ctx):
    """The wide kernel (launchers/attention.py decode_plan: a block an SM,
    more registers) on the caches that take it: qwen3-8b's and the 30B MoE's
    layers, from one key to a full cache."""
    splits, merge_regs = attention.decode_plan(dev.sm_count, 1, Hkv, n_ctx, G, 128, True)
    assert merge_regs == attention.WIDE_MERGE_REGS and splits <= -(-dev.sm_count // Hkv)
    run_attention(dev, rng("dec-wide", L, G), 1, L - 1, n_ctx, Hkv, G, 128, 1, 0, "decode")


@gpu
def test_attention_decode_8b_shape(dev):
    """Llama/Qwen-8B layer: 32 heads, 8 KV heads, D 128, f16, 1500 cached."""
    run_attention(dev, rng("dec8b"), 1, 1499, 8192, 8, 4, 128, 1, 0, "decode")


@gpu
def test_attention_decode_many_splits(dev):
    """More active splits than the merge keeps weights for in shared memory
    (GQA 16, heads of 64: 96 kept; 105 active): the rest read from L2."""
    assert attention.decode_splits(dev.sm_count, 1, 1, 16384) >= 105
    run_attention(dev, rng("dec-many"), 1, 9999, 16384, 1, 16, 64, 1, 0, "decode")


@gpu
def test_attention_decode_many_splits_few_outputs(dev):
    """A KV head's G*D outputs fewer than the merging block's threads (GQA 2,
    heads of 64: 128 outputs, 256 threads) with more active splits than the
    merge's first batch (79): the threads without an output read nothing."""
    assert attention.decode_splits(dev.sm_count, 1, 2, 16384) >= 79
    run_attention(dev, rng("dec-many-few"), 1, 9999, 16384, 2, 2, 64, 1, 0, "decode")


@gpu
def test_attention_decode_merges_again(dev):
    """The split blocks' merge is done by the last block to take a ticket, and
    the ticket returns to 0: launch after launch (a graph's replays) gives the
    same bits, also after a launch with another split count."""
    r = rng("dec-again")
    kc, vc, _, _ = make_cache(dev, r, 4096, 3000, 8, 128, 1)
    q = dev.upload(r.standard_normal((1, 32, 128)).astype(np.float32))
    pos, short = dev.upload(np.array([2999], np.int32)), dev.upload(np.array([40], np.int32))
    outs = []
    for p in (pos, short, pos, pos):
        out = poisoned(dev, (1, 32 * 128))
        attention.attention(dev, q, kc, vc, out, p, 0.088, 0, path="decode")
        outs.append(out.numpy())
    assert attention.decode_splits(dev.sm_count, 1, 8, 4096) > 1
    np.testing.assert_array_equal(outs[2], outs[0])
    np.testing.assert_array_equal(outs[3], outs[0])


@gpu
@pytest.mark.parametrize("kv_f16", [1, 0])
@pytest.mark.parametrize("T,p0,D,G,window", [
    (1, 0, 128, 4, 0),
    (5, 0, 64, 1, 0),
    (33, 0, 128, 4, 0),
    (129, 7, 256, 4, 0),
    (200, 300, 128, 8, 0),   # chunked prefill: earlier positions already cached
    (64, 0, 128, 1, 8),
    (300, 50, 256, 4, 100),  # gemma3-style sliding window
    (70, 20, 512, 8, 0),     # gemma4's full layers: heads of 512
    (600, 0, 128, 4, 0),
    (600, 0, 64, 8, 64),
])
@pytest.mark.parametrize("path", ["prefill", "prefill_tc", "decode"])
def test_attention_prefill(dev, kv_f16, T, p0, D, G, window, path):
    """T queries with the causal mask (and window); the decode kernel is
    checked on the same cases since attention() may route small T to it."""
    if path == "decode" and T > 64:
        pytest.skip("decode kernel on long prompts: covered by the short cases")
    if path == "prefill_tc" and not (kv_f16 and D in attention.TC_HEAD_DIMS):
        pytest.skip("the tensor-core prefill reads f16 caches with heads of 64, 128 or 256")
    run_attention(dev, rng("pf", kv_f16, T, p0, D, G, window, path), T, p0, p0 + T + 40, 2, G, D, kv_f16, window, path)


@gpu
@pytest.mark.parametrize("path", ["decode", "prefill", "prefill_tc"])
@pytest.mark.parametrize("window", [0, 1, 8, 1000])
def test_attention_mask_exact(dev, path, window):
    """Every key identical -> every visible key gets exactly the same weight;
    V[p] = p/1024 (exact in f16 below 2048) -> the output is the mean
    visible position / 1024 = (lo + pos)/2/1024. A key too many or too few at
    either end of the range moves it by 0.5/1024 = 4.9e-4; fp32 summation of
    <= 1600 equal-weight terms errs by ~1e-6, so 1e-4 separates the two.
    Positions are scattered (not consecutive), queries in one prefill tile
    see different ranges, and the rows past the last position are NaN."""
    r = rng("mask", path, window)
    Hkv, G, D, n_ctx = 2, 4, 128, 2048
    T = 3 if path == "decode" else 70
    pos = np.sort(r.choice(np.arange(1, 1600), T, replace=False)).astype(np.int32)
    pos[0] = 0
    kvec = r.standard_normal(D).astype(np.float16)
    k = np.broadcast_to(kvec, (n_ctx, Hkv, D)).copy()
    v = np.broadcast_to((np.arange(n_ctx) / 1024.0)[:, None, None], (n_ctx, Hkv, D)).astype(np.float16)
    k[pos[-1] + 1:] = np.nan
    v[pos[-1] + 1:] = np.nan
    q = r.standard_normal((T, Hkv * G, D)).astype(np.float32)
    out = poisoned(dev, (T, Hkv * G * D))
    attention.attention(dev, dev.upload(q), dev.upload(k), dev.upload(v), out, dev.upload(pos), 0.125, window,
                       path=path)
    lo = np.maximum(0, pos - window + 1) if window else np.zeros_like(pos)
    want = np.broadcast_to(((lo + pos) / 2.0 / 1024.0)[:, None], (T, Hkv * G * D))
    assert_close(out.numpy(), want, 1e-4, 0, f"mask {path} window={window} pos={pos.tolist()}")


# ---- elementwise ---------------------------------------------------------------------

EW_SIZES = [1, 7, 4096, 14336 * 3 + 1]  # odd sizes exercise the scalar tail


def ew_inputs(dev, r, n, misaligned):
    """Two random fp32 vectors on the device; misaligned=True offsets them by
    one float so the kernels take their scalar (non-float4) path."""
    a = (r.standard_normal(n) * 3).astype(np.float32)
    b = (r.standard_normal(n) * 2).astype(np.float32)
    off = 1 if misaligned else 0
    da, db = dev.empty((n + off,)), dev.empty((n + off,))
    dev.upload(np.concatenate([np.float32([1.5] * off), a]), da)
    dev.upload(np.concatenate([np.float32([1.5] * off), b]), db)
    dy = poisoned(dev, (n + off,))
    view = lambda d: d.rows(off, n + off)
    return a, b, view(da), view(db), view(dy)


@gpu
@pytest.mark.parametrize("n", EW_SIZES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_gated_activations(dev, n, misaligned):
    r = rng("act", n, misaligned)
    g, u, dg, du, dy = ew_inputs(dev, r, n, misaligned)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    # silu: __expf (≲ 2+1.2|x| ulp, |x| ≲ 15 here) and an approximate divide: ~2e-6 relative
    elementwise.silu_mul(dev, dg, du, dy)
    assert_close(dy.numpy(), g64 / (1 + np.exp(-g64)) * u64, 1e-7, 1e-5, "silu_mul")
    # gelu: tanhf compiles to tanh.approx.f32 under fast math (max rel. error
    # 2^-11 ≈ 4.9e-4, as in llama.cpp's build), which moves y by up to
    # 0.5·|g·u|·|tanh|·4.9e-4: bound by |g·u| rather than |ref| (ref ≈ 0 when
    # 1+tanh ≈ 0 but the absolute error need not be).
    elementwise.gelu_tanh_mul(dev, dg, du, dy)
    ref = 0.5 * g64 * (1 + np.tanh(0.7978845608 * g64 * (1 + 0.044715 * g64 * g64))) * u64
    err = np.abs(dy.numpy() - ref)
    bad = ~(err <= 1e-7 + 3e-4 * np.abs(g64 * u64) + 1e-5 * np.abs(ref))
    assert not bad.any(), f"gelu_tanh_mul: {bad.sum()} bad, worst {err.max():.3g} (seed {SEED})"
    # with a bf16 copy (a prefill GEMM's input): the same fp32 bits, and the copy rounded to nearest even
    for glu in (elementwise.silu_mul, elementwise.gelu_tanh_mul):
        glu(dev, dg, du, dy)
        plain = dy.numpy()
        yb = poisoned(dev, (n,), np.uint16)
        dev.upload(np.full(n, np.nan, np.float32), dy)  # the fp32 result must be written again
        glu(dev, dg, du, dy, yb=yb)
        np.testing.assert_array_equal(dy.numpy(), plain, err_msg=f"{glu.__name__} with yb (seed {SEED})")
        np.testing.assert_array_equal(yb.numpy(), bf16_bits(plain), err_msg=f"{glu.__name__} yb (seed {SEED})")


@gpu
@pytest.mark.parametrize("n", EW_SIZES)
@pytest.mark.parametrize("misaligned", [False, True])
def test_add_scale_softcap(dev, n, misaligned):
    r = rng("arith", n, misaligned)
    a, b, da, db, dy = ew_inputs(dev, r, n, misaligned)
    elementwise.add(dev, da, db, dy)  # one float32 rounding either way: exact
    np.testing.assert_array_equal(dy.numpy(), a + b, err_msg=f"add (seed {SEED})")
    elementwise.add(dev, da, db, da)  # in place
    np.testing.assert_array_equal(da.numpy(), a + b, err_msg=f"add in place (seed {SEED})")
    elementwise.scale(dev, db, 0.37)  # exact: one multiply
    np.testing.assert_array_equal(db.numpy(), b * np.float32(0.37), err_msg=f"scale (seed {SEED})")
    x = (b * np.float32(0.37)).astype(np.float64) * 20  # logits-like range
    dev.upload(x.astype(np.float32), db)
    elementwise.softcap(dev, db, 30.0)
    # tanh.approx.f32 (rel. error ≤ 2^-11) dominates: 6e-4 relative
    assert_close(db.numpy(), 30.0 * np.tanh(x.astype(np.float32).astype(np.float64) / 30.0), 1e-6, 6e-4,
                 "softcap")
    # the gemma reference op itself, for good measure
    assert_close(db.numpy(), ops.softcap(x.astype(np.float32), 30.0), 1e-6, 6e-4, "softcap vs ops.softcap")


@gpu
@pytest.mark.parametrize("n", EW_SIZES)
def test_f32_to_bf16(dev, n):
    r = rng("bf16", n)
    x = (r.standard_normal(n) * 10.0 ** r.integers(-5, 5, n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 3.0e38, -3.4e38,
                        np.uint32(0x3F808000).view(np.float32),   # tie, even mantissa: rounds down
                        np.uint32(0x3F818000).view(np.float32)],  # tie, odd mantissa: rounds up
                       np.float32)
    x[: min(n, special.size)] = special[: min(n, special.size)]
    dy = poisoned(dev, (n,), np.uint16)
    elementwise.f32_to_bf16(dev, dev.upload(x), dy)
    np.testing.assert_array_equal(dy.numpy(), bf16_bits(x), err_msg=f"f32_to_bf16 (seed {SEED})")


@gpu
@pytest.mark.parametrize("n", EW_SIZES)
def test_f32_to_f16(dev, n):
    """Bit-exact against NumPy's round-to-nearest-even cast, overflow to inf and subnormals included."""
    r = rng("f16", n)
    x = (r.standard_normal(n) * 10.0 ** r.integers(-8, 5, n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, -7.0e4, 6.0e-8,
                        np.float32(1.0 + 2.0 ** -11),                   # tie, even mantissa: rounds down
                        np.float32(1.0 + 3 * 2.0 ** -11)], np.float32)  # tie, odd mantissa: rounds up
    x[: min(n, special.size)] = special[: min(n, special.size)]
    dy = poisoned(dev, (n,), np.float16)
    elementwise.f32_to_f16(dev, dev.upload(x), dy)
    with np.errstate(over="ignore"):  # the cast overflows to inf on purpose
        want = x.astype(np.float16)
    np.testing.assert_array_equal(dy.numpy().view(np.uint16), want.view(np.uint16), err_msg=f"f32_to_f16 (seed {SEED})")


@gpu
@pytest.mark.parametrize("rows,n", [(1, 4096), (37, 1024), (5, 3)])
def test_bias_add_rows(dev, rows, n):
    r = rng("bias", rows, n)
    y = r.standard_normal((rows, n)).astype(np.float32)
    b = r.standard_normal(n).astype(np.float32)
    dy = dev.upload(y)
    elementwise.bias_add_rows(dev, dy, dev.upload(b))
    np.testing.assert_array_equal(dy.numpy(), y + b, err_msg=f"bias_add_rows (seed {SEED})")  # one add: exact


@gpu
@pytest.mark.parametrize("rows,n,n_w", [(1, 4096, 4096), (37, 1024, 1), (5, 3, 3)])
def test_mul_rows(dev, rows, n, n_w):
    """A weight row (or one scalar: gemma4's layer_output_scale) times every row."""
    r = rng("mul_rows", rows, n, n_w)
    x = r.standard_normal((rows, n)).astype(np.float32)
    w = r.standard_normal(n_w).astype(np.float32)
    dy = poisoned(dev, (rows, n))
    elementwise.mul_rows(dev, dev.upload(x), dev.upload(w), dy)
    np.testing.assert_array_equal(dy.numpy(), ops.mul(x, w), err_msg=f"mul_rows (seed {SEED})")  # one multiply: exact


@gpu
def test_mul_gather(dev):
    """Routing weights times their experts' scales (gemma4's ffn_down_exps.scale)."""
    r = rng("mul_gather")
    w = r.random((7, 8)).astype(np.float32)
    ids = r.integers(0, 128, (7, 8)).astype(np.int32)
    s = r.standard_normal(128).astype(np.float32)
    dy = poisoned(dev, (7, 8))
    elementwise.mul_gather(dev, dev.upload(w), dev.upload(ids), dev.upload(s), dy)
    np.testing.assert_array_equal(dy.numpy(), w * s[ids], err_msg=f"mul_gather (seed {SEED})")


# ---- argmax --------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("n", [1, 1000, 32000, 32769, 151936, 262144])
def test_argmax_ties(dev, n):
    """Ties go to the lowest index, across threads and across the blocks of
    the two-pass path (which splits at multiples of ~n/nb); a non-finite
    value anywhere gives -1."""
    r = rng("argmax", n)
    out = poisoned(dev, (1,), np.int32)
    x = r.standard_normal(n).astype(np.float32)
    cases = {"random": x.copy()}
    tied = x.copy()
    top = np.float32(x.max() + 1)
    where = np.unique(np.concatenate([r.integers(0, n, 5), [n - 1], [n // 2, n // 2 - 1]]))
    tied[where] = top
    cases["ties"] = tied
    cases["all equal"] = np.full(n, np.float32(-2.5))
    last = x.copy()
    last[-1] = top
    cases["max last"] = last
    huge = np.full(n, np.float32(-3e38))
    huge[n // 3] = np.float32(-1e38)
    cases["-3e38 elsewhere"] = huge
    # any NaN or infinity, in any block, answers -1 (the host names the step)
    for bad, where in ((np.nan, 0), (np.nan, n - 1), (np.inf, n // 2), (-np.inf, n // 3)):
        v = x.copy()
        v[where] = bad
        cases[f"{bad} at {where}"] = v
    # every call reuses the blocks' ticket: a ticket not returned to 0 leaves the next answer unwritten
    for name, v in cases.items():
        dev.fill(out, 0xFF)
        argmax.argmax(dev, dev.upload(v), out)
        want = int(np.argmax(v)) if np.isfinite(v).all() else -1
        assert int(out.numpy()[0]) == want, f"argmax {name} n={n}: got {out.numpy()[0]}, want {want} (seed {SEED})"
    # decode's form: the same launch feeds the choice back as the step's token and moves its position on
    token, pos = dev.upload(np.array([-7], np.int32)), dev.upload(np.array([41], np.int32))
    for step, name in enumerate(("ties", "max last")):
        dev.fill(out, 0xFF)
        argmax.argmax(dev, dev.upload(cases[name]), out, feed=(token, pos))
        want = int(np.argmax(cases[name]))
        got = (int(out.numpy()[0]), int(token.numpy()[0]), int(pos.numpy()[0]))
        assert got == (want, want, 42 + step), f"argmax feed {name} n={n}: out, token, pos {got} (seed {SEED})"
