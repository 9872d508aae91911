"""Launchers for dequant.cu: whole-matrix dequantisation to bf16 (the
prefill GEMM's weights) and the embedding lookup (get_rows), for every type
in ``launch.WEIGHT_TYPES``."""

from __future__ import annotations

import numpy as np

from ....errors import AnvilError
from ....quants import BLOCK, row_bytes
from .. import launch
from ..device import DArray, Device


def dequant_bf16(dev: Device, W: DArray, qtype, out: DArray, n_rows: int, n_in: int) -> None:
    """out[r][c] = bf16(W[r][c]) (round to nearest even) for the whole matrix;
    ``out`` is n_rows*n_in bf16 values (e.g. a uint16 DArray)."""
    qt = launch.weight_type(qtype, "dequant_bf16")
    need = n_rows * row_bytes(qt, n_in)
    if W.nbytes < need or out.nbytes < 2 * n_rows * n_in:
        raise AnvilError(f"CUDA dequant_bf16 {qt.name} [{n_rows} x {n_in}]: W has {W.nbytes} bytes "
                         f"(needs {need}), out {out.nbytes} bytes (needs {2 * n_rows * n_in})")
    launch.aligned(W, "W")
    launch.aligned(out, "out")
    n = n_rows * n_in
    fn = launch.function(dev, "dequant.cu", f"dequant_{launch.TYPE_SUFFIX[qt]}_bf16")
    dev.launch(fn, launch.grid(dev, max(n // 8, 1)), (256,), (W, out, n_rows, n_in))


def get_rows(dev: Device, W: DArray, qtype, ids: DArray, out: DArray, n_in: int, scale: float = 1.0) -> None:
    """out[i][c] = W[ids[i]][c] * scale in fp32 (embedding lookup); ids int32,
    each in range (not checked on the device)."""
    qt = launch.weight_type(qtype, "get_rows")
    n_ids = ids.size
    if out.size < n_ids * n_in or np.dtype(ids.dtype) != np.int32:
        raise AnvilError(f"CUDA get_rows {qt.name}: {n_ids} ids ({np.dtype(ids.dtype)}, need int32) "
                         f"of {n_in} columns need {n_ids * n_in} outputs, out has {out.size}")
    row_bytes(qt, n_in)  # raises if n_in is not a multiple of the block size
    launch.aligned(W, "W")
    launch.aligned(out, "out")
    per_thread = 8 if (BLOCK[qt][0] > 1 or n_in % 8 == 0) else 1
    fn = launch.function(dev, "dequant.cu", f"get_rows_{launch.TYPE_SUFFIX[qt]}")
    dev.launch(fn, launch.grid(dev, max(n_ids * n_in // per_thread, 1)), (256,), (W, ids, out, n_ids, n_in, float(scale)))
