"""The dense gated feed-forward network (architectures.md §0.5; llama.cpp's
``build_ffn`` with ``LLM_FFN_PAR``):

    h = act(W_gate·m) ⊙ (W_up·m),   out = W_down·h

``act`` is SiLU (SwiGLU: llama, qwen2, qwen3) or tanh-GELU (GeGLU: gemma3).
The caller applies W_down, so it can fuse the residual add into it.
"""

from __future__ import annotations

from .weights import Spec

TENSORS = {
    "ffn_norm": Spec("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    "w_gate": Spec("blk.{i}.ffn_gate.weight", lambda c: (c.n_ff, c.n_embd), group="gate_up"),
    "w_up": Spec("blk.{i}.ffn_up.weight", lambda c: (c.n_ff, c.n_embd), group="gate_up"),
    "w_down": Spec("blk.{i}.ffn_down.weight", lambda c: (c.n_embd, c.n_ff)),
}


def gated_hidden(ops, w, m, activation: str):
    """``act(W_gate·m) ⊙ (W_up·m)``: gate and up as one group (ops.glu)."""
    return ops.glu(m, w.w_gate, w.w_up, activation)
