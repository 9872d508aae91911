"""Where the gate's thresholds come from: llama.cpp's own spread and stated
precision budgets, never the engine under test.

``harness reference --variation`` runs llama.cpp against its own references
under settings a correct engine cannot be expected to follow, each run
teacher-forced on the reference's tokens and measured exactly as the engine
is (``validate.validate_model``). Which settings count as noise depends on
the reference set:

- **cpu on a quantised file**: ``f32-twin``, llama.cpp on the model's F32
  twin (the same weights, no 8-bit activation rounding), is the exact size
  of llama.cpp's activation rounding, which the engine does not do; and
  ``ubatch-1`` (the prompt fed one token at a time: other kernels). The
  f16kv set's are the same, both with its F16 KV cache (a variant changes
  only its own settings).
- **fp32** (the twin set, and the cpu set of an F32 model): ``ubatch-1``
  and ``threads-1``; both sides compute in fp32, so the spread is tiny and
  the stated fp32 budget below sets the bound. Flash attention is not noise
  here: on the CPU it rounds K and V to f16.
- **gpu** (llama.cpp with CUDA): ``flash-attn`` (the other attention path),
  ``ubatch-1``, both together, and ``ubatch-64`` (``GPU_VARIANTS``).

A proposal is ``max(HEADROOM x spread, budget)`` per check (KL scales with
the square of a logit error, so its headroom is squared). The share of a
prompt's steps that may be near-tie flips is HEADROOM x the largest share
llama.cpp flipped in one prompt under one variant (judged with an infinite
gate, every flip of its own is a near-tie); no budget stands in for it. It
is printed beside the catalog's current value, marked where it would loosen
the gate; nothing is written: a threshold changes only by editing the
catalog.

That is the NumPy engine's gate. Every CUDA gate takes a headroom per check
that holding each realisation out measures (``held_out_headroom``,
``propose_measured``), not a factor chosen: against the CPU-made sets, over
four realisations of the rounding-faithful oracle (``measure_faithful``:
what the engine's roundings cost), where 1.25 over the largest of four
failed 27 of 196 sound realisations held out; against llama.cpp's CUDA
references (gpu, deep), over llama.cpp's own CUDA realisations
(``GPU_VARIANTS``), where 1.25 over the largest of the others failed 4 of 24
(reports/notes/cuda-gate-2026-12-04.md §9-10, §19).
"""

from __future__ import annotations

import sys

import numpy as np

from . import catalog

HEADROOM = 1.25

# fp32 on both sides, only summation order differs: logits of |z| <= ~30
# accumulate relative rounding of ~1e-6 over a few thousand-term sums per
# layer; 1e-3 leaves a wide margin and is still 30x under the smallest
# planted bug seen (RoPE base x1.01: 0.032). The margin shift is a difference
# of two logits (2x); KL of a perturbation d is ~ var(d)/2.
FP32_BUDGET = catalog.Gate(margin=2e-3, logit=1e-3, kl=1e-6)
# llama.cpp's CPU GELU reads an f16 table (GGML_GELU_FP16: input and output
# rounded to f16, relative 2^-11 each), the engine computes tanh-GELU in
# fp32: ~5e-4 relative on every FFN activation, ~5e-3 on logits of ~10.
# 4x that on the logit and the margin; KL ~ var(d)/2.
GELU_F16_BUDGET = catalog.Gate(margin=0.02, logit=0.02, kl=2e-4)
MIN_MARGIN = 0.01  # without a budget: a near-tie in a reference's printing precision

# The CUDA engine's operators against the rounding-faithful oracle's on the same
# inputs (harness/anchored.py): the normalised error |cuda - oracle| / |oracle|
# of each output. What may differ, op by op:
# - sums in another fp32 order (GEMV, GEMM, norms, softmax, the DeltaNet
#   recurrence): ~2^-24·√terms, under 1e-6 for the widths here; fast-math exp,
#   rsqrt and division: a few ulp (~3e-7). A one-output product (``dot``: a
#   gate's logit) may cancel, so its error is measured against Σ|x·w|, the
#   scale of fp32's error, not against its own value;
# - the roundings themselves see identical inputs (the int8 activations of a
#   GEMV, a GEMM's bf16 inputs, the f16 KV store) and agree bit for bit;
# - a rounding inside an op of a value the op computed itself moves one step
#   where the fp32 value (off by ε ~ 1e-6) lies within ε of a boundary: a
#   share ε/u of the elements by u each, a normalised √(ε·u). The MoE hidden
#   (int8 at u ~ 1/127 of its group's largest in decode, bf16 at 2^-8 in
#   prefill): √(1e-6 · 8e-3) ~ 9e-5; attention's P in f16 (u = 2^-11):
#   √(1e-6 · 5e-4) ~ 2e-5, spread over the keys' values. That estimate
#   takes the stepped elements to weigh as much as the rest; where a few
#   dominate their rows, their steps weigh that much (1.95e-3 of the whole
#   op on tiny-gemma4moe, every stage matching). So the CUDA prefill
#   MoE FFN, whose stages the engine hands over (cuda Ops.moe_watch), is
#   judged stage by stage instead (anchored.moe_stage_errors: each stage on
#   the engine's own output of the one before, the sums to fp32 order, the
#   roundings exact: OP_BUDGET_DEFAULT); the whole-op bound below is for
#   the decode GEMVs, which hand none over.
# - RoPE: the kernels form the angle in fp32 with fast-math __powf, __sinf
#   and __cosf, as llama.cpp's CUDA build does (rope.cuh): an absolute error
#   of ~|θ|·2^-22, θ up to the position, which the oracle's float64 angles
#   do not make. A rotation at positions up to P: 2^-22·P on top.
# Three times the estimate, rounded up. A wrong rounding costs far more: the
# exact NumPy engine against the faithful one measures 2.5e-3 (bf16 GEMM),
# 5e-3 (int8 GEMV), 2.5e-4 (f16 KV) and 1.2e-4 (f16 Q and P) on tiny-qwen3moe.
OP_BUDGET = {"attention": 1e-4, "moe_ffn": 3e-4}
OP_BUDGET_DEFAULT = 1e-5
ROPE_OPS = ("rope", "qk_norm_rope")
ROPE_ANGLE_ERROR = 2.0 ** -22  # per radian of angle: __sinf/__cosf and __powf (rope.cuh)


def op_budget(op: str, max_position: int = 0) -> float:
    """The bound on one op's normalised error (``max_position``: the largest
    position a rotation turns)."""
    rope = ROPE_ANGLE_ERROR * max_position if op in ROPE_OPS else 0.0
    return OP_BUDGET.get(op, OP_BUDGET_DEFAULT) + rope


# llama.cpp's own spread (architectures.md §8): settings a correct engine
# cannot be expected to follow, each run teacher-forced on a reference's
# tokens and measured exactly as the engine is. flash-attn: the other
# attention path (FA kernels instead of KQ/softmax/PV matmuls); ubatch-1:
# the prompt fed one token at a time (decode kernels instead of prefill
# ones); threads-1: another CPU summation split; f32-twin: the quantised
# file's F32 twin (no q8_0 activation rounding on the CPU). On the GPU the
# prompt's products take MMQ at 9 tokens and more, MMVQ under
# (ggml-cuda.cu ggml_cuda_mul_mat, MMVQ_MAX_BATCH_SIZE), and MMQ splits
# each product's sum over its stream-k blocks by the count of tiles, which
# the batch sets (mmq.cuh): ubatch-64 is the same kernels summing in
# another order; flash-attn-ubatch-1 the one-token products with the FA
# attention (the two axes together, so that the four realise matmul x
# attention both ways each).
FP32_VARIANTS = {"ubatch-1": {"n_batch": 1, "n_ubatch": 1}, "threads-1": {"n_threads": 1}}
QUANT_VARIANTS = {"f32-twin": "twin", "ubatch-1": {"n_batch": 1, "n_ubatch": 1}}
GPU_VARIANTS = {"flash-attn": {"flash_attn": True}, "ubatch-1": {"n_batch": 1, "n_ubatch": 1},
                "flash-attn-ubatch-1": {"flash_attn": True, "n_batch": 1, "n_ubatch": 1},
                "ubatch-64": {"n_batch": 64, "n_ubatch": 64}}


def is_fp32(entry: catalog.Entry, reference_set: str) -> bool:
    """Both sides compute in fp32: llama.cpp on the CPU on F32 weights (the
    twin, or a model without one: its file is F32 already), or the NumPy
    oracle on an F32 file."""
    return reference_set == "twin" or (reference_set in ("cpu", "oracle") and "twin" not in entry.reference_sets)


def variants(entry: catalog.Entry, reference_set: str) -> dict:
    """name -> settings change, or "twin" (run the F32 twin instead)."""
    if catalog.REFERENCE_SETS[reference_set] == "gpu":
        return GPU_VARIANTS
    return FP32_VARIANTS if is_fp32(entry, reference_set) else QUANT_VARIANTS


def judged_backend(reference_set: str) -> str:
    """The engine whose gate a variation of ``reference_set`` measures: CUDA
    against llama.cpp's CUDA references, NumPy against its CPU ones."""
    return "cuda" if catalog.REFERENCE_SETS[reference_set] == "gpu" else "numpy"


def budget(entry: catalog.Entry, reference_set: str) -> catalog.Gate | None:
    if not is_fp32(entry, reference_set):
        return None
    made_by_llamacpp = reference_set not in catalog.ENGINE_SETS  # its CPU GELU reads an f16 table
    return GELU_F16_BUDGET if entry.arch in ("gemma3", "gemma4") and made_by_llamacpp else FP32_BUDGET


def propose(entry: catalog.Entry, reference_set: str, spread: list) -> catalog.Gate:
    """Thresholds from llama.cpp's spread (ModelResults of its variants; a
    spread saved before KL was measured sets no KL bound)."""
    floor = budget(entry, reference_set) or catalog.Gate(MIN_MARGIN, 0.0, 0.0)
    margin = max(r.max_margin_shift for r in spread)
    logit = max(r.max_logit_diff for r in spread)
    kl = None if any(r.max_kl is None for r in spread) else max(r.max_kl for r in spread)
    return catalog.Gate(margin=round2(max(floor.margin, HEADROOM * margin)),
                        logit=round2(max(floor.logit, HEADROOM * logit)),
                        kl=None if kl is None else round2(max(floor.kl, HEADROOM ** 2 * kl)),
                        flips=propose_flips((len(c.flips), c.n_steps) for r in spread for c in r.cases))


def propose_flips(counts) -> float:
    """The near-tie flip share from llama.cpp's (flips, steps) per prompt and
    variant: HEADROOM x the largest (0: it never flipped, so no flip passes;
    at most 1, every step)."""
    return min(1.0, round2(HEADROOM * max((f / n for f, n in counts if n), default=0.0)))


def round2(x: float) -> float:
    """Two significant digits: how every proposed threshold is written."""
    return float(f"{x:.2g}")


def measure(cat, names: list[str], reference_set: str):
    """Run llama.cpp's variants against the references of ``reference_set``:
    a list of (model, variant, settings, ModelResult)."""
    from . import refs, validate
    from .reference import LlamaCppModel

    out = []
    for name in names:
        e = catalog.entry(name, cat)
        if reference_set not in e.reference_sets:
            continue
        ref = refs.for_entry(e, reference_set)  # on another file, llama.cpp would pass for its own spread
        for variant, change in variants(e, reference_set).items():
            print(f"{name}: llama.cpp {variant} vs its {reference_set} references...", file=sys.stderr, flush=True)
            on_twin = change == "twin" or reference_set == "twin"
            path = catalog.twin_path(name, catalog=cat) if on_twin else catalog.model_path(name, catalog=cat)
            settings = {**ref.settings, **({} if change == "twin" else change)}
            llm = LlamaCppModel(path, settings)
            try:
                # judged with an infinite gate: only the measurements are wanted
                gate = catalog.Gate(margin=float("inf"))
                r = validate.validate_model(llm, e, ref, f"llama.cpp {variant}", tier=reference_set, gate=gate)
            finally:
                llm.close()
            out.append((name, variant, settings, r))
    return out


# The faithful oracle's realisations: its sums in fp32 (BLAS) or exactly, and
# RoPE's angles formed in fp32 as the kernels form them or off by their
# fast-math error. A model's roundings amplify such differences into ~0.3
# logits, so one realisation's largest spread is itself noisy (±50% between
# two); the CUDA engine is one more, and its gate the largest of these times a
# headroom that the realisations measure themselves (``held_out_headroom``).
FAITHFUL_ENGINE = "anvil faithful oracle"  # a variation record's "engine"
FAITHFUL_VARIANTS = {"faithful": "fp32", "faithful-f64": "fp64", "faithful-rope32": "fp32",
                     "faithful-rope-fast": "fp32"}
CHECKS = {"margin": "max_margin_shift", "logit": "max_logit_diff", "kl": "max_kl"}


def ceil2(x: float) -> float:
    """``x`` rounded up to two significant digits: a bound is never written
    under what it was derived to cover."""
    if x <= 0 or not np.isfinite(x):
        return float(x)
    digits = 1 - int(np.floor(np.log10(x)))
    return float(np.ceil(round(x * 10.0 ** digits, 9)) / 10.0 ** digits)


def near_tie_span(r) -> float:
    """What a realisation's near-tie bound (the margin check) must cover: its
    largest margin shift, and at each of its flips both llama.cpp's margin
    and its own gap, or the gate would call its own flips drift."""
    return max([r.max_margin_shift] + [max(f.ref_margin, f.engine_margin) for c in r.cases for f in c.flips])


def _measure(r, check: str) -> float:
    return near_tie_span(r) if check == "margin" else getattr(r, CHECKS[check])


def _most_flips(r) -> list[tuple[int, int]]:
    return [(len(c.flips), c.n_steps) for c in r.cases if c.n_steps]


def held_out_headroom(cat, measured: dict) -> dict[str, float]:
    """The headroom over the largest spread of a set's realisations (the
    faithful oracle's, or llama.cpp's CUDA ones), per check, as they measure it: each one held out and set against the
    largest of the others on the same model and set; the headroom is the
    largest such ratio over every pair, rounded up. Pairs where the stated
    budget binds (a realisation at or under it) do not count: there the
    budget is the bound, and a realisation alone in carrying an error the
    budget covers (the fast-math RoPE on an F32 file) is no sample of the
    others' spread. "flips": the most near-tie flips a held-out realisation
    made in one prompt beyond the most the others made there (a count)."""
    need = {c: 1.0 for c in CHECKS} | {"flips": 0.0}
    for (name, rset), spread in measured.items():
        if name not in cat or len(spread) < 2:
            continue
        floor = budget(cat[name], rset) or catalog.Gate(MIN_MARGIN, 0.0, 0.0)
        spread_sets = [c for c in CHECKS if all(_measure(r, c) is not None for r in spread)  # KL: once not measured
                       and min(_measure(r, c) for r in spread) > getattr(floor, c)]
        for i, held in enumerate(spread):
            others = spread[:i] + spread[i + 1:]
            for check in spread_sets:
                need[check] = max(need[check], _measure(held, check) / max(_measure(r, check) for r in others))
            for k, (n, _) in enumerate(_most_flips(held)):
                need["flips"] = max(need["flips"], n - max(_most_flips(r)[k][0] for r in others))
    return {c: ceil2(v) for c, v in need.items()}


def propose_measured(entry: catalog.Entry, reference_set: str, spread: list, headroom: dict) -> catalog.Gate:
    """The CUDA engine's gate from a set's realisations (``spread``: the
    faithful oracle's against a CPU-made set, llama.cpp's own against its
    CUDA references): per check the largest times its headroom
    (``held_out_headroom``), never under the stated budget; a prompt
    may have as many near-tie flips as the realisations made in it at most,
    plus the held-out excess, as a share of its steps. Each realisation
    passes the gate it is part of, its flips included."""
    floor = budget(entry, reference_set) or catalog.Gate(MIN_MARGIN, 0.0, 0.0)
    bound = {c: None if any(_measure(r, c) is None for r in spread)  # a record from before KL was measured
             else ceil2(max(getattr(floor, c), headroom[c] * max(_measure(r, c) for r in spread))) for c in CHECKS}
    most = [max(f) for f in zip(*([n for n, _ in _most_flips(r)] for r in spread))]
    steps = [n for _, n in _most_flips(spread[0])]
    flips = max(((m + headroom["flips"]) / n for m, n in zip(most, steps)), default=0.0)
    return catalog.Gate(margin=bound["margin"], logit=bound["logit"], kl=bound["kl"], flips=min(1.0, ceil2(flips)))


def held_out_failures(cat, measured: dict, headroom: dict) -> list[tuple[str, str, str, list[str]]]:
    """Each realisation judged by the gate the others propose (its checks
    past that gate): the rule's own false-fail rate, measured without the
    engine under test."""
    from .validate import is_near_tie

    out = []
    for (name, rset), spread in measured.items():
        if name not in cat or len(spread) < 2:
            continue
        for i, held in enumerate(spread):
            g = propose_measured(cat[name], rset, spread[:i] + spread[i + 1:], headroom)
            bad = [c for c, a in CHECKS.items() if getattr(g, c) is not None and not getattr(held, a) <= getattr(g, c)]
            for c in held.cases:
                near = [f for f in c.flips if is_near_tie(f, g.margin)]
                bad += ["drift"] * (len(near) < len(c.flips))
                bad += ["flips"] * (c.n_steps and len(near) / c.n_steps > g.flips)
            if bad:
                out.append((name, rset, held.variant, sorted(set(bad))))
    return out


def rope_angles_fp32(positions, n_rot: int, base: float, scale: float, freq_divisors=None):
    """RoPE's cos/sin with the angle formed in fp32 as the kernels form it
    (rope.cuh: pos · theta_scale^i, theta_scale = base^(-2/n_rot) in fp32, then
    / divisor, · scale) where the oracle forms it in float64: the
    "faithful-rope32" realisation (the kernels' fast-math sines err more still)."""
    f32 = np.float32
    theta_scale = f32(base) ** f32(-2.0 / n_rot)
    inv = theta_scale ** np.arange(n_rot // 2, dtype=f32)
    theta = np.asarray(positions).astype(f32)[:, None] * inv[None, :]
    if freq_divisors is not None:
        theta = theta / freq_divisors.astype(f32)
    theta = f32(scale) * theta
    return np.cos(theta).astype(np.float64), np.sin(theta).astype(np.float64)


def rope_angles_fast(positions, n_rot: int, base: float, scale: float, freq_divisors=None):
    """RoPE's cos/sin off by the error rope.cuh states for the kernels'
    fast-math __sinf/__cosf/__powf, |θ|·2^-22 (ROPE_ANGLE_ERROR), each angle
    up or down at random (seeded by position and pair, so that a position's
    rotation is the same each time it is formed): the "faithful-rope-fast"
    realisation, the one difference the others leave out that the ops
    check measured to matter (RoPE, 6e-5 - 1.2e-4 of its output at position ~1750)."""
    pos = np.asarray(positions).astype(np.int64)
    i = np.arange(n_rot // 2, dtype=np.int64)
    inv = base ** (-2.0 * i / n_rot)
    if freq_divisors is not None:
        inv = inv / freq_divisors.astype(np.float64)
    theta = scale * pos.astype(np.float64)[:, None] * inv[None, :]
    h = (pos[:, None] * 1000003 + i[None, :] * 7919) % 2147483647  # a fixed sign a (position, pair)
    sign = np.where((h * 48271 % 2147483647) % 2 == 0, 1.0, -1.0)
    theta = theta + sign * np.abs(theta) * ROPE_ANGLE_ERROR
    return np.cos(theta), np.sin(theta)


def measure_faithful(cat, names: list[str], reference_set: str, variants=tuple(FAITHFUL_VARIANTS)):
    """The rounding-faithful oracle (the NumPy engine with the CUDA engine's
    roundings and KV type: engine/backends/numpy/faithful.py) against the
    references of ``reference_set``, measured as validate-catalog measures
    an engine: what the CUDA engine's roundings alone cost against them,
    which ``gate.<set>-cuda`` is set from (the CUDA engine itself never is).
    A list of (model, variant, settings, ModelResult), as ``measure``."""
    import engine
    from engine.backends.numpy import faithful
    from engine.backends.numpy import ops as np_ops

    from . import refs, validate

    out = []
    for name in names:
        e = catalog.entry(name, cat)
        if reference_set not in e.reference_sets or catalog.REFERENCE_SETS[reference_set] != "cpu":
            continue
        ref = refs.for_entry(e, reference_set)
        kv_f16 = ref.settings.get("type_k") != "f32"  # the KV type the CUDA engine is judged with (validate.Loaded)
        for variant in variants:
            print(f"{name}: the faithful oracle ({variant}) vs its {reference_set} references...", file=sys.stderr,
                  flush=True)
            sums, faithful.SUMS = faithful.SUMS, FAITHFUL_VARIANTS[variant]
            angles = np_ops.rope_angles
            if variant in ("faithful-rope32", "faithful-rope-fast"):
                np_ops.rope_angles = rope_angles_fp32 if variant == "faithful-rope32" else rope_angles_fast
            try:
                model = engine.load(catalog.model_path(name, catalog=cat), backend="numpy", rounding="cuda",
                                    kv_f16=kv_f16)
                r = validate.validate_model(model, e, ref, f"{variant} oracle", tier=reference_set,
                                            gate=catalog.Gate(margin=float("inf")))
            finally:
                faithful.SUMS, np_ops.rope_angles = sums, angles
            out.append((name, variant, {"rounding": "cuda", "kv_f16": kv_f16, "sums": FAITHFUL_VARIANTS[variant]}, r))
    return out


def of_catalog_file(result: dict, cat) -> bool:
    """Whether a saved measurement (a variation record's result) is of the file
    the catalog names for its model now: a model's file can be made anew, and
    a measurement of the old one must not set the new one's gate. A result
    saved before results named their file's sha256 counts as of it."""
    e = cat.get(result["model"])
    return e is None or result.get("model_sha256", e.sha256) == e.sha256


def variation_records(results_dir, engine: str, cat=None) -> dict[tuple[str, str], list]:
    """The committed measurements of ``engine``'s variants (``harness reference
    --variation [--faithful] --save``: "llama.cpp" or "anvil faithful oracle"):
    (model, set) -> its results, the newest of each variant of the catalog's
    file, as objects ``propose`` reads (``record``: the file it came from).
    Only the variants the gates take now count (``variants``: flash attention
    on the CPU was measured once and is no longer noise there;
    FAITHFUL_VARIANTS). A llama.cpp record made before KL was measured has
    ``max_kl`` None."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    cat = catalog.load() if cat is None else cat
    newest: dict[tuple[str, str, str], tuple[str, dict]] = {}
    for f in sorted(Path(results_dir).glob("variation-*.json")):
        rec = json.loads(f.read_text())
        if rec.get("engine") != engine:
            continue
        for r in rec["results"]:
            if not of_catalog_file(r, cat):
                continue
            taken = FAITHFUL_VARIANTS if engine == FAITHFUL_ENGINE else (
                variants(cat[r["model"]], r["tier"]) if r["model"] in cat else {})
            if r["variant"] not in taken:
                continue
            key = (r["model"], r["tier"], r["variant"])
            if key not in newest or rec["date"] >= newest[key][0]:
                newest[key] = (rec["date"], {**r, "record": f.name})
    out: dict[tuple[str, str], list] = {}
    for (model, rset, _), (_, r) in sorted(newest.items()):
        out.setdefault((model, rset), []).append(
            SimpleNamespace(**{"max_kl": None, **r,
                               "cases": [SimpleNamespace(**{**c, "flips": [SimpleNamespace(**f) for f in c["flips"]]})
                                         for c in r["cases"]]}))
    return out


def faithful_records(results_dir, cat=None) -> dict[tuple[str, str], list]:
    """The faithful oracle's committed realisations (``variation_records``)."""
    return variation_records(results_dir, FAITHFUL_ENGINE, cat)


def gpu_records(results_dir, cat=None) -> dict[tuple[str, str], list]:
    """llama.cpp's committed CUDA realisations against its CUDA references
    (the gpu and deep sets), each model's newest of each variant."""
    return {k: v for k, v in variation_records(results_dir, "llama.cpp", cat).items()
            if catalog.REFERENCE_SETS[k[1]] == "gpu"}


def spread_text(r, check: str) -> str:
    """One variant's measure behind ``check``, as gate comments write it: for flips, its prompt
    with the most (flips/steps); "—" where the record has none (KL before it was measured)."""
    if check == "flips":
        most = max(r.cases, key=lambda c: len(c.flips) / max(c.n_steps, 1), default=None)
        return "—" if most is None else f"{len(most.flips)}/{most.n_steps}"
    v = getattr(r, CHECKS[check])
    return "—" if v is None else f"{v:.3g}"


def format_proposals(cat, measured, reference_set: str) -> str:
    """Per model: llama.cpp's spread, the proposed gate and the catalog's
    (for the engine that set is judged with: CUDA for llama.cpp's CUDA references)."""
    from .table import markdown

    faithful = any(v in FAITHFUL_VARIANTS for _, v, _, _ in measured)  # the CUDA engine's gate, from the faithful oracle
    backend = "cuda" if faithful else judged_backend(reference_set)
    measured_rule = backend == "cuda"  # every CUDA gate: the held-out headroom (the module's doc)
    if measured_rule:  # the headroom over every committed set of its kind, this measurement's in place of its own
        from . import results

        pairs = (faithful_records if faithful else gpu_records)(results.DEFAULT_DIR, cat)
        for name in dict.fromkeys(m for m, *_ in measured):
            pairs[(name, reference_set)] = [r for m, _, _, r in measured if m == name]
        headroom = held_out_headroom(cat, pairs)
    rows = []
    for name in dict.fromkeys(m for m, *_ in measured):
        e = catalog.entry(name, cat)
        spread = [r for m, _, _, r in measured if m == name]
        new = propose_measured(e, reference_set, spread, headroom) if measured_rule else \
            propose(e, reference_set, spread)
        old = e.gate(backend, reference_set)
        for check in ("margin", "logit", "kl", "flips"):
            o, n = (getattr(old, check) if old else None), getattr(new, check)
            change = "new" if o is None else "LOOSER" if n > o else "tighter" if n < o else "same"
            src = ", ".join(f"{v} {spread_text(r, check)}" for m, v, _, r in measured if m == name)
            b = getattr(budget(e, reference_set), check, None)
            rows.append([name, f"gate.{e.gate_key(backend, reference_set)}.{check}", src,
                         "—" if b is None else f"{b:g}", "—" if o is None else f"{o:g}", f"{n:g}", change])
    return markdown(["model", "catalog key", f"{'the faithful oracle' if faithful else 'llama.cpp'}'s spread (per variant)",
                     "budget", "catalog now",
                     "proposed", "change"], rows)
