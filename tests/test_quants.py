"""engine.quants must match gguf.quants.dequantize bit for bit.

Random data is fresh each run; every mismatch message states the seed, and
ANVIL_QUANTS_SEED=<int> replays it. (The seed is kept out of the test ids so
that parallel workers, each with its own seed, still collect the same tests.)
"""

from __future__ import annotations

import os
import secrets
import tracemalloc

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from engine.gguf_file import GGUFFile
from engine.quants import BLOCK, SUPPORTED, QType, dequantize, dequantize_rows, row_bytes

SEED = int(os.environ.get("ANVIL_QUANTS_SEED", secrets.randbelow(2**32)))

BLOCK_TYPES = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K]
FLOAT_TYPES = [QType.F32, QType.F16, QType.BF16]

# Byte offsets of the fp16 fields (d, m, dmin) inside each block, written out
# from the architectures.md table rather than taken from engine.quants, so a
# wrong layout there cannot hide behind the same mistake here.
F16_FIELDS = {
    QType.Q4_0: [0],
    QType.Q4_1: [0, 2],
    QType.Q5_0: [0],
    QType.Q5_1: [0, 2],
    QType.Q8_0: [0],
    QType.Q4_K: [0, 2],
    QType.Q5_K: [0, 2],
    QType.Q6_K: [208],
}


def _ids(t: QType) -> str:
    return t.name


def _reference(raw: np.ndarray, qtype: QType, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(gq.dequantize(raw, GGMLQuantizationType(int(qtype)))).reshape(shape)


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert got.flags.c_contiguous, what
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = got.view(np.uint32) != want.astype(np.float32).view(np.uint32)
    if bad.any():
        i = np.argwhere(bad)[0]
        pytest.fail(
            f"{what} (seed {SEED}): {int(bad.sum())} elements differ, first at {tuple(i)}: "
            f"{got[tuple(i)]!r} vs {want[tuple(i)]!r}"
        )


def _finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite fp16 bit patterns: both signs, all exponents but 31 (Inf/NaN).

    Exponent 0 (zero and denormals) comes up in about 1/31 of draws anyway; a
    quarter are forced to it so tiny scales are always well covered.
    """
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    exp = rng.integers(0, 31, n, dtype=np.uint16)
    exp[rng.random(n) < 0.25] = 0
    return (bits & np.uint16(0x83FF)) | (exp << np.uint16(10))


def _random_blocks(rng: np.random.Generator, qtype: QType, n_rows: int, blocks_per_row: int) -> np.ndarray:
    """(n_rows, row_bytes) random blocks whose fp16 scale fields are finite."""
    _, nbytes = BLOCK[qtype]
    raw = rng.integers(0, 256, (n_rows * blocks_per_row, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = _finite_f16_bits(rng, len(raw)).view(np.uint8).reshape(-1, 2)
    return raw.reshape(n_rows, blocks_per_row * nbytes)


def _random_floats(rng: np.random.Generator, qtype: QType, n: int) -> np.ndarray:
    """Raw bytes of n random finite values (both signs, denormals, zeros) of a float type."""
    if qtype == QType.F16:
        return _finite_f16_bits(rng, n).view(np.uint8)
    if qtype == QType.BF16:  # 8-bit exponent in bits 7..14; 255 is Inf/NaN
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        exp = rng.integers(0, 255, n, dtype=np.uint16)
        exp[rng.random(n) < 0.1] = 0
        return ((bits & np.uint16(0x807F)) | (exp << np.uint16(7))).view(np.uint8)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    exp = rng.integers(0, 255, n, dtype=np.uint32)
    exp[rng.random(n) < 0.1] = 0
    return ((bits & np.uint32(0x807FFFFF)) | (exp << np.uint32(23))).view(np.uint8)


# ---------------------------------------------------------------------------
# Type table
# ---------------------------------------------------------------------------


def test_type_table_matches_gguf():
    for t in QType:
        g = GGMLQuantizationType(int(t))
        assert g.name == t.name
        assert BLOCK[t] == GGML_QUANT_SIZES[g], t.name
    assert SUPPORTED == frozenset(BLOCK) - {QType.Q2_K, QType.Q3_K}


def test_row_bytes():
    assert row_bytes(QType.Q8_0, 640) == 20 * 34
    assert row_bytes(QType.Q4_K, 2048) == 8 * 144
    assert row_bytes(QType.F16, 7) == 14
    with pytest.raises(ValueError, match=r"Q4_K.*256.*100"):
        row_bytes(QType.Q4_K, 100)


# ---------------------------------------------------------------------------
# Random data against gguf.quants
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=_ids)
def test_random_blocks_bit_exact(qtype):
    rng = np.random.default_rng([SEED, int(qtype)])
    elems, _ = BLOCK[qtype]
    # ~500 blocks over several rows; 32-element types get more blocks per row
    n_rows, per_row = 6, (96 if elems == 32 else 80)
    raw = _random_blocks(rng, qtype, n_rows, per_row)
    shape = (n_rows, per_row * elems)
    want = _reference(raw, qtype, shape)
    _assert_bits_equal(dequantize(raw, qtype, shape), want, qtype.name)
    # flat bytes and a different (3-D) shape of the same data give the same values
    _assert_bits_equal(dequantize(raw.reshape(-1), qtype, (2, 3, per_row * elems)), want.reshape(2, 3, -1), qtype.name)


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=_ids)
def test_random_floats_bit_exact(qtype):
    rng = np.random.default_rng([SEED, int(qtype)])
    shape = (7, 1000)
    raw = _random_floats(rng, qtype, 7000)
    want = _reference(raw, qtype, (-1,)).reshape(shape)
    _assert_bits_equal(dequantize(raw, qtype, shape), want, qtype.name)
    if qtype != QType.BF16:  # GGUFReader hands F32/F16 over as typed arrays
        typed = raw.view(np.float32 if qtype == QType.F32 else np.float16).reshape(shape)
        _assert_bits_equal(dequantize(typed, qtype, shape), want, qtype.name + " typed")


def test_result_owns_its_memory():
    raw = np.arange(8, dtype=np.float32)
    out = dequantize(raw, QType.F32, (2, 4))
    out[0, 0] = 42.0
    assert raw[0] == 0.0


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=_ids)
def test_dequantize_rows_matches_dequantize(qtype):
    rng = np.random.default_rng([SEED, int(qtype), 1])
    elems, _ = BLOCK[qtype]
    n_rows, n_cols = 40, 4 * max(elems, 32)
    if qtype in FLOAT_TYPES:
        raw = _random_floats(rng, qtype, n_rows * n_cols).reshape(n_rows, -1)
    else:
        raw = _random_blocks(rng, qtype, n_rows, n_cols // elems)
    full = dequantize(raw, qtype, (n_rows, n_cols))
    rows = np.concatenate([[0, n_rows - 1, 3, 3], rng.integers(0, n_rows, 10)])  # repeats, any order
    _assert_bits_equal(dequantize_rows(raw, qtype, rows, n_cols), full[rows], qtype.name)
    assert dequantize_rows(raw, qtype, np.array([], dtype=np.int64), n_cols).shape == (0, n_cols)
    with pytest.raises(IndexError):
        dequantize_rows(raw, qtype, np.array([n_rows]), n_cols)


@pytest.mark.parametrize("qtype", BLOCK_TYPES + [QType.BF16], ids=lambda t: t.name)
def test_memory_stays_near_output_size(qtype):
    # A 262144x640 embedding table must not need several full-size temporaries:
    # peak allocation may exceed the output only by the bounded per-chunk scratch.
    elems, nbytes = BLOCK[qtype]
    n_elems = 1 << 22  # 16 MiB of float32 output
    raw = np.zeros(n_elems // elems * nbytes, dtype=np.uint8)
    tracemalloc.start()
    try:
        out = dequantize(raw, qtype, (n_elems // 1024, 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < out.nbytes + (16 << 20), f"peak {peak / 2**20:.1f} MiB for {out.nbytes / 2**20:.0f} MiB output"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_wrong_byte_count_names_sizes():
    raw = np.zeros((4, row_bytes(QType.Q4_K, 512)), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"Q4_K.*\(4, 512\).*needs 1152 bytes.*got 1151"):
        dequantize(raw.reshape(-1)[:-1], QType.Q4_K, (4, 512))
    with pytest.raises(ValueError, match=r"needs 1152 bytes.*got 1440"):
        dequantize(np.zeros(1440, np.uint8), QType.Q4_K, (4, 512))
    with pytest.raises(ValueError, match=r"F32.*needs 16 bytes.*got 12"):
        dequantize(np.zeros(3, np.float32), QType.F32, (4,))
    with pytest.raises(ValueError, match=r"Q8_0.*not a multiple.*32"):
        dequantize(np.zeros(34, np.uint8), QType.Q8_0, (2, 16))
    with pytest.raises(ValueError, match=r"Q8_0.*bytes"):
        dequantize_rows(np.zeros(35, np.uint8), QType.Q8_0, np.array([0]), 32)


def test_unsupported_type_is_named():
    with pytest.raises(ValueError, match="Q2_K"):
        dequantize(np.zeros(84, np.uint8), QType.Q2_K, (256,))
    with pytest.raises(ValueError, match="Q3_K"):
        dequantize_rows(np.zeros(110, np.uint8), QType.Q3_K, np.array([0]), 256)
    # ids with no QType member (here IQ4_NL) are named too
    with pytest.raises(ValueError, match="IQ4_NL"):
        dequantize(np.zeros(18, np.uint8), GGMLQuantizationType.IQ4_NL, (32,))
    with pytest.raises(ValueError, match="IQ4_NL"):
        dequantize(np.zeros(18, np.uint8), 20, (32,))


# ---------------------------------------------------------------------------
# Every tensor of the real models
# ---------------------------------------------------------------------------

N_EDGE = 64  # rows checked at each end, plus as many random ones, for big tensors


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_real_model_tensors_bit_exact(model, request):
    path = request.getfixturevalue(model)
    rng = np.random.default_rng([SEED, 7])
    seen = set()
    gf = GGUFFile(path)  # gguf's own reader spends seconds on the 262k-token vocabulary
    for name in gf.tensor_names():
        qtype, shape, data = gf.tensor_type(name), gf.tensor_shape(name), gf.raw(name)
        seen.add(qtype.name)
        n_cols = shape[-1]
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))
        what = f"{path}:{name} ({qtype.name}, shape {shape})"
        if n_rows <= 3 * N_EDGE:
            _assert_bits_equal(dequantize(data, qtype, shape), _reference(data, qtype, shape), what)
            continue
        # The whole of a big tensor costs seconds and adds no new code paths:
        # check both ends (padding / tail mistakes) and random rows in between.
        rows = np.concatenate(
            [np.arange(N_EDGE), np.arange(n_rows - N_EDGE, n_rows), rng.integers(N_EDGE, n_rows - N_EDGE, N_EDGE)]
        )
        by_row = data.reshape(n_rows, -1)
        want = _reference(np.ascontiguousarray(by_row[rows]), qtype, (len(rows), n_cols))
        _assert_bits_equal(dequantize_rows(data, qtype, rows, n_cols), want, what + " rows")
        _assert_bits_equal(dequantize(by_row[rows], qtype, (len(rows), n_cols)), want, what)
    assert seen <= {t.name for t in SUPPORTED}


def test_quantize_x_rounds_each_group_to_int8_of_its_own_scale():
    from engine.quants import quantize_x, xq_group

    # group 0: amax 127 -> scale 1, ties to even (2.5 -> 2, 3.5 -> 4, -0.5 -> -0);
    # group 1: all zero -> zeros; group 2: one outlier sets a scale of 1000/127
    x = np.zeros(48, np.float32)
    x[:4] = [127.0, 2.5, 3.5, -0.5]
    x[32], x[33] = 1000.0, 3.0
    got = quantize_x(x, 16)
    assert got[:4].tolist() == [127.0, 2.0, 4.0, -0.0] and not got[4:32].any()
    d = np.float64(np.float32(1000.0) / np.float32(127.0))
    assert got[32] == 127 * d and got[33] == 0.0  # 3 * 127/1000 = 0.38 -> 0
    assert np.array_equal(quantize_x(x.reshape(3, 16), 16), got.reshape(3, 16))
    assert np.abs(quantize_x(x, 8) - x).max() <= np.abs(quantize_x(x, 16) - x).max()
    assert xq_group(QType.Q6_K) == 8 and xq_group(QType.Q4_K) == 16 and xq_group(QType.BF16) is None

