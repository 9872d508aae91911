"""Launchers for attention.cu: the KV-cache store and causal GQA attention
(split-K decode for a few queries, tiled prefill otherwise). Attention needs
a scratch buffer for its splits: pass one (e.g. from the forward pass's
Workspace) or the launcher takes ``launch.scratch``."""

from __future__ import annotations

import numpy as np

from ....errors import AnvilError
from .. import launch
from ..device import DArray, Device


DECODE_MAX_T = 4        # up to this many queries use the split-K decode kernel
SPLIT_MIN_KEYS = 128    # decode splits: never more than n_ctx / SPLIT_MIN_KEYS
DEC_BLOCKS_PER_SM = 2   # split so decode fills ~2 blocks per SM at full context (the sweep's best at 16k keys);
                        # one where decode_plan() takes the wide kernel
TILE_WARPS = None       # decode warps across a head's key tiles; None: attention.cu's default (a sweep sets it)
V_EARLY = True          # attention.cu DEC_V_EARLY: a tile's V loads issued with its K loads (a sweep clears it)
HEADS_PER_WARP = None   # attention.cu DEC_HPW: query heads a decode warp scores; None: its default (a sweep sets it)
MIN_CHUNK = None        # attention.cu DEC_CHUNK: keys a decode split takes at least; None: a tile a warp (a sweep sets it)
MERGE_REGS = None       # attention.cu DEC_MERGE_REGS: registers for the merge's first loads; None: its default (a sweep sets it)
WIDE = True             # the wide decode kernel where decode_plan() takes it (a sweep clears it)
MAX_REGS = None         # attention.cu DEC_MAX_REGS: a register cap for the long-cache decode kernel (a sweep sets it)
WIDE_SPLIT_KEYS = 256   # ... where a full cache leaves each split of a block an SM at most this many keys
WIDE_MERGE_REGS = 80    # ... its DEC_MERGE_REGS: 184 registers a thread at GQA 4 (ptxas, sm_90), a block an SM
PF_BQ = 32              # attention.cu: queries per prefill block
TC_TQ, TC_THREADS = 64, 128  # attention.cu: queries and threads per tensor-core prefill block
TC_HEAD_DIMS = (64, 128, 256)  # attention.cu: head sizes of the tensor-core prefill (f16 caches)
KV_STORE_THREADS = 256  # attention.cu: kv_store's block
KV_STORE_SPAN = 1024    # attention.cu: elements of a row per kv_store block (4 per thread)


def tc_keys(head_dim: int) -> int:
    """attention.cu's TK: keys per tile of the tensor-core prefill (heads of
    256 take 32: O alone is 128 registers a lane)."""
    return 64 if head_dim <= 128 else 32


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
    launch.check_f32(k, v)
    T = k.shape[0]
    kv_dim = k.size // T
    assert k_cache.shape[1] * k_cache.shape[2] == kv_dim and v_cache.shape == k_cache.shape
    assert v_cache.dtype == k_cache.dtype and pos.dtype == np.int32
    fn = launch.function(dev, "attention.cu", "kv_store", {"KV_F16": _kv_f16(k_cache)})
    dev.launch(fn, (T, launch.ceil_div(kv_dim, KV_STORE_SPAN)), (KV_STORE_THREADS,),
               [k, v, k_cache, v_cache, pos, T, kv_dim])


def decode_splits(sm_count: int, T: int, n_head_kv: int, n_ctx: int, blocks_per_sm: int | None = None) -> int:
    """Fixed split count for the decode kernel: enough blocks for
    ~blocks_per_sm (DEC_BLOCKS_PER_SM) per SM, never chunks shorter than
    SPLIT_MIN_KEYS of the whole cache. Depends on shapes only (graph-safe);
    the kernel gives short contexts fewer, shorter splits on the device."""
    want = launch.ceil_div((blocks_per_sm or DEC_BLOCKS_PER_SM) * sm_count, n_head_kv * T)
    return max(1, min(launch.ceil_div(n_ctx, SPLIT_MIN_KEYS), want))


def decode_plan(sm_count: int, T: int, n_head_kv: int, n_ctx: int, gqa: int, head_dim: int,
                kv_f16: bool) -> tuple[int, int | None]:
    """(splits, DEC_MERGE_REGS or None) of the decode kernel for a cache of
    n_ctx rows: shapes only, so graph-safe.

    The wide kernel: where a full cache split over one block an SM leaves each
    split at most WIDE_SPLIT_KEYS keys, the kernel takes a block an SM and
    the registers that frees (WIDE_MERGE_REGS for the merge's first loads,
    184 a thread at GQA 4). With them ptxas keeps more of a tile's loads in
    flight; at 128 registers it interleaves K's loads with the scores. On the
    H200 (reports/notes/decode-attention-merge-2026-12-02.md) the decode step
    of qwen3-8b at depth 64 took 2312 us against 2401, and the kernel alone
    was faster up to 4096 keys on the 8B and 30B MoE layers but 4-14% slower
    at 16384 with two blocks' grid: so long caches keep two blocks an SM and
    128 registers. Measured at f16 heads of 128, GQA 4 and 8: only there."""
    wide_shape = kv_f16 and head_dim == 128 and gqa >= 4
    if WIDE and wide_shape and MERGE_REGS is None:
        one = decode_splits(sm_count, T, n_head_kv, n_ctx, blocks_per_sm=1)
        if launch.ceil_div(n_ctx, one) <= WIDE_SPLIT_KEYS:
            return one, WIDE_MERGE_REGS
    return decode_splits(sm_count, T, n_head_kv, n_ctx), MERGE_REGS


def decode_layout(gqa: int) -> tuple[int, int]:
    """attention.cu's decode block for GQA ratio ``gqa``: (warps, query heads
    per warp). Warps spread over the heads first (one head each below GQA 4,
    two from GQA 4), then over the key tiles, up to 8 warps."""
    hpw = min(HEADS_PER_WARP, gqa) if HEADS_PER_WARP else 1 if gqa < 4 else max(2, (gqa + 7) // 8)
    nhg = launch.ceil_div(gqa, hpw)
    tile_warps = TILE_WARPS or (1 if nhg >= 8 else 8 // nhg)
    if nhg * tile_warps > 8:
        raise AnvilError(f"CUDA attention: {tile_warps} tile warps x {nhg} head warps is over 8 (GQA {gqa})")
    return nhg * tile_warps, hpw


def decode_shared(gqa: int, head_dim: int) -> int:
    """Dynamic shared memory of the decode kernel: per warp and head, O, P
    and (m, l)."""
    warps, hpw = decode_layout(gqa)
    return 4 * warps * hpw * (head_dim + 32 + 2)


def _tc(k_cache: DArray) -> bool:
    return _kv_f16(k_cache) == 1 and k_cache.shape[2] in TC_HEAD_DIMS


def path_of(T: int, k_cache: DArray) -> str:
    """The kernel ``attention`` runs for T queries over this cache: "decode"
    (split-K) up to DECODE_MAX_T, else "prefill_tc" (tensor cores) where the
    cache is f16 and the head size one of TC_HEAD_DIMS, else "prefill"."""
    return "decode" if T <= DECODE_MAX_T else "prefill_tc" if _tc(k_cache) else "prefill"


def attention(dev: Device, q: DArray, k_cache: DArray, v_cache: DArray, out: DArray, pos: DArray,
              scale: float, window: int = 0, scratch: DArray | None = None, path: str | None = None,
              k_new: DArray | None = None, v_new: DArray | None = None, outb: DArray | None = None) -> None:
    """Causal GQA attention of q [T, n_head, head_dim] (query t at position
    pos[t]) over the cache rows it can see; out [T, n_head*head_dim].

    outb (bf16 bits, uint16; the tensor-core prefill only, see path_of): out
    rounded to bf16 as f32_to_bf16 rounds it, written beside it.

    k_new, v_new [1, n_head_kv*head_dim] (decode of one query only): this
    step's K and V rows, which the kernel stores into cache row pos[0] before
    reading it (as kv_store would; one launch instead of two).

    path: None picks decode (split-K) for T <= DECODE_MAX_T, else the
    tensor-core prefill where the cache is f16 and the head size one of
    TC_HEAD_DIMS, else the fp32 prefill; "decode" / "prefill" / "prefill_tc"
    force one (each is correct for any T; "prefill_tc" needs its cache and
    head size).
    """
    launch.check_f32(q, out)
    T, n_head, head_dim = q.shape
    n_ctx, n_head_kv, hd = k_cache.shape
    assert hd == head_dim and head_dim in (64, 128, 256, 512), head_dim  # attention.cu static_assert
    assert v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype
    assert out.size == q.size and pos.dtype == np.int32 and pos.size >= T
    defines = attention_defines(k_cache, n_head)
    args_tail = [float(scale), int(window)]
    path = path or path_of(T, k_cache)
    tc = _tc(k_cache)
    assert outb is None or path == "prefill_tc", "a bf16 copy of the output is the tensor-core prefill's"
    launch.check_bf16_bits(outb, out.size)

    assert k_new is None or path == "decode", "the step's K/V rows are stored by the decode kernel only"
    if path == "prefill_tc":
        assert tc, (k_cache.dtype, head_dim)
        shared = 2 * (TC_TQ + 4 * tc_keys(head_dim)) * (head_dim + 8)  # Q, two K and two V tiles of f16 rows padded by 8
        fn = launch.function(dev, "attention.cu", "attention_prefill_tc", defines, shared)
        dev.launch(fn, (n_head, launch.ceil_div(T, TC_TQ)), (TC_THREADS,),  # the last query tiles first
                   [q, k_cache, v_cache, out, launch.null_or(outb), pos, T, n_head, n_head_kv] + args_tail,
                   shared=shared)
        return
    if path == "prefill":
        shared = 4 * (3 * PF_BQ * (head_dim + 4) + PF_BQ * (PF_BQ + 4))  # Q, K, V tiles + P
        fn = launch.function(dev, "attention.cu", "attention_prefill", defines, shared)
        dev.launch(fn, (launch.ceil_div(T, PF_BQ), n_head), (128,),
                   [q, k_cache, v_cache, out, pos, T, n_head, n_head_kv] + args_tail, shared=shared)
        return
    assert path == "decode", path
    if k_new is not None:
        launch.check_f32(k_new, v_new)
        assert T == 1 and k_new.size == v_new.size == n_head_kv * head_dim, (T, k_new.shape, v_new.shape)

    G = defines["GQA"]
    n_splits, merge_regs = decode_plan(dev.sm_count, T, n_head_kv, n_ctx, G, head_dim, bool(defines["KV_F16"]))
    if TILE_WARPS:
        defines["DEC_TILE_WARPS"] = TILE_WARPS
    if not V_EARLY:
        defines["DEC_V_EARLY"] = 0
    if HEADS_PER_WARP:
        defines["DEC_HPW"] = HEADS_PER_WARP
    if MIN_CHUNK:
        defines["DEC_CHUNK"] = MIN_CHUNK
    if merge_regs:
        defines["DEC_MERGE_REGS"] = merge_regs
    elif MAX_REGS:
        defines["DEC_MAX_REGS"] = MAX_REGS
    warps, _ = decode_layout(G)
    shared = decode_shared(G, head_dim)
    fn = launch.function(dev, "attention.cu", "attention_decode", defines, shared)
    if n_splits == 1:
        part_o = part_ml = tickets = launch.null()
    else:
        tickets = launch.counter(dev, "attention_decode", T * n_head_kv)  # the last split block merges
        n_part = T * n_head * n_splits
        nbytes = 4 * n_part * (head_dim + 2)
        buf = scratch if scratch is not None else launch.scratch(dev, "attention", nbytes)
        assert buf.nbytes >= nbytes, (buf.nbytes, nbytes)
        part_o = DArray(buf.ptr, (n_part, head_dim), np.dtype(np.float32), dev)
        part_ml = DArray(buf.ptr + 4 * n_part * head_dim, (n_part, 2), np.dtype(np.float32), dev)
    dev.launch(fn, (n_splits, n_head_kv, T), (32 * warps,),
               [q, k_cache, v_cache, out, part_o, part_ml, tickets, pos, n_head, n_head_kv] + args_tail
               + [launch.null_or(k_new), launch.null_or(v_new)], shared=shared)
