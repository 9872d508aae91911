"""The engine held to the rounding-faithful oracle op by op (the ``ops`` check).

Whole models cannot be compared at fp32 precision once they round on
purpose: an int8, bf16 or f16 rounding turns an fp32 summation-order
difference of 1e-6 into a whole rounding step wherever a value sits near a
boundary, and layer after layer those steps grow to ~0.3 logits on the tiny
models (CUDA against the faithful oracle, H200, 2026-12-04:
reports/notes/cuda-gate-2026-12-04.md). So each operator is judged on its
own inputs instead: the engine runs a prompt and a few teacher-forced decode
steps with its operators wrapped; before each op its inputs are copied to
the host, after it its outputs; the rounding-faithful NumPy op
(engine/backends/numpy/faithful.py) runs on the same inputs with the same
weights, and the normalised error ``|engine - oracle| / |oracle|`` of every
output is held to ``gates.OP_BUDGET``. What stays out of a step's output
(the KV rows it stores, the recurrent state it advances) is compared too.

The engine's operators are its unfolded ones (as `harness diff` traces
them), and then, for one prompt's decode steps, the operators with the
decode folds users run: the norm folded into gate/up's GEMV is judged
inside that GEMV against the faithful fold ("glu norm"); a GEMV held back
for the Q/K heads is launched as it was (the heads fold is seen by the
model-level checks only).

The reference prompts decode no deeper than position 1658; a last, deep
pass runs the deep set's text (catalog.deep_prompts) cut at
DEEP_PROMPT_TOKENS and judges its decode steps, at positions past 2048,
where the split-K decode attention merges many splits (phase "decode
deep": check_deep).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from engine.backends.numpy import faithful
from engine.backends.numpy import ops as np_ops

from . import gates


@dataclass
class OpError:
    phase: str  # "prefill" | "decode"
    layer: int  # -1 before the first layer, n_layer after the last
    op: str
    output: int  # which output of the op (or of what it stored)
    error: float  # |engine - oracle| / |oracle|
    bound: float  # its budget (harness/gates.py op_budget)


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _weights(engine_model, oracle_model) -> dict[int, object]:
    """The engine's weight objects -> the oracle's, by their place in the
    model (both loaded by models/weights.py from one file)."""
    out = {}
    pairs = [(engine_model.glob, oracle_model.glob), *zip(engine_model.layers, oracle_model.layers)]
    for a, b in pairs:
        for k, v in vars(a).items():
            if v is not None:
                out[_key(v)] = getattr(b, k)
    return out


def _key(v) -> int:
    """A weight's identity: its device address on the GPU, the object itself on the host."""
    data = getattr(v, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return data.ptr  # a QWeight
    return getattr(v, "ptr", id(v))  # a 1-D device weight, or a host array


class Anchored:
    """The engine's operators, each checked against the faithful oracle's on its own inputs."""

    def __init__(self, engine_model, oracle_model, folded: bool = False):
        self.model, self.oracle = engine_model, oracle_model
        self.ops = engine_model.ops if folded else getattr(engine_model.ops, "unfolded", engine_model.ops)
        self.norm = None  # folded: a one-row RMSNorm held back, (its output, the oracle's x, w, eps)
        self.faithful = oracle_model.ops
        self.weights = _weights(engine_model, oracle_model)
        self.cfg = engine_model.config
        self.layer, self.errors = -1, []
        self.stored = None  # (layer state, positions, k, v) of the last KV store, checked by attention

    # ---- host copies -----------------------------------------------------------
    def host(self, v):
        """``v`` as the oracle takes it: weights -> the oracle's, device arrays
        -> host copies (f16 caches as float32), positions and rotations
        rebuilt, a recurrent state copied."""
        from engine.backends import cuda

        if isinstance(v, (list, tuple)):
            return type(v)(self.host(x) for x in v)
        if v is None or isinstance(v, (int, float, str, bool, np.integer, np.floating)):
            return v
        if _key(v) in self.weights:
            return self.weights[_key(v)]
        if isinstance(v, np.ndarray):
            return v.copy()
        if isinstance(v, cuda.Positions):
            return self.host(v.dev).astype(np.int64)
        if isinstance(v, cuda.Rotation):
            freq = None if v.freq_div is None else self.host(v.freq_div)
            cos, sin = np_ops.rope_angles(self.host(v.positions), v.n_rot, v.base, v.scale, freq)
            return cos, sin, v.rope_type
        if isinstance(v, cuda.RecurrentLayer):
            return SimpleNamespace(conv=self.host(v.conv), s=self.host(v.s))
        if isinstance(v, cuda.DArray):
            return np.asarray(self.model.backend.to_host(v)).reshape(v.shape).astype(
                np.float32 if v.dtype == np.float16 else v.dtype)
        if hasattr(v, "conv") and hasattr(v, "s"):  # the NumPy engine's recurrent state
            return SimpleNamespace(conv=v.conv.copy(), s=v.s.copy())
        raise TypeError(f"anchored: cannot copy a {type(v).__name__} to the host")

    # ---- the wrapped operators ------------------------------------------------------
    def __getattr__(self, name):
        fn = getattr(self.ops, name)
        if not callable(fn) or name.startswith("_"):
            return fn

        def op(*args, **kw):
            if self.norm is not None:
                y, x, w, eps = self.norm
                self.norm = None
                if name == "glu" and args[0] is y:  # the norm folded into gate/up's GEMV
                    rest = self.host(args[1:])
                    out = fn(*args, **kw)
                    want = self.faithful.glu(x, *rest, norm=(w, eps))
                    self._compare("glu norm", out, want, args, (x, *rest))
                    return out
                self.ops.settle()  # not folded: launched now, before anything reads it
                self._record("rms_norm", "decode", 0, self.host(y), self.faithful.rms_norm(x, w, eps))
            if name == "rms_norm" and not kw and hasattr(self.ops, "settle"):
                host_args = self.host(args)
                out = fn(*args)
                if isinstance(self.ops._pending, dict) and self.ops._pending["y"] is out:  # held back
                    self.norm = (out, *host_args)
                    return out
                self._compare(name, out, self.faithful.rms_norm(*host_args), args, host_args)
                return out
            if name == "attention":
                return self._attention(fn, *args, **kw)
            if name == "moe_ffn" and hasattr(self.ops, "moe_watch"):
                return self._moe_ffn(fn, args, kw)
            host_args, host_kw = self.host(args), {k: self.host(v) for k, v in kw.items()}
            out = fn(*args, **kw)
            if self.norm is None and getattr(self.ops, "_pending", None) is not None:
                self.ops.settle()  # a GEMV held for the Q/K heads: launched as it was, its output read now
            want = getattr(self.faithful, name)(*host_args, **host_kw)
            self._compare(name, out, want, args, host_args)
            if name == "embed":
                self.layer = 0
            elif name == "end_layer":
                self.layer += 1
            return out
        return op

    def _phase(self, x) -> str:
        return "decode" if x.shape[0] <= faithful.GEMV_MAX_TOKENS else "prefill"

    def _record(self, name: str, phase: str, i: int, got, want, max_position: int = 0) -> None:
        bound = gates.op_budget(name.split(" ")[0], max_position)
        self.errors.append(OpError(phase, self.layer, name, i, rel_error(got, want), bound))

    def _compare(self, name, out, want, args, host_args) -> None:
        rows = next((a for a in args if len(getattr(a, "shape", ())) >= 2), None)
        phase = "prefill" if rows is None else self._phase(rows)
        outs = out if isinstance(out, (list, tuple)) else [out]
        wants = want if isinstance(want, (list, tuple)) else [want]
        if name == "moe_route":  # the chosen experts exactly; the weights of each
            ids, w = self.host(outs[0]), self.host(outs[1])
            if not np.array_equal(np.sort(ids, axis=1), np.sort(wants[0], axis=1)):
                self.errors.append(OpError(phase, self.layer, name + " ids", 0, float("inf"), 0.0))
                return
            self._record(name, phase, 1, w, wants[1])
            return
        if name == "dot":  # one sum a row, which may cancel: its error measured against Σ|x·w|, fp32's scale
            x, w = host_args
            got, want = self.host(outs[0]), wants[0]
            scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
            self.errors.append(OpError(phase, self.layer, name, 0, rel_error(got, want) * np.linalg.norm(want)
                                       / max(float(np.linalg.norm(scale)), 1e-30), gates.op_budget(name)))
            return
        # a rotation's angles grow with the position (gates.ROPE_ANGLE_ERROR)
        rotation = args[0] if name in gates.ROPE_OPS else None
        max_pos = int(self.host(rotation.positions).max()) if hasattr(rotation, "positions") else 0
        for i, (o, w) in enumerate(zip(outs, wants)):
            self._record(name, phase, i, self.host(o), w, max_pos)
        for i, (a, h) in enumerate(zip(args, host_args)):  # a state the op advanced in place
            if isinstance(h, SimpleNamespace):
                after = self.host(a)
                self._record(name + " state", phase, 0, after.conv, h.conv)
                self._record(name + " state", phase, 1, after.s, h.s)

    def _moe_ffn(self, fn, args, kw):
        """The CUDA MoE FFN: in prefill, judged stage by stage (its ``moe_watch``
        hands over each stage as it is made; ``moe_stage_errors``), each stage
        on the engine's own output of the stage before, to fp32 order. The
        whole op is not judged there: its bf16 hidden rounds values the op
        computed itself, and where the engine's fp32 GLU output and the
        oracle's sit on either side of a rounding boundary, the hidden steps
        by one bf16 ulp, by as much as the data makes that element weigh
        (tiny-gemma4moe, H200 2026-12-05: the whole op 1.95e-3 from the
        oracle's, every stage at or under 3.4e-7, the hidden's rounding
        exact). Decode's GEMVs show no stages: the whole op, as every op."""
        host_args, host_kw = self.host(args), {k: self.host(v) for k, v in kw.items()}
        stages = {}
        self.ops.moe_watch = lambda stage, arrays: stages.update({stage: {k: self.host(v) for k, v in arrays.items()}})
        try:
            out = fn(*args, **kw)
        finally:
            self.ops.moe_watch = None
        if self.norm is None and getattr(self.ops, "_pending", None) is not None:
            self.ops.settle()  # as every op (__getattr__)
        if not stages:
            self._compare("moe_ffn", out, self.faithful.moe_ffn(*host_args, **host_kw), args, host_args)
            return out
        bound = inspect.signature(self.faithful.moe_ffn).bind(*host_args, **host_kw)  # the op's arguments by name
        bound.apply_defaults()
        a = bound.arguments
        errors = moe_stage_errors(a["x"], a["ids"], a["weights"], a["gate_exps"], a["up_exps"], a["down_exps"],
                                  a["add"], a["activation"], a["down_scale"], stages, self.host(out))
        for stage, err in errors.items():
            self.errors.append(OpError("prefill", self.layer, f"moe_ffn {stage}", 0, err, gates.OP_BUDGET_DEFAULT))
        return out

    def _attention(self, fn, q, keys, values, positions, scale, window=0):
        """Attention over the cache as the engine left it (its rows before
        this step checked against the store that wrote them), the oracle
        reading the same rows, rounded as its own store rounds them."""
        from engine.backends import cuda

        pos = self.host(positions)
        row = None
        if isinstance(keys, cuda.NewRow):  # decode: the kernel stores the step's row itself
            row = (self.host(keys.row), self.host(values.row))
            cache_k, cache_v = keys.cache, values.cache
        else:
            cache_k, cache_v = keys, values
        n = int(pos.max()) + 1
        hk, hv = self.host(cache_k)[:n], self.host(cache_v)[:n]
        f16 = getattr(cache_k, "dtype", np.float32) == np.float16 or getattr(self.faithful, "kv_f16", False)
        store = faithful.f16 if f16 else (lambda a: a)
        if row is not None:
            shape = hk.shape[1:]
            hk[pos], hv[pos] = store(row[0].reshape(shape)), store(row[1].reshape(shape))
        out = fn(q, keys, values, positions, scale, window)
        want = self.faithful.attention(self.host(q), hk, hv, pos, scale, window)
        phase = "decode" if q.shape[0] <= faithful.GEMV_MAX_TOKENS else "prefill"
        self._record("attention", phase, 0, self.host(out), want)
        # the rows this step stored: as the oracle's store rounds what the layer handed it
        k_new, v_new = row if row is not None else self.stored[2:] if self.stored is not None else (None, None)
        if k_new is not None:
            got_k, got_v = self.host(cache_k)[pos], self.host(cache_v)[pos]
            self._record("kv store", phase, 0, got_k, store(np.asarray(k_new).reshape(got_k.shape)))
            self._record("kv store", phase, 1, got_v, store(np.asarray(v_new).reshape(got_v.shape)))
        self.stored = None
        return out


def check(engine_model, oracle_model, prompt_ids, forced, folded: bool = False,
          prefill: bool = True) -> list[OpError]:
    """Run ``prompt_ids`` and then the ``forced`` tokens one at a time through
    ``engine_model`` with every op checked against ``oracle_model``'s (the
    NumPy engine with rounding="cuda", loaded from the same file with the
    engine's KV type). The engine must run eagerly (no graphs: each op's
    output is read back as it is made). ``folded``: its operators with the
    decode folds users run (cuda Folded), the norm folded into gate/up
    judged against the faithful fold ("glu norm"). ``prefill=False``: the
    prompt runs through the same operators unchecked and only the forced
    steps are judged (the oracle never needs the prompt: each op it checks
    reads the engine's own inputs, the KV rows and recurrent state
    included)."""
    anchored = Anchored(engine_model, oracle_model, folded)
    ops = engine_model.ops
    layers = engine_model.cache.layers
    originals = [getattr(layer, "store", None) for layer in layers]

    def watch(layer, store):
        def stored(positions, k, v):
            out = store(positions, k, v)
            anchored.stored = (layer, positions, anchored.host(k), anchored.host(v))  # attention checks the rows
            return out
        return stored

    for layer, store in zip(layers, originals):
        if store is not None:
            layer.store = watch(layer, store)
    try:
        engine_model.reset()
        if not prefill:
            engine_model.ops = anchored.ops
            engine_model.forward(prompt_ids)
            anchored.stored = None
        engine_model.ops = anchored
        if prefill:
            engine_model.forward(prompt_ids)
        for tok in forced:
            anchored.layer = -1
            engine_model.forward([tok])
    finally:
        engine_model.ops = ops
        for layer, store in zip(layers, originals):
            if store is not None:
                del layer.store  # the instance attribute; the class's method again
    return anchored.errors


STEPS = 4  # teacher-forced decode steps a prompt: every decode kernel runs, each at a few depths

# The deep pass (check_deep): a prompt of DEEP_PROMPT_TOKENS, then STEPS decode steps, their queries at
# positions 2108-2111. The reference prompts' decode steps stop at 1658 (the long prompt, 1614-1655
# tokens), so a bug that bites only at depth (harness/mutants.py DEEP_POSITION, 2048) would never meet
# the other passes. The split-K decode attention (launchers/attention.py decode_plan, attention.cu
# split_range) cuts a cache of n_ctx rows into min(ceil(n_ctx / SPLIT_MIN_KEYS), ceil(2 x SMs / KV heads))
# splits: 32 on the H200 (132 SMs) for every model the ops check runs, at the default n_ctx of 4096. A
# query's keys go to the splits in chunks of max(ceil(n_keys / 32), DEC_MIN_CHUNK) rounded up to 32;
# DEC_MIN_CHUNK is 32 x the warps across a head's tiles: 64 at GQA 3 and 8, 128 at GQA 2 and 4, 256 at
# GQA 1. So a full-attention layer's query at 2108-2111 reads 2109-2112 keys in 22 chunks of 96, 17 of
# 128 or 9 of 256, and the last, newest split holds at least 61 keys at each: 2108 is the shortest
# length past 2048 that leaves the last split that full at all three (at 2048 it holds 1-4 keys, at 2112
# 1-4 in chunks of 96). Sliding-window layers read their window only: one split or a few.
DEEP_PROMPT_TOKENS = 2108


def check_entry(entry, ref, quiet: bool = True) -> list[OpError]:
    """The catalog model on the CUDA engine as users run it (f16 KV cache),
    eagerly, held to the faithful oracle by every pass of ``check_model``."""
    import engine

    from . import catalog

    path = catalog.model_path(entry.name, progress=not quiet)
    cuda = engine.load(path, backend="cuda", kv_f16=True, eager=True)
    oracle = engine.load(path, backend="numpy", rounding="cuda", kv_f16=True)
    return check_model(cuda, oracle, ref)


def check_model(engine_model, oracle_model, ref) -> list[OpError]:
    """The ops check's passes: every prompt of ``ref`` (llama.cpp's prompt
    ids, its first STEPS tokens forced), each op against the faithful
    oracle's; then the first prompt's decode steps again with every GEMV on
    the bulk-copy kernel, which otherwise only matrices of 8 MB and more take
    (phase "decode bulk"), once more through the operators with their
    decode folds (phase "decode folded": the norm inside gate/up's GEMV),
    and STEPS decode steps past position 2048 (phase "decode deep":
    check_deep).
    ``engine_model`` runs eagerly; a NumPy engine plays it on the CPU (the
    bulk switch is the CUDA GEMV launcher's: nothing to it there)."""
    from engine.backends.cuda.launchers import gemv

    errors = []
    for case in ref.cases:
        errors += check(engine_model, oracle_model, case.prompt_ids, case.tokens[:STEPS])
    case = ref.cases[0]
    threshold, gemv.BULK_MIN_BYTES = gemv.BULK_MIN_BYTES, 0
    try:
        bulk = [e for e in check(engine_model, oracle_model, case.prompt_ids, case.tokens[:STEPS])
                if e.phase == "decode"]
    finally:
        gemv.BULK_MIN_BYTES = threshold
    for e in bulk:
        e.phase = "decode bulk"
    folded = [e for e in check(engine_model, oracle_model, case.prompt_ids, case.tokens[:STEPS], folded=True)
              if e.phase == "decode"]
    for e in folded:
        e.phase = "decode folded"
    return errors + bulk + folded + check_deep(engine_model, oracle_model)


def deep_case(model) -> tuple[list[int], list[int]]:
    """The deep pass's prompt and forced tokens: the deep set's text
    (catalog.deep_prompts, ~4.8k tokens) through the model's own tokenizer
    (engine/tokenizer.py, as `anvil generate --prompt` tokenizes), cut at
    DEEP_PROMPT_TOKENS; the STEPS tokens after the cut are forced."""
    from engine.errors import AnvilError
    from engine.tokenizer import Tokenizer

    from . import catalog

    ids = Tokenizer.from_gguf(model.gguf).encode(catalog.deep_prompts()[0])
    end = DEEP_PROMPT_TOKENS + STEPS
    if len(ids) < end or model.n_ctx < end:
        raise AnvilError(f"{model.path}: the ops check's deep pass needs {end} tokens of the deep prompt in the "
                         f"context (the text gives {len(ids)}, the context holds {model.n_ctx})")
    return ids[:DEEP_PROMPT_TOKENS], ids[DEEP_PROMPT_TOKENS:end]


def check_deep(engine_model, oracle_model) -> list[OpError]:
    """The deep pass (phase "decode deep"): STEPS decode steps at positions
    DEEP_PROMPT_TOKENS on (deep_case), each op against the oracle's, where
    the decode attention merges many splits. Only the decode steps are
    checked: the prompt runs unchecked (``check(prefill=False)``). Its
    check would cost the oracle a NumPy prefill of 2108 tokens, the whole
    pass's CPU time on the CUDA host (54 s for smollm2-135m, 27 s for
    gemma3-270m on one core of a slow CPU, against ~1-4 s for the decode
    steps), to judge what the other passes' long prompt already judges: the
    same prefill kernels, over up to 1655 positions. Every op checked is a
    decode step's, so all are kept (the embedding too, whose rows rule in
    _compare says "prefill": its one 2-D argument is the table). RoPE's
    bound grows with the position its rotation turns, read from the
    rotation itself (_compare): 1e-5 + 2111 x 2^-22 = 5.1e-4 at the last
    step, where fast-math's angle error is that large."""
    prompt, forced = deep_case(engine_model)
    errors = check(engine_model, oracle_model, prompt, forced, prefill=False)
    for e in errors:
        e.phase = "decode deep"
    return errors


def worst(errors: list[OpError]) -> dict[str, list[float]]:
    """Each op's largest error and the bound it was held to there, by "phase op"."""
    out: dict[str, list[float]] = {}
    for e in errors:
        k = f"{e.phase} {e.op}"
        if k not in out or e.error > out[k][0]:
            out[k] = [e.error, e.bound]
    return out


def over(errors: list[OpError]) -> list[OpError]:
    """The errors past their bound (NaN included), the worst of each op."""
    bad: dict[str, OpError] = {}
    for e in errors:
        k = f"{e.phase} {e.op}"
        if not e.error <= e.bound and (k not in bad or e.error > bad[k].error):
            bad[k] = e
    return list(bad.values())


# ---- one op by stages: where a composite op parts from the oracle ---------------------------------

def moe_stage_errors(x, ids, weights, gate_exps, up_exps, down_exps, add, activation, down_scale, stages,
                     y) -> dict[str, float]:
    """The CUDA prefill MoE FFN (its stages as cuda Ops ``moe_watch`` sees them) held to the
    faithful oracle stage by stage, each stage on the engine's own output of
    the stage before: the pairs sorted by expert, the routing weights with
    the expert scale folded in, the gather of x (bf16 rows, or int8 groups of
    32 for the int8 GEMM, with their scales and sums), the gate and up GEMMs,
    the GLU and its rounded hidden, the down GEMM and the weighted combine.
    ``stages`` holds the host copies by stage name (bf16 arrays as their
    bits), the op's arguments as the oracle takes them (the expert weights
    faithful.Weight). Each value is |engine - oracle| / |oracle|: the sort
    exact (0, else inf), rounded stages agree exactly when their inputs do,
    the sums to fp32 order (gates.OP_BUDGET_DEFAULT)."""
    k = ids.shape[1]
    pair_at = np.asarray(stages["gather"]["pair_at"]).astype(np.int64)
    sort = 0.0 if np.array_equal(pair_at, np.argsort(np.asarray(ids).reshape(-1), kind="stable")) else float("inf")
    scaled = stages["gather"]["weights"]  # what the combine reads
    expert = np.asarray(ids).reshape(-1)[pair_at]  # each sorted position's expert
    g, u = stages["gate_up"]["g"], stages["gate_up"]["u"]
    h = stages["glu"]["h"]
    d = stages["down"]["d"]
    errors = {"sort": sort,
              "expert scale": rel_error(scaled, weights if down_scale is None else weights * down_scale[ids])}

    def rows(stage, name, exact, w):
        """The engine's input rows of the GEMM of ``w`` (``{name}s`` bf16 bits, or
        ``{name}q``/``{name}d`` int8 groups), each rounding held to the oracle's of ``exact``."""
        st, label = stages[stage], {"x": "gather ({} x)", "h": "{} hidden"}[name]
        if faithful.moe_gemm.int8(w.qtype):
            q, scale = st[f"{name}q"][:, :exact.shape[1]], st[f"{name}d"][:, :exact.shape[1] // 32]
            groups = q.reshape(len(q), -1, 32)
            a = (groups.astype(np.float64) * scale[..., None]).reshape(q.shape)
            sums = scale * groups.astype(np.int32).sum(axis=2).astype(np.float32)  # one fp32 rounding, as the kernel
            errors[label.format("int8")] = rel_error(a, faithful.grouped_in(exact, w))
            errors[label.format("int8") + " sums"] = rel_error(st[f"{name}sum"][:, :scale.shape[1]], sums)
            return a
        a = faithful.from_bf16_bits(st[f"{name}s"])
        errors[label.format("bf16")] = rel_error(a, faithful.bf16(exact))
        return a

    def grouped(a, w):  # the oracle's grouped GEMM on the engine's own rounded rows
        out = np.zeros((a.shape[0], w.shape[1]), np.float32)
        for e in np.unique(expert):
            at = expert == e
            out[at] = faithful.grouped_rows(a[at], w.expert(e))
        return out

    act = np_ops.swiglu if activation == "silu" else np_ops.geglu
    xg = x[pair_at // k]
    errors["gate GEMM"] = rel_error(g, grouped(rows("gather", "x", xg, gate_exps), gate_exps))
    errors["up GEMM"] = rel_error(u, grouped(rows("gather", "x", xg, up_exps), up_exps))
    errors["GLU"] = rel_error(h, act(g, u))
    errors["down GEMM"] = rel_error(d, grouped(rows("glu", "h", h, down_exps), down_exps))
    pos_of = np.empty_like(pair_at)
    pos_of[pair_at] = np.arange(pair_at.size)
    combined = np.zeros_like(y)
    for j in range(k):  # in selection order, as moe_combine and the oracle sum
        combined += d[pos_of[np.arange(y.shape[0]) * k + j]] * scaled[:, j:j + 1]
    errors["combine"] = rel_error(y, combined if add is None else add + combined)
    return errors
