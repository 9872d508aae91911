"""The one cuBLAS call the prefill needs, through ctypes.

Prefill multiplies all prompt tokens by each weight at once, a GEMM, with
``cublasGemmEx`` accumulating in fp32. Inputs keep the weight's own
precision where it is a float type: F32 weights run in fp32 (no TF32), F16
weights with f16 activations, and BF16 and every quantised type with bf16
(quantised weights dequantised into a scratch buffer). The library comes from
NVIDIA's ``nvidia-cublas`` wheel or the CUDA toolkit, located by
``cuda.pathfinder``.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from ...errors import AnvilError
from .device import DArray

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68  # fp32 accumulation; fp32 inputs stay fp32 (no TF32 unless asked)
DATA_TYPES = {"f32": CUDA_R_32F, "f16": CUDA_R_16F, "bf16": CUDA_R_16BF}
CUBLAS_GEMM_DEFAULT = -1


@lru_cache(maxsize=None)
def _lib():
    try:
        import cuda.pathfinder

        loaded = cuda.pathfinder.load_nvidia_dynamic_lib("cublas")
        return ctypes.CDLL(loaded.abs_path)
    except Exception as e:
        raise AnvilError(f"cuBLAS not found ({e}); pip install nvidia-cublas or install the CUDA toolkit") from None


def version() -> str:
    """The loaded cuBLAS's version, "major.minor.patch" (cublasGetProperty: no handle needed)."""
    parts = []
    for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        _check(_lib().cublasGetProperty(prop, ctypes.byref(v)), "cublasGetProperty")
        parts.append(str(v.value))
    return ".".join(parts)


def _check(status: int, what: str) -> None:
    if status != 0:
        raise AnvilError(f"cuBLAS {what} failed with status {status}")


class Cublas:
    def __init__(self, stream):
        lib = _lib()
        self.handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        _check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(int(stream))), "cublasSetStream")
        lib.cublasGemmEx.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib = lib
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def set_workspace(self, buf: DArray) -> None:
        """cuBLAS's scratch, ours: a GEMM recorded into a CUDA graph (the
        prefill graph) must not allocate during the capture."""
        self.lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        _check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(buf.ptr), buf.nbytes), "cublasSetWorkspace")

    def gemm(self, x: DArray, w: DArray, y: DArray, T: int, n_in: int, n_out: int, dtype: str = "bf16",
             accumulate: bool = False) -> None:
        """``y[T, n_out] = x[T, n_in] · w[n_out, n_in]ᵀ`` (``+= `` with
        ``accumulate``: beta 1, y's old values added in the epilogue, one fp32
        rounding as a separate add): x and w both of ``dtype`` (f32, f16 or
        bf16), fp32 accumulation and output.

        cuBLAS is column-major: row-major ``y`` is column-major ``yᵀ``
        ``[n_out, T] = w · xᵀ``, i.e. op(A)=Wᵀ-as-stored (A = w, lda = n_in,
        transposed) times B = x (ldb = n_in).
        """
        t = DATA_TYPES[dtype]
        _check(self.lib.cublasGemmEx(
            self.handle, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in,
            ctypes.byref(self._one), ctypes.c_void_p(w.ptr), t, n_in,
            ctypes.c_void_p(x.ptr), t, n_in,
            ctypes.byref(self._one if accumulate else self._zero), ctypes.c_void_p(y.ptr), CUDA_R_32F, n_out,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), f"cublasGemmEx ({dtype})")
