"""``harness diff MODEL --prompt TEXT``: the first op where two runs part.

One prefill of the prompt through two implementations, every named
intermediate tensor of every layer captured, lined up by llama.cpp's own
names (``attn_norm-3``, ``Qcur-3``, ``kqv_out-3``, ``l_out-3`` ...), and the
normalised error ``|a - b| / |b|`` printed per layer and op, with the first
one past the tolerance marked. The sides:

- **llama.cpp** (the default reference): llama-cpp-python with its
  scheduler's eval callback (``cb_eval``) copying out each named tensor as
  it is computed, on the CPU, F32 KV cache, flash attention off; on a
  quantised catalog model it runs the model's F32 twin, so fp32 noise
  (~1e-6) is all that should separate it from the NumPy engine.
- **the engine** on a backend (``numpy`` or ``cuda``): its operators wrapped
  by a tracer that records every op's output; each family module maps
  llama.cpp's names onto (op, occurrence in the layer, output)
  (``llama_cpp_names``).

``--against numpy`` holds the CUDA engine to the NumPy engine the same way,
``--against faithful`` to the NumPy engine rounding as the CUDA engine does
(engine/backends/numpy/faithful.py; both with an f16 KV cache);
``--mutant NAME`` switches a mutant of ``harness mutants`` on in the engine
under test, to show where a planted bug first shows.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

GGML_TYPE_F32 = 0
GGML_MAX_DIMS = 4


class _GGMLTensor(ctypes.Structure):
    """The head of ggml.h's ``struct ggml_tensor`` (llama.cpp as vendored by
    llama-cpp-python 0.3.36), up to the fields read here."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * GGML_MAX_DIMS), ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def llama_cpp_tensors(model_path: Path, tokens: list[int], names: set[str], settings: dict) -> dict[str, np.ndarray]:
    """Run llama.cpp over ``tokens`` in one batch and return each wanted
    tensor (``name-layer``) as ``[rows, values per row]`` float32."""
    from . import reference  # first: llama.cpp before NumPy's BLAS (see reference.py)

    llama_cpp = reference._import_llama_cpp()
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    got: dict[str, list[np.ndarray]] = {}

    def base(name: str) -> str:
        return name.rsplit("-", 1)[0] if name[-1:].isdigit() and "-" in name else name

    def callback(t_ptr, ask, _user):
        t = _GGMLTensor.from_address(t_ptr)
        name = t.name.decode(errors="replace")
        if ask:
            return base(name) in names
        ne = list(t.ne)
        contiguous = t.nb[0] == 4 and all(t.nb[i] == t.nb[i - 1] * ne[i - 1] for i in range(1, GGML_MAX_DIMS))
        if t.type == GGML_TYPE_F32 and contiguous:
            out = np.empty(int(np.prod(ne)), np.float32)
            lib.ggml_backend_tensor_get(t_ptr, out.ctypes.data, 0, out.nbytes)
            # tokens run along the highest axis longer than 1 ([n, T], [D, H, T]); a
            # single row (llama.cpp's last layer keeps only the last token) has none
            k = max((i for i in range(1, GGML_MAX_DIMS) if ne[i] > 1), default=0)
            rows = ne[k] if k else 1
            got[name] = out.reshape(rows, -1)  # the last of a name wins: the graph's final use of it
        return True

    cb = llama_cpp.llama_cpp.ggml_backend_sched_eval_callback(callback)
    real_defaults = llama_cpp.llama_cpp.llama_context_default_params

    def with_callback():
        p = real_defaults()
        p.cb_eval, p.cb_eval_user_data = cb, None
        return p

    n = max(len(tokens), 8)
    llama_cpp.llama_cpp.llama_context_default_params = with_callback
    try:
        llm = reference.LlamaCppModel(model_path, {**settings, "n_ctx": max(settings["n_ctx"], n),
                                                   "n_batch": n, "n_ubatch": n})
    finally:
        llama_cpp.llama_cpp.llama_context_default_params = real_defaults
    try:
        llm.forward(tokens)
    finally:
        llm.close()
    return got


class Tracer:
    """An engine's operators, recording each op's outputs (on the host) by
    (layer, op, occurrence in the layer); layer -1 is before the first
    layer, n_layer after the last."""

    def __init__(self, ops, to_host):
        self._ops, self._host = ops, to_host
        self.layer, self.counts, self.records = -1, {}, {}

    def __getattr__(self, name):
        fn = getattr(self._ops, name)
        if not callable(fn):
            return fn

        def traced(*args, **kw):
            out = fn(*args, **kw)
            n = self.counts.get((self.layer, name), 0)
            self.counts[(self.layer, name)] = n + 1
            outs = out if isinstance(out, (list, tuple)) else [out]
            self.records[(self.layer, name, n)] = [np.array(self._host(o), np.float32).reshape(o.shape[0], -1)
                                                   for o in outs]
            if name == "embed":
                self.layer = 0
            elif name == "end_layer":
                self.layer += 1
            return out
        return traced


def engine_tensors(model, tokens: list[int]) -> dict[str, np.ndarray]:
    """One traced prefill; the records under llama.cpp's names."""
    # the operators themselves: the CUDA decode's folds (Folded: norms, heads) would leave outputs unwritten
    ops = model.ops
    tracer = Tracer(getattr(ops, "unfolded", ops), model.backend.to_host)
    model.ops = tracer
    try:
        model.reset()
        logits = model.forward(tokens)
    finally:
        model.ops = ops
    names = model.family.llama_cpp_names(model.config)
    out = {}
    for il in range(model.config.n_layer):
        for name, (op, k, i) in names.items():
            rec = tracer.records.get((il, op, k))
            if rec is not None:
                out[f"{name}-{il}"] = rec[i]
    last = model.config.n_layer
    if (last, "rms_norm", 0) in tracer.records:
        out["result_norm"] = tracer.records[(last, "rms_norm", 0)][0]
    out["result_output"] = np.asarray(logits, np.float32).reshape(1, -1)
    return out


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """|a - b| / |b| over the rows both have (llama.cpp keeps only the last
    row in its last layer: the rows are aligned from the end)."""
    n = min(a.shape[0], b.shape[0])
    a, b = a[-n:].astype(np.float64), b[-n:].astype(np.float64)
    if a.shape != b.shape:
        return float("nan")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(test: dict, ref: dict, order: list[str], n_layer: int, tol: float):
    """Rows (layer, [(name, error)]) in graph order, and the first (layer, name, error) past ``tol``."""
    rows, first = [], None
    for il in [*range(n_layer), None]:
        keys = [f"{n}-{il}" for n in order] if il is not None else ["result_norm", "result_output"]
        errs = [(k.rsplit("-", 1)[0] if il is not None else k, rel_error(test[k], ref[k]))
                for k in keys if k in test and k in ref]
        rows.append(("out" if il is None else il, errs))
        for name, e in errs:
            if first is None and not e <= tol:
                first = ("out" if il is None else il, name, e)
    return rows, first


def format_rows(rows, first, tol: float, test_name: str, ref_name: str) -> str:
    from .table import markdown

    names = list(dict.fromkeys(n for _, errs in rows[:-1] for n, _ in errs))
    table = []
    for il, errs in rows:
        by = dict(errs)
        cells = [("◀ " if first and (il, n) == first[:2] else "") + (f"{by[n]:.1e}" if n in by else "—")
                 for n in (names if il != "out" else ["result_norm", "result_output"])]
        table.append([str(il)] + cells + [""] * (len(names) - len(cells)))
    head = ["layer"] + names
    verdict = (f"first divergence past {tol:g}: layer {first[0]}, {first[1]} (|{test_name} - {ref_name}| / "
               f"|{ref_name}| = {first[2]:.3g})" if first else f"no op differs by more than {tol:g}")
    return markdown(head, table) + "\n" + verdict


def main_diff(args, path: Path) -> int:
    """``harness diff``: ``path`` is the model file (a catalog model's, fetched)."""
    from engine.errors import AnvilError
    from engine.gguf_file import GGUFFile
    from engine.tokenizer import Tokenizer

    from . import catalog, mutants, reference

    cat = catalog.load()
    tokens = Tokenizer.from_gguf(GGUFFile(path)).encode(args.prompt)
    from engine.model import UBATCH

    if not 2 <= len(tokens) <= UBATCH:  # one micro-batch: each op is traced once per layer
        raise AnvilError(f"--prompt: {len(tokens)} tokens; give 2 to {UBATCH}")
    if args.mutant and args.mutant not in mutants.BY_NAME:
        raise AnvilError(f"unknown mutant {args.mutant}; the suite has: {', '.join(mutants.BY_NAME)}")
    import contextlib

    import engine

    faithful = args.against == "faithful"  # both sides with the CUDA engine's f16 KV cache

    def load(backend: str, **options):
        # CUDA: eager, so a prompt of a full micro-batch is not captured as a graph (the tracer copies each
        # operator's output to the host, which a capture cannot hold)
        return engine.load(path, backend=backend, **options,
                           **({"kv_f16": faithful, "eager": True} if backend == "cuda" else {}))

    with mutants.BY_NAME[args.mutant].on() if args.mutant else contextlib.nullcontext():
        model = load(args.backend)
        test = engine_tensors(model, tokens)
    names = list(model.family.llama_cpp_names(model.config))
    if args.against == "llama.cpp":
        e = cat.get(args.model)
        twin = e is not None and "twin" in e.reference_sets and not args.no_twin
        ref_path = catalog.twin_path(args.model, catalog=cat) if twin else path
        ref = llama_cpp_tensors(ref_path, tokens, {*names, "result_norm", "result_output"}, reference.CPU_SETTINGS)
        ref_name = "llama.cpp" + (" (F32 twin)" if twin else "")
    elif faithful:
        ref, ref_name = engine_tensors(load("numpy", rounding="cuda", kv_f16=True), tokens), "faithful numpy"
    else:
        ref, ref_name = engine_tensors(load("numpy"), tokens), "numpy"
    rows, first = compare(test, ref, names, model.config.n_layer, args.tol)
    test_name = args.backend + (f" + {args.mutant}" if args.mutant else "")
    print(f"{path.name}: {len(tokens)} tokens; normalised error |{test_name} - {ref_name}| / |{ref_name}| per op")
    print(format_rows(rows, first, args.tol, test_name, ref_name))
    return 1 if first else 0
