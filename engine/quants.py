"""GGUF tensor types: block layouts and NumPy dequantisation.

Every ``_deq_*`` function below is the matching llama.cpp ``dequantize_row_*``
(``ggml/src/ggml-quants.c``; formulas in architectures.md section 7) written
over a whole batch of blocks at once. The output is bit-for-bit equal to
``gguf.quants.dequantize``: every product and sum is one fp32 operation in
the same order as there (``d1 = d*sc`` first, then ``d1*q - m1``), with no
float64 anywhere. (Order and FMA contraction turn out not to matter: an fp16
scale has an 11-bit significand and the integer factors are at most 6-8 bits,
so every product here is exact in fp32 except Q6_K's ``d*sc*q`` -- up to 25
bits, rounded once whichever way it is grouped. Each output is therefore
rounded at most once, by its final multiply or ``+ m`` / ``- m1``, in
llama.cpp's C, in gguf-py and here alike.)

A block is viewed through a packed NumPy structured dtype that spells out its
C struct (``block_q4_K`` etc. in ``ggml/src/ggml-common.h``), so field
offsets come from the layout, not from hand-counted slice indices. All
multi-byte fields are little-endian, as in GGUF files.
"""

from __future__ import annotations

import enum
import math

import numpy as np

__all__ = ["QType", "BLOCK", "SUPPORTED", "row_bytes", "dequantize", "dequantize_rows"]


class QType(enum.IntEnum):
    """GGML type ids (``ggml/include/ggml.h``); same values as gguf.GGMLQuantizationType."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


QK_K = 256  # elements per K-quant super-block

# (elements per block, bytes per block); float types are "blocks" of one element.
BLOCK: dict[QType, tuple[int, int]] = {
    QType.F32: (1, 4),
    QType.F16: (1, 2),
    QType.BF16: (1, 2),
    QType.Q4_0: (32, 18),
    QType.Q4_1: (32, 20),
    QType.Q5_0: (32, 22),
    QType.Q5_1: (32, 24),
    QType.Q8_0: (32, 34),
    QType.Q2_K: (QK_K, 84),
    QType.Q3_K: (QK_K, 110),
    QType.Q4_K: (QK_K, 144),
    QType.Q5_K: (QK_K, 176),
    QType.Q6_K: (QK_K, 210),
}

# --------------------------------------------------------------------------
# Block layouts (packed, little-endian), one per ggml-common.h struct.
# --------------------------------------------------------------------------
_F16 = "<f2"
_LAYOUT: dict[QType, np.dtype] = {
    # block_q4_0: d, then 32 4-bit quants; low nibbles are y[0..15], high y[16..31]
    QType.Q4_0: np.dtype([("d", _F16), ("qs", "u1", 16)]),
    # block_q4_1: as q4_0 plus an additive min m
    QType.Q4_1: np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", 16)]),
    # block_q5_0: qh holds the 5th bit of element j at bit j of a little-endian uint32
    QType.Q5_0: np.dtype([("d", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]),
    QType.Q5_1: np.dtype([("d", _F16), ("m", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]),
    # block_q8_0: d, then 32 signed bytes
    QType.Q8_0: np.dtype([("d", _F16), ("qs", "i1", 32)]),
    # block_q4_K: 8 sub-blocks of 32 with 6-bit scales/mins packed into 12 bytes
    QType.Q4_K: np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", 128)]),
    # block_q5_K: as q4_K plus qh[32]; bit s of qh[l] is the 5th bit of element l of sub-block s
    QType.Q5_K: np.dtype(
        [("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    ),
    # block_q6_K: low 4 bits, high 2 bits, 16 signed 8-bit sub-block scales, then d (last!)
    QType.Q6_K: np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", _F16)]),
}
for _t, _dt in _LAYOUT.items():
    assert _dt.itemsize == BLOCK[_t][1], _t

# --------------------------------------------------------------------------
# Small helpers. Everything returned is float32 (or an integer type).
# --------------------------------------------------------------------------


def _f16(x: np.ndarray) -> np.ndarray:
    """fp16 field -> fp32 (exact, denormals included), as a column for broadcasting."""
    return x.astype(np.float32)[:, None]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): all low nibbles, then all high nibbles (the 32-block order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits_le(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes read as a little-endian uint32 -> (n, 32) bits, bit j at column j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for all 8 sub-blocks: 12 packed bytes -> (n, 8) 6-bit scales and mins.

    Sub-blocks 0-3 keep their 6 bits in scales[0..7]; sub-blocks 4-7 take their
    low 4 bits from scales[8..11] and their top 2 bits from the spare top bits
    of scales[0..7].
    """
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


# --------------------------------------------------------------------------
# Per-type dequantisers: structured block array (n,) -> float32 (n, elems).
# --------------------------------------------------------------------------


def _deq_q4_0(b: np.ndarray) -> np.ndarray:
    # y = (q - 8) * d
    q = _nibbles(b["qs"]).astype(np.float32) - np.float32(8)
    return _f16(b["d"]) * q


def _deq_q4_1(b: np.ndarray) -> np.ndarray:
    # y = q * d + m   (two roundings: the product, then the sum)
    q = _nibbles(b["qs"]).astype(np.float32)
    return _f16(b["d"]) * q + _f16(b["m"])


def _q5_values(b: np.ndarray) -> np.ndarray:
    # Column j of the nibble order is element j, and element j's 5th bit is bit j of qh.
    return _nibbles(b["qs"]) | (_bits_le(b["qh"]) << 4)


def _deq_q5_0(b: np.ndarray) -> np.ndarray:
    # y = (q5 - 16) * d
    q = _q5_values(b).astype(np.float32) - np.float32(16)
    return _f16(b["d"]) * q


def _deq_q5_1(b: np.ndarray) -> np.ndarray:
    # y = q5 * d + m
    q = _q5_values(b).astype(np.float32)
    return _f16(b["d"]) * q + _f16(b["m"])


def _deq_q8_0(b: np.ndarray) -> np.ndarray:
    # y = q * d
    return b["qs"].astype(np.float32) * _f16(b["d"])


def _q4k_values(b: np.ndarray) -> np.ndarray:
    """(n, 8, 32) 4-bit values: 32-byte chunk c gives sub-block 2c (low nibbles) and 2c+1 (high)."""
    qs = b["qs"].reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: y = (d*sc) * q - (dmin*mn), with d*sc and dmin*mn each rounded to fp32 first."""
    sc, mn = _k_scales_mins(b["scales"])
    d1 = _f16(b["d"]) * sc.astype(np.float32)  # (n, 8)
    m1 = _f16(b["dmin"]) * mn.astype(np.float32)
    y = d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]
    return y.reshape(-1, QK_K)


def _deq_q4_k(b: np.ndarray) -> np.ndarray:
    return _k_affine(b, _q4k_values(b))


def _deq_q5_k(b: np.ndarray) -> np.ndarray:
    # Sub-block s takes its 5th bit from bit s of qh[l] (chunk c: bits 2c and 2c+1).
    high = (b["qh"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return _k_affine(b, _q4k_values(b) | (high << 4))


def _deq_q6_k(b: np.ndarray) -> np.ndarray:
    # Two halves of 128; each half's four 32-groups g take their low 4 bits from
    # ql[0:32]&15, ql[32:64]&15, ql[0:32]>>4, ql[32:64]>>4 (the nibble order of
    # the 64 ql bytes) and their top 2 bits from (qh >> 2g) & 3.
    ql = b["ql"].reshape(-1, 2, 64)
    qh = b["qh"].reshape(-1, 2, 1, 32)
    lo = _nibbles(ql).reshape(-1, 2, 4, 32)
    hi = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
    q = (lo | (hi << 4)).astype(np.float32) - np.float32(32)
    # y = (d * scale) * (q6 - 32); scale k covers outputs 16k..16k+15 of the block.
    ds = _f16(b["d"]) * b["scales"].astype(np.float32)  # (n, 16)
    return (ds[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1, QK_K)


_DEQUANT = {
    QType.Q4_0: _deq_q4_0,
    QType.Q4_1: _deq_q4_1,
    QType.Q5_0: _deq_q5_0,
    QType.Q5_1: _deq_q5_1,
    QType.Q8_0: _deq_q8_0,
    QType.Q4_K: _deq_q4_k,
    QType.Q5_K: _deq_q5_k,
    QType.Q6_K: _deq_q6_k,
}

SUPPORTED: frozenset[QType] = frozenset(_DEQUANT) | {QType.F32, QType.F16, QType.BF16}

# Blocks are processed this many output elements at a time, so that the integer
# and float temporaries stay a few MiB whatever the tensor size (a 262144-row
# embedding table would otherwise need several full-size temporaries).
_CHUNK_ELEMS = 1 << 20

# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def _qtype(qtype) -> QType:
    try:
        return QType(int(qtype))
    except ValueError:
        name = getattr(qtype, "name", None)
        if name is None:
            try:  # name ids we have no enum member for (IQ*, TQ*, ...) via gguf when available
                import gguf

                name = gguf.GGMLQuantizationType(int(qtype)).name
            except Exception:
                name = "unknown"
        raise ValueError(
            f"unsupported tensor type {name} (ggml type id {int(qtype)}); "
            f"supported: {_supported_names()}"
        ) from None


def _supported_names() -> str:
    return ", ".join(t.name for t in sorted(SUPPORTED))


def _check_supported(qt: QType) -> None:
    if qt not in SUPPORTED:
        raise ValueError(
            f"unsupported tensor type {qt.name} (ggml type id {int(qt)}); "
            f"supported: {_supported_names()}"
        )


def row_bytes(qtype: QType, n_cols: int) -> int:
    """Bytes of one row of ``n_cols`` elements of ``qtype``."""
    qt = _qtype(qtype)
    elems, nbytes = BLOCK[qt]
    if n_cols % elems:
        raise ValueError(
            f"{qt.name} rows must be a multiple of {elems} elements, got {n_cols} columns"
        )
    return n_cols // elems * nbytes


def _as_bytes(data) -> np.ndarray:
    """Raw bytes of ``data`` as a flat uint8 array (a view when ``data`` is contiguous)."""
    a = np.ascontiguousarray(data)
    return a.reshape(-1).view(np.uint8)


def _dequantize_bytes(raw: np.ndarray, qt: QType, n_elems: int) -> np.ndarray:
    """Flat uint8 bytes of exactly n_elems elements -> flat float32 array (new memory)."""
    if qt == QType.F32:
        return raw.view("<f4").astype(np.float32)  # copy: the result never aliases the file
    if qt == QType.F16:
        return raw.view(_F16).astype(np.float32)
    if qt == QType.BF16:
        # bf16 is the top half of an fp32: widen the bits, don't round.
        bits = raw.view("<u2").astype(np.uint32)
        bits <<= 16  # in place: no second full-size temporary
        return bits.view(np.float32)

    elems = BLOCK[qt][0]
    blocks = raw.view(_LAYOUT[qt])  # (n_blocks,) structured
    fn = _DEQUANT[qt]
    out = np.empty((len(blocks), elems), dtype=np.float32)
    step = max(1, _CHUNK_ELEMS // elems)
    # NaN/Inf scales (only in corrupt files) give NaN outputs, as in llama.cpp; no warnings.
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, len(blocks), step):
            out[start : start + step] = fn(blocks[start : start + step])
    return out.reshape(-1)


def dequantize(data: np.ndarray, qtype: QType, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantise a whole tensor to a float32 C-contiguous array of numpy ``shape``.

    ``data`` is the tensor's raw storage as gguf.GGUFReader gives it (uint8 of
    any shape for block types and BF16; the typed array or its raw bytes for
    F32/F16). ``shape`` is row-major (reversed GGUF ``ne``).
    """
    qt = _qtype(qtype)
    _check_supported(qt)
    shape = tuple(int(s) for s in shape)
    n_elems = math.prod(shape)
    elems, nbytes = BLOCK[qt]
    if shape and shape[-1] % elems:
        raise ValueError(
            f"{qt.name} tensor of shape {shape}: last dimension {shape[-1]} "
            f"is not a multiple of the block size {elems}"
        )
    if not shape and elems != 1:
        raise ValueError(f"{qt.name} tensor cannot be a scalar")
    raw = _as_bytes(data)
    expected = n_elems // elems * nbytes
    if raw.size != expected:
        raise ValueError(
            f"{qt.name} tensor of shape {shape} needs {expected} bytes "
            f"({n_elems // elems} blocks of {nbytes} bytes), got {raw.size} bytes"
        )
    return _dequantize_bytes(raw, qt, n_elems).reshape(shape)


def dequantize_rows(data: np.ndarray, qtype: QType, rows: np.ndarray, n_cols: int) -> np.ndarray:
    """Dequantise only ``rows`` of a 2-D tensor with ``n_cols`` columns -> float32 (len(rows), n_cols).

    Only the selected rows' bytes are read, so looking up a few token
    embeddings in a memory-mapped 262144-row table stays cheap.
    """
    qt = _qtype(qtype)
    _check_supported(qt)
    rb = row_bytes(qt, int(n_cols))
    raw = _as_bytes(data)
    if rb == 0 or raw.size % rb:
        raise ValueError(
            f"{qt.name} tensor of {raw.size} bytes is not a whole number of "
            f"{n_cols}-column rows ({rb} bytes each)"
        )
    n_rows = raw.size // rb
    idx = np.asarray(rows)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"rows must be a 1-D integer array, got shape {idx.shape} dtype {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"row index out of range for a tensor of {n_rows} rows")
    picked = np.ascontiguousarray(raw.reshape(n_rows, rb)[idx])  # copies only these rows
    return _dequantize_bytes(picked.reshape(-1), qt, idx.size * int(n_cols)).reshape(idx.size, int(n_cols))



def xq_group(qtype) -> int | None:
    """The group size of the int8 activations the CUDA decode GEMV uses with
    ``qtype`` weights (gemv.cuh, GEMV_XQ): 8 for Q6_K (a work unit's runs of 8
    elements), 16 for the other block types, None for float weights (fp32 x)."""
    qt = QType(int(qtype))
    if qt in (QType.F32, QType.F16, QType.BF16):
        return None
    return 8 if qt == QType.Q6_K else 16


def _x_groups(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 activations of the CUDA kernels (gemv.cuh quant16, moe_gemm.cu
    moe_quant_q8): x in groups of ``group`` consecutive elements, scale d =
    amax/127, q = rint(x/d) (x times the float32 127/amax, rounded once, ties
    to even). Returns q ([groups, group], float64: NaN where x is not finite)
    and d (float32, per group). ``x``: float32, its last axis a multiple of ``group``."""
    g = np.asarray(x, np.float32).reshape(-1, group)
    m = np.abs(g).max(axis=1)
    d = m / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(m > 0, np.float32(127) / m, np.float32(0)).astype(np.float32)
        q = np.rint(g.astype(np.float64) * inv.astype(np.float64)[:, None])
    return q, d


def quantize_x(x: np.ndarray, group: int) -> np.ndarray:
    """The int8 activations (``_x_groups``) as the float64 values d*q the kernels multiply with."""
    q, d = _x_groups(x, group)
    return (q * d.astype(np.float64)[:, None]).reshape(np.shape(x))


def quantize_x_int8(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 activations (``_x_groups``) as the kernels store them: q int8 in
    x's shape, d float32 one per group. x must be finite (the integers of a
    group holding NaN or inf are the kernel's garbage, not these)."""
    q, d = _x_groups(x, group)
    shape = np.shape(x)
    return q.astype(np.int8).reshape(shape), d.reshape(*shape[:-1], shape[-1] // group)
