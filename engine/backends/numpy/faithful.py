"""The rounding-faithful oracle: the NumPy operators, rounding where the CUDA
engine rounds on purpose, and nowhere else.

The CUDA engine is not an fp32 engine: its decode GEMVs meet block-type
weights with int8 activations, its prefill GEMMs take bf16 (or f16) inputs,
its KV cache is f16 and its tensor-core prefill attention rounds Q and P to
f16. Held to the exact oracle (``ops``), a CUDA bug hides under the cost of
those roundings (up to a logit on the tiny models). Held to this one op by
op, on each op's own inputs, what is left is fp32 summation order and
fast-math's exp, rsqrt, division and sines (harness/anchored.py; the
budgets in harness/gates.py OP_BUDGET). Whole models cannot be held to it
that closely: each rounding turns those few-ulp differences into whole
rounding steps where a value sits near a boundary.

Each rounding is written once, here, bit for bit as the kernel does it (the
kernel's comment names the same choice):

- ``gemv_x``: int8 activations in groups of ``quants.xq_group(qtype)``
  (gemv.cuh quant16: d = amax/127, q = rint(x·(127/amax))), block types only;
- ``gemm_in``: prefill GEMM inputs, x and W both bf16 (round to nearest
  even) for bf16 and block-type weights, f16 for F16 weights, fp32 for F32
  (cuda/__init__.py Ops._gemms, dequant.cu); the grouped expert GEMM
  (moe_gemm.cu, ``grouped``) takes bf16 for every type, or on the int8 tensor
  cores (launchers/moe_gemm.py ``int8``) x as int8 groups of 32, rounded as
  ``gemv_x`` rounds, and the weights' exact values;
- ``f16``: the KV cache's stores (attention.cu to_kv);
- ``attention_tc``: the tensor-core prefill (attention.cu attention_prefill_tc):
  Q·scale in f16, keys in tiles with an online softmax, P rounded to f16.

Which path a product takes follows the CUDA backend's own switches
(``GEMV_MAX_TOKENS``, ``DECODE_MAX_T``, the tensor-core head sizes), read
from there so the two cannot part.
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...quants import QType, dequantize_rows, quantize_x, xq_group
from ..cuda import GEMV_MAX_TOKENS, UBATCH  # noqa: F401  (UBATCH: the micro-batch, numpy/__init__.py)
from ..cuda.launchers.attention import DECODE_MAX_T, TC_HEAD_DIMS, TC_TQ, tc_keys
from ..cuda.launchers import moe_gemm
from . import ops

F32 = np.float32
MOE_GEMM_ALIGN = 32  # cuda Ops.moe_ffn: widths the grouped GEMM cannot tile run as GEMVs


@dataclass(frozen=True)
class Weight:
    """A weight matrix as the CUDA engine holds it: its values (dequantised
    exactly, float32) and its GGUF type, which decides the rounding."""
    values: np.ndarray
    qtype: QType

    @property
    def shape(self):
        return self.values.shape

    def expert(self, e: int) -> "Weight":
        """Expert ``e``'s matrix of a stacked expert tensor."""
        return Weight(self.values[e], self.qtype)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of a matrix (an embedding lookup)."""
        return self.values[idx]


class LazyWeight(Weight):
    """A Weight dequantised when read, not held: the oracle of a model whose
    float32 weights would not fit the host (a 30B MoE is 120 GB of them),
    used op by op (harness/anchored.py). An embedding lookup dequantises
    its rows, an expert its own matrix; the last LAZY_KEEP matrices read
    stay dequantised (a MoE op reads three per expert)."""

    __eq__, __hash__ = object.__eq__, object.__hash__  # the dataclass's would read the values

    def __init__(self, gf, name: str):  # the frozen dataclass's fields, set once
        object.__setattr__(self, "qtype", gf.tensor_type(name))
        object.__setattr__(self, "_source", (gf, name, next(_SERIAL)))

    @property
    def shape(self):
        gf, name, _ = self._source
        return tuple(gf.tensor_shape(name))

    @property
    def values(self) -> np.ndarray:
        gf, name, key = self._source
        return _kept(key, lambda: gf.dequantize(name))

    def _rows(self, idx) -> np.ndarray:
        gf, name, _ = self._source
        return dequantize_rows(gf.raw(name), self.qtype, np.asarray(idx), self.shape[-1])

    def expert(self, e: int) -> Weight:
        n_out = self.shape[1]
        return Weight(_kept((self._source[2], int(e)), lambda: self._rows(np.arange(e * n_out, (e + 1) * n_out))),
                      self.qtype)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        return self._rows(np.asarray(idx).reshape(-1)).reshape(*np.shape(idx), self.shape[-1])


LAZY_KEEP = 4
_LAZY: OrderedDict = OrderedDict()  # (a LazyWeight's serial[, expert]) -> its values, the most recently read last
_SERIAL = itertools.count()


def _kept(key, make) -> np.ndarray:
    if key in _LAZY:
        _LAZY.move_to_end(key)
        return _LAZY[key]
    _LAZY[key] = out = make()
    while len(_LAZY) > LAZY_KEEP:
        _LAZY.popitem(last=False)
    return out


def values(w):
    return w.values if isinstance(w, Weight) else w


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 (round to nearest even), as float32 (``__float2bfloat16_rn``)."""
    b = np.ascontiguousarray(x, F32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    out = b.astype(np.uint32).view(F32)
    nan = np.isnan(x)
    return np.where(nan, np.float32(np.nan), out) if nan.any() else out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 (round to nearest even) as its 16 bits (uint16), as the kernels store it."""
    return (bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16_bits(a: np.ndarray) -> np.ndarray:
    """bf16 values held as their 16 bits (uint16, as the kernels store them) -> float32."""
    return (np.asarray(a, np.uint16).astype(np.uint32) << 16).view(F32)


def f16(x: np.ndarray) -> np.ndarray:
    """float32 -> f16 (round to nearest even), as float32 (``__float2half_rn``)."""
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def gemv_x(x: np.ndarray, qtype: QType) -> np.ndarray:
    """The decode GEMV's activations for a weight of ``qtype``: int8 groups
    for block types (their values d·q), fp32 otherwise."""
    group = xq_group(qtype)
    return x if group is None else quantize_x(x, group)


def gemm_in(x: np.ndarray, w: Weight) -> tuple[np.ndarray, np.ndarray]:
    """The prefill GEMM's inputs (x, W) for a weight of ``w.qtype``."""
    if w.qtype == QType.F32:
        return x, w.values
    if w.qtype == QType.F16:
        return f16(x), w.values  # F16 weights are exact in f16
    return bf16(x), bf16(w.values)


# The sums themselves in fp32 (BLAS sgemm), as the kernels make them: the
# order differs, which is the oracle's stated tolerance, not a rounding.
# SUMS = "fp64" sums them exactly instead: another realisation of that
# tolerance (harness/gates.py measure_faithful measures both).
SUMS = "fp32"


def _dot(a: np.ndarray, b_t: np.ndarray) -> np.ndarray:
    if SUMS == "fp64":
        return (a.astype(np.float64) @ b_t.astype(np.float64)).astype(F32)
    return np.asarray(a, F32) @ b_t


def gemv(x: np.ndarray, w: Weight) -> np.ndarray:
    """Rows of ``x · Wᵀ`` each as the decode GEMV computes one."""
    return _dot(gemv_x(x, w.qtype), w.values.T)


def gemm(x: np.ndarray, w: Weight) -> np.ndarray:
    """``x · Wᵀ`` as the prefill GEMM computes it (fp32 sums of the rounded inputs)."""
    xa, wa = gemm_in(x, w)
    return _dot(xa, wa.T)


def grouped_in(x: np.ndarray, w: Weight) -> np.ndarray:
    """The grouped expert GEMM's input rows for a weight of ``w.qtype``: int8
    in groups of 32 on the int8 GEMM (moe_gemm.int8; their values d·q, the
    rounding of ``quantize_x``), bf16 on the bf16 GEMM (every type, F32 too)."""
    return quantize_x(x, moe_gemm.Q8_GROUP) if moe_gemm.int8(w.qtype) else bf16(x)


def grouped_rows(a: np.ndarray, w: Weight) -> np.ndarray:
    """The grouped expert GEMM of rows ``a`` already rounded as ``grouped_in``
    rounds them: the int8 GEMM multiplies the weights' exact values (their
    integers and scales), the bf16 GEMM their bf16 roundings."""
    return _dot(a, (w.values if moe_gemm.int8(w.qtype) else bf16(w.values)).T)


def grouped(x: np.ndarray, w: Weight) -> np.ndarray:
    """The grouped expert GEMM (moe_gemm.cu) of rows ``x``."""
    return grouped_rows(grouped_in(x, w), w)


def product(x: np.ndarray, w: Weight) -> np.ndarray:
    """``x · Wᵀ`` on the path the CUDA engine takes for these rows."""
    return gemv(x, w) if x.shape[0] <= GEMV_MAX_TOKENS else gemm(x, w)


class FaithfulOps:
    """``ops`` with the CUDA engine's roundings; every other operator is ``ops``'s own."""

    def __init__(self, kv_f16: bool, fold: bool = True):
        self.kv_f16, self.fold = kv_f16, fold
        # the decode fold (cuda Folded): a decode RMSNorm whose output the very
        # next op, a glu, reads is folded into that glu's GEMV. (output, x, w, eps)
        self._normed = None

    @property
    def unfolded(self) -> "FaithfulOps":
        """The operators without the decode fold (as the CUDA engine's ``unfolded``)."""
        out = copy.copy(self)
        out.fold, out._normed = False, None
        return out

    def __getattr__(self, name):
        fn = getattr(ops, name)
        if not callable(fn):
            return fn

        def op(*args, **kw):
            self._normed = None  # any other op settles the fold (cuda Folded._settle)
            return fn(*args, **kw)
        return op

    def rms_norm(self, x, w, eps):
        y = ops.rms_norm(x, w, eps)
        fold = self.fold and w is not None and x.ndim == 2 and x.shape[0] <= GEMV_MAX_TOKENS
        self._normed = (y, x, w, eps) if fold else None
        return y

    def embed(self, table, tokens, scale=1.0):
        self._normed = None
        if not isinstance(table, Weight):
            return ops.embed(table, tokens, scale)
        x = table.rows(tokens)  # ops.embed's lookup, of a table that may be lazy
        return x * F32(scale) if scale != 1.0 else x

    def matmul(self, x, w, bias=None, add=None):
        self._normed = None
        y = product(x, w)
        if bias is not None:
            y = y + bias
        return y if add is None else add + y

    def matmuls(self, x, weights, biases=None):
        biases = biases or (None,) * len(weights)
        return [self.matmul(x, w, b) for w, b in zip(weights, biases)]

    def glu(self, x, w_gate, w_up, activation, norm=None):
        """``norm=(w, eps)``: the decode fold of an RMSNorm into gate/up's
        GEMV (cuda Folded, gemv.cuh GEMV_NORM): x·w is what is rounded to
        int8, the row sums are multiplied by 1/rms (fp32 sum of squares,
        ``rsqrt(sum/n + eps)``) after. Taken by itself when ``x`` is the
        output of the decode RMSNorm just before (``fold``), as CUDA does."""
        held, self._normed = self._normed, None
        if norm is None and held is not None and x is held[0]:
            x, norm = held[1], held[2:]
        if norm is None:
            g, u = self.matmuls(x, (w_gate, w_up))
        else:
            w, eps = norm
            xw = (np.asarray(x, F32) * w).astype(F32)
            ss = np.sum(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
            inv = F32(1) / np.sqrt(ss / F32(x.shape[-1]) + F32(eps), dtype=F32)
            g, u = (gemv(xw, wi) * inv for wi in (w_gate, w_up))
        return ops.swiglu(g, u) if activation == "silu" else ops.geglu(g, u)

    def dot(self, x, w):
        self._normed = None
        return self.matmul(x, Weight(w[None, :], QType.F32))

    def causal_conv(self, x, w, state):
        self._normed = None
        return ops.causal_conv(x, values(w), state)

    def moe_route(self, x, router, k, norm, scale=1.0):
        self._normed = None
        # the CUDA router scales the logits, not the input (equal up to rounding)
        logits = product(x, router)
        return ops.route(logits * F32(scale) if scale != 1.0 else logits, k, norm)

    def moe_ffn(self, x, ids, weights, gate_exps, up_exps, down_exps, add=None, activation="silu",
                down_scale=None):
        """Decode (and widths the grouped GEMM cannot tile): every expert a
        GEMV, int8 x and int8 hidden. Prefill: the grouped GEMMs, x and the
        hidden rounded for each (``grouped``: bf16, or int8 groups of 32;
        cuda Ops.moe_ffn). The experts' outputs are summed in selection order."""
        act = ops.swiglu if activation == "silu" else ops.geglu
        n_embd, n_ff = down_exps.shape[1], down_exps.shape[2]
        self._normed = None
        per_row = x.shape[0] <= GEMV_MAX_TOKENS or n_embd % MOE_GEMM_ALIGN or n_ff % MOE_GEMM_ALIGN
        mul = gemv if per_row else grouped
        if down_scale is not None:
            weights = weights * down_scale[ids]  # folded into the routing weights (mul_gather)
        ys = np.zeros((*ids.shape, n_embd), F32)
        for e in np.unique(ids):
            t, j = np.nonzero(ids == e)
            g, u, d = (w.expert(e) for w in (gate_exps, up_exps, down_exps))
            h = act(mul(x[t], g), mul(x[t], u))
            ys[t, j] = mul(h, d)
        out = np.zeros((x.shape[0], n_embd), F32)
        for j in range(ids.shape[1]):
            out += ys[:, j] * weights[:, j:j + 1]
        return out if add is None else add + out

    def attention(self, q, keys, values_, positions, scale, window=0):
        self._normed = None
        T, _, D = q.shape
        if T > DECODE_MAX_T and self.kv_f16 and D in TC_HEAD_DIMS:
            return attention_tc(q, keys, values_, positions, scale, window)
        return ops.attention(q, keys, values_, positions, scale, window)


def attention_tc(q: np.ndarray, keys: np.ndarray, vals: np.ndarray, positions: np.ndarray, scale: float,
                 window: int = 0) -> np.ndarray:
    """The tensor-core prefill attention's arithmetic: per block of
    TC_TQ query rows, the keys it can see from ``klo`` in tiles of
    ``tc_keys(D)``, an online softmax in fp32 (running max m, sum l of the
    unrounded p), and ``O += f16(p)·V``; Q is rounded to f16 and multiplied by
    f16(scale) in f16. The cache holds f16 values already. ``[T, H·D]``."""
    T, H, D = q.shape
    _, Hkv, _ = keys.shape
    g = H // Hkv
    TK = tc_keys(D)
    qh = f16(f16(q) * f16(np.float32(scale)))  # __hmul2: the product rounded to f16
    out = np.empty((T, H, D), F32)
    kv_head = np.arange(H) // g
    for t0 in range(0, T, TC_TQ):
        rows = slice(t0, min(T, t0 + TC_TQ))
        qp = positions[rows]
        klo = max(0, int(qp.min()) - window + 1) if window > 0 else 0
        khi = int(qp.max())
        K = keys[klo:khi + 1][:, kv_head].transpose(1, 0, 2).astype(np.float64)  # [H, S, D]
        V = vals[klo:khi + 1][:, kv_head].transpose(1, 0, 2).astype(np.float64)
        s = np.einsum("thd,hsd->hts", qh[rows].astype(np.float64), K).astype(F32)  # [H, n, S]
        kp = np.arange(klo, khi + 1)
        visible = kp[None, :] <= qp[:, None]
        if window:
            visible &= (qp[:, None] - kp[None, :]) < window
        s = np.where(visible[None], s, -np.inf)
        n = qp.size
        m = np.full((H, n, 1), -np.inf, F32)
        l = np.zeros((H, n, 1), F32)
        o = np.zeros((H, n, D), F32)
        for a in range(0, khi + 1 - klo, TK):
            st = s[:, :, a:a + TK]
            mn = np.maximum(m, st.max(axis=-1, keepdims=True))
            mu = np.where(np.isneginf(mn), F32(0), mn)
            with np.errstate(invalid="ignore"):
                corr = np.exp(m - mu).astype(F32)
                p = np.exp(st - mu).astype(F32)
            m = mn
            l = l * corr + p.sum(axis=-1, keepdims=True, dtype=np.float64).astype(F32)
            o = o * corr + (f16(p).astype(np.float64) @ V[:, a:a + TK]).astype(F32)
        out[rows] = (o * (F32(1) / l)).transpose(1, 0, 2)
    return out.reshape(T, H * D)

