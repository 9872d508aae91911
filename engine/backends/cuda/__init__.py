"""The CUDA backend: quantised weights on the GPU, NVRTC kernels, graph decode.

Weights are uploaded in their GGUF block form and read directly by the
matrix-vector kernels (decode); prefill multiplies all prompt tokens at once
with cuBLAS: float weights as stored (F32 in fp32, F16 with f16 activations),
quantised ones dequantised to bf16 into a scratch buffer for the tensor
cores, a group of projections stored back to back at once, so no
dequantised copy of the model is kept.

Decode runs as one CUDA graph per sequence step: the token id, its position
and the KV length live in device memory, the graph's last kernel (the argmax)
advances them, and the host only reads back the chosen token. Every kernel is
launched with programmatic dependent launch on Hopper (device.py,
kernels/common.cuh): it may start while the previous one finishes, and the
matrix-vector kernels fetch their weights before waiting for their input.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ... import memory
from ...config import ModelConfig
from ...errors import AnvilError
from ...gguf_file import GGUFFile
from ...quants import QType
from . import launchers
from .device import DArray, Device, Workspace

# Prefill/decode switch: up to this many tokens the matrix-vector kernels
# read the quantised weights directly; above it, dequantise + GEMM.
GEMV_MAX_TOKENS = 1
# Decode: of one input's projections in several launches (Q4_K_M's Q/K, then its Q6_K V), each launch
# after the first runs beside the one before it (launchers/gemv.py overlap=). A test turns it off.
OVERLAP_RUNS = True
# Decode: that later launch forms the Q/K heads after its wait, where a qk_norm_rope or rope launch would
# follow (Folded). A test turns it off.
HEADS_IN_GEMV = True
# Prefill: the norms and the GLU write their output in bf16 too, beside its fp32
# values, and a GEMM reading that output takes the bf16 copy (the same bits
# f32_to_bf16 would make), with no conversion launch. A test turns it off.
PRODUCERS_WRITE_BF16 = True

# Architectures the CUDA backend does not run yet (their kernels are not yet
# validated on a GPU against the catalog): refused at load, and --backend auto
# runs them on NumPy (model.make_backend).
PENDING_ARCHS: frozenset[str] = frozenset()

CUBLAS_WORKSPACE = 32 << 20  # cuBLAS's scratch on Hopper (its own default there)
DEFAULT_WORKSPACE_MB = 256  # the least workspace: one 512-token micro-batch of an 8B shape fits
# A prompt's micro-batch on the GPU (model.py). Each micro-batch dequantises
# every weight matrix to bf16 for its GEMMs, ~6.7 ms a pass on qwen3-8b
# (reports/notes/decode-in-graph-2026-12-01.md), so a 4096-token prompt in
# 512-token pieces paid it 8 times. The cost is workspace: 12 rows of the
# widest activation a token (2.4 GB for qwen3-8b), never more than the
# context needs. At most MAX_UBATCH: a token-by-token MoE launch puts the
# tokens in grid.z (65535 at most), and element counts stay well inside int.
UBATCH = 4096
MAX_UBATCH = 16384


def workspace_bytes(cfg: ModelConfig, tokens: int) -> int:
    """One micro-batch's temporaries (``tokens`` of them): a layer's scratch is
    a few rows of its widest activation per token. 256 MB holds the 8B
    shapes' 512 tokens (FFN 14336: under 9 rows); qwen36-27b (FFN 17408) ran
    out past 273 MB (7.7 rows, its DeltaNet's chunked scratch among them). 12
    rows of the widest, at least 256 MB."""
    widest = max(cfg.n_embd, cfg.n_ff, 2 * cfg.n_head * max(s.head_dim for s in cfg.layer_shapes or [cfg]),
                 cfg.ssm.conv_dim + cfg.ssm.value_dim if cfg.ssm else 0)
    return max(DEFAULT_WORKSPACE_MB << 20, 12 * 4 * tokens * widest)


def weights_bytes(gf: GGUFFile) -> int:
    """One allocation holds all weights: the file's size bounds them (the 1-D
    tensors, dequantised to f32, are a rounding error)."""
    return gf.path.stat().st_size + (64 << 20)


@dataclass(frozen=True)
class QWeight:
    data: DArray  # raw GGUF blocks, uint8
    qtype: QType
    n_out: int
    n_in: int
    n_expert: int = 0  # a 3-D expert tensor: n_expert matrices [n_out, n_in] back to back


# Prefill graphs (Backend.prefill): from this many tokens a micro-batch is
# captured, for at most this many lengths.
GRAPH_MIN_TOKENS = 512
GRAPH_LENGTHS = 4


@dataclass
class PrefillGraph:
    """A captured prefill pass of one length: its static inputs, the graph, its logits."""
    tokens: DArray  # int32 [T]
    pos: DArray     # int32 [T]
    graph: object = None
    logits: DArray | None = None


@dataclass(frozen=True)
class Positions:
    dev: DArray  # int32 [T] on the device
    T: int


@dataclass(frozen=True)
class Rotation:
    positions: Positions
    base: float
    scale: float
    freq_div: DArray | None
    rope_type: str
    n_rot: int


@dataclass
class NewRow:
    """A cache and the one row a decode step adds to it, not yet stored:
    ``Ops.attention`` has its kernel store the row (a launch less a layer)."""
    cache: DArray
    row: DArray


class KVLayer:
    """Layer ``il``'s keys and values on the device (f16 or f32), and its RoPE."""

    def __init__(self, state: "State", il: int, n_ctx: int):
        cfg, dev = state.cfg.layer(il), state.backend.dev
        self.state, self.il = state, il
        dtype = np.float16 if state.backend.kv_f16 else np.float32
        self.k = dev.empty((n_ctx, cfg.n_head_kv, cfg.head_dim), dtype)
        self.v = dev.empty((n_ctx, cfg.n_head_kv, cfg.head_dim), dtype)

    def rope(self, positions: Positions) -> Rotation:
        il = self.il
        c = self.state.cfg.layer(il)
        divisors = self.state.rope_freqs if c.has_rope_freqs else None  # gemma4: its full layers only
        return Rotation(positions, c.rope_base[il], c.rope_scale[il], divisors, c.rope_type, c.n_rot)

    def store(self, positions: Positions, k: DArray, v: DArray):
        if k.shape[0] == 1:  # decode: the attention kernel stores the row (Ops.attention)
            return NewRow(self.k, k), NewRow(self.v, v)
        launchers.attention.kv_store(self.state.backend.dev, k, v, self.k, self.v, positions.dev)
        return self.k, self.v

    def reset(self) -> None:
        """Zeroed with memsets on the stream (capturable in a graph)."""
        dev = self.state.backend.dev
        dev.fill(self.k, 0)
        dev.fill(self.v, 0)


class RecurrentLayer:
    """A Gated DeltaNet layer's carried state on the device (fp32, as
    llama.cpp keeps it): the last d_conv-1 inputs of its causal conv, ``conv
    [d_conv-1, conv_dim]``, and the delta-rule state ``s [H_v, S_k, S_v]``;
    Ops.causal_conv and Ops.delta_rule advance them in place."""

    def __init__(self, state: "State", il: int, n_ctx: int):
        c, dev = state.cfg.ssm, state.backend.dev
        self.state = state
        self.conv = dev.empty((c.d_conv - 1, c.conv_dim))
        self.s = dev.empty((c.n_v_heads, c.head_k, c.head_v))
        self.reset()

    def reset(self) -> None:
        """Zeroed with memsets on the stream (capturable in a graph)."""
        dev = self.state.backend.dev
        dev.fill(self.conv, 0)
        dev.fill(self.s, 0)


LAYER_KINDS = {"attention": KVLayer, "recurrent": RecurrentLayer}


def _arrays(values):
    for v in values:
        if isinstance(v, DArray):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _arrays(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):  # Positions, NewRow, Rotation, QWeight
            yield from _arrays(getattr(v, f.name) for f in dataclasses.fields(v))


def _overlap(a: DArray, b: DArray) -> bool:
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


@dataclass
class HeldGemv:
    """A decode GEMV that ``Ops._matmuls`` allocated the output of but did not
    launch (``hold``): ``Ops.launch_held`` launches it, with the heads to form
    or without."""
    x: DArray
    w: QWeight
    bias: DArray | None
    y: DArray
    norm: tuple | None


class Folded:
    """The operators, with two decode folds the model code does not see (it
    stays the math; prefill, more than one row, is unchanged). At most one
    fold is pending at a time; any other operator settles it first.

    **A norm into gate/up**: a one-row weighted RMSNorm is folded into the
    gate/up GEMV that reads it (launchers/gemv.py norm=): the FFN input norm
    where the model forms it with ``rms_norm`` (the llama family, whose Wo
    GEMV adds the residual). Inside the decode graph that norm sat between
    the O projection and gate/up, and gate/up could not hide it (190 us a
    step on qwen3-8b, reports/notes/decode-in-graph-2026-12-01.md); the
    attention input norm before the QKV GEMV cost nothing there (folding it
    into QKV as well, the step was 0.979x), so only ``glu`` folds.
    ``rms_norm`` of one row records the norm instead of launching it and
    hands out its output array; ``glu`` given that very array reads x
    through the norm instead. Settled: if the operator reads the output, or
    no GEMV took the norm, the norm is launched then (x is as it was:
    nothing ran in between but GEMVs); otherwise it is dropped, and an
    operator that later reads the dropped output raises (there is nothing in
    it).

    **The Q/K heads into V's GEMV**: ``matmuls`` of one row whose last
    launch runs beside the one before it (OVERLAP_RUNS: Q4_K_M's Q6_K V
    after the Q/K GEMV) holds that launch back. If ``qk_norm_rope`` or
    ``rope`` of two arrays it does not write comes next, the held GEMV forms
    those heads after its late wait (gemv.cu GEMV_HEADS): one launch a layer
    less (reports/notes/decode-heads-in-v-2026-12-04.md). Settled: it is
    launched as it was."""

    def __init__(self, ops: "Ops"):
        self._ops, self._pending, self._dropped = ops, None, []

    @property
    def unfolded(self) -> "Ops":
        """The operators themselves, every norm and head launched (harness diff traces these)."""
        return self._ops

    def rms_norm(self, x: DArray, w: DArray | None, eps: float) -> DArray:
        self._settle((x, w))
        if x.shape[0] > GEMV_MAX_TOKENS or w is None or len(x.shape) != 2 or x.ptr % 16:  # the GEMV's x alignment
            return self._ops.rms_norm(x, w, eps)
        y = self._ops._empty(x.shape)
        self._pending = {"x": x, "w": w, "eps": eps, "y": y, "taken": False}
        return y

    def glu(self, x: DArray, w_gate, w_up, activation: str) -> DArray:
        p = self._pending
        if isinstance(p, dict) and x is p["y"] and not any(_overlap(a, p["y"]) for a in _arrays((w_gate, w_up))):
            p["taken"] = True
            return self._ops._glu(p["x"], w_gate, w_up, activation, norm=(p["w"], p["eps"]))
        self._settle((x, w_gate, w_up))
        return self._ops.glu(x, w_gate, w_up, activation)

    def matmuls(self, x: DArray, weights, biases=None) -> list[DArray]:
        self._settle((x, weights, biases))
        if not HEADS_IN_GEMV:
            return self._ops.matmuls(x, weights, biases)
        out, self._pending = self._ops._matmuls(x, weights, biases, hold=True)
        return out

    def qk_norm_rope(self, rotation: Rotation, q: DArray, k: DArray, q_norm: DArray, k_norm: DArray,
                     eps: float) -> list[DArray]:
        if self._holds_for(q, k):
            return self._ops.launch_held(self._take(), self._ops.heads(rotation, q, k, q_norm, k_norm, eps))
        self._settle((rotation, q, k, q_norm, k_norm))
        return self._ops.qk_norm_rope(rotation, q, k, q_norm, k_norm, eps)

    def rope(self, rotation: Rotation, *xs: DArray) -> list[DArray]:
        if len(xs) == 2 and self._holds_for(*xs):
            return self._ops.launch_held(self._take(), self._ops.heads(rotation, *xs))
        self._settle((rotation, xs))
        return self._ops.rope(rotation, *xs)

    def _holds_for(self, q: DArray, k: DArray) -> bool:
        """A GEMV is held that may form the heads q, k after its wait: one
        token's, of one width, neither read nor written by its product."""
        h = self._pending
        return (isinstance(h, HeldGemv) and q.shape[0] == k.shape[0] == 1 and q.shape[2] == k.shape[2]
                and not any(_overlap(a, b) for a in (q, k) for b in _arrays((h.x, h.w, h.bias, h.y, h.norm))))

    def settle(self) -> None:
        """Launch whatever is pending (the end of a pass)."""
        self._settle(())

    def _take(self):
        p, self._pending = self._pending, None
        return p

    def __getattr__(self, name):
        fn = getattr(self._ops, name)
        if not callable(fn) or name.startswith("_"):
            return fn

        def op(*args, **kw):
            if name == "embed":  # a new pass: nothing of the last one is pending or read
                self._pending = None
                self._dropped.clear()
            self._settle(args + tuple(kw.values()))
            if name == "end_layer":  # the workspace's rows are reused from here
                self._dropped.clear()
            return fn(*args, **kw)
        return op

    def _settle(self, args) -> None:
        arrays = list(_arrays(args))
        for a in arrays:
            if any(_overlap(a, d) for d in self._dropped):
                raise AnvilError("CUDA backend: an operator read a norm's output that its GEMVs had folded in "
                                 "(Folded): the model reads it after other operators ran")
        p = self._take()
        if isinstance(p, HeldGemv):
            self._ops.launch_held(p)
        elif p is not None:
            if not p["taken"] or any(_overlap(a, p["y"]) for a in arrays):
                launchers.norm.rms_norm(self._ops.dev, p["x"], p["w"], p["y"], p["eps"])
            else:
                self._dropped.append(p["y"])


class State:
    """The state of one sequence: ``layers[il]`` for each layer, chosen by
    the layer's kind; ``reset()`` clears all of it."""

    def __init__(self, backend: "Backend", kinds: list[str], rope_freqs):
        self.cfg, self.backend, self.rope_freqs = backend.cfg, backend, rope_freqs
        self.layers = [LAYER_KINDS[kind](self, il, backend.n_ctx) for il, kind in enumerate(kinds)]

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()


class Ops:
    """The operators the model code calls, on device arrays. Outputs come from
    the workspace, which the model resets at the start of each pass."""

    def __init__(self, backend: "Backend"):

        self.b, self.dev = backend, backend.dev
        self._scratch: DArray | None = None
        self._bf16: dict[int, tuple[DArray, DArray]] = {}  # id(y) -> (y, y in bf16): this layer's
        # moe_watch(stage, arrays), when set, sees the prefill MoE FFN's device arrays as each stage makes
        # them, before the next overwrites any (scripts/gpu/moe_stages.py: which stage parts from the oracle)
        self.moe_watch = None

    def _empty(self, shape, dtype=np.float32) -> DArray:
        return self.b.workspace.empty(shape, dtype)

    def _bf16_beside(self, y: DArray) -> DArray | None:
        """Where a prefill GEMM may read ``y`` (rows of a matrix, more than a
        GEMV takes): a bf16 array for the kernel writing y to fill too, which
        _gemms then reads for y (found by the object: a view of y is another,
        and converts). None otherwise."""
        if not PRODUCERS_WRITE_BF16 or len(y.shape) != 2 or y.shape[0] <= GEMV_MAX_TOKENS:
            return None
        yb = self._empty(y.shape, np.uint16)
        self._bf16[id(y)] = (y, yb)
        return yb

    def _written(self, *xs: DArray) -> None:
        """``xs`` are changed in place: the bf16 copies of arrays they overlap
        (themselves, or arrays they are views of) no longer hold them."""
        for key, (y, _) in list(self._bf16.items()):
            if any(_overlap(x, y) for x in xs):
                del self._bf16[key]

    def embed(self, table: QWeight, tokens: DArray, scale: float = 1.0) -> DArray:
        x = self._empty((tokens.size, table.n_in))
        launchers.dequant.get_rows(self.dev, table.data, table.qtype, tokens, x, table.n_in, scale)
        self.b.workspace.set_mark()  # everything after the embedding is per-layer scratch
        self._bf16.clear()  # a new pass
        return x

    def rms_norm(self, x: DArray, w: DArray | None, eps: float) -> DArray:
        y = self._empty(x.shape)
        launchers.norm.rms_norm(self.dev, x, w, y, eps, yb=self._bf16_beside(y))
        return y

    def matmuls(self, x: DArray, weights, biases=None) -> list[DArray]:
        """Several projections of one input. In decode, each run of
        consecutive weights of one type stored back to back (as loaded) runs
        as a single matrix-vector launch over their stacked rows, and the
        outputs are views of its result (Q4_K_M's Q6_K V beside Q4_K Q and K:
        Q and K one launch, V another)."""
        return self._matmuls(x, weights, biases)

    def _matmuls(self, x: DArray, weights, biases=None, norm=None, hold: bool = False):
        """``matmuls``; ``norm`` (w, eps), decode only: the input is
        RMSNorm(x)·w, formed by each GEMV as it reads x (Folded). ``hold``:
        (the outputs, the last launch held back as a HeldGemv where it runs
        beside the one before it, else None)."""
        biases = tuple(biases or (None,) * len(weights))
        if x.shape[0] > GEMV_MAX_TOKENS:
            assert norm is None, "a folded norm is a decode GEMV's"
            out = self._gemms(x, weights, biases)
            return (out, None) if hold else out
        out, i, held = [], 0, None
        while i < len(weights):
            j = len(weights)  # the longest stackable run from i
            while j > i + 1 and self._stack(weights[i:j], biases[i:j]) is False:
                j -= 1
            w, bias = (weights[i], biases[i]) if j == i + 1 else self._stack(weights[i:j], biases[i:j])
            # a run after the first reads x, which the first's launch waited for, and writes its own
            # output: it runs beside the launch before it (OVERLAP_RUNS)
            overlap = OVERLAP_RUNS and i > 0
            if hold and overlap and j == len(weights) and x.shape[0] == 1:
                y = self._empty((1, w.n_out))
                held = HeldGemv(x, w, bias, y, norm)
            else:
                y = self._matmul(x, w, bias, norm=norm, overlap=overlap)
            start = 0
            for wi in weights[i:j]:
                out.append(y if j == i + 1 else DArray(y.ptr + 4 * start, (x.shape[0], wi.n_out), y.dtype, y.device))
                start += wi.n_out
            i = j
        return (out, held) if hold else out

    def launch_held(self, h: HeldGemv, heads: "launchers.rope.Heads | None" = None):
        """Launch a GEMV ``_matmuls`` held (as it would have been), forming
        ``heads`` after its wait where given; returns [q, k] of the heads."""
        launchers.gemv.gemv(self.dev, h.w.data, h.w.qtype, h.x, h.y, h.w.n_in, h.w.n_out, add=h.bias,
                            norm=h.norm, overlap=True, heads=heads)
        if heads is not None:
            self._written(heads.q, heads.k)
            return [heads.q, heads.k]

    def heads(self, rotation: Rotation, q: DArray, k: DArray, q_norm: DArray | None = None,
              k_norm: DArray | None = None, eps: float = 0.0) -> "launchers.rope.Heads":
        """q and k's heads to form: per-head RMSNorm where the weights are given, then RoPE."""
        r = rotation
        return launchers.rope.Heads(q, k, r.positions.dev, r.rope_type, r.n_rot, r.base, r.scale, r.freq_div,
                                    q_norm, k_norm, eps)

    def glu(self, x: DArray, w_gate: QWeight, w_up: QWeight, activation: str) -> DArray:
        """Decode with gate and up stacked (one type, back to back, as loaded):
        one GEMV launch with the GLU in its epilogue. Otherwise the two
        projections, then the GLU kernel."""
        return self._glu(x, w_gate, w_up, activation)

    def _glu(self, x: DArray, w_gate: QWeight, w_up: QWeight, activation: str, norm=None) -> DArray:
        """``glu``; ``norm`` as for ``_matmuls``."""
        if x.shape[0] <= GEMV_MAX_TOKENS:
            stacked = self._stack((w_gate, w_up), (None, None))
            if stacked:
                y = self._empty((x.shape[0], w_gate.n_out))
                w = stacked[0]
                launchers.gemv.gemv_glu(self.dev, w.data, w.qtype, x, y, w.n_in, w_gate.n_out, activation,
                                        norm=norm)
                return y
        g, u = self._matmuls(x, (w_gate, w_up), norm=norm)
        return self.swiglu(g, u) if activation == "silu" else self.geglu(g, u)

    def _stack(self, weights, biases):
        """``_stack``'s answer, kept per group of weights."""
        key = tuple(w.data.ptr for w in weights)
        stacked = self.b.stacked.get(key)
        if stacked is None:
            stacked = self.b.stacked[key] = _stack(weights, biases)
        return stacked

    def add_rms_norm(self, x: DArray, a: DArray, w, eps: float, a_norm: DArray | None = None) -> tuple:
        """``x += a`` (or a's post-norm) in place (x is this pass's residual stream), then the norm
        (one per weight, if ``w`` is a tuple): one launch."""
        ws = w if isinstance(w, tuple) else (w,)
        ys = tuple(self._empty(x.shape) for _ in ws)
        self._written(x)
        launchers.norm.add_rms_norm(self.dev, x, a, ws, ys, eps, a_norm=a_norm, yb=self._bf16_beside(ys[0]))
        return (x, *ys)

    def norm_add(self, x: DArray, a: DArray, w: DArray, eps: float, scale: DArray | None = None,
                 x_norm: DArray | None = None) -> DArray:
        """``x = (x + RMSNorm(a)·w)·scale`` in place (x normed first with ``x_norm``): one launch."""
        self._written(x)
        launchers.norm.add_rms_norm(self.dev, x, a, None, None, eps, a_norm=w, scale=scale, x_norm=x_norm)
        return x

    def matmul(self, x: DArray, w: QWeight, bias: DArray | None = None, add: DArray | None = None) -> DArray:
        return self._matmul(x, w, bias, add)

    def _matmul(self, x: DArray, w: QWeight, bias: DArray | None = None, add: DArray | None = None,
                norm=None, overlap: bool = False) -> DArray:
        """``matmul``; ``norm`` as for ``_matmuls``, ``overlap`` as for launchers.gemv.gemv (a GEMV
        with at most one of bias and add)."""
        T = x.shape[0]
        assert norm is None or (T <= GEMV_MAX_TOKENS and (bias is None or add is None)), "a folded norm is a GEMV's"
        if T <= GEMV_MAX_TOKENS and (bias is None or add is None):
            # the kernel adds one vector to its output: a bias or the residual
            y = self._empty((T, w.n_out))
            launchers.gemv.gemv(self.dev, w.data, w.qtype, x, y, w.n_in, w.n_out, add=bias if add is None else add,
                                norm=norm, overlap=overlap)
            return y
        if add is not None and bias is None:  # the residual stream, updated in place by the GEMM's epilogue
            return self._gemms(x, (w,), (None,), into=add)[0]
        y = self._gemms(x, (w,), (bias,))[0]
        if add is not None:
            launchers.elementwise.add(self.dev, y, add, y)
        return y

    def _gemms(self, x: DArray, weights, biases, into: DArray | None = None) -> list[DArray]:
        """Prefill: ``x · W_iᵀ (+ b_i)`` for each weight, cuBLAS GEMMs
        accumulating in fp32. F32 weights run in fp32 (nothing rounded), F16
        weights with x rounded to f16; BF16 and quantised weights are copied or
        dequantised to bf16 first, each run of them of one type stored back to
        back (a declared group, as loaded) by one launch, and x is rounded to
        bf16 once for all of them (the same bits as weight by weight). With
        launchers.gemm.WGMMA, a run of quantised weights is instead one launch
        of a GEMM that dequantises as it goes (the same bf16 values). ``into``
        (one weight): the product is added to it in place (``+=``)."""
        T, n_in = x.shape[0], weights[0].n_in  # one input: one n_in
        assert into is None or (len(weights) == 1 and (into.ptr >= x.ptr + x.nbytes or x.ptr >= into.ptr + into.nbytes))
        out, converted, i = [], {}, 0

        def x_as(kind: str) -> DArray:  # x rounded to f16 or bf16 once (or bf16 as its kernel wrote it)
            beside = self._bf16.get(id(x)) if kind == "bf16" else None
            if beside is not None and beside[0] is x:
                converted[kind] = beside[1]
            if kind not in converted:
                xr = converted[kind] = self._empty((T, n_in), np.float16 if kind == "f16" else np.uint16)
                (launchers.elementwise.f32_to_f16 if kind == "f16" else launchers.elementwise.f32_to_bf16)(
                    self.dev, x, xr)
            return converted[kind]

        if into is not None:
            self._written(into)

        while i < len(weights):
            w = weights[i]
            if w.qtype in (QType.F32, QType.F16):
                y = self._empty((T, w.n_out)) if into is None else into
                kind = "f32" if w.qtype == QType.F32 else "f16"
                self.b.cublas.gemm(x if kind == "f32" else x_as(kind), w.data, y, T, n_in, w.n_out, kind,
                                   accumulate=into is not None)
                out.append(y)
                i += 1
                continue
            j = len(weights)  # the longest run from i that is one stacked matrix
            while j > i + 1 and _stack(weights[i:j], (None,) * (j - i)) is False:
                j -= 1
            run = _stack(weights[i:j], (None,) * (j - i))[0]
            if launchers.gemm.takes(self.dev, run.qtype, n_in, [wi.n_out for wi in weights[i:j]]):
                # the weights' blocks read by the GEMM itself: no bf16 copy (launchers/gemm.py)
                for k in range(i, j, launchers.gemm.MAX_OUTS):
                    part = weights[k:min(j, k + launchers.gemm.MAX_OUTS)]
                    ys = [self._empty((T, wi.n_out)) if into is None else into for wi in part]
                    launchers.gemm.gemm(self.dev, _stack(part, (None,) * len(part))[0].data, run.qtype, x_as("bf16"),
                                        ys, T, n_in, accumulate=into is not None)
                    out.extend(ys)
                i = j
                continue
            wb = self._bf16_scratch(run.n_out * n_in).reshape(run.n_out, n_in)
            launchers.dequant.dequant_bf16(self.dev, run.data, run.qtype, wb, run.n_out, n_in)
            r0 = 0
            for wi in weights[i:j]:
                y = self._empty((T, wi.n_out)) if into is None else into
                self.b.cublas.gemm(x_as("bf16"), wb.rows(r0, r0 + wi.n_out), y, T, n_in, wi.n_out, "bf16",
                                   accumulate=into is not None)
                out.append(y)
                r0 += wi.n_out
            i = j
        for y, b in zip(out, biases):
            if b is not None:
                launchers.elementwise.bias_add_rows(self.dev, y, b)
        return out

    def _bf16_scratch(self, n: int) -> DArray:
        if self._scratch is None or self._scratch.size < n:
            self._scratch = self.dev.empty((n,), np.uint16)
        return self._scratch.reshape(-1).rows(0, n)

    def rope(self, rotation: Rotation, *xs: DArray) -> list[DArray]:
        """Rotate in place (each x is this pass's own temporary). Queries and
        keys stored back to back (stacked decode projections) share a launch."""
        T = xs[0].shape[0]
        if len(xs) == 2 and T == 1 and xs[0].ptr + xs[0].nbytes == xs[1].ptr and xs[0].shape[2] == xs[1].shape[2]:
            both = DArray(xs[0].ptr, (T, xs[0].shape[1] + xs[1].shape[1], xs[0].shape[2]), xs[0].dtype, self.dev)
            groups = [both]
        else:
            groups = xs
        self._written(*xs)
        for x in groups:
            r = rotation
            launchers.rope.rope(self.dev, x, r.positions.dev, r.rope_type, r.n_rot, r.base, r.scale, r.freq_div)
        return list(xs)

    def qk_norm_rope(self, rotation: Rotation, q: DArray, k: DArray, q_norm: DArray, k_norm: DArray,
                     eps: float) -> list[DArray]:
        """Per-head RMSNorm and RoPE of q and k in place (this pass's own temporaries), one launch."""
        self._written(q, k)
        launchers.rope.qk_norm_rope(self.dev, self.heads(rotation, q, k, q_norm, k_norm, eps))
        return [q, k]

    def attention(self, q: DArray, keys: DArray, values: DArray, positions: Positions, scale: float,
                  window: int = 0) -> DArray:
        T, H, D = q.shape
        out = self._empty((T, H * D))
        k_new = v_new = outb = None
        if isinstance(keys, NewRow):  # KVLayer.store of one row: stored by the decode kernel
            keys, k_new, values, v_new = keys.cache, keys.row, values.cache, values.row
        elif launchers.attention.path_of(T, keys) == "prefill_tc":
            outb = self._bf16_beside(out)
        launchers.attention.attention(self.dev, q, keys, values, out, positions.dev, scale, window,
                                      k_new=k_new, v_new=v_new, outb=outb)
        return out

    def add(self, a: DArray, b: DArray) -> DArray:
        y = self._empty(a.shape)
        launchers.elementwise.add(self.dev, a, b, y)
        return y

    def swiglu(self, g: DArray, u: DArray) -> DArray:
        y = self._empty(g.shape)
        launchers.elementwise.silu_mul(self.dev, g, u, y, yb=self._bf16_beside(y))
        return y

    def geglu(self, g: DArray, u: DArray) -> DArray:
        y = self._empty(g.shape)
        launchers.elementwise.gelu_tanh_mul(self.dev, g, u, y, yb=self._bf16_beside(y))
        return y

    def sigmoid_mul(self, a: DArray, g: DArray) -> DArray:
        y = self._empty(a.shape)
        launchers.elementwise.sigmoid_mul(self.dev, a, g, y)
        return y

    def split(self, x: DArray, sizes) -> list[DArray]:
        """Column pieces of ``x [T, Σ sizes]``: views of one row in decode, copies otherwise."""
        T, n = x.shape
        assert sum(sizes) == n, (sizes, x.shape)
        out, off = [], 0
        for size in sizes:
            if T == 1:
                out.append(DArray(x.ptr + 4 * off, (1, size), x.dtype, x.device))
            else:
                y = self._empty((T, size))
                launchers.elementwise.copy_cols(self.dev, x, y, T, size, n, off)
                out.append(y)
            off += size
        return out

    def split_gate(self, x: DArray, n_head: int, head_dim: int) -> tuple[DArray, DArray]:
        """``[q | gate]`` per head of ``x [T, H·2D]``: ``q [T, H, D]``, ``gate [T, H·D]``."""
        T = x.shape[0]
        q, gate = self._empty((T, n_head, head_dim)), self._empty((T, n_head * head_dim))
        for y, off in ((q, 0), (gate, head_dim)):
            launchers.elementwise.copy_cols(self.dev, x, y, T * n_head, head_dim, 2 * head_dim, off)
        return q, gate

    def dot(self, x: DArray, w: DArray) -> DArray:
        """``x · w`` per row for an F32 vector ``w``: a one-row matmul."""
        return self.matmul(x, QWeight(w, QType.F32, 1, w.size))

    def decay_gates(self, b: DArray, a: DArray, dt_bias: DArray, ssm_a: DArray) -> tuple[DArray, DArray]:
        beta, g = self._empty(b.shape), self._empty(b.shape)
        launchers.deltanet.decay_gates(self.dev, b, a, dt_bias, ssm_a, beta, g)
        return beta, g

    def causal_conv(self, x: DArray, w: QWeight, state: RecurrentLayer) -> DArray:
        if w.qtype != QType.F32:
            raise AnvilError(f"CUDA causal_conv: the conv weight must be F32, got {w.qtype.name}")
        y = self._empty(x.shape)
        launchers.deltanet.causal_conv(self.dev, x, DArray(w.data.ptr, (w.n_out, w.n_in), np.dtype(np.float32),
                                                           self.dev), state.conv, y)
        return y

    def l2_norm(self, x: DArray, eps: float) -> DArray:
        """As llama.cpp: RMSNorm with ``eps/S``, then ``·1/√S``. One launch:
        the factor is the norm's weight (a vector of 1/√S), which rounds as a
        separate scaling does."""
        S = x.shape[-1]
        y = self._empty(x.shape)
        launchers.norm.rms_norm(self.dev, x, self.b.constant(S, float(np.float32(1.0 / np.sqrt(S)))), y, eps / S)
        return y

    def delta_rule(self, q: DArray, k: DArray, v: DArray, g: DArray, beta: DArray, state: RecurrentLayer) -> DArray:
        out = self._empty(v.shape)
        launchers.deltanet.delta_rule(self.dev, q, k, v, g, beta, state.s, out)
        return out

    def moe_route(self, x: DArray, router: QWeight, k: int, norm: bool, scale: float = 1.0):
        """The router's logits (a matmul), then softmax and top-k on the device:
        ids and weights stay in device memory for the expert kernels. Decode
        with an F32 router (as llama.cpp writes every router): one launch for
        both. ``scale`` multiplies the logits (the same as the input, up to
        rounding)."""
        T = x.shape[0]
        ids = self._empty((T, k), np.int32)
        weights = self._empty((T, k))
        if T <= GEMV_MAX_TOKENS and router.qtype == QType.F32:
            logits = self._empty((T, router.n_out))
            launchers.moe.router_route(self.dev, router.data, router.qtype, x, logits, ids, weights, router.n_in, k,
                                       norm, scale)
            return ids, weights
        logits = self.matmul(x, router)
        if scale != 1.0:
            launchers.elementwise.scale(self.dev, logits, scale)
        launchers.moe.route(self.dev, logits, ids, weights, k, norm)
        return ids, weights

    def moe_ffn(self, x: DArray, ids: DArray, weights: DArray, gate_exps: QWeight, up_exps: QWeight,
                down_exps: QWeight, add: DArray | None = None, activation: str = "silu",
                down_scale: DArray | None = None) -> DArray:
        """Decode: the k selected experts of each token as matrix-vector
        products reading their ids on the device (gate and up in one launch
        with SwiGLU; the down projection sums the experts and adds ``add``).
        Prefill: the (token, expert) pairs grouped by expert on the device,
        one grouped GEMM per projection. ``down_scale`` is folded into the
        routing weights (each expert's weight times its scale)."""
        T, k = ids.shape
        n_embd, n_ff, n_expert = down_exps.n_out, down_exps.n_in, down_exps.n_expert
        glu = launchers.elementwise.silu_mul if activation == "silu" else launchers.elementwise.gelu_tanh_mul
        if down_scale is not None:
            scaled = self._empty(weights.shape)
            launchers.elementwise.mul_gather(self.dev, weights, ids, down_scale, scaled)
            weights = scaled
        y = self._empty((T, n_embd))
        if T <= GEMV_MAX_TOKENS or n_embd % 32 or n_ff % 32:
            # (widths the grouped GEMM cannot tile run token by token: grid.z = T)
            h = self._empty((T, k, n_ff))
            if gate_exps.qtype == up_exps.qtype:
                launchers.moe.glu(self.dev, gate_exps.data, up_exps.data, gate_exps.qtype, ids, x, h, n_embd, n_ff,
                                  n_expert, activation=activation)
            else:  # no fused kernel for two types: each projection, then the GLU
                g, u = self._empty((T, k, n_ff)), self._empty((T, k, n_ff))
                for w, out in ((gate_exps, g), (up_exps, u)):
                    launchers.moe.gemv(self.dev, w.data, w.qtype, ids, x, out, n_embd, n_ff, n_expert)
                glu(self.dev, g, u, h)
            launchers.moe.down(self.dev, down_exps.data, down_exps.qtype, ids, weights, h, y, add, n_ff, n_embd,
                               n_expert)
            return y
        watch = self.moe_watch or (lambda stage, arrays: None)
        mg = launchers.moe_gemm
        grouping = mg.Grouping.empty(self._empty, T * k, n_expert)
        mg.sort(self.dev, ids, grouping)
        # each projection's input as its GEMM takes it (moe_gemm.int8): bf16, int8 groups, or both
        xs = xq = None
        if not (mg.int8(gate_exps.qtype) and mg.int8(up_exps.qtype)):
            xs = self._empty((T * k, n_embd), np.uint16)  # bf16 bits, in expert order
            mg.gather_bf16(self.dev, x, grouping, k, xs)
        if mg.int8(gate_exps.qtype) or mg.int8(up_exps.qtype):
            xq = mg.Q8Rows.empty(self._empty, T * k, n_embd)
            mg.quant_q8(self.dev, x, xq, grouping, k)
        watch("gather", {"pair_at": grouping.pair_at, "weights": weights, **self._moe_inputs("x", xs, xq)})
        g, u = self._empty((T * k, n_ff)), self._empty((T * k, n_ff))
        for w, out in ((gate_exps, g), (up_exps, u)):
            self._grouped(w, xs, xq, grouping, out, n_embd, n_ff)
        watch("gate_up", {"g": g, "u": u})
        hs = None if mg.int8(down_exps.qtype) else self._empty((T * k, n_ff), np.uint16)
        glu(self.dev, g, u, g, hs)  # hs: the hidden in bf16, for the bf16 down GEMM
        hq = None
        if mg.int8(down_exps.qtype):
            hq = mg.Q8Rows.empty(self._empty, T * k, n_ff)
            mg.quant_q8(self.dev, g, hq)
        watch("glu", {"h": g, **self._moe_inputs("h", hs, hq)})
        d = self._empty((T * k, n_embd))
        self._grouped(down_exps, hs, hq, grouping, d, n_ff, n_embd)
        watch("down", {"d": d})
        launchers.moe_gemm.combine(self.dev, d, grouping, weights, add, y)
        return y

    def _grouped(self, w: QWeight, xs: DArray | None, xq, grouping, y: DArray, n_in: int, n_out: int) -> None:
        """One projection of the grouped experts, on the GEMM its type takes: int8
        (moe_gemm.INT8), else bf16 by wgmma (gemm.WGMMA_GROUPED) or moe_gemm's."""
        mg = launchers.moe_gemm
        if mg.int8(w.qtype):
            mg.gemm_i8(self.dev, w.data, w.qtype, xq, grouping, y, n_in, n_out)
        elif launchers.gemm.takes_grouped(self.dev, w.qtype, n_in, n_out):
            launchers.gemm.grouped(self.dev, w.data, w.qtype, xs, grouping, y, n_in, n_out)
        else:
            mg.gemm(self.dev, w.data, w.qtype, xs, grouping, y, n_in, n_out)

    @staticmethod
    def _moe_inputs(name: str, bf16_rows: DArray | None, q8) -> dict:
        """A grouped GEMM input for ``moe_watch``: ``{name}s`` bf16 bits, and/or
        ``{name}q`` / ``{name}d`` / ``{name}sum`` int8 groups (Q8Rows)."""
        out = {} if bf16_rows is None else {f"{name}s": bf16_rows}
        if q8 is not None:
            out |= {f"{name}q": q8.q, f"{name}d": q8.d, f"{name}sum": q8.s}
        return out

    def mul(self, x: DArray, w: DArray) -> DArray:
        y = self._empty(x.shape)
        launchers.elementwise.mul_rows(self.dev, x, w, y)
        return y

    def softcap(self, x: DArray, cap: float) -> DArray:
        self._written(x)
        launchers.elementwise.softcap(self.dev, x, cap)
        return x

    def last_row(self, x: DArray) -> DArray:
        return x.rows(x.shape[0] - 1, x.shape[0])

    def end_layer(self, x: DArray) -> DArray:
        """Recycle the layer's temporaries: move the residual stream to the
        start of the layer's workspace region and release the rest, so a
        512-token prefill needs one layer's scratch, not 36 layers'. A decode
        step's temporaries are small: it keeps them all and saves the copy
        (a graph of kernels only, so each can overlap the next: common.cuh)."""
        self._bf16.clear()  # the layer's temporaries are released
        if x.shape[0] <= GEMV_MAX_TOKENS:
            return x
        return self.b.workspace.keep(x)


def _stack(weights, biases):
    """(weight, bias) covering consecutive matrices, or False if they are not
    one type, not back to back, or only some have biases."""
    w0 = weights[0]
    for a, b in zip(weights, weights[1:]):
        if b.qtype != w0.qtype or b.n_in != w0.n_in or a.data.ptr + a.data.nbytes != b.data.ptr:
            return False
    if any(b is None for b in biases):
        if any(b is not None for b in biases):
            return False
        bias = None
    else:
        for a, b in zip(biases, biases[1:]):
            if a.ptr + a.nbytes != b.ptr:
                return False
        bias = DArray(biases[0].ptr, (sum(b.size for b in biases),), biases[0].dtype, biases[0].device)
    nbytes = sum(w.data.nbytes for w in weights)
    data = DArray(w0.data.ptr, (nbytes,), w0.data.dtype, w0.data.device)
    return QWeight(data, w0.qtype, sum(w.n_out for w in weights), w0.n_in), bias


class Backend:
    name = "cuda"

    def __init__(self, cfg: ModelConfig, n_ctx: int, *, kv_f16: bool = True, eager: bool = False,
                 ubatch: int = UBATCH, workspace_mb: int | None = None, device=None, cublas=None,
                 gguf: GGUFFile | None = None, kinds: list[str] | None = None):
        """``ubatch``: a prompt's micro-batch (the workspace holds one).
        ``device``/``cublas``: others than the GPU's (recording.py's count launches on any machine).
        ``gguf``/``kinds``: the model about to be loaded, refused here if it
        does not fit the device's free memory (memory.py)."""
        from ...model import UBATCH as SMALLEST
        from .cublas import Cublas

        if cfg.arch in PENDING_ARCHS:
            raise AnvilError(f"the CUDA backend does not run {cfg.arch} models yet: use --backend numpy")
        if not isinstance(ubatch, int) or not SMALLEST <= ubatch <= MAX_UBATCH:
            # harness diff traces one NumPy micro-batch (model.UBATCH) and needs it to be one here too
            raise AnvilError(f"ubatch {ubatch!r}: a micro-batch must be {SMALLEST} to {MAX_UBATCH} tokens")
        self.cfg, self.n_ctx, self.kv_f16, self.eager, self.ubatch = cfg, n_ctx, kv_f16, eager, ubatch
        self.dev = device or Device()
        if cfg.moe is not None:  # refused at load, not halfway through a prompt's layers
            pairs = min(ubatch, n_ctx) * cfg.moe.n_expert_used
            if launchers.moe_gemm.sort_shared(cfg.moe.n_expert, pairs) > self.dev.max_shared:
                raise AnvilError(f"ubatch {ubatch}: a micro-batch of {min(ubatch, n_ctx)} tokens has {pairs} "
                                 f"(token, expert) pairs, more than moe_sort sorts in a block's "
                                 f"{self.dev.max_shared} bytes of shared memory: give a smaller ubatch")
        scratch = workspace_mb << 20 if workspace_mb else workspace_bytes(cfg, min(ubatch, n_ctx))
        if gguf is not None and kinds is not None:  # before the first allocation
            memory.check_fits(gguf.path, "the CUDA engine",
                              {"weights": weights_bytes(gguf), "workspace": scratch + CUBLAS_WORKSPACE},
                              memory.kv_bytes_per_token(cfg, kinds, 2 if kv_f16 else 4), n_ctx,
                              (self.dev.mem_free(), f"free on the {self.dev.name}"),
                              "take a smaller model, or free the GPU of other processes")
        self.cublas = cublas or Cublas(self.dev.stream)
        self.cublas.set_workspace(self.dev.empty((CUBLAS_WORKSPACE,), np.uint8))
        self.workspace = Workspace(self.dev, scratch)
        self.weights: Workspace | None = None  # sized from the file on the first upload
        self.stacked: dict = {}
        self.constants: dict[tuple[int, float], DArray] = {}
        self.ops = Folded(Ops(self))
        # decode state: static device buffers the captured graph reads
        self.token = self.dev.empty((1,), np.int32)
        self.pos = self.dev.empty((1,), np.int32)
        self.next_token = self.dev.empty((1,), np.int32)
        self.history = self.dev.empty((n_ctx,), np.int32)  # the step at position p's answer (decode_greedy)
        self.graph = None
        self.logits: DArray | None = None  # the decode step's logits: a fixed workspace address, replay after replay
        self._device_state = None  # (token, pos) the buffers hold for the next step
        # prefill micro-batches of GRAPH_MIN_TOKENS or more: a captured pass per length
        self.pf_graphs: dict[int, PrefillGraph] = {}

    def upload(self, gf: GGUFFile, name: str):
        if self.weights is None:
            self.weights = Workspace(self.dev, weights_bytes(gf), align=16)
        shape = gf.tensor_shape(name)
        qtype = gf.tensor_type(name)
        host = gf.dequantize(name) if len(shape) == 1 else np.ascontiguousarray(gf.raw(name)).view(np.uint8)
        if len(shape) == 3 and qtype in (QType.F32, QType.F16, QType.BF16):
            self.weights.align_to(32)  # the grouped expert GEMM reads float rows 32 bytes at a time (moe_gemm.py)
        data = self.dev.upload(host.reshape(-1), self.weights.empty((host.size,), host.dtype))
        if len(shape) == 1:
            return data
        return QWeight(data, qtype, *shape[-2:], n_expert=shape[0] if len(shape) == 3 else 0)

    def make_state(self, kinds: list[str], rope_freqs) -> State:
        return State(self, kinds, rope_freqs)

    def inputs(self, tokens: np.ndarray, start: int):
        self.workspace.reset()
        tok = self.workspace.empty((tokens.size,), np.int32)
        pos = self.workspace.empty((tokens.size,), np.int32)
        self.dev.upload(tokens.astype(np.int32), tok)
        self.dev.upload(np.arange(start, start + tokens.size, dtype=np.int32), pos)
        return tok, Positions(pos, tokens.size)

    def constant(self, n: int, value: float) -> DArray:
        """A device vector of ``n`` float32 ``value``s, made on first use
        (an eager pass: an upload cannot be captured) and kept."""
        key = (n, value)
        if key not in self.constants:
            self.constants[key] = self.dev.upload(np.full(n, value, np.float32))
        return self.constants[key]

    def to_host(self, x: DArray) -> np.ndarray:
        return self.dev.download(x)

    # ---- prefill --------------------------------------------------------
    def prefill(self, model, tokens: np.ndarray, start: int) -> DArray:
        """A prompt micro-batch's forward pass: the last token's logits.

        A micro-batch of GRAPH_MIN_TOKENS or more (a benchmark's prompt, every
        piece of a long one) runs as a CUDA graph, as decode does: captured
        after its first eager run, then replayed with the tokens and positions
        written into static buffers. The pass's kernels read positions from
        device memory and size their grids from shapes alone, so one graph
        serves every start position, and a replay issues the pass without
        Python (at 512 tokens the GEMMs dominate:
        reports/notes/fusions-2026-12-01.md measured a small gain). Each length
        needs its own graph: the first GRAPH_LENGTHS lengths get one, and a
        full micro-batch (every piece of a long prompt but its last) always
        does; shorter pieces (a validation's prompts, each of its own length,
        run once) run eagerly."""
        T = tokens.size
        g = self.pf_graphs.get(T)
        full = len(self.pf_graphs) >= GRAPH_LENGTHS and T != self.ubatch
        if g is None and (self.eager or T < GRAPH_MIN_TOKENS or full):
            return self._run(model, *self.inputs(tokens, start))
        if g is None:
            g = PrefillGraph(self.dev.empty((T,), np.int32), self.dev.empty((T,), np.int32))
        self.dev.upload(tokens.astype(np.int32), g.tokens)
        self.dev.upload(np.arange(start, start + T, dtype=np.int32), g.pos)
        if g.graph is not None:
            self.dev.replay(g.graph)
            return g.logits

        def body():
            self.workspace.reset()
            g.logits = self._run(model, g.tokens, Positions(g.pos, T))

        body()  # eagerly: compiles, loads and allocates everything the capture will record
        g.graph = self.dev.capture(body)
        self.pf_graphs[T] = g
        return g.logits

    # ---- decode ---------------------------------------------------------
    def decode_next(self, model, token: int, pos: int) -> int:
        """Run ``token`` at ``pos`` and return the greedy next token.

        The first step runs eagerly (compiling/loading every kernel), then the
        same step is captured as a graph; later steps only replay it. The
        graph feeds its own argmax back in, so a plain greedy loop writes
        nothing to the device; a different token (teacher forcing) or a jump
        in position is written into the static buffers first. The logits
        stay where the graph wrote them (the workspace is laid out the same
        on every replay), so ``decode_logits`` reads exactly what the graph's
        argmax saw, with no extra kernel in the graph.
        """
        if (token, pos) != self._device_state:
            self.dev.upload(np.array([token], np.int32), self.token)
            self.dev.upload(np.array([pos], np.int32), self.pos)
        if self.graph is not None and not self.eager:
            self.dev.replay(self.graph)
        else:
            self._decode_body(model)
            if not self.eager:
                self.graph = self.dev.capture(lambda: self._decode_body(model))
        nxt = int(self.dev.download(self.next_token)[0])
        self._device_state = (max(nxt, 0), pos + 1)  # a non-finite answer (-1) feeds token 0 (argmax.cu)
        return nxt

    def decode_greedy(self, model, token: int, pos: int, n: int) -> list[int]:
        """``n`` greedy steps from ``token`` at ``pos``, each fed the one
        before's answer: the answers, -1 where a logit was not finite.

        The graph's argmax feeds its answer back and keeps it in ``history``,
        so the replays go to the stream back to back and the host reads the
        n answers once, after the last: the GPU never waits on the host's
        turn between steps (reading a token, launching the next replay), as
        it does with ``decode_next`` a step at a time. The steps and their
        tokens are decode_next's. After a non-finite answer the queued steps
        run on token 0; their answers are not the caller's."""
        first = self.decode_next(model, token, pos)  # captures the graph on the first step
        if n == 1 or first < 0 or self.graph is None or self.eager:
            out = [first]
            for k in range(1, n if first >= 0 else 1):
                out.append(self.decode_next(model, out[-1], pos + k))
                if out[-1] < 0:
                    break
            return out
        for _ in range(n - 1):
            self.dev.replay(self.graph)
        answers = self.dev.download(DArray(self.history.ptr + 4 * (pos + 1), (n - 1,), np.dtype(np.int32), self.dev))
        out = [first, *(int(a) for a in answers)]
        self._device_state = (max(out[-1], 0), pos + n)
        return out

    def decode_logits(self) -> np.ndarray:
        return self.dev.download(self.logits).reshape(-1)

    def _run(self, model, tokens: DArray, positions: Positions) -> DArray:
        """The model's pass, every fold of its operators settled (the last one may hold a launch)."""
        logits = model.run(tokens, positions)
        self.ops.settle()
        return logits

    def _decode_body(self, model) -> None:

        self.workspace.reset()
        self.logits = self._run(model, self.token, Positions(self.pos, 1))
        # the greedy choice, fed back as the next replay's token and position
        launchers.argmax.argmax(self.dev, self.logits, self.next_token, feed=(self.token, self.pos),
                                history=self.history)
