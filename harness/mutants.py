"""``harness mutants``: the gate must fail on deliberate engine bugs.

Each mutant is one named, realistic bug, switched on in a fresh process
(``python -m harness.mutants NAME ...``) by patching the engine while its
models load and run (``Mutant.on()``, undone on exit): a changed config field (the bug a wrong GGUF key or a wrong
default makes), a changed tensor as read from the file, a changed operator,
or, for a CUDA kernel, a changed kernel source compiled into a cache of its
own. The child then runs the gate on the catalog models that have the
feature the mutant breaks, cheapest and sharpest first, and stops at the
first model the gate fails (judged up to the first prompt that fails): the
mutant is *caught* there, by the checks named. A mutant no model catches is
a hole in the gate.

A later architecture adds its mutants here, with the feature predicate that
says which catalog models can show them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from unittest import mock

from engine.config import ROPE_NEOX, ROPE_NORM, ModelConfig

# ---- how a mutant changes the engine ----------------------------------------
# Each helper returns a function that yields the patches (unittest.mock
# patchers) switching the bug on; ``Mutant.on()`` enters them all and undoes
# them on exit, so a mutant never outlives its ``with`` block.


def _config(**changes: Callable[[ModelConfig], object]):
    """Change config fields as ``ModelConfig.from_gguf`` returns them."""
    def patches():
        real = ModelConfig.from_gguf.__func__

        def from_gguf(cls, gf):
            cfg = real(cls, gf)
            return dataclasses.replace(cfg, **{k: f(cfg) for k, f in changes.items()})
        yield mock.patch.object(ModelConfig, "from_gguf", classmethod(from_gguf))
    return patches


def _tensor(pattern: str, change: Callable):
    """Change the bytes of every tensor whose name matches ``pattern`` as the
    engine reads them from the file (both backends read through ``raw``)."""
    def patches():
        from engine.gguf_file import GGUFFile

        real = GGUFFile.raw

        def raw(self, name):
            data = real(self, name)
            return change(self, name, data) if re.fullmatch(pattern, name) else data
        yield mock.patch.object(GGUFFile, "raw", raw)
    return patches


def _op(numpy_name: str, numpy_op: Callable, cuda=None):
    """Replace a NumPy operator; ``cuda`` (patches) changes the CUDA backend alike."""
    def patches():
        from engine.backends.numpy import ops

        yield mock.patch.object(ops, numpy_name, numpy_op)
        if cuda is not None:
            yield from cuda()
    return patches


def _wrap(numpy_name: str, wrapper: Callable, cuda=None):
    """Replace a NumPy operator by ``wrapper(real_op, *args)``; ``cuda`` (patches) changes the CUDA backend alike."""
    def patches():
        from engine.backends.numpy import ops

        yield mock.patch.object(ops, numpy_name, functools.partial(wrapper, getattr(ops, numpy_name)))
        if cuda is not None:
            yield from cuda()
    return patches


def _cuda_op(name: str, method: Callable):
    """Replace the CUDA backend's operator ``name`` by ``method(real, self, *args)``."""
    def patches():
        from engine.backends.cuda import Ops

        real = getattr(Ops, name)

        def op(self, *args):
            return method(real, self, *args)
        yield mock.patch.object(Ops, name, op)
    return patches


def _kernel_source(file: str, old: str, new: str, *more: tuple[str, str]):
    """Compile the CUDA kernels from a copy with ``old`` replaced by ``new``
    in ``file``, and each further (old, new) of ``more`` (one bug may need
    the same change in two places), into a kernel cache of their own."""
    edits = ((old, new), *more)

    def patches():
        from engine.backends.cuda import compile as nvrtc

        yield nvrtc.edited_kernels(file, *edits)
    patches.kernel_edits = (file, edits)  # the tests check each edit still applies, once
    return patches


def _regroup_q_heads(gf, name, data):
    """Query head rows reordered so that the head in slot j is head
    (j mod g)·n_kv + j div g: each query head meets KV head h mod n_kv
    instead of h div g (g = n_head / n_head_kv, n_head_kv the layer's)."""
    import numpy as np

    arch = gf.get("general.architecture")
    h, hkv = gf.get(f"{arch}.attention.head_count"), gf.get(f"{arch}.attention.head_count_kv")
    if isinstance(hkv, list):  # per layer (gemma4)
        hkv = hkv[int(name.split(".")[1])]
    g = h // hkv
    perm = np.array([(j % g) * hkv + j // g for j in range(h)])
    return np.ascontiguousarray(data.reshape(h, -1)[perm]).reshape(data.shape)


def _gelu_erf(x):
    import numpy as np
    from scipy.special import erf

    return (np.float32(0.5) * x * (np.float32(1) + erf(x / np.float32(np.sqrt(2))))).astype(np.float32)


def _moe(c):
    return c.moe is not None


def _moe_route_sigmoid(x, router, k, norm, scale=1.0):
    """Router gating by sigmoid instead of softmax (another family's choice)."""
    import numpy as np

    from engine.backends.numpy.ops import MOE_NORM_CLAMP

    p = (1.0 / (1.0 + np.exp(-((x * np.float32(scale)) @ router.T).astype(np.float64)))).astype(np.float32)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=-1)
    return ids, (w / np.maximum(w.sum(axis=-1, keepdims=True), MOE_NORM_CLAMP) if norm else w).astype(np.float32)


def _moe_weights_reversed():
    """Each chosen expert weighted by another's routing weight: the router's
    weights handed on in reverse order of its expert ids."""
    from engine.backends.numpy import ops

    real = ops.moe_route

    def route(x, router, k, norm, scale=1.0):
        ids, w = real(x, router, k, norm, scale)
        return ids, w[:, ::-1]
    yield mock.patch.object(ops, "moe_route", route)
    yield from _kernel_source("moe.cu", "weights[lane] = finite ? my_w * wscale",
                              "weights[k - 1 - lane] = finite ? my_w * wscale")()


def _deltanet(c):
    return c.ssm is not None


def _conv_state_dropped(real, x, w, state):
    """The conv's carried inputs zeroed on every call: a decode step forgets the tokens before it."""
    state.conv = state.conv * 0
    return real(x, w, state)


def _decay_sign(real, b, a, dt_bias, ssm_a):
    beta, g = real(b, a, dt_bias, ssm_a)
    return beta, -g


def _grouped_key_heads(real, q, k, v, g, beta, state):
    """Value head h reads key head h // (H_v / H_k) (a grouped layout) instead of h mod H_k."""
    import numpy as np

    idx = np.arange(v.shape[1]) // (v.shape[1] // q.shape[1])
    return real(q[:, idx], k[:, idx], v, g, beta, state)


def _gate_halves(real, x, n_head, head_dim):
    """[all q | all gates] instead of [q | gate] per head."""
    import numpy as np

    T = x.shape[0]
    return np.ascontiguousarray(x[:, :n_head * head_dim]).reshape(T, n_head, head_dim), \
        np.ascontiguousarray(x[:, n_head * head_dim:])


def _gate_halves_cuda(real, self, x, n_head, head_dim):
    """As _gate_halves, with the CUDA backend's column copy."""
    from engine.backends.cuda import launchers

    T, n = x.shape[0], n_head * head_dim
    q, gate = self._empty((T, n_head, head_dim)), self._empty((T, n))
    for y, off in ((q, 0), (gate, n)):
        launchers.elementwise.copy_cols(self.dev, x, y, T, n, 2 * n, off)
    return q, gate


def _zero_cuda(real, self, *args):
    from engine.backends.cuda import launchers

    y = real(self, *args)
    launchers.elementwise.scale(self.dev, y, 0.0)
    return y


def _gelu_quick(x):
    import numpy as np

    with np.errstate(over="ignore"):
        return (x / (np.float32(1) + np.exp(np.float32(-1.702) * x))).astype(np.float32)


def _first_row_cuda():
    from engine.backends.cuda import Ops

    yield mock.patch.object(Ops, "last_row", lambda self, x: x.rows(0, 1))


def _drop_attn_norm_weights():
    from engine.models import weights

    real = weights.load

    def load(gf, cfg, layer_tensors, upload):
        glob, layers = real(gf, cfg, layer_tensors, upload)
        for w in layers:
            w.attn_norm = None
        return glob, layers
    yield mock.patch.object(weights, "load", load)


def _layers(**changes):
    """Change every layer's LayerShape fields (gemma4's per-layer geometry)."""
    return lambda c: tuple(dataclasses.replace(s, **changes) for s in c.layer_shapes)


def _ones(gf, name, data):
    """A 1-D F32 tensor read as all ones (a scale the engine forgot)."""
    import numpy as np

    return np.ones_like(data)


def _rotate(t: tuple) -> tuple:
    return t[1:] + t[:1]


def _global_base(c: ModelConfig) -> tuple:
    full = [b for b, w in zip(c.rope_base, c.swa_window) if not w]
    return tuple(full[0] for _ in c.rope_base)


# ---- the suite ----------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what a developer got wrong, in words
    has_feature: Callable[[ModelConfig], bool]  # the models that can show it
    patches: Callable  # yields the patches that switch the bug on
    backends: tuple[str, ...] = ("numpy", "cuda")  # the engines that have the code it breaks
    first: tuple[str, ...] = ()  # catalog models to try before the others: where a small bug shows at all

    @contextlib.contextmanager
    def on(self):
        """``with mutant.on(): ...``: the engine has the bug inside the block only."""
        with contextlib.ExitStack() as stack:
            for p in self.patches():
                stack.enter_context(p)
            yield


def _post_norms_skipped():
    """Gemma's post-norms skipped: each sublayer's raw output added to the
    residual (the fused residual kernel adds a where it adds RMSNorm(a)·w)."""
    from engine.backends.numpy import ops

    yield mock.patch.object(ops, "add_rms_norm", lambda x, a, w, eps, a_norm=None: (
        x + a, *(ops.rms_norm(x + a, wi, eps) for wi in (w if isinstance(w, tuple) else (w,)))))
    yield mock.patch.object(ops, "norm_add", lambda x, a, w, eps, scale=None, x_norm=None: (
        (x if x_norm is None else ops.rms_norm(x, x_norm, eps)) + a) * (1 if scale is None else scale))
    yield from _kernel_source("norm.cu", "return wa ? __fmul_rn(__fmul_rn(sa, v), wa[i]) : v;", "return v;")()


def _any(c):
    return True


def _swa(c):
    return any(c.swa_window)


MUTANTS = [
    Mutant("rope-base", "RoPE frequency base x1.01", _any,
           _config(rope_base=lambda c: tuple(b * 1.01 for b in c.rope_base))),
    Mutant("rope-type", "RoPE pairs swapped: NEOX (i, i+d/2) for NORM (2i, 2i+1) and back", _any,
           _config(rope_type=lambda c: ROPE_NEOX if c.rope_type == ROPE_NORM else ROPE_NORM)),
    Mutant("rope-freqs-ignored", "rope_freqs frequency divisors not applied (llama-3's; gemma4's proportional RoPE)",
           lambda c: c.has_rope_freqs, _config(has_rope_freqs=lambda c: False,
                                               layer_shapes=_layers(has_rope_freqs=False))),
    Mutant("rms-eps", "RMSNorm epsilon x100", _any, _config(rms_eps=lambda c: c.rms_eps * 100)),
    Mutant("attn-scale", "attention scale x1.05", _any, _config(attn_scale=lambda c: c.attn_scale * 1.05)),
    Mutant("softcap-half", "final logit softcap at half its value", lambda c: c.final_softcap > 0,
           _config(final_softcap=lambda c: c.final_softcap / 2)),
    Mutant("softcap-dropped", "final logit softcap not applied", lambda c: c.final_softcap > 0,
           _config(final_softcap=lambda c: 0.0)),
    Mutant("softcap-added", "a final logit softcap of 30 where the file has none", lambda c: not c.final_softcap,
           _config(final_softcap=lambda c: 30.0)),
    Mutant("swa-window-off-by-one", "sliding window one token wider", _swa,
           _config(swa_window=lambda c: tuple(w + 1 if w else 0 for w in c.swa_window))),
    Mutant("swa-off", "sliding-window layers attend to the whole context", _swa,
           _config(swa_window=lambda c: tuple(0 for _ in c.swa_window))),
    Mutant("swa-pattern-shifted", "sliding/full layer pattern shifted by one layer",
           lambda c: _swa(c) and not all(c.swa_window),
           _config(swa_window=lambda c: _rotate(c.swa_window), rope_base=lambda c: _rotate(c.rope_base),
                   rope_scale=lambda c: _rotate(c.rope_scale))),
    Mutant("swa-rope-base", "sliding-window layers rotate with the global RoPE base",
           lambda c: _swa(c) and len(set(c.rope_base)) > 1, _config(rope_base=_global_base)),
    Mutant("embd-scale-dropped", "token embedding not scaled by sqrt(n_embd)", lambda c: c.embd_scale != 1.0,
           _config(embd_scale=lambda c: 1.0)),
    Mutant("qk-norm-dropped", "per-head Q/K RMSNorm weights not loaded", lambda c: c.qk_norm,
           _config(qk_norm=lambda c: False)),
    Mutant("qkv-bias-dropped", "Q/K/V biases not added", lambda c: c.qkv_bias, _config(qkv_bias=lambda c: False)),
    Mutant("head-tied", "the output head read from token_embd on an untied model", lambda c: not c.tied_output,
           _config(tied_output=lambda c: True)),
    Mutant("gqa-mapping", "query head h attends with KV head h mod n_kv instead of h div (n_head/n_kv)",
           lambda c: c.n_head_kv < c.n_head, _tensor(r"blk\.\d+\.attn_q\.(weight|bias)", _regroup_q_heads)),
    Mutant("attn-norm-weight-ignored", "the attention RMSNorm's weight not applied", _any, _drop_attn_norm_weights),
    Mutant("last-row-first", "logits taken from the first prompt token instead of the last", _any,
           _op("last_row", lambda x: x[:1], _first_row_cuda)),
    Mutant("gelu-quick", "GELU as the sigmoid approximation x·σ(1.702x) (CLIP's quick GELU)",
           lambda c: c.activation == "gelu_tanh",
           _op("gelu_tanh", _gelu_quick, _kernel_source(
               "common.cuh", "__expf(-2.0f * a)", "__expf(-1.702f * g)"))),
    # erf and tanh GELU differ by < 5e-4, under one f16 step of llama.cpp's CPU
    # GELU table: against CPU references only just visible (gemma3-270m's twin);
    # the CUDA engine against the NumPy oracle (both fp32) sees it clearly.
    Mutant("moe-top-k-less", "one expert fewer per token than expert_used_count", _moe,
           _config(moe=lambda c: dataclasses.replace(c.moe, n_expert_used=c.moe.n_expert_used - 1))),
    Mutant("moe-no-renorm", "the chosen experts' weights not renormalised to sum 1", _moe,
           _config(moe=lambda c: dataclasses.replace(c.moe, norm_topk=False))),
    Mutant("moe-router-sigmoid", "router probabilities by sigmoid instead of softmax", _moe,
           _op("moe_route", _moe_route_sigmoid, _kernel_source(
               # sigmoid(logit) where softmax's exp was; the renormalisation cancels the sum it is then divided by
               "moe.cu", "p[i] = __expf(p[i] - mx);", "p[i] = 1.0f / (1.0f + __expf(-p[i]));"))),
    Mutant("moe-weights-reversed", "each chosen expert weighted by another's routing weight", _moe,
           _moe_weights_reversed),
    Mutant("deltanet-conv-state-dropped", "the DeltaNet conv's carried inputs zeroed on every call", _deltanet,
           _wrap("causal_conv", _conv_state_dropped, _kernel_source(
               "deltanet.cu", "if (j < K - 1) win[j] = t >= 0 ? x[(size_t)t * C + c] : state[(size_t)(t + K - 1) * C + c];",
               "if (j < K - 1) win[j] = t >= 0 ? x[(size_t)t * C + c] : 0.0f;"))),
    Mutant("deltanet-decay-sign", "DeltaNet's log-decay g with the wrong sign (the state grows)", _deltanet,
           _wrap("decay_gates", _decay_sign, _kernel_source("deltanet.cu", "g[i] = sp * ssm_a[h];",
                                                            "g[i] = -sp * ssm_a[h];"))),
    Mutant("deltanet-l2norm-dropped", "DeltaNet's q and k not L2-normalised", _deltanet,
           _op("l2_norm", lambda x, eps: x, _cuda_op("l2_norm", lambda real, self, x, eps: x))),
    Mutant("deltanet-key-heads-grouped", "value head h reads key head h // (H_v/H_k), not h mod H_k", _deltanet,
           _wrap("delta_rule", _grouped_key_heads, _kernel_source("deltanet.cu", "hk = h % H_k;",
                                                                  "hk = h / (H_v / H_k);"))),
    Mutant("attn-gate-dropped", "the gated attention's sigmoid output gate not applied", lambda c: c.attn_gate,
           _op("sigmoid_mul", lambda a, g: a, _cuda_op("sigmoid_mul", lambda real, self, a, g: a))),
    Mutant("q-gate-halves", "the Q projection read as [all q | all gates], not [q | gate] per head",
           lambda c: c.attn_gate, _wrap("split_gate", _gate_halves, _cuda_op("split_gate", _gate_halves_cuda))),
    Mutant("rope-partial-full", "every head dim rotated where the file rotates rope.dimension_count of them",
           lambda c: c.n_rot < c.head_dim, _config(n_rot=lambda c: c.head_dim)),
    Mutant("shared-expert-gate-ignored", "the shared expert's gate logit ignored (every token gated by 1/2)",
           lambda c: c.moe is not None and c.moe.n_ff_shexp > 0,
           _op("dot", lambda x, w: (x[:, :1] * 0), _cuda_op("dot", _zero_cuda))),
    Mutant("v-norm-dropped", "V not RMS-normed per head (gemma4)", lambda c: c.v_norm, _config(v_norm=lambda c: False)),
    Mutant("kq-scale-sqrt-d", "q·k scaled by 1/sqrt(head_dim) where the Q/K norms replace it (gemma4: 1)",
           lambda c: c.arch == "gemma4", _config(attn_scale=lambda c: 1.0 / c.head_dim ** 0.5)),
    Mutant("post-norms-skipped", "gemma's post-attention and post-FFN norms skipped (raw sublayer outputs added)",
           lambda c: c.arch in ("gemma3", "gemma4"), _post_norms_skipped),
    Mutant("layer-scale-ignored", "the per-layer layer_output_scale not applied (gemma4)",
           lambda c: any(s.out_scale for s in c.layer_shapes), _config(layer_shapes=_layers(out_scale=False))),
    Mutant("router-scale-ignored", "the router input's scale vector ffn_gate_inp.scale not applied (gemma4)",
           lambda c: c.arch == "gemma4" and c.moe is not None, _tensor(r"blk\.\d+\.ffn_gate_inp\.scale", _ones)),
    Mutant("expert-scale-ignored", "the per-expert output scale ffn_down_exps.scale not applied (gemma4)",
           lambda c: c.moe is not None and c.moe.expert_scale, _tensor(r"blk\.\d+\.ffn_down_exps\.scale", _ones)),
    Mutant("gelu-erf", "GELU computed with erf instead of llama.cpp's tanh approximation",
           lambda c: c.activation == "gelu_tanh",
           _op("gelu_tanh", _gelu_erf, _kernel_source(
               "common.cuh", "g / (1.0f + __expf(-2.0f * a))", "0.5f * g * (1.0f + erff(g * 0.70710678f))")),
           # the two differ by at most 4.7e-4 (at x = -2.7): the tiny models never show it (22 s of passing
           # runs on four of them), gemma3-270m does (its twin set, fp32)
           first=("gemma3-270m",)),
]
MUTANTS += [
    # the CUDA decode GEMVs' int8 activations (gemv.cuh, GEMV_XQ): code the NumPy engine does not have
    Mutant("xq-min-sums-swapped", "int8-activation GEMV: a K-quant sub-block's min correction taken with the "
           "other half's sum of x (Q4_K, Q5_K)", _any,
           _kernel_source("gemv.cuh", "const float mlo = i2f((int)(mn & 0xFFu) * lo.s), mhi = i2f((int)(mn >> 8) * hi.s);",
                          "const float mlo = i2f((int)(mn & 0xFFu) * hi.s), mhi = i2f((int)(mn >> 8) * lo.s);"),
           backends=("cuda",)),
    Mutant("xq-q6k-offset-dropped", "int8-activation GEMV: Q6_K's -32 offset left out of the integer sums", _any,
           _kernel_source("gemv.cuh", "xs.s[g] = 32 * __dp4a(", "xs.s[g] = 0 * __dp4a("), backends=("cuda",)),
    # the decode fusions (reports/notes/fusions-2026-12-01.md): code the NumPy engine does not have
    Mutant("glu-up-row-shifted", "GLU GEMV: each gate row paired with the previous row's up projection", _any,
           _kernel_source("gemv.cuh", "(r < H ? 0 : n_out)", "(r < H ? 0 : n_out - 1)"), backends=("cuda",)),
    Mutant("bulk-glu-up-row-shifted", "bulk-copy GLU GEMV (matrices of 4 MB and more): each gate row paired "
           "with the previous row's up projection", _any,
           _kernel_source("gemv.cuh", "(GLU && p ? n_out : 0)", "(GLU && p ? n_out - 1 : 0)"), backends=("cuda",),
           # the tiny models' matrices are under the bulk kernel's 4 MB: a real shape shows it
           first=("qwen3-8b",)),
    # the llama family's FFN norm, folded into the decode gate/up GEMV (Folded, gemv.cuh GEMV_NORM)
    Mutant("ffn-norm-fold-weight-dropped", "decode gate/up GEMV reading x through the folded FFN norm: the "
           "norm's weight not applied (x/rms only)", lambda c: c.arch in ("llama", "qwen2", "qwen3"),
           _kernel_source("gemv.cuh", "return make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);",
                          "return make_float4(v.x, v.y, v.z, v.w);"), backends=("cuda",)),
    Mutant("attn-merge-first-split", "split decode attention: the last block's merge takes only the first "
           "split's values (the later splits' dropped, their softmax mass kept)", _any,
           _kernel_source("attention.cu", "e_s[h * MERGE_KEEP + u] = e;", "e_s[h * MERGE_KEEP + u] = u ? 0.0f : e;"),
           backends=("cuda",)),
    Mutant("decode-feed-position-stuck", "graph decode's argmax feeding the step back: the token written "
           "but the position not moved on (each step overwrites the last cache row)", _any,
           _kernel_source("argmax.cu", "*pos += 1;", "*pos += 0;"), backends=("cuda",)),
    Mutant("attn-store-head0-key", "decode attention storing the step's K/V rows: every KV head stores "
           "head 0's key", _any,
           _kernel_source("attention.cu", "to_kv(k_new[g * D + i])", "to_kv(k_new[i])"), backends=("cuda",)),
    Mutant("deq-q4k-scale-nibble-swapped", "Q4_K dequantised word by word (prefill's bf16 weights, embedding "
           "rows): sub-blocks 4-7 take their min's low bits as their scale's", _any,
           _kernel_source("quants.cuh", "(b2 & 0xF) | ((b0 >> 6) << 4)", "(b2 >> 4) | ((b0 >> 6) << 4)"),
           backends=("cuda",)),
    Mutant("attn-prefill-tile-unmasked", "tensor-core prefill attention: a key tile that crosses the causal "
           "edge taken as whole (later keys seen by earlier queries)", _any,
           _kernel_source("attention.cu", "kb + TK - 1 <= wq_lo &&", "kb <= wq_lo &&"), backends=("cuda",)),
    Mutant("attn-merge-few-last-split", "split decode attention at a short context (a few splits, merged in "
           "one round trip): the last split's keys, the newest, dropped", _any,
           _kernel_source("attention.cu", "if (u < n_active) {", "if (u < n_active - 1) {"), backends=("cuda",),
           # the tiny models (GQA 2: splits of at least 64 keys) decode their short prompts in one split and
           # the long one in many; qwen3-8b (GQA 4: 32) has two splits in its short prompts' last steps
           first=("qwen3-8b",)),
    # a GEMV of the same input as the launch before it runs beside it (gemv.cuh GEMV_LATE_WAIT): only there
    Mutant("late-wait-everywhere", "decode GEMVs: every GEMV reads its input before the kernel that writes it "
           "has ended (the late wait of a projection beside another of its input, taken everywhere)", _any,
           _kernel_source("gemv.cuh", "#define GEMV_LATE_WAIT 0", "#define GEMV_LATE_WAIT 1"), backends=("cuda",)),
    # ...and V's GEMV there forms the Q/K heads after its wait (gemv.cu GEMV_HEADS), a warp a head
    Mutant("heads-in-v-keys-unformed", "decode: the V GEMV that forms the Q/K heads after its wait (in place of "
           "their own launch) forms the queries' heads only, the keys left unnormed and unrotated", _any,
           _kernel_source("gemv.cu", "if (h < n_head + n_head_kv) qk_head", "if (h < n_head) qk_head"),
           backends=("cuda",)),
    # a bulk GEMV's ring stage split around x's loads (launchers/gemv.py PRE_STAGES, gemv.cuh GEMV_PRE_HALVES):
    # half of it requested before the wait, half after
    Mutant("bulk-split-stage-half-refetched", "bulk-copy GEMV whose ring stage is requested in two halves around "
           "its input's loads (PRE_STAGES): the second half copied from the first half's weights", _any,
           _kernel_source("gemv.cuh", "bulk_copy(part + cut, a0 + cut, n - cut, bar);",
                          "bulk_copy(part + cut, a0, n - cut, bar);"), backends=("cuda",),
           # only a bulk GEMV of two or more stages splits one (the tiny models' matrices are under
           # BULK_MIN_BYTES): qwen3-8b's down projections and output head do
           first=("qwen3-8b",)),
    Mutant("queued-history-shifted", "queued greedy steps (the decode graph's argmax keeping each answer for the "
           "host to read once): the answer kept a row late", _any,
           _kernel_source("argmax.cu", "history[*pos] = a;", "history[*pos + 1] = a;"), backends=("cuda",)),
]

# Precision-class mutants: the CUDA engine rounds on purpose (int8 activations like q8_1, f16 KV), and a
# rounding one step coarser, or a sum a little off, is the bug a fast kernel invites. Each is small next to
# a logic bug: whether the gate sees it is what their runs measure.
# attn-merge-deep-last-split bites from this position on (see there): below the decode steps of the
# ops check's deep pass (harness/anchored.py DEEP_PROMPT_TOKENS on; tests/test_anchored_deep.py holds it so)
DEEP_POSITION = 2048
MUTANTS += [
    # each lane keeps its running sum of its units' partial dots (gemv.cuh dot_staged, and the bulk-copy
    # kernel's loop) as a __half: a float row's units are 4-8 elements, so the F32 files round most often,
    # and their gates are 2 x the fp32 budget
    Mutant("gemv-acc-f16", "decode GEMVs accumulating in f16: each lane's running sum rounded to __half "
           "after every unit it adds", _any,
           _kernel_source("gemv.cuh", "acc[r] += Q::dot(buf + r * Q::SPAN, off + boff, sub, xs);",
                          "acc[r] = __half2float(__float2half_rn(acc[r] + Q::dot(buf + r * Q::SPAN, off + boff, "
                          "sub, xs)));",
                          ("acc[r] += Q::dot(st + pp * part, off + boff, sub, xs[p]);",
                           "acc[r] = __half2float(__float2half_rn(acc[r] + Q::dot(st + pp * part, off + boff, sub, "
                           "xs[p])));")),
           backends=("cuda",), first=("tiny-qwen3-f32",)),
    # q8_1 keeps its scale as f16 (11 significant bits); this keeps 8, as a (d, sum) pair packed in
    # __nv_bfloat162 would. The integers still come from the exact 127/amax: only the scale is off, by up
    # to 2^-9 of itself, per group of 16 (8 for Q6_K). Quantised files only (the F32 ones take fp32 x)
    Mutant("xq-scale-bf16", "int8-activation GEMV: each group's scale amax/127 rounded to bf16 before it "
           "multiplies the integer sums (q8_1 rounds it to f16)", _any,
           _kernel_source("gemv.cuh", "o.d = __fdiv_rn(m, 127.0f);",
                          "o.d = __bfloat162float(__float2bfloat16_rn(__fdiv_rn(m, 127.0f)));",
                          ("xs.g[g].d = __fdiv_rn(m, 127.0f);",
                           "xs.g[g].d = __bfloat162float(__float2bfloat16_rn(__fdiv_rn(m, 127.0f)));")),
           backends=("cuda",)),
    # the sum of a group's int8s (quant16's s) is the K-quants' min term and the legacy quants' offset
    # (Q4_0, Q5_0) and min (Q4_1, Q5_1); Q8_0 and Q6_K do not use it. tiny-llama (Q4_0, Q5_1) is tried first
    Mutant("xq-block-sum-word-dropped", "int8-activation GEMV: a group's sum of its 16 int8s (the min and "
           "offset terms) taken over its first 12, the last word left out", _any,
           _kernel_source("gemv.cuh", "o.s = __dp4a((int)o.q[i], 0x01010101, o.s);",
                          "o.s = i < 3 ? __dp4a((int)o.q[i], 0x01010101, o.s) : o.s;"),
           backends=("cuda",)),
    # the cpu, twin and oracle sets run F32 KV as their references do; the f16 KV cache runs in the
    # ops check (with the oracle set: its KV store is compared) and against the gpu sets (llama.cpp with
    # CUDA, F16 KV), of which smollm2-135m's is the smallest
    Mutant("kv-bf16", "KV cache values rounded to bf16 (8 significant bits) before their f16 store", _any,
           _kernel_source("attention.cu", "return __float2half_rn(x);",
                          "return __float2half_rn(__bfloat162float(__float2bfloat16_rn(x)));"),
           backends=("cuda",), first=("smollm2-135m",)),
    # No reference prompt but the deep set's (qwen3-8b's, ~4.8k tokens: catalog.deep_prompts) reaches
    # position 2048 (the default long prompt is 1614-1655 tokens, 1687 positions with its decode steps),
    # and on a random-weight 8B model the dropped keys move the logits less than llama.cpp's own noise.
    # The ops check's deep pass (harness/anchored.py check_deep) decodes at 2108-2111 on every model of
    # a CUDA run's oracle sets, where the last split holds 61 or more of the ~2110 keys (its NumPy
    # analogue on tiny-llama: attention off by 1.7-3.9%, against a budget of 1e-4; tests/test_anchored_deep.py).
    # So no model comes first: the first oracle pair a run tries (tiny-qwen3-f32's, fifth) should catch
    # it (not yet run on the H200)
    Mutant("attn-merge-deep-last-split", f"split decode attention from position {DEEP_POSITION} on: the "
           "merge leaves out the last split (the newest keys)", _any,
           _kernel_source("attention.cu", "(size_t)g * G, n_splits, n_active);",
                          f"(size_t)g * G, n_splits, qp >= {DEEP_POSITION} ? n_active - 1 : n_active);"),
           backends=("cuda",)),
    # chunks of DR_C = 64 tokens, the next one starting at the last one's final token: that token updates
    # the state twice. Only a chunked prefill of 64 tokens or more (the long prompt) has a boundary
    Mutant("deltanet-chunk-boundary-off-by-one", "chunked DeltaNet prefill: each chunk of 64 starts one "
           "token early, so the token at every chunk boundary enters the state twice", _deltanet,
           _kernel_source("deltanet.cu", "for (int t0 = 0; t0 < T; t0 += DR_C) {",
                          "for (int t0 = 0; t0 < T; t0 += DR_C - 1) {"),
           backends=("cuda",)),
]
# The int8 grouped expert GEMM's own bugs (moe_gemm.cu moe_gemm_i8). They join the suite while the
# engine runs that GEMM (launchers/moe_gemm.py INT8): with it off, no model could show them
INT8_GEMM_MUTANTS = [
    Mutant("moe-i8-min-dropped", "int8 grouped expert GEMM: the Q4_K/Q5_K min term (dmin·m times the "
           "activations' group sum) not subtracted", _moe,
           _kernel_source("moe_gemm.cu", "if (Q::MIN && u == 0) o = fmaf(-m, sx[nt][j], o);", "(void)sx;"),
           backends=("cuda",)),
    Mutant("moe-i8-q6k-one-scale", "int8 grouped expert GEMM: a Q6_K group's second 16 columns scaled by its "
           "first 16's scale", _moe,
           _kernel_source("moe_gemm.cu", "const float sw = Ws[f * S::SL + 2 * c + u];",
                          "const float sw = Ws[f * S::SL + 2 * c];"),
           backends=("cuda",)),
    Mutant("moe-i8-x-scale-neighbour", "int8 grouped expert GEMM: each group's products scaled by the "
           "neighbouring group's activation scale", _moe,
           _kernel_source("moe_gemm.cu", "dx[nt][j] = Xd[i * S::XL + c];", "dx[nt][j] = Xd[i * S::XL + (c ^ 1)];"),
           backends=("cuda",)),
]

# The prefill GEMM from the quantised blocks (gemm.cu): in the suite while the engine runs it
# (launchers/gemm.py WGMMA)
WGMMA_GEMM_MUTANTS = [
    Mutant("gemm-wgmma-weights-truncated", "prefill GEMM from the quantised blocks: the weights rounded to bf16 "
           "toward zero, not to nearest", _any,
           _kernel_source("gemm.cu", "o[i] = __floats2bfloat162_rn(v[8 * q + 2 * i], v[8 * q + 2 * i + 1]);",
                          "o[i] = __halves2bfloat162(__float2bfloat16_rz(v[8 * q + 2 * i]), "
                          "__float2bfloat16_rz(v[8 * q + 2 * i + 1]));"),
           backends=("cuda",)),
    Mutant("gemm-wgmma-last-k16-dropped", "prefill GEMM from the quantised blocks: the last 16 columns of each "
           "64-column sub-step not multiplied", _any,
           _kernel_source("gemm.cu", "for (int kk = 0; kk < BK / 16; kk++)",
                          "for (int kk = 0; kk < BK / 16 - 1; kk++)"),
           backends=("cuda",)),
    Mutant("gemm-wgmma-first-tile-rows", "prefill GEMM from the quantised blocks: every 128-token tile reads "
           "the first tile's tokens (shows past 128 tokens only)", _any,
           _kernel_source("gemm.cu", "W, x + (size_t)t0 * K, min(BM, T - t0)", "W, x, min(BM, T - t0)"),
           backends=("cuda",)),
]
# ... and its grouped form for the MoE projections (launchers/gemm.py WGMMA_GROUPED)
WGMMA_GROUPED_MUTANTS = [
    Mutant("gemm-wgmma-grouped-first-rows", "grouped expert GEMM from the quantised blocks: an expert's rows past "
           "its first 128 read its first 128 again (shows where an expert gets more than 128 tokens)", _moe,
           _kernel_source("gemm.cu", "xs + (size_t)r0 * K, min(BM, end - r0)", "xs + (size_t)offsets[e] * K, "
                          "min(BM, end - r0)"),
           backends=("cuda",)),
]


def _switched_kernels() -> list:
    """The mutants of the kernels that are off in the tree, for those switched on."""
    from engine.backends.cuda.launchers import gemm, moe_gemm

    return ((INT8_GEMM_MUTANTS if moe_gemm.INT8 else []) + (WGMMA_GEMM_MUTANTS if gemm.WGMMA else [])
            + (WGMMA_GROUPED_MUTANTS if gemm.WGMMA_GROUPED else []))


MUTANTS += _switched_kernels()
BY_NAME = {m.name: m for m in MUTANTS}


def for_backend(backend: str) -> list[Mutant]:
    """The suite of one engine: the mutants whose code it has."""
    return [m for m in MUTANTS if backend in m.backends]


# ---- running them ---------------------------------------------------------------


def candidates(cat, mutant: Mutant, backend: str, tiers: list[str], models=None) -> list[tuple[str, str]]:
    """(model, reference set) pairs the gate runs that have the mutant's
    feature, the mutant's ``first`` models, then sharpest and cheapest first:
    fp32 comparisons (F32 models, F32 twins) catch small bugs that hide under
    the quantised sets' noise."""
    from . import catalog, gates, validate

    pairs, _ = validate.plan(cat, backend, tiers)
    out = []
    for e, s in pairs:
        if models and e.name not in models:
            continue
        path = catalog.model_path(e.name, catalog=cat, progress=False)
        if mutant.has_feature(_config_of(str(path))):
            out.append((e.name not in mutant.first, not gates.is_fp32(e, s), path.stat().st_size, e.name, s))
    return [(name, s) for *_, name, s in sorted(out)]


@functools.lru_cache(maxsize=None)
def _config_of(path: str) -> ModelConfig:
    from engine.gguf_file import GGUFFile

    return ModelConfig.from_gguf(GGUFFile(path))


def run_one(mutant: Mutant, backend: str, pairs: list[tuple[str, str]]) -> dict:
    """In this process: switch the mutant on, gate each pair until one fails.
    A pair is judged up to its first failing prompt: the mutant is caught
    there, and ``checks`` are the checks that failed on that prompt."""
    from . import catalog, refs, validate

    cat = catalog.load()
    tried = []
    with mutant.on():  # a model's sets share its (mutated) load and free runs
        loaded = validate.Loaded(cat, backend, quiet=True)
        for name, s in pairs:
            e = catalog.entry(name, cat)
            r = validate.run(cat, e, refs.for_entry(e, s), s, backend, first_failure=True, loaded=loaded)
            tried.append(f"{name} ({s})")
            if not r.passed:
                return {"mutant": mutant.name, "caught": True, "model": name, "references": s,
                        "checks": sorted({f.check for f in r.failures}),
                        "first": validate.format_failures([r]).splitlines()[0], "tried": tried}
    return {"mutant": mutant.name, "caught": False, "tried": tried}


# BLAS thread pools in each child when several children share the CPUs
_ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def default_jobs(backend: str) -> int:
    """Children at a time: one per CPU for the NumPy engine (each is one
    model at a time on one core); one for CUDA (one GPU, whose kernel
    compiles and runs the children would contend for)."""
    return 1 if backend == "cuda" else max(1, os.cpu_count() or 1)


CONTROL = "control"  # the child's name for the build as it is, no mutant on


def run_control(backend: str, pairs: list[tuple[str, str]]) -> dict:
    """In this process: the build as it is on every pair; the pairs it fails.
    A mutant "caught" on a pair the build itself fails measures nothing."""
    from . import catalog, refs, validate

    cat = catalog.load()
    loaded = validate.Loaded(cat, backend, quiet=True)
    failed = []
    for name, s in pairs:
        e = catalog.entry(name, cat)
        r = validate.run(cat, e, refs.for_entry(e, s), s, backend, first_failure=True, loaded=loaded)
        if not r.passed:
            failed.append({"model": name, "references": s, "first": validate.format_failures([r]).splitlines()[0]})
    return {"mutant": CONTROL, "failed": failed}


def _child(name: str, backend: str, pairs, env) -> dict:
    arg = ",".join(f"{n}:{s}" for n, s in pairs)
    p = subprocess.run([sys.executable, "-m", "harness.mutants", name, "--backend", backend, "--pairs", arg],
                       capture_output=True, text=True, env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        how = (f"killed by signal {-p.returncode}" if p.returncode < 0 else
               f"failed (exit {p.returncode}): {(p.stderr.strip().splitlines() or ['no output'])[-1]}")
        return {"mutant": name, "caught": False, "tried": [], "error": f"the mutant's process {how}"}


def control(cat, names: list[str], backend: str, tiers: list[str], models=None, jobs: int = 1,
            spread=None) -> list[dict]:
    """The build as it is on every pair the mutants would try, a child per
    model (``jobs`` at a time, or a fresh worker each over ``spread``'s GPUs:
    harness/distribute.py): the pairs it fails, each with its first failure."""
    env = os.environ if jobs <= 1 else {**_ONE_THREAD, **os.environ}
    pairs = list(dict.fromkeys(p for n in names for p in candidates(cat, BY_NAME[n], backend, tiers, models)))
    by_model = {}
    for m, s in pairs:
        by_model.setdefault(m, []).append((m, s))
    if spread is not None:
        from .distribute import mutant_rows

        rows = mutant_rows(spread, [(CONTROL, ps) for ps in by_model.values()], backend)
    else:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            rows = list(pool.map(lambda ps: _child(CONTROL, backend, ps, env), by_model.values()))
    out = []
    for ps, row in zip(by_model.values(), rows):
        if "error" in row:  # a model the build cannot even run: none of its pairs can judge a mutant
            out += [{"model": m, "references": s, "first": row["error"]} for m, s in ps]
        else:
            out += row["failed"]
    return out


def run_suite(cat, names: list[str], backend: str, tiers: list[str], models=None, progress=None,
              jobs: int = 1, exclude=(), spread=None) -> list[dict]:
    """One child process per mutant, ``jobs`` at a time (or a fresh worker
    each over ``spread``'s GPUs: harness/distribute.py); rows in the order of
    ``names``. ``exclude``: (model, set) pairs not to try (the build fails them)."""
    env = os.environ if jobs <= 1 else {**_ONE_THREAD, **os.environ}
    exclude = set(exclude)

    def unjudged(name: str) -> dict:
        why = "every catalog model with this feature fails without it" if exclude else \
            "no catalog model has this feature"
        return {"mutant": name, "caught": False, "tried": [], "error": why}

    def one(name: str) -> dict:
        m = BY_NAME[name]
        pairs = [p for p in candidates(cat, m, backend, tiers, models) if p not in exclude]
        t0 = time.perf_counter()
        row = _child(name, backend, pairs, env) if pairs else unjudged(name)
        row.update(bug=m.bug, seconds=round(time.perf_counter() - t0, 1))
        if progress:
            progress(row)
        return row

    if spread is not None:
        from .distribute import mutant_rows

        plan = {n: [p for p in candidates(cat, BY_NAME[n], backend, tiers, models) if p not in exclude]
                for n in names}
        ran = iter(mutant_rows(spread, [(n, ps) for n, ps in plan.items() if ps], backend, progress,
                               extra=lambda n: {"bug": BY_NAME[n].bug}))
        rows = [next(ran) if plan[n] else {**unjudged(n), "bug": BY_NAME[n].bug, "seconds": 0.0} for n in names]
        for row in rows:
            if progress and not plan[row["mutant"]]:
                progress(row)
        return rows
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # threads only wait on the children
        return list(pool.map(one, names))


def format_rows(rows: list[dict]) -> str:
    from .table import markdown

    table = []
    for r in rows:
        if r["caught"]:
            where, how = f"{r['model']} ({r['references']})", ", ".join(r["checks"])
        else:
            where, how = (("NOT JUDGED", r["error"]) if r.get("error")
                          else ("NOT CAUGHT", f"passed on {', '.join(r['tried'])}"))
        table.append([r["mutant"], r["bug"], where, how, f"{r['seconds']:.0f} s"])
    return markdown(["mutant", "bug", "caught by", "checks that failed", "time"], table)


def main_suite(args) -> int:
    """``harness mutants``: the suite, one child process per mutant; exit 0 only if every one is caught."""

    from engine.bench import build_hash
    from engine.errors import AnvilError

    from . import catalog

    backend = args.backend
    if backend == "auto":
        from engine.backends.cuda.device import gpu_available

        backend = "cuda" if gpu_available() else "numpy"
    tiers = [args.tier] if args.tier else (["cpu", "gpu"] if backend == "cuda" else ["cpu"])
    names = args.mutant or [m.name for m in for_backend(backend)]
    unknown = sorted(set(names) - set(BY_NAME))
    if unknown:
        raise AnvilError(f"unknown mutant(s) {', '.join(unknown)}; the suite has: {', '.join(BY_NAME)}")
    other = [n for n in names if backend not in BY_NAME[n].backends]
    if other:
        raise AnvilError(f"mutant(s) {', '.join(other)}: only for the {'/'.join(BY_NAME[other[0]].backends)} engine, "
                         f"not {backend} (--backend)")

    def progress(row):
        verdict = (f"caught by {row['model']} ({row['references']})" if row["caught"]
                   else f"NOT JUDGED: {row['error']}" if row.get("error") else "NOT CAUGHT")
        print(f"{row['mutant']}: {verdict} ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)

    cat = catalog.load()
    for name in args.model or []:
        catalog.entry(name, cat)  # an unknown name is an error, not an empty suite
    jobs = args.jobs or default_jobs(backend)
    spread = {}
    if getattr(args, "gpus", None) or getattr(args, "ray", None):  # a fresh worker per mutant over the GPUs
        from .distribute import Spread

        spread = {"spread": Spread(args, num_gpus=int(backend == "cuda"))}
    build = build_hash()  # the sources the children load
    # the build itself first: a pair it fails cannot tell a mutant from it
    failed = control(cat, names, backend, tiers, models=args.model, jobs=jobs, **spread)
    for f in failed:
        print(f"control: the build itself fails {f['model']} ({f['references']}), not tried: {f['first']}",
              file=sys.stderr)
    rows = run_suite(cat, names, backend, tiers, models=args.model, progress=progress, jobs=jobs,
                     exclude=[(f["model"], f["references"]) for f in failed], **spread)
    print(format_rows(rows))
    rec = sitting(backend, tiers, args.model, rows, build)
    rec["control_failed"] = failed
    print(f"caught {rec['caught']} of {len(rows)} mutants")
    if rec["partial"]:
        print(f"partial: {len(rec['not_run'])} of the suite's {len(rec['suite'])} mutants not run, "
              f"{len(rec['not_judged'])} not judged")
    if args.save:
        from engine.bench import gpu_info

        from . import results as store

        rec.update(gpu_info() if backend == "cuda" else {"gpu": None})
        print(f"saved {store.save(rec, 'mutants')}", file=sys.stderr)
    return 0 if rec["caught"] == len(rows) else 1


def sitting(backend: str, tiers: list[str], models, rows: list[dict], build: str) -> dict:
    """One run of ``harness mutants`` as one record: every mutant's result on
    one build (the models it tried; where it was caught and by which checks),
    and what makes the run partial: the backend's mutants it did not run
    (``--mutant``), and those it could not judge (a child that failed, or no
    model with the feature among ``--model``). The scoreboard shows such a
    record as it is, never merged with another."""
    suite = [m.name for m in for_backend(backend)]
    ran = {r["mutant"] for r in rows}
    not_run = [n for n in suite if n not in ran]
    not_judged = [r["mutant"] for r in rows if r.get("error")]
    return {"engine": "anvil", "build": build, "backend": backend, "tiers": tiers,
            "models": sorted(models) if models else None,  # None: every catalog model the tiers have
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "caught": sum(bool(r["caught"]) for r in rows), "suite": suite, "not_run": not_run,
            "not_judged": not_judged, "partial": bool(not_run or not_judged), "mutants": rows}


def main(argv=None) -> int:
    """The child: ``python -m harness.mutants NAME --backend B --pairs model:set,...``;
    prints one JSON line."""
    p = argparse.ArgumentParser(prog="python -m harness.mutants")
    p.add_argument("name", choices=sorted(BY_NAME) + [CONTROL])
    p.add_argument("--backend", choices=["numpy", "cuda"], default="numpy")
    p.add_argument("--pairs", required=True, help="model:reference-set,... in the order to try")
    args = p.parse_args(argv)
    pairs = [tuple(x.split(":", 1)) for x in args.pairs.split(",")]
    if args.name == CONTROL:
        print(json.dumps(run_control(args.backend, pairs)))
    else:
        print(json.dumps(run_one(BY_NAME[args.name], args.backend, pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
