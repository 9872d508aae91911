"""``harness validate-catalog``: the correctness gate.

For each catalog model, each of its reference sets and each reference
prompt, the engine decodes greedily from llama.cpp's prompt ids
(``compare.compare_case``) and is judged at every step. A model passes only
when every step of every prompt passes every check of its gate
(``catalog.Gate``, one per model, reference set and backend):

- **drift**: a flip (the engine's argmax is not llama.cpp's token) is
  tolerated only as a near-tie: both sides were nearly undecided, llama.cpp's
  own top-2 margin there and the engine's gap from its top logit to
  llama.cpp's token each below ``margin``;
- **flips**: near-tie flips take at most the share ``flips`` of a prompt's
  steps (llama.cpp's own flip rate under other settings): a sound engine
  flips where llama.cpp nearly ties, not at every step a loose bound admits;
- **logit**: max |Δlogit| over llama.cpp's stored top-k within ``logit``;
- **kl**: the top-k KL divergence within ``kl``;
- **margin**: the shift of llama.cpp's top-1/top-2 margin within ``margin``;
- **degenerate**: no non-finite logits, no stop token at step 0, no short
  repetition loop where llama.cpp has none;
- **queued**: where the engine queues its greedy steps (CUDA: the graph
  replayed back to back, as tg and generate run), the tokens are those of a
  step at a time, which the checks above judge;
- **ops** (the CUDA engine, with its oracle set): every operator of a
  prefill and a few decode steps of each prompt, and of a few decode steps
  past position 2048 (the deep pass), against the rounding-faithful NumPy
  oracle's on the same inputs (harness/anchored.py), within its per-op
  budget (``gates.op_budget``): the sharp check, which a model's whole
  output cannot be (its roundings amplify fp32 noise).

Thresholds come from measurements that exclude the engine under test
(``harness reference --variation``: llama.cpp against its own references
under other settings, and on the dequantised F32 twin) or from a stated
precision budget; they are written in the catalog with their source and
never derived from the engine's own runs.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field

from engine.model import DEFAULT_N_CTX

from . import catalog, refs
from .compare import CaseResult, compare_case

CHECKS = ("drift", "flips", "logit", "kl", "margin", "degenerate", "queued", "ops",
          "error")  # error: no verdict, the run itself failed (a worker that died: harness/distribute.py)


@dataclass
class Failure:
    case: int
    step: int | None
    check: str  # one of CHECKS
    detail: str


@dataclass
class ModelResult:
    model: str
    tier: str  # the reference set judged against (catalog.REFERENCE_SETS)
    backend: str
    gate: catalog.Gate
    cases: list[CaseResult] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    ops: dict[str, list[float]] | None = None  # the ops check, where it ran: "phase op" -> [worst error, its bound]
    placement: dict | None = None  # where it ran under --gpus/--ray (harness/distribute.py): gpu_index, gpu, host
    model_sha256: str = ""  # the file judged (its references' file): a model's file can be made anew

    @property
    def near_tie(self) -> float:
        return self.gate.margin

    @property
    def steps(self) -> int:
        return sum(c.n_steps for c in self.cases)

    @property
    def matched(self) -> int:
        """Steps of the free run equal to llama.cpp's, prompt by prompt up to the first difference."""
        return sum(c.matched for c in self.cases)

    @property
    def agreement(self) -> int:
        """Judged steps whose argmax is llama.cpp's token (teacher-forced where the free run diverged)."""
        return sum(c.agreement for c in self.cases)

    @property
    def n_flips(self) -> int:
        return sum(len(c.flips) for c in self.cases)

    @property
    def max_flip_share(self) -> float:
        """The largest share of one prompt's steps that were near-tie flips."""
        shares = (len(near_ties(c, self.gate.margin)) / c.n_steps for c in self.cases if c.n_steps)
        return max(shares, default=0.0)

    @property
    def drift(self) -> list[tuple[int, int]]:
        return [(f.case, f.step) for f in self.failures if f.check == "drift"]

    @property
    def max_logit_diff(self) -> float:
        return max((c.max_logit_diff for c in self.cases), default=0.0)

    @property
    def max_kl(self) -> float:
        return max((c.max_kl for c in self.cases), default=0.0)

    @property
    def max_margin_shift(self) -> float:
        """The largest change of llama.cpp's top-1/top-2 margin as this model sees it."""
        return max((c.max_margin_shift for c in self.cases), default=0.0)

    @property
    def mode(self) -> str:
        return "exact" if all(c.mode == "exact" for c in self.cases) else "teacher-forced"

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict:
        finite = lambda v: v if v is None or math.isfinite(v) else None  # noqa: E731  (JSON has no inf)
        return {"model": self.model, "tier": self.tier, "backend": self.backend,
                "gate": {k: finite(v) for k, v in asdict(self.gate).items()}, "near_tie": finite(self.near_tie), "mode": self.mode, "steps": self.steps, "matched": self.matched,
                "agreement": self.agreement, "flips": self.n_flips, "drift": self.drift,
                "max_logit_diff": self.max_logit_diff, "max_kl": self.max_kl,
                "max_margin_shift": self.max_margin_shift, "passed": self.passed,
                "failures": [asdict(f) for f in self.failures], "seconds": self.seconds, "ops": self.ops,
                "cases": [{"prompt": c.prompt[:80], "n_steps": c.n_steps, "matched": c.matched, "mode": c.mode,
                           "agreement": c.agreement, "flips": [asdict(f) for f in c.flips],
                           "max_logit_diff": c.max_logit_diff, "max_kl": c.max_kl,
                           "max_margin_shift": c.max_margin_shift, "degenerate": c.degenerate,
                           "queued": c.queued and c.queued[1]}
                          for c in self.cases], **({"model_sha256": self.model_sha256} if self.model_sha256 else {}),
                **(self.placement or {})}


def plan(cat, backend: str, tiers: list[str], models: list[str] | None = None):
    """(entry, reference set) pairs to validate on ``tiers`` (of ``models``,
    in the order given, or of the whole catalog), and the pairs that have no
    gate for ``backend`` (reported, never silently dropped)."""
    entries = [catalog.entry(m, cat) for m in dict.fromkeys(models)] if models else list(cat.values())
    pairs = [(e, s) for e in entries for s in e.reference_sets if catalog.REFERENCE_SETS[s] in tiers
             and not (s == "oracle" and backend == "numpy")]  # the NumPy engine is the oracle
    return [(e, s) for e, s in pairs if e.gate(backend, s)], [(e, s) for e, s in pairs if not e.gate(backend, s)]


def is_near_tie(flip, near_tie: float) -> bool:
    """Both sides nearly undecided: llama.cpp's top-2 margin and the engine's
    gap to llama.cpp's token (its top-1 logit minus that token's) under the
    bound. Whether llama.cpp's token is the engine's second does not count:
    a confident engine is drift wherever llama.cpp's token ranks."""
    return flip.ref_margin < near_tie and flip.engine_margin < near_tie


def near_ties(c: CaseResult, near_tie: float) -> list:
    return [f for f in c.flips if is_near_tie(f, near_tie)]


def judge(i: int, c: CaseResult, gate: catalog.Gate) -> list[Failure]:
    """Every check of one case against its gate; the first failing step of
    each measure (not every step: one line per check says enough)."""
    out = []
    if c.degenerate:
        out.append(Failure(i, None, "degenerate", c.degenerate))
    if c.queued is not None:
        out.append(Failure(i, c.queued[0], "queued", c.queued[1]))
    for f in c.flips:
        if not is_near_tie(f, gate.margin):
            out.append(Failure(i, f.step, "drift",
                               f"llama.cpp token {f.ref_token} vs engine token {f.engine_token}: llama.cpp's top-2 "
                               f"margin {f.ref_margin:.4g}, the engine's gap {f.engine_margin:.4g} (a near-tie needs "
                               f"both below {gate.margin:g})"))
    near = near_ties(c, gate.margin)
    if gate.flips is not None and c.n_steps and len(near) / c.n_steps > gate.flips:
        past = next(k for k in range(len(near)) if (k + 1) / c.n_steps > gate.flips)  # the flip one too many
        out.append(Failure(i, near[past].step, "flips",
                           f"{len(near)} near-tie flips in {c.n_steps} steps, a share of {len(near) / c.n_steps:.3g} "
                           f"> {gate.flips:g}"))
    for check, values, bound in (("logit", c.logit_diffs, gate.logit), ("kl", c.kls, gate.kl),
                                 ("margin", [abs(m) for m in c.margin_shifts], gate.margin)):
        if bound is None:
            continue
        for step, v in enumerate(values):
            if not v <= bound:  # NaN fails too
                what = {"logit": "max |Δlogit| over the top-k", "kl": "top-k KL divergence",
                        "margin": "top-2 margin shift"}[check]
                out.append(Failure(i, step, check, f"{what} {v:.3g} > {bound:g}"))
                break
    return out


def validate_model(model, entry: catalog.Entry, ref: refs.Reference, backend: str, progress=None,
                   tier: str | None = None, gate: catalog.Gate | None = None,
                   first_failure: bool = False, runs: dict | None = None) -> ModelResult:
    """``model`` against ``ref``, the model's references of set ``tier``
    (default: its own tier), judged by ``gate`` (default: the catalog's).
    ``first_failure``: stop after the first prompt that fails (the verdict
    is already known; `harness mutants` needs no more). ``runs``: shared by
    the sets of one loaded model (compare.compare_case)."""
    t0 = time.perf_counter()
    tier = tier or entry.tier
    gate = gate or entry.gate(backend, tier)
    if gate is None:
        raise catalog.AnvilError(f"catalog: {entry.name} has no gate.{entry.gate_key(backend, tier)} thresholds")
    out = ModelResult(entry.name, tier, backend, gate, model_sha256=ref.model_sha256)
    for i, case in enumerate(ref.cases):
        r = compare_case(model, case, runs)
        out.cases.append(r)
        out.failures += judge(i, r, gate)
        if progress:
            progress()
        if first_failure and out.failures:
            break
    out.seconds = time.perf_counter() - t0
    return out


class Loaded:
    """The catalog models as the validation loads them, the last one kept:
    consecutive reference sets of one model share the loaded model and its
    free greedy runs (their prompts are the same: compare.compare_case)."""

    def __init__(self, cat, backend: str, quiet: bool = False):
        self.cat, self.backend, self.quiet = cat, backend, quiet
        self.key = self.model = self.runs = None

    def get(self, entry: catalog.Entry, ref: refs.Reference):
        """(model, runs) for ``entry`` loaded as ``ref`` was made (the KV cache
        type llama.cpp used: F32 on the CPU, F16 with CUDA and in the f16kv
        set; either engine, catalog.SET_SETTINGS)."""
        import engine

        options = {"kv_f16": ref.settings.get("type_k") != "f32"}
        if ref.settings.get("n_ctx", 0) > DEFAULT_N_CTX:  # a deep set's context (catalog.SET_SETTINGS)
            options["n_ctx"] = ref.settings["n_ctx"]
        key = (entry.name, tuple(sorted(options.items())))
        if key != self.key:
            self.key = self.model = None  # one model in memory at a time
            path = catalog.model_path(entry.name, catalog=self.cat, progress=not self.quiet)
            self.model, self.runs, self.key = engine.load(path, backend=self.backend, **options), {}, key
        return self.model, self.runs


def run(cat, entry: catalog.Entry, ref: refs.Reference, reference_set: str, backend: str, progress=None,
        quiet: bool = False, first_failure: bool = False, loaded: Loaded | None = None) -> ModelResult:
    """Load the catalog model on ``backend`` (through ``loaded``, to share it
    with the model's other sets) and validate it (``first_failure``: as
    validate_model)."""
    model, runs = (loaded or Loaded(cat, backend, quiet)).get(entry, ref)
    out = validate_model(model, entry, ref, backend, progress=progress, tier=reference_set,
                         first_failure=first_failure, runs=runs)
    if backend == "cuda" and reference_set == "oracle" and not (first_failure and out.failures):
        judge_ops(out, entry, ref, quiet)
    return out


def judge_ops(out: ModelResult, entry: catalog.Entry, ref: refs.Reference, quiet: bool = True) -> None:
    """The ops check (harness/anchored.py) into ``out``: one failure per op
    past its budget, at its worst."""
    from . import anchored

    t0 = time.perf_counter()
    errors = anchored.check_entry(entry, ref, quiet)
    out.ops = anchored.worst(errors)
    for e in anchored.over(errors):
        out.failures.append(Failure(-1, None, "ops", f"{e.phase} layer {e.layer} {e.op} (output {e.output}): "
                                                     f"|cuda - faithful oracle| / |oracle| {e.error:.3g} > {e.bound:.3g}"))
    out.seconds += time.perf_counter() - t0


def _num(text: str) -> str:
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", text)  # 7.63e-5, not 7.63e-05: the table fits 120 columns


def _fmt(v: float | None, bound: float | None) -> str:
    value = _num(f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:.3g}")  # 3 digits, and 1.11e-4 over 0.000111
    return value + (f" / {_num(f'{bound:g}')}" if bound is not None else " (not judged)")


TABLE_HEADER = ["model", "set", "prefix", "agree", "flips", "flip share", "Δlogit", "KL", "margin shift", "verdict"]


def table_legend(results: list[ModelResult]) -> str:
    backends = ", ".join(dict.fromkeys(r.backend for r in results))
    return (f"The {backends} engine against each model's llama.cpp reference set: prefix, the free run's steps equal "
            f"to llama.cpp's; agree, the steps (teacher-forced after a flip) whose token is llama.cpp's; flips, "
            f"near-tie flips; flip share, Δlogit, KL and margin shift: the largest / the bound (each model's time "
            f"is in its line above).")


def table_rows(results: list[ModelResult]) -> list[list[str]]:
    rows = []
    for r in results:
        verdict = "pass" if r.passed else "FAIL: " + ", ".join(sorted({f.check for f in r.failures}))
        rows.append([r.model, r.tier, f"{r.matched}/{r.steps}", f"{r.agreement}/{r.steps}",
                     str(r.n_flips - len(r.drift)), _fmt(r.max_flip_share, r.gate.flips),
                     _fmt(r.max_logit_diff, r.gate.logit), _fmt(r.max_kl, r.gate.kl),
                     _fmt(r.max_margin_shift, r.gate.margin), verdict])
    return rows


def format_table(results: list[ModelResult]) -> str:
    from .table import markdown

    return markdown(TABLE_HEADER, table_rows(results))


def format_failures(results: list[ModelResult]) -> str:
    """One line per failure: model, reference set, prompt, step, tokens and
    the check; after a CUDA run's, where to look: the ops check at its first
    failing step (scripts/gpu/ops_at_step.py, on the GPU host)."""
    lines = []
    for r in results:
        stepped = [f for f in r.failures if f.case >= 0 and f.step is not None]
        if r.backend == "cuda" and stepped:
            f = stepped[0]
            hint = (f"  where: python3 scripts/gpu/ops_at_step.py {r.model} --set {r.tier} --case {f.case} "
                    f"--step {f.step}  (each CUDA op there against the faithful oracle)")
        else:
            hint = None
        for f in r.failures:
            if f.case < 0:  # the ops check: all prompts
                lines.append(f"FAIL {r.model} ({r.tier} references, {r.backend}): {f.check}: {f.detail}")
                continue
            c = r.cases[f.case]
            prompt = c.prompt if len(c.prompt) <= 40 else c.prompt[:37] + "..."
            step = "" if f.step is None else f" step {f.step}"
            lines.append(f"FAIL {r.model} ({r.tier} references, {r.backend}) prompt {f.case} {prompt!r}{step}: "
                         f"{f.check}: {f.detail}")
        if hint:
            lines.append(hint)
    return "\n".join(lines)


def passed_flips(r: ModelResult) -> list[tuple[int, object]]:
    """(prompt, flip) of each near-tie flip the gate let pass."""
    drift = set(r.drift)
    return [(i, f) for i, c in enumerate(r.cases) for f in c.flips if (i, f.step) not in drift]


def _flip(i: int, f) -> str:
    return (f"prompt {i} step {f.step}: llama.cpp token {f.ref_token} (top-2 margin {f.ref_margin:.3g}), "
            f"engine token {f.engine_token} (gap {f.engine_margin:.3g})")


def format_flips(results: list[ModelResult], verbose: bool = False, width: int = 120) -> str:
    """The near-tie flips that passed: per model their count and the one
    closest to the bound, or with ``verbose`` each one."""
    import textwrap

    lines = []
    for r in results:
        flips = passed_flips(r)
        if verbose:
            lines += [f"near-tie {r.model} ({r.tier}) {_flip(i, f)}, bound {r.near_tie:g}" for i, f in flips]
        elif flips:
            i, closest = max(flips, key=lambda x: max(x[1].ref_margin, x[1].engine_margin))
            lines.append(f"  {r.model} ({r.tier} references): {len(flips)} in {len({i for i, _ in flips})} of "
                         f"{len(r.cases)} prompts, bound {r.near_tie:g}; the closest to it, {_flip(i, closest)}")
    if lines and not verbose:
        lines.insert(0, "Near-tie flips, where llama.cpp's top-2 margin and the engine's gap (its top logit minus "
                        "its logit for llama.cpp's token) are both below the model's bound (--verbose lists each):")
        lines = [textwrap.fill(ln, width, subsequent_indent="    ") for ln in lines]
    return "\n".join(lines)
