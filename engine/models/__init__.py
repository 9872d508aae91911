"""Model families: one module per architecture family, each owning its
architecture whole. A family module defines

- ``ARCHS``: the ``general.architecture`` values it runs;
- ``layer_tensors(cfg, il)``: the tensors of layer ``il`` ({name: weights.Spec}),
  built from the shared groups (``attention.TENSORS``, ``ffn.TENSORS``, ``moe.TENSORS``,
  ``deltanet.TENSORS``) plus its own;
- ``layer_kinds(cfg)``: each layer's kind ("attention" or "recurrent"), which
  picks the backend's state object for it (an attention layer keeps keys and
  values, a recurrent one its conv inputs and DeltaNet state);
- ``block(ops, cfg, w, il, x, positions, state)``: one layer, written as the math
  with the ops of ``ops`` (a backend's), the shared sub-blocks and the layer's state;
- ``bytes_per_token(gf, cfg)``: the weight bytes one decode step reads;
- ``llama_cpp_names(cfg)``: llama.cpp's names for the block's intermediates
  (``harness diff``).

The embedding, the final norm and the head are shared (``weights.GLOBAL``,
``engine/model.py``). To add an architecture, read ``llama.py``.
"""

from __future__ import annotations

from ..errors import AnvilError
from . import gemma3, gemma4, llama, qwen3moe, qwen35

FAMILIES = {arch: module for module in (llama, qwen3moe, gemma3, qwen35, gemma4) for arch in module.ARCHS}


def family(arch: str):
    """The family module that runs ``arch``."""
    try:
        return FAMILIES[arch]
    except KeyError:
        raise AnvilError(f"no model family runs architecture '{arch}' (families: {', '.join(FAMILIES)})") from None
