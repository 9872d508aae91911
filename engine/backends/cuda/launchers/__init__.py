"""Kernel launchers: one module per kernel file of ``engine/kernels`` (norm,
rope, attention, elementwise, argmax, gemv, gemm, dequant, moe, moe_gemm,
deltanet), each in the convention of ``engine/backends/cuda/launch.py``. Their NumPy references are
``engine/backends/numpy/ops.py``; their tests tests/test_kernels_*.py."""

from . import argmax, attention, deltanet, dequant, elementwise, gemm, gemv, moe, moe_gemm, norm, rope

__all__ = ["argmax", "attention", "deltanet", "dequant", "elementwise", "gemm", "gemv", "moe", "moe_gemm",
           "norm", "rope"]
