"""The NumPy reference backend: float32 weights, float64 reductions."""

from ...gguf_file import GGUFFile
from . import ops
from .cache import KVCache


def upload(gf: GGUFFile, name: str):
    """Weights live in host memory, dequantised once to float32."""
    return gf.dequantize(name)


__all__ = ["ops", "KVCache", "upload"]
