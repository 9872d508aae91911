"""Anvil's inference engine: GGUF models on a NumPy reference backend (and, on
NVIDIA GPUs, CUDA kernels compiled at run time)."""

from .errors import AnvilError, GGUFError

__version__ = "0.1.0"


def load(path, **kwargs):
    """Open a GGUF model and load its weights: ``engine.load("m.gguf").forward([1, 2, 3])``."""
    from .model import Model

    return Model(path, **kwargs)


__all__ = ["load", "AnvilError", "GGUFError", "__version__"]
