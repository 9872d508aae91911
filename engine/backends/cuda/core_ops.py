"""Launchers for the core (non-matmul) kernels: norms, RoPE, KV cache and
attention, elementwise ops, argmax.

Each follows the convention of ``launch.py``. NumPy references:
``engine/backends/numpy/ops.py``; tests: tests/test_kernels_core.py. Two ops
need a scratch buffer (split-K attention, two-pass argmax); pass one (e.g.
from the forward pass's Workspace) or the launcher takes ``launch.scratch``.
"""

from __future__ import annotations


import numpy as np

from ...config import ROPE_NEOX, ROPE_NORM
from . import launch
from .device import DArray, Device


def _check_f32(*arrays: DArray) -> None:
    for a in arrays:
        if a is not None and a.dtype != np.float32:
            raise TypeError(f"expected a float32 DArray, got {a.dtype} {a.shape}")


# ---- norms -------------------------------------------------------------------

def _norm_threads(n: int) -> int:
    """~one float4 per thread: 32 threads for a 128-wide head, 1024 for n >= 4096."""
    return min(1024, max(32, 32 * launch.ceil_div(n, 128)))


def rms_norm(dev: Device, x: DArray, w: DArray | None, y: DArray, eps: float) -> None:
    """y = x * rsqrt(mean(x², last axis) + eps) * w, for every row of x (any
    leading shape: [T, n] model norms, [T, H, D] per-head Q/K norms). y may be x."""
    _check_f32(x, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert y.size == x.size and (w is None or w.size == n), (x.shape, y.shape, w and w.shape)
    fn = launch.function(dev, "norm.cu", "rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, launch.null_or(w), y, n, float(eps)])


def add_rms_norm(dev: Device, x: DArray, a: DArray, w: DArray | None, y: DArray, eps: float) -> None:
    """x += a (in place: the residual stream), then y = rms_norm(x) * w."""
    _check_f32(x, a, w, y)
    n = x.shape[-1]
    rows = x.size // n
    assert a.size == x.size and y.size == x.size and y.ptr != x.ptr
    fn = launch.function(dev, "norm.cu", "add_rms_norm")
    dev.launch(fn, (rows,), (_norm_threads(n),), [x, a, launch.null_or(w), y, n, float(eps)])


# ---- RoPE --------------------------------------------------------------------

def rope_theta_scale(base: float, n_rot: int) -> float:
    """``powf(freq_base, -2.0f/n_rot)`` in float32, as llama.cpp computes it on the host."""
    return float(np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot)))


def rope(dev: Device, x: DArray, pos: DArray, rope_type: str, n_rot: int, base: float,
         scale: float = 1.0, freq_div: DArray | None = None) -> None:
    """Rotate x [T, n_heads, head_dim] in place; token t at position pos[t]
    (int32, device). freq_div: optional [n_rot/2] divisors (llama3 rope_freqs)."""
    _check_f32(x, freq_div)
    T, n_heads, head_dim = x.shape
    assert pos.dtype == np.int32 and pos.size >= T
    assert n_rot % 2 == 0 and n_rot <= head_dim and (freq_div is None or freq_div.size >= n_rot // 2)
    name = {ROPE_NORM: "rope_norm", ROPE_NEOX: "rope_neox"}[rope_type]
    fn = launch.function(dev, "rope.cu", name)
    dev.launch(fn, (T, n_heads), (32 * launch.ceil_div(n_rot // 2, 32),),
               [x, pos, n_heads, head_dim, n_rot, rope_theta_scale(base, n_rot), float(scale),
                launch.null_or(freq_div)])


# ---- KV cache and attention --------------------------------------------------

DECODE_MAX_T = 4        # up to this many queries use the split-K decode kernel
DEC_WARPS = 4           # attention.cu: warps per decode block
DEC_MIN_CHUNK = 128     # attention.cu: smallest key chunk per split
DEC_BLOCKS_PER_SM = 4   # split so decode fills ~4 blocks per SM at full context
PF_BQ = 32              # attention.cu: queries per prefill block


def _kv_f16(cache: DArray) -> int:
    if cache.dtype == np.float16:
        return 1
    if cache.dtype == np.float32:
        return 0
    raise TypeError(f"KV cache must be float16 or float32, got {cache.dtype}")


def attention_defines(k_cache: DArray, n_head: int) -> dict:
    n_ctx, n_head_kv, head_dim = k_cache.shape
    assert n_head % n_head_kv == 0, (n_head, n_head_kv)
    return {"KV_F16": _kv_f16(k_cache), "HEAD_DIM": head_dim, "GQA": n_head // n_head_kv}


def kv_store(dev: Device, k: DArray, v: DArray, k_cache: DArray, v_cache: DArray, pos: DArray) -> None:
    """Write k, v [T, n_head_kv*head_dim] into cache rows pos[t] of the
    [n_ctx, n_head_kv, head_dim] caches (f16 caches round to nearest)."""
    _check_f32(k, v)
    T = k.shape[0]
    kv_dim = k.size // T
    assert k_cache.shape[1] * k_cache.shape[2] == kv_dim and v_cache.shape == k_cache.shape
    assert v_cache.dtype == k_cache.dtype and pos.dtype == np.int32
    fn = launch.function(dev, "attention.cu", "kv_store", {"KV_F16": _kv_f16(k_cache)})
    dev.launch(fn, (T,), (256,), [k, v, k_cache, v_cache, pos, T, kv_dim])


def decode_splits(sm_count: int, T: int, n_head_kv: int, n_ctx: int) -> int:
    """Fixed split count for the decode kernel: enough blocks for
    ~DEC_BLOCKS_PER_SM per SM, never chunks shorter than DEC_MIN_CHUNK of the
    whole cache. Depends on shapes only (graph-safe)."""
    want = launch.ceil_div(DEC_BLOCKS_PER_SM * sm_count, n_head_kv * T)
    return max(1, min(launch.ceil_div(n_ctx, DEC_MIN_CHUNK), want))


def attention_scratch_nbytes(dev: Device, T: int, n_head: int, n_head_kv: int, head_dim: int, n_ctx: int) -> int:
    """Scratch the decode path needs (0 for prefill or a single split)."""
    if T > DECODE_MAX_T:
        return 0
    s = decode_splits(dev.sm_count, T, n_head_kv, n_ctx)
    return 0 if s == 1 else 4 * T * n_head * s * (head_dim + 2)


def attention(dev: Device, q: DArray, k_cache: DArray, v_cache: DArray, out: DArray, pos: DArray,
              scale: float, window: int = 0, scratch: DArray | None = None, path: str | None = None) -> None:
    """Causal GQA attention of q [T, n_head, head_dim] (query t at position
    pos[t]) over the cache rows it can see; out [T, n_head*head_dim].

    path: None picks decode (split-K) for T <= DECODE_MAX_T, else prefill
    (tiled); "decode" / "prefill" force one (both are correct for any T).
    """
    _check_f32(q, out)
    T, n_head, head_dim = q.shape
    n_ctx, n_head_kv, hd = k_cache.shape
    assert hd == head_dim and head_dim in (64, 128, 256), head_dim  # attention.cu static_assert
    assert v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype
    assert out.size == q.size and pos.dtype == np.int32 and pos.size >= T
    defines = attention_defines(k_cache, n_head)
    args_tail = [float(scale), int(window)]
    path = path or ("decode" if T <= DECODE_MAX_T else "prefill")

    if path == "prefill":
        shared = 4 * (3 * PF_BQ * (head_dim + 4) + PF_BQ * (PF_BQ + 4))  # Q, K, V tiles + P
        fn = launch.function(dev, "attention.cu", "attention_prefill", defines, shared)
        dev.launch(fn, (launch.ceil_div(T, PF_BQ), n_head), (128,),
                   [q, k_cache, v_cache, out, pos, T, n_head, n_head_kv] + args_tail, shared=shared)
        return
    assert path == "decode", path

    n_splits = decode_splits(dev.sm_count, T, n_head_kv, n_ctx)
    G = defines["GQA"]
    shared = 4 * DEC_WARPS * G * (head_dim + 32 + 2)  # per-warp O (q aliases it) + P + (m, l)
    fn = launch.function(dev, "attention.cu", "attention_decode", defines, shared)
    if n_splits == 1:
        part_o = part_ml = launch.null()
    else:
        n_part = T * n_head * n_splits
        nbytes = 4 * n_part * (head_dim + 2)
        buf = scratch if scratch is not None else launch.scratch(dev, "attention", nbytes)
        assert buf.nbytes >= nbytes, (buf.nbytes, nbytes)
        part_o = DArray(buf.ptr, (n_part, head_dim), np.dtype(np.float32), dev)
        part_ml = DArray(buf.ptr + 4 * n_part * head_dim, (n_part, 2), np.dtype(np.float32), dev)
    dev.launch(fn, (n_splits, n_head_kv, T), (32 * DEC_WARPS,),
               [q, k_cache, v_cache, out, part_o, part_ml, pos, n_head, n_head_kv] + args_tail, shared=shared)
    if n_splits > 1:
        fn = launch.function(dev, "attention.cu", "attention_combine", defines)
        dev.launch(fn, (n_head, T), (head_dim,), [part_o, part_ml, out, pos, n_head, n_splits, int(window)])


# ---- elementwise ---------------------------------------------------------------

def _ew_launch(dev: Device, name: str, n: int, args: list) -> None:
    """~one float4 per thread per pass, at most 8 waves of 256-thread blocks."""
    blocks = max(1, min(launch.ceil_div(n, 1024), 8 * dev.sm_count))
    dev.launch(launch.function(dev, "elementwise.cu", name), (blocks,), (256,), args)


def silu_mul(dev: Device, g: DArray, u: DArray, y: DArray) -> None:
    """y = silu(g) * u (SwiGLU)."""
    _check_f32(g, u, y)
    assert g.size == u.size == y.size
    _ew_launch(dev, "silu_mul", g.size, [g, u, y, g.size])


def gelu_tanh_mul(dev: Device, g: DArray, u: DArray, y: DArray) -> None:
    """y = gelu_tanh(g) * u (GeGLU, gemma)."""
    _check_f32(g, u, y)
    assert g.size == u.size == y.size
    _ew_launch(dev, "gelu_tanh_mul", g.size, [g, u, y, g.size])


def add(dev: Device, a: DArray, b: DArray, y: DArray) -> None:
    """y = a + b (y may be a or b)."""
    _check_f32(a, b, y)
    assert a.size == b.size == y.size
    _ew_launch(dev, "add", a.size, [a, b, y, a.size])


def scale(dev: Device, x: DArray, s: float) -> None:
    """x *= s in place."""
    _check_f32(x)
    _ew_launch(dev, "scale", x.size, [x, float(s), x.size])


def softcap(dev: Device, x: DArray, cap: float) -> None:
    """x = cap * tanh(x / cap) in place."""
    _check_f32(x)
    _ew_launch(dev, "softcap", x.size, [x, float(cap), x.size])


def f32_to_bf16(dev: Device, x: DArray, y: DArray) -> None:
    """y (any 2-byte dtype, e.g. uint16 holding bf16 bits) = bf16(x), round to nearest even."""
    _check_f32(x)
    assert y.size == x.size and np.dtype(y.dtype).itemsize == 2
    _ew_launch(dev, "f32_to_bf16", x.size, [x, y, x.size])


def f32_to_f16(dev: Device, x: DArray, y: DArray) -> None:
    """y (float16, or any 2-byte dtype) = f16(x), round to nearest even."""
    _check_f32(x)
    assert y.size == x.size and np.dtype(y.dtype).itemsize == 2
    _ew_launch(dev, "f32_to_f16", x.size, [x, y, x.size])


def bias_add_rows(dev: Device, y: DArray, b: DArray) -> None:
    """y[r, :] += b for every row of y (row length b.size)."""
    _check_f32(y, b)
    n = b.size
    rows = y.size // n
    assert rows * n == y.size
    fn = launch.function(dev, "elementwise.cu", "bias_add_rows")
    dev.launch(fn, (min(launch.ceil_div(n, 256), 64), min(rows, 65535)), (256,), [y, b, rows, n])


# ---- argmax ------------------------------------------------------------------

ARGMAX_ONE_BLOCK = 32768  # below this one block is as fast as two passes


def argmax(dev: Device, x: DArray, out: DArray, scratch: DArray | None = None) -> None:
    """out[0] (int32, device) = index of the largest element of x, lowest
    index among ties (np.argmax)."""
    _check_f32(x)
    assert out.dtype == np.int32
    n = x.size
    if n <= ARGMAX_ONE_BLOCK:
        dev.launch(launch.function(dev, "argmax.cu", "argmax"), (1,), (1024,), [x, n, out])
        return
    # ~8 elements per thread in 256-thread blocks, at most ~4 blocks per SM.
    nb = min(launch.ceil_div(n, 2048), 4 * dev.sm_count)
    buf = scratch if scratch is not None else launch.scratch(dev, "argmax", 8 * nb)
    assert buf.nbytes >= 8 * nb
    part_val = DArray(buf.ptr, (nb,), np.dtype(np.float32), dev)
    part_idx = DArray(buf.ptr + 4 * nb, (nb,), np.dtype(np.int32), dev)
    dev.launch(launch.function(dev, "argmax.cu", "argmax_partial"), (nb,), (256,), [x, n, part_val, part_idx])
    dev.launch(launch.function(dev, "argmax.cu", "argmax_final"), (1,), (256,), [part_val, part_idx, nb, out])
