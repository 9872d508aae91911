"""The Mixture-of-Experts FFN (architectures.md §0.6; llama.cpp's
``build_moe_ffn`` with softmax gating):

    p = softmax(W_router·m)                      over all experts
    E = top-k experts by p (ties to the lower id), w_j = p[E_j]
    w = w / max(Σw, 2^-14)                       (norm_topk: qwen3moe always)
    out = Σ_j w_j · W_down[E_j]·(SiLU(W_gate[E_j]·m) ⊙ (W_up[E_j]·m))   (in selection order)

Expert weights are 3-D: ``[n_expert, n_out, n_in]``, one matrix per expert.
A shared expert (qwen35moe) adds ``sigmoid(g·m) · W_down_s·(SiLU(W_gate_s·m) ⊙ (W_up_s·m))``
for every token, ``g`` a vector (``SHARED_TENSORS``, ``shared_expert``).
"""

from __future__ import annotations

from .weights import Spec

TENSORS = {
    "ffn_norm": Spec("blk.{i}.ffn_norm.weight", lambda c: (c.n_embd,)),
    "router": Spec("blk.{i}.ffn_gate_inp.weight", lambda c: (c.moe.n_expert, c.n_embd)),
    "gate_exps": Spec("blk.{i}.ffn_gate_exps.weight", lambda c: (c.moe.n_expert, c.moe.n_ff_exp, c.n_embd),
                      group="gate_up_exps"),
    "up_exps": Spec("blk.{i}.ffn_up_exps.weight", lambda c: (c.moe.n_expert, c.moe.n_ff_exp, c.n_embd),
                    group="gate_up_exps"),
    "down_exps": Spec("blk.{i}.ffn_down_exps.weight", lambda c: (c.moe.n_expert, c.n_embd, c.moe.n_ff_exp)),
}

EXPERT_TENSORS = ("gate_exps", "up_exps", "down_exps")


def moe_ffn(ops, cfg, w, m, add=None):
    """The routed experts' weighted sum for the rows of ``m`` (already normed),
    plus ``add`` (the residual, which the backend may fuse)."""
    ids, weights = ops.moe_route(m, w.router, cfg.moe.n_expert_used, cfg.moe.norm_topk)
    return ops.moe_ffn(m, ids, weights, w.gate_exps, w.up_exps, w.down_exps, add=add)


SHARED_TENSORS = {
    "shexp_gate": Spec("blk.{i}.ffn_gate_inp_shexp.weight", lambda c: (c.n_embd,)),
    "w_gate_shexp": Spec("blk.{i}.ffn_gate_shexp.weight", lambda c: (c.moe.n_ff_shexp, c.n_embd), group="shexp"),
    "w_up_shexp": Spec("blk.{i}.ffn_up_shexp.weight", lambda c: (c.moe.n_ff_shexp, c.n_embd), group="shexp"),
    "w_down_shexp": Spec("blk.{i}.ffn_down_shexp.weight", lambda c: (c.n_embd, c.moe.n_ff_shexp)),
}


def shared_expert(ops, w, m):
    """The shared expert's SwiGLU output, scaled per token by sigmoid(shexp_gate · m)."""
    s = ops.matmul(ops.glu(m, w.w_gate_shexp, w.w_up_shexp, "silu"), w.w_down_shexp)
    return ops.sigmoid_mul(s, ops.dot(m, w.shexp_gate))
