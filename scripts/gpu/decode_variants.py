"""The captured decode graph timed under variants, against the whole step,
in interleaved rounds: kernels left out (what each costs inside the graph)
and launcher knobs changed (tuning in the graph, not in isolation).

    python3 scripts/gpu/decode_variants.py MODEL.gguf [--depth N] [--ctx N] [--rounds 3] [--steps 128] [--each]
        [--knob gemv.WARPS_PER_SM=8,24 --knob attention.DEC_BLOCKS_PER_SM=3 --knob A.X=1+A.Y=2+edit=NAME ...]
        [--edit all | --edit NAME ...]
        [--no-leave-out] [--also-without LABEL ...]

The cache is sized as ``harness bench`` sizes it at that depth (engine.bench
bench_ctx: depth + 512 for its pp512 test), so the step timed is the one
the scoreboard's tg128 @ dN runs: the decode attention's split plan depends
on the cache size (launchers/attention.py decode_plan). ``--ctx`` sets it.

Leaving kernels out. Nsight Compute times each kernel alone with the caches
flushed, so it overstates small kernels and cannot see what programmatic
dependent launch overlaps; leaving a kernel out of the real graph measures
what the step would save without it. The outputs are wrong in such a
variant (the kernels after a dropped one read stale buffers); only the time
is read, and every kernel's work is the same whatever the values (a dense
model's step has no data-dependent branch). A launch is named "kernel
(grid)", e.g. "gemv_q4_k (256, 1, 1)"; ``--each`` adds a variant for every
such name in the step (a GEMV's grid tells the projections of one type
apart).

Knobs. ``--knob MODULE.NAME=V1,V2`` (a module of
engine/backends/cuda/launchers, or ``backend``: the switches of
engine/backends/cuda itself) adds a variant per value, the other knobs at
their defaults. A knob can size what the model allocates (the decode
attention's splits), so each knob variant loads the model afresh with the
knob set, and frees it after.

Kernel edits. ``--edit NAME`` (one of EDITS, or ``all``) times the step with
that kernel source edit made (compile.edited_kernels, as the mutants make
theirs): a phase of one kernel left out, or its order changed, where
leaving the whole kernel out says too little. Like a knob, each loads the
model afresh; like a left-out kernel, its outputs are wrong and only its
time is read.

``--also-without LABEL`` (a key of LEAVE_OUT) times the whole step and each
edit again with LABEL's launches left out: whether what an edit changes lies
in those kernels (a 2 x 2 of with and without).

Each variant is captured afresh and timed as ``steps`` greedy graph replays,
as ``engine bench`` times decode; round 0 warms up and is dropped.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import importlib
import re
import statistics
import sys
import time
from dataclasses import dataclass

LEAVE_OUT = {  # label: the launch names (regex) left out
    "rms_norm": r"^rms_norm",
    "add_rms_norm": r"^add_rms_norm",
    "qk_norm_rope": r"^qk_norm_rope",
    "attention_decode": r"^attention_decode",
    "argmax": r"^argmax",
    "GEMV (not GLU)": r"^gemv_(?!glu)",
    "GLU GEMV": r"^gemv_glu",
    "every GEMV": r"^gemv_",
    "all but GEMVs": r"^(?!gemv_)",
}

# name: (kernel file, (old, new), ...): phases of the decode kernels, for --edit
EDITS = {
    # the split decode attention: its keys, its partials and ticket, the last block's merge
    "attention: no keys read": ("attention.cu", ("kb < c1; kb += DEC_WT * 32) {", "kb < c0; kb += DEC_WT * 32) {")),
    "attention: splits exit after their partials": ("attention.cu", ("if (n_active == 1) return;", "return;")),
    "attention: no merge": ("attention.cu", ("if (!last_block(ticket, n_active)) return;",
                                             "last_block(ticket, n_active);\n    return;")),
    # the decode attention reading pos (written by the step's first kernel, two or more kernels back: done once
    # this one starts) before its wait, so the split's range is known when the wait returns
    "attention: pos before the wait": (
        "attention.cu",
        ("    KERNEL_START();\n    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n"
         "    const int qp = pos[t];\n",
         "    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n"
         "    const int qp = pos[t];\n    KERNEL_START();\n")),
    # the decode attention's splits without keys (all but one in a short context) exit before its wait: pos
    # is read before it, as above
    "attention: idle splits exit before the wait": (
        "attention.cu",
        ("    KERNEL_START();\n    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n",
         "    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n"),
        ("    split_range(qp, window, n_splits, s, c0, c1, n_active);\n",
         "    split_range(qp, window, n_splits, s, c0, c1, n_active);\n    if (s >= n_active) return;\n    KERNEL_START();\n")),
    # the decode attention's keys read before its wait (q and the step's row stale: a timing only), what
    # loading the cached rows under the kernel before it could save at most
    "attention: waits after its keys": (
        "attention.cu",
        ("    KERNEL_START();\n    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n",
         "    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n"),
        ("    // Merge the tile warps of each head.\n    __syncthreads();\n",
         "    // Merge the tile warps of each head.\n    KERNEL_START();\n    __syncthreads();\n")),
    # the decode attention lets the next kernel (the O GEMV, whose blocks request their weights before their
    # wait) start only once its keys and values are in: whether those requests slow the attention's own
    "attention: next kernel after its keys": (
        "attention.cu",
        ("    KERNEL_START();\n    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n",
         "    pdl_wait();\n    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;\n"),
        ("    // Merge the tile warps of each head.\n    __syncthreads();\n",
         "    // Merge the tile warps of each head.\n    pdl_launch_next();\n    __syncthreads();\n")),
    # every kernel that starts with KERNEL_START lets the next one start before its own wait (not after):
    # the GEMV after a one-block norm is then resident, and requests its weights, while the GEMV before
    # the norm still runs (decode_trace.py: the norm's slot is ~5 us, for one block's 16 KB)
    "KERNEL_START: next kernel before the wait": (
        "common.cuh",
        ("        pdl_wait();      \\\n        pdl_launch_next(); \\\n",
         "        pdl_launch_next(); \\\n        pdl_wait();      \\\n")),
    # the same for the one-block rms_norm alone (the attention norm before Q/K/V, the final norm before the
    # head), and for the Q/K norms with RoPE alone (the attention's blocks resident under the V GEMV)
    "rms_norm: next kernel before its wait": (
        "norm.cu",
        ("rms_norm(const float* x, const float* w, float* y, __nv_bfloat16* yb, int n, float eps) {\n"
         "    KERNEL_START();\n",
         "rms_norm(const float* x, const float* w, float* y, __nv_bfloat16* yb, int n, float eps) {\n"
         "    pdl_launch_next();\n    pdl_wait();\n")),
    "qk_norm_rope: next kernel before its wait": (
        "rope.cu",
        ("    KERNEL_START();\n    qk_norm_rope_impl<true>(", "    pdl_launch_next();\n    pdl_wait();\n    qk_norm_rope_impl<true>("),
        ("    KERNEL_START();\n    qk_norm_rope_impl<false>(",
         "    pdl_launch_next();\n    pdl_wait();\n    qk_norm_rope_impl<false>(")),
    # the bulk GEMV lets the next kernel start once its x is in registers, not right after its wait: the next
    # GEMV's weight requests (the GLU's: up to 29 MB) then do not queue ahead of this one's x loads
    "gemv bulk: next kernel after its x": (
        "gemv.cuh",
        ("        pdl_wait();\n        pdl_launch_next();\n    }\n    typename Q::Xs xs[P];\n",
         "        pdl_wait();\n    }\n    typename Q::Xs xs[P];\n"),
        ("            else Q::load_x(xs[p], x, first + p * NT);\n        }\n    }\n",
         "            else Q::load_x(xs[p], x, first + p * NT);\n        }\n    }\n    pdl_launch_next();\n")),
    # the step's argmax (the graph's last kernel): launched and waiting only; its scan's loads issued together;
    # no ticket and no last block (the token is not fed back: a timing only)
    "argmax: exits after its wait": (
        "argmax.cu", ("    KERNEL_START();\n    const int chunk = (n + gridDim.x - 1) / gridDim.x;",
                      "    KERNEL_START();\n    if (n > 0) return;\n    const int chunk = (n + gridDim.x - 1) / gridDim.x;")),
    "argmax: scan's loads together": (
        "argmax.cu", ("    bool finite = true;\n    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {",
                      "    bool finite = true;\n#pragma unroll 8\n    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {")),
    "argmax: no last block": (
        "argmax.cu", ("    if (!last_block(ticket, gridDim.x)) return;", "    return;")),
    # the argmax whole, the token fed back, the position held: every replay runs the same position (what
    # leaving the argmax out also does), so the context does not grow (a timing only)
    "argmax: holds the position": ("argmax.cu", ("        *pos += 1;", "        *pos += 0;")),
    # the GEMVs' activations not read: values from the thread index instead (what x's loads cost after the wait)
    "gemv: x not read": (
        "gemv.cuh",
        ("ld_x4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }",
         "ld_x4(const float* p) { const float f = (float)(threadIdx.x & 7); return make_float4(f, f + 1.f, f, 2.f); }")),
    # a quarter of x's bytes read (what x pre-quantised to int8 would load), or the folded norm's weight not read
    "gemv: x a quarter of the bytes": (
        "gemv.cuh",
        ("        v[i] = ld_x4(p + 4 * i);\n        m = amax4(v[i], m);", "        v[i] = i ? v[0] : ld_x4(p);\n        m = amax4(v[i], m);"),
        ("const float4 a = ld_x4(p + 32 * g), b = ld_x4(p + 32 * g + 4);", "const float4 a = ld_x4(p + 32 * (g & 2)), b = a;")),
    # half of x's loads (what a 16-bit copy of x would load; the folded norm's weight halved too)
    "gemv: x half the loads": (
        "gemv.cuh",
        ("        v[i] = ld_x4(p + 4 * i);\n        m = amax4(v[i], m);",
         "        v[i] = (i & 1) ? v[i - 1] : ld_x4(p + 4 * i);\n        m = amax4(v[i], m);"),
        ("const float4 a = ld_x4(p + 32 * g), b = ld_x4(p + 32 * g + 4);", "const float4 a = ld_x4(p + 32 * g), b = a;")),
    # x's loads through L2 only (ld.global.cg), not the L1 / texture path
    "gemv: x loads L2 only": (
        "gemv.cuh", ("ld_x4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }",
                     "ld_x4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }")),
    "gemv: norm weight not read": (
        "gemv.cuh", ("const float4 v = ld_x4(p.x), g = ld_x4(p.w);", "const float4 v = ld_x4(p.x), g = make_float4(1.f, 1.f, 1.f, 1.f);")),
    # (the bulk GEMV's weights requested after its wait: the knob gemv.PRE_STAGES=0)
}


@dataclass(frozen=True)
class Variant:
    label: str
    leave_out: str | None = None  # regex over launch names
    knob: tuple | None = None  # ((module, name, value), ...): set together
    edit: str | None = None  # a name of EDITS


@contextlib.contextmanager
def applied(v: Variant):
    """Inside the block, models load as variant ``v`` has them: its knobs set
    (the GEMV plans made afresh) and its kernel edit made; both undone after."""
    from engine.backends.cuda import compile as nvrtc
    from engine.backends.cuda.launchers import gemv

    defaults = [(mod, name, getattr(mod, name)) for mod, name, _ in v.knob or ()]
    with contextlib.ExitStack() as stack:
        if v.edit is not None:
            file, *edits = EDITS[v.edit]
            stack.enter_context(nvrtc.edited_kernels(file, *edits))
        for mod, name, value in v.knob or ():
            setattr(mod, name, value)
        gemv._plans.clear()  # plans follow the knobs
        try:
            yield
        finally:
            for mod, name, value in defaults:
                setattr(mod, name, value)
            gemv._plans.clear()


def parse_edit(name: str) -> list[Variant]:
    if name == "all":
        return [Variant(n, edit=n) for n in EDITS]
    if name not in EDITS:
        raise SystemExit(f"--edit {name!r}: expected 'all' or one of {', '.join(map(repr, EDITS))}")
    return [Variant(name, edit=name)]


def also_without(variants: list[Variant], labels: list[str]) -> list[Variant]:
    """The whole step and each edit of ``variants`` again with each label's
    launches (LEAVE_OUT) left out."""
    for label in labels:
        if label not in LEAVE_OUT:
            raise SystemExit(f"--also-without {label!r}: expected one of {', '.join(map(repr, LEAVE_OUT))}")
    return [Variant(f"{v.label} without {label}", leave_out=LEAVE_OUT[label], edit=v.edit)
            for label in labels for v in variants if v.label == "whole step" or (v.edit and not v.leave_out)]


def left_out(pattern: str | None, launch_name: str) -> bool:
    """Whether a variant leaves out a launch of this name ("kernel (grid)")."""
    return pattern is not None and re.search(pattern, launch_name) is not None


def launch_name(kernel: str, grid) -> str:
    return f"{kernel} {tuple(grid) + (1,) * (3 - len(grid))}"


def parse_knob(spec: str) -> list[Variant]:
    """``gemv.WARPS_PER_SM=8,24`` -> a variant per value (Python literals);
    ``attention.MIN_CHUNK=256+attention.TILE_WARPS=2`` -> one variant
    with both set; ``norm.MAX_THREADS=256+edit=NAME`` -> one variant with
    the knob set and the kernel edit NAME (of EDITS) made."""
    if "+" in spec:
        edits = [part[len("edit="):] for part in spec.split("+") if part.startswith("edit=")]
        parts = [parse_knob(part) for part in spec.split("+") if not part.startswith("edit=")]
        if any(len(p) != 1 for p in parts) or len(edits) > 1:
            raise SystemExit(f"--knob {spec!r}: one value a knob, and at most one edit=NAME, joined with +")
        for name in edits:
            parse_edit(name)  # a name of EDITS
        return [Variant(spec, knob=tuple(p[0].knob[0] for p in parts), edit=edits[0] if edits else None)]
    try:
        target, values = spec.split("=", 1)
        module, name = target.rsplit(".", 1)
        mod = importlib.import_module("engine.backends.cuda" if module == "backend"
                                      else f"engine.backends.cuda.launchers.{module}")
    except (ValueError, ImportError) as e:
        raise SystemExit(f"--knob {spec!r}: expected MODULE.NAME=V1,V2 with MODULE in launchers/, "
                         f"or backend (the CUDA backend's switches) ({e})")
    if not hasattr(mod, name):
        raise SystemExit(f"--knob {spec!r}: {mod.__name__} has no {name}")
    return [Variant(f"{target}={v}", knob=((mod, name, ast.literal_eval(v)),)) for v in values.split(",")]


def time_variants(variants: list[Variant], rounds: int, run, after_warmup=lambda: []) -> tuple[dict, dict]:
    """Each variant's times (µs a step) over ``rounds`` interleaved rounds
    after an untimed warm-up round; ``after_warmup()`` may add variants then.
    A knob value the launchers refuse (a decode layout over 8 warps) is
    dropped from ``variants`` and returned with its reason, not timed: the
    other variants still run. Each time is also printed to stderr as it is
    taken, so a run cut short by a time limit still says what it measured."""
    from engine.errors import AnvilError

    times, refused = collections.defaultdict(list), {}
    for r in range(rounds + 1):
        for v in list(variants):
            try:
                us = run(v)
            except AnvilError as e:
                if v.knob is None:
                    raise
                refused[v.label] = str(e)
                variants.remove(v)
                continue
            print(f"round {r}{' (warm-up, dropped)' if r == 0 else ''}: {v.label}: {us:.1f} us a step",
                  file=sys.stderr, flush=True)
            if r:
                times[v.label].append(us)
        if r == 0:
            variants += after_warmup()
    return times, refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=None, help="cache rows (default: as harness bench at --depth)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--each", action="store_true", help="also leave out each kernel-and-grid of the step alone")
    ap.add_argument("--knob", action="append", default=[], metavar="MODULE.NAME=V1,V2")
    ap.add_argument("--edit", action="append", default=[], metavar="NAME", help="a kernel edit of EDITS, or all")
    ap.add_argument("--no-leave-out", action="store_true", help="only the whole step and the knob variants")
    ap.add_argument("--also-without", action="append", default=[], metavar="LABEL",
                    help="the whole step and each edit again with these launches (a LEAVE_OUT label) left out")
    a = ap.parse_args()

    from engine.bench import bench_ctx
    from engine.model import Model

    # the bench's cache, or room for the warm-up steps past a long --steps
    n_ctx = a.ctx or bench_ctx(a.depth, n_gen=a.steps + 8)
    if n_ctx is not None and n_ctx < a.depth + a.steps + 8:
        raise SystemExit(f"--ctx {n_ctx}: depth {a.depth} and {a.steps} steps need {a.depth + a.steps + 8} rows")

    def load():
        return Model(a.model, backend="cuda", n_ctx=n_ctx)

    m = load()
    prompt = [(7 * i) % 1000 + 1 for i in range(max(a.depth, 4))]
    seen = collections.Counter()  # launches a step, by name, as captured with nothing left out

    def timed(model, pattern: str | None) -> float:
        b, dev = model.backend, model.backend.dev
        launch, names, captured = dev.launch, {}, collections.Counter()

        def filtered(fn, grid, block, args, shared=0):
            if int(fn) not in names:
                names.update({int(f): key[1] for key, f in dev._functions.items()})
            name = launch_name(names.get(int(fn), ""), grid)
            captured[name] += 1
            if not left_out(pattern, name):
                launch(fn, grid, block, args, shared)

        def step(tok: int) -> int:
            # the backend's step, not Model.decode_next: a variant's logits may be garbage,
            # even non-finite (the argmax then answers -1), and that is no error here
            nxt = b.decode_next(model, tok, model.pos)
            model.pos += 1
            return max(nxt, 0)

        model.reset()
        tok = int(model.forward(prompt).argmax())
        b.graph = None
        dev.launch = filtered  # the eager step and the capture see the filter; replays do not launch
        try:
            tok = step(tok)
        finally:
            dev.launch = launch
        if pattern is None and model is m:
            seen.clear()
            seen.update({k: v // 2 for k, v in captured.items()})  # the eager step, then the capture
        for _ in range(4):
            tok = step(tok)
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            tok = step(tok)
        dev.synchronize()
        return (time.perf_counter() - t0) / a.steps * 1e6

    def afresh(pattern: str | None = None) -> float:  # a model loaded as the variant has it (a knob, an edit)
        other = load()
        try:
            return timed(other, pattern)
        finally:
            other.backend.dev.free_all()

    def run(v: Variant) -> float:
        if v.edit is None and v.knob is None:
            return timed(m, v.leave_out)
        with applied(v):
            return afresh(v.leave_out)

    variants = [Variant("whole step")]
    if not a.no_leave_out:
        variants += [Variant(label, leave_out=p) for label, p in LEAVE_OUT.items()]
    for spec in a.knob:
        variants += parse_knob(spec)
    for name in a.edit:
        variants += parse_edit(name)
    variants += also_without(variants, a.also_without)

    def each_kernel() -> list[Variant]:  # after the warm-up round, which counted the step's launches
        return [Variant(name, leave_out="^" + re.escape(name) + "$") for name in sorted(seen)] if a.each else []

    times, refused = time_variants(variants, a.rounds, run, each_kernel)
    whole = statistics.median(times["whole step"])
    print(f"decode step at depth {a.depth}, median of {a.rounds} rounds of {a.steps} graph replays")
    print("| variant | launches left out | us a step | saved us | saved % | saved us a launch |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        t = statistics.median(times[v.label])
        n = sum(c for name, c in seen.items() if left_out(v.leave_out, name))
        per = f"{(whole - t) / n:.2f}" if n else ""
        print(f"| {v.label} | {n} | {t:.1f} | {whole - t:.1f} | {100 * (whole - t) / whole:.1f} | {per} |")
    for label, why in refused.items():
        print(f"| {label} | refused: {why} | | | | |")


if __name__ == "__main__":
    main()
