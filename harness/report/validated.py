"""Which validation backs a speed figure: a speed figure belongs to a build
that passed the gate on that model in the same sitting (design notes).

An Anvil bench record B is *validated* by a validate record V (``harness
validate-catalog --save``) when, from what the two records hold:

- both ran the CUDA engine, and V's build is B's (``engine.bench.build_hash``:
  sha256 over the engine's sources, so the code measured is the code judged);
- on the same GPU (its name), and the same host where both name one (a
  validate entry's own, where it says: ``harness validate-catalog --gpus``
  or ``--ray`` ran it on one GPU and host of several);
- in one sitting: V's date within SITTING_S of B's, before or after. A
  sitting on the GPU host is one lease of the machine, at most 30 minutes,
  and ``scripts/gpu/scoreboard.sh`` validates a model right before it
  benchmarks it (in the committed records a model's validation and its
  benchmark lie up to 15 minutes apart);
- V judged B's model file (its sha256, where both records name it) against
  its ``gpu`` reference set (llama.cpp with CUDA on the same file, the run
  the speed figure is compared with) and passed;
- and no validate record of that build, GPU, host and sitting failed the
  model against any reference set: a failed gate is not outweighed by a pass.

llama.cpp's records need no validation: the engine under test is Anvil's.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

SITTING_S = 1800
GATE_SET = "gpu"  # the reference set a speed figure's validation must cover


@dataclass(frozen=True)
class Backing:
    record: str | None  # the validate record (file name) that backs the figure; None: not validated
    note: str           # one line: what the record showed, or why no record backs the figure

    @property
    def ok(self) -> bool:
        return self.record is not None


def validate_entries(rec: dict) -> list[dict]:
    """A validate record holds one ModelResult.to_json() (plus provenance) or a
    list of them under "models" or "results"."""
    for key in ("models", "results"):
        if isinstance(rec.get(key), list):
            return [e for e in rec[key] if isinstance(e, dict) and e.get("model")]
    return [rec] if rec.get("model") and ("passed" in rec or "mode" in rec) else []


def _when(rec: dict) -> datetime.datetime | None:
    try:
        t = datetime.datetime.fromisoformat(str(rec.get("date") or rec.get("saved_at")).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else None  # a date without a zone is no time to measure a gap from


def _file(rec: dict) -> str:
    return Path(rec["_path"]).name if rec.get("_path") else "(unsaved record)"


def _gap(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def backing(bench: dict, model: str, validations: list[dict]) -> Backing:
    """The validate record among ``validations`` that backs Anvil's bench
    record ``bench`` of ``model`` (the catalog name), nearest in time, or why
    none does (the first condition of the module's definition that fails)."""
    build = str(bench.get("build") or "")
    if str(bench.get("backend") or "").lower() != "cuda":
        return Backing(None, f"not validated: a {bench.get('backend') or 'backend-less'} run, the gate judges CUDA")
    t = _when(bench)
    judged = []  # (gap in seconds, record, its entries for the model) of this build on the CUDA engine
    for v in validations:
        entries = [e for e in validate_entries(v) if e.get("model") == model
                   and str(e.get("backend", v.get("backend"))).lower() == "cuda"]
        tv = _when(v)
        if entries and build and v.get("build") == build and t and tv:
            judged.append((abs((tv - t).total_seconds()), v, entries))
    if not judged:
        return Backing(None, f"not validated: build {build[:8] or '?'} was never validated on {model}")
    sha = bench.get("model_sha256")  # where both name the file: the one benchmarked
    judged = [(gap, v, [e for e in entries if not sha or e.get("model_sha256", sha) == sha])
              for gap, v, entries in judged]
    judged = [j for j in judged if j[2]]
    if not judged:
        return Backing(None, f"not validated: build {build[:8]} was validated on {model} only on another file")

    def same_place(v: dict, e: dict) -> bool:  # an entry's own GPU and host (harness --gpus/--ray), else its record's
        gpu, host = e.get("gpu", v.get("gpu")), e.get("host", v.get("host"))
        return gpu == bench.get("gpu") and (not host or not bench.get("host") or host == bench["host"])

    here = [(gap, v, [e for e in entries if same_place(v, e)]) for gap, v, entries in judged]
    here = [j for j in here if j[2]]
    if not here:
        return Backing(None, f"not validated: build {build[:8]} was validated on {model} only on another GPU or host")
    sitting = sorted((j for j in here if j[0] <= SITTING_S), key=lambda j: (j[0], _file(j[1])))
    if not sitting:
        return Backing(None, f"not validated: build {build[:8]} was validated on {model} only in another sitting "
                             f"({_gap(min(j[0] for j in here))} away)")
    failed = [(v, e) for _, v, entries in sitting for e in entries if not e.get("passed")]
    if failed:
        v, e = failed[0]
        return Backing(None, f"not validated: {model} FAILED the gate against its {e.get('tier')} references "
                             f"in this sitting ({_file(v)})")
    for gap, v, entries in sitting:
        if any(e.get("tier") == GATE_SET for e in entries):
            return Backing(_file(v), f"{model} passed against llama.cpp with CUDA ({GATE_SET} references), "
                                     f"build {build[:8]}, {_gap(gap)} from the benchmark")
    return Backing(None, f"not validated: {model} was not judged against its {GATE_SET} references in this sitting")
