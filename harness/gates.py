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
  ``ubatch-1`` (the prompt fed one token at a time: other kernels).
- **fp32** (the twin set, and the cpu set of an F32 model): ``ubatch-1``
  and ``threads-1``; both sides compute in fp32, so the spread is tiny and
  the stated fp32 budget below sets the bound. Flash attention is not noise
  here: on the CPU it rounds K and V to f16.
- **gpu** (llama.cpp with CUDA): ``flash-attn`` (the other attention path)
  and ``ubatch-1``.

A proposal is ``max(HEADROOM x spread, budget)`` per check (KL scales with
the square of a logit error, so its headroom is squared). The share of a
prompt's steps that may be near-tie flips is HEADROOM x the largest share
llama.cpp flipped in one prompt under one variant (judged with an infinite
gate, every flip of its own is a near-tie); no budget stands in for it. It
is printed beside the catalog's current value, marked where it would loosen
the gate; nothing is written: a threshold changes only by editing the
catalog.
"""

from __future__ import annotations

import sys

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

FP32_VARIANTS = {"ubatch-1": {"n_batch": 1, "n_ubatch": 1}, "threads-1": {"n_threads": 1}}
QUANT_VARIANTS = {"f32-twin": "twin", "ubatch-1": {"n_batch": 1, "n_ubatch": 1}}
GPU_VARIANTS = {"flash-attn": {"flash_attn": True}, "ubatch-1": {"n_batch": 1, "n_ubatch": 1}}


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
    return GELU_F16_BUDGET if entry.arch in ("gemma3", "gemma4") else FP32_BUDGET


def propose(entry: catalog.Entry, reference_set: str, spread: list) -> catalog.Gate:
    """Thresholds from llama.cpp's spread (ModelResults of its variants)."""
    floor = budget(entry, reference_set) or catalog.Gate(MIN_MARGIN, 0.0, 0.0)
    margin = max(r.max_margin_shift for r in spread)
    logit = max(r.max_logit_diff for r in spread)
    kl = max(r.max_kl for r in spread)
    return catalog.Gate(margin=round2(max(floor.margin, HEADROOM * margin)),
                        logit=round2(max(floor.logit, HEADROOM * logit)),
                        kl=round2(max(floor.kl, HEADROOM ** 2 * kl)),
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


def _spread(r, check: str) -> str:
    """One variant's measure behind ``check``: for flips, its prompt with the most (flips/steps)."""
    if check == "flips":
        most = max(r.cases, key=lambda c: len(c.flips) / max(c.n_steps, 1), default=None)
        return "—" if most is None else f"{len(most.flips)}/{most.n_steps}"
    return f"{getattr(r, {'margin': 'max_margin_shift', 'logit': 'max_logit_diff', 'kl': 'max_kl'}[check]):.3g}"


def format_proposals(cat, measured, reference_set: str) -> str:
    """Per model: llama.cpp's spread, the proposed gate and the catalog's
    (for the engine that set is judged with: CUDA for llama.cpp's CUDA references)."""
    from .table import markdown

    backend = judged_backend(reference_set)
    rows = []
    for name in dict.fromkeys(m for m, *_ in measured):
        e = catalog.entry(name, cat)
        spread = [r for m, _, _, r in measured if m == name]
        new, old = propose(e, reference_set, spread), e.gate(backend, reference_set)
        for check in ("margin", "logit", "kl", "flips"):
            o, n = (getattr(old, check) if old else None), getattr(new, check)
            change = "new" if o is None else "LOOSER" if n > o else "tighter" if n < o else "same"
            src = ", ".join(f"{v} {_spread(r, check)}" for m, v, _, r in measured if m == name)
            b = getattr(budget(e, reference_set), check, None)
            rows.append([name, f"gate.{e.gate_key(backend, reference_set)}.{check}", src,
                         "—" if b is None else f"{b:g}", "—" if o is None else f"{o:g}", f"{n:g}", change])
    return markdown(["model", "catalog key", "llama.cpp's spread (per variant)", "budget", "catalog now",
                     "proposed", "change"], rows)
