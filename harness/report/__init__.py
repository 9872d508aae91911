"""``harness report``: the scoreboard of prefill and decode, one
self-contained HTML page (figures inline as SVG) or GitHub markdown, built
from the results store and, to tell a validation of a model's current file
from one of a file since made anew, what the catalog pins now
(``catalog_files``, passed in: ``build_report`` opens no file).

    rep = build_report(results.load_all(), catalog_files())  # pure: same input -> same Report
    write_html(rep, "reports")              # reports/index.html, nothing beside it
    print(render_md(rep))

``build_report`` reads no clock and no environment: every list is sorted and
"latest" means the latest *record* (by its own date), so the same records
render to byte-identical HTML. A speed figure is chosen once, by ``_select``
(per model, test and GPU: the newest pair of one sitting whose Anvil build
was validated there), and the scoreboard, its summary, the history's
"today" and the README's table all show that one. Numbers are compared only
within one benchmark spec (``results.spec_hash``) on one GPU
(``results.comparable``), and read against the roofline measured on that
GPU (harness/roofline.py), or against none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import json
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from engine.errors import AnvilError

from .. import ab, nvml, project, results
from .. import roofline as roofline_
from . import diagnose as dx  # not `from .diagnose import diagnose`: that would hide the submodule
from .changes import Change, change_points
from .diagnose import Diagnosis, Rate
from .html import atomic_write, fmt_short_build, render_md, render_readme_table, update_readme, write_html
from .validated import Backing, backing, validate_entries

ANVIL, LLAMACPP = "anvil", "llama.cpp"
_LLAMACPP_NAMES = {"llama.cpp", "llamacpp", "llama-cpp-python", "llama-bench"}
AB_SHOWN = 10  # most recent A/B records on the page
DEFAULT_OUT = results.DEFAULT_DIR.parent / "index.html"
# the summary's columns: llama-bench's two tests, a long prefill, and decode after 4096 cached tokens
SUMMARY_TESTS = ("pp512", "tg128", "pp4096", "tg128 @ d4096")


@dataclass(frozen=True)
class Measure:
    """One test of one record (a bench record, or one arm's run of an A/B)."""
    engine: str
    test: str
    tok_s: float
    tok_s_sd: float | None
    n: int
    date: str
    gpu: str | None
    driver: str | None
    build: str
    settings: str
    file: str
    note: str
    rate: Rate
    diagnosis: Diagnosis
    figure: str | None  # its NVML trace figure (a Figure's name)
    j_per_token: float | None = None  # energy: mean board power over the measured window / tok/s
    peak_bytes: int | None = None  # peak device memory the engine allocated (its record's peak_device_bytes)
    stack: str = ""  # the CUDA stack it ran on: "CUDA driver API 12.9, NVRTC 12.9, cuBLAS 12.9.1.4"
    validation: Backing | None = None  # Anvil's: the validate record of its build and sitting (validated.py)
    samples: tuple[float, ...] = ()  # the repetitions' tok/s
    spec: str = ""  # results.spec_hash of its test

    @property
    def energy_note(self) -> str:
        return ("mean NVML board power over the measured window ÷ tokens/s (NVML averages power over ~1 s: "
                "a window that short, as a 512-token prefill's, reads partly the power before it)")

    @property
    def provenance(self) -> str:
        return (f"{self.engine} on {self.gpu or 'unknown GPU'}, driver {self.driver or '?'}"
                f"{', ' + self.stack if self.stack else ''}, {self.date or '?'}, "
                f"build {self.build}; {self.settings}; {self.n} samples; {self.file}")


@dataclass(frozen=True)
class Row:
    """One model x test x GPU: the numbers ``_select`` chose."""
    model: str
    test: str
    gpu: str | None
    spec: str       # results.spec_hash of the chosen numbers
    spec_text: str  # its fields, for a tooltip
    anvil: Measure | None
    llamacpp: Measure | None
    ratio: float | None  # anvil / llama.cpp; None unless both exist and are comparable
    anvil_spread: tuple[float, int] | None = None  # run-to-run spread of Anvil's build: (spread, sittings)
    # the newest pair, where it is newer than the row's and not validated: (Anvil, llama.cpp, ratio)
    newer_unvalidated: tuple[Measure, Measure, float] | None = None

    @property
    def validated(self) -> bool:
        """Anvil's number stands: its build passed the gate on the model in its sitting."""
        return self.anvil is not None and self.anvil.validation is not None and self.anvil.validation.ok


@dataclass(frozen=True)
class History:
    """One engine on one row's spec: its first record ("published") against
    the row's number ("today", the same ``_select`` chose), every record
    between, and where the build changed, what the speed did."""
    model: str
    test: str
    engine: str
    gpu: str | None
    spec: str
    first: Measure
    latest: Measure
    n_records: int
    points: tuple[Measure, ...] = ()  # every record of the spec, oldest first
    changes: tuple[Change, ...] = ()  # at each change of build (changes.py), oldest first
    newer: int = 0  # records after "today" (not validated, so not the scoreboard's)

    @property
    def gain(self) -> float | None:
        return self.latest.tok_s / self.first.tok_s if self.first.tok_s > 0 else None

    @property
    def last_change(self) -> Change | None:
        return self.changes[-1] if self.changes else None


@dataclass(frozen=True)
class Parity:
    model: str
    tier: str
    backend: str
    status: str  # "exact", "teacher-forced: N near-tie flips", "FAIL: <checks>"
    ok: bool
    matched: str  # free-run prefix: steps equal to llama.cpp's before the first difference
    max_logit_diff: float | None
    near_tie: float | None
    provenance: str
    # largest change of llama.cpp's top-1/top-2 margin as the engine sees it, and
    # as llama.cpp itself sees it under other settings (harness reference
    # --variation): "flash-attn 2.14, ubatch-1 1.25". The threshold is read against both.
    margin_shift: float | None = None
    llama_spread: str | None = None
    agreement: str = "—"  # teacher-forced agreement: judged steps whose argmax is llama.cpp's token
    max_kl: float | None = None
    file: str = ""  # its validate record's file name
    date: str = ""


@dataclass(frozen=True)
class ABTest:
    """One test of one A/B record: harness.ab's analysis, as recorded."""
    file: str
    date: str
    model: str
    arm_a: str  # commit and subject where the record has them, else the wheel and its hash
    arm_b: str
    test: str
    a_median: float
    b_median: float
    ratio: float
    ci: tuple[float, float]
    p_value: float
    wins: str
    verdict: str
    diag_a: str
    diag_b: str
    notes: str
    provenance: str


@dataclass(frozen=True)
class Run:
    """A diagnosed run (the page's diagnosis section)."""
    source: str  # "bench" or "ab"
    group: str   # the A/B record's file ("" for bench runs)
    model: str
    who: str
    test: str
    diagnosis: Diagnosis
    figure: str | None
    provenance: str


@dataclass(frozen=True)
class Figure:
    name: str   # unique on the page (the inline SVG's id)
    kind: str   # "bars", "lines" or "trace" (figures.py)
    title: str
    data: tuple  # bars: ((label, ((series, tok_s, sd), ...)), ...); trace: ((key, values), ...); lines: see figures


@dataclass(frozen=True)
class SummaryRow:
    """One model on one GPU: its rows of SUMMARY_TESTS (None where it has none)."""
    model: str
    gpu: str | None
    cells: tuple[Row | None, ...]


def by_gpu(items) -> tuple[tuple[str | None, tuple], ...]:
    """``items`` (rows, summary rows: each with ``gpu``, the GPU's name) as
    one section per kind of GPU, named GPUs first by name, the order within
    each kept: numbers of one GPU are read, and compared, among themselves."""
    groups: dict = {}
    for x in items:
        groups.setdefault(x.gpu, []).append(x)
    return tuple((g, tuple(groups[g])) for g in sorted(groups, key=lambda g: (g is None, g or "")))


@dataclass(frozen=True)
class ModelSection:
    name: str
    rows: tuple[Row, ...]
    history: tuple[History, ...]
    parity: tuple[Parity, ...]
    figures: tuple[Figure, ...] = ()  # tok/s over the records (history-*), tok/s against depth (depth-*)

    @property
    def rows_by_gpu(self) -> tuple[tuple[str | None, tuple[Row, ...]], ...]:
        return by_gpu(self.rows)


@dataclass(frozen=True)
class MutantSuite:
    """One backend's mutation suite as one ``harness mutants`` record left it
    (one sitting, one build), never a merge of records: the latest record
    that ran the backend's whole suite, or, with none, the latest record
    (partial). The suite's mutants it has no result for are listed, not
    hidden; the backend's other records are history, each its own result."""
    backend: str
    caught: int
    total: int  # mutants in the record
    rows: tuple[tuple[str, str, str, str, str], ...]  # (mutant, bug, caught by, checks, models tried)
    build: str
    date: str
    file: str
    provenance: str  # where it ran
    partial: bool  # some of the suite not run, or not judged
    not_run: tuple[str, ...] = ()  # the suite's mutants (as it stands) the record has no result for
    # (model (set), the build's own first failure there): pairs the build itself failed, which no mutant
    # tried, since a failing pair cannot tell a mutant from the build
    control_failed: tuple[tuple[str, str], ...] = ()
    history: tuple[tuple[str, str, str, str, str], ...] = ()  # (date, build, result, run, file), newest first


@dataclass(frozen=True)
class SuiteRun:
    """One run of the GPU test suite (a ``tests`` record, harness/testrun.py)."""
    file: str
    date: str
    build: str
    where: str  # GPU, driver, host
    passed: int
    failed: int
    errors: int
    skipped: int
    duration_s: float | None
    command: str
    problem: str | None  # why the run does not stand (testrun.verdict); None: it passed


@dataclass(frozen=True)
class Report:
    models: tuple[ModelSection, ...]
    parity: tuple[Parity, ...]
    ab: tuple[ABTest, ...]
    runs: tuple[Run, ...]
    figures: tuple[Figure, ...]
    sources: tuple[tuple[str, str, str, str, str], ...]  # (file, kind, model, engine, date)
    digest: str  # sha256 over the records' content: which evidence the page shows
    latest_date: str
    mutants: tuple[MutantSuite, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (file, why): records the store could not use
    records_href: str = ""  # the results store relative to the page: record links ("" = no links)
    suite_runs: tuple[SuiteRun, ...] = ()  # the GPU test suite's latest runs, newest first
    summary: tuple[SummaryRow, ...] = ()
    rooflines: tuple[roofline_.Roofline, ...] = ()  # the newest of each GPU
    summary_tests: tuple[str, ...] = SUMMARY_TESTS

    @property
    def rows(self) -> tuple[Row, ...]:
        return tuple(r for m in self.models for r in m.rows)

    @property
    def summary_by_gpu(self) -> tuple[tuple[str | None, tuple[SummaryRow, ...]], ...]:
        """The summary, a section per kind of GPU."""
        return by_gpu(self.summary)

    @property
    def history(self) -> tuple[History, ...]:
        return tuple(h for m in self.models for h in m.history)

    @property
    def flagged(self) -> tuple[tuple[History, Change], ...]:
        """Every change of build whose label is not "no change" or "insufficient data"."""
        return tuple((h, c) for h in self.history for c in h.changes if c.css)


# ---- record helpers ---------------------------------------------------------

def _file(rec: dict) -> str:
    return Path(rec["_path"]).name if rec.get("_path") else "(unsaved record)"


def _date(rec: dict) -> str:
    return str(rec.get("date") or rec.get("saved_at") or "")


def _order(rec: dict) -> tuple:
    # a saved record's file name is unique: its content breaks ties only for unsaved ones (tests);
    # dumping every record's JSON at every comparison made the report slow
    return (_date(rec), str(rec.get("saved_at") or ""), _file(rec), "" if rec.get("_path") else _canon(rec))


def _canon(rec: dict) -> str:
    return json.dumps({k: v for k, v in rec.items() if k != "_path"}, sort_keys=True, default=str)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)  # a figure file name, and html.py's stale-figure pattern


def _stem(rec: dict) -> str:
    return _safe(Path(rec["_path"]).stem if rec.get("_path") else hashlib.sha256(_canon(rec).encode()).hexdigest()[:12])


def model_name(rec: dict) -> str:
    name = rec.get("model_name") or Path(str(rec.get("model") or "unknown")).name
    return name[:-5] if name.endswith(".gguf") else name


def engine_name(rec: dict) -> str:
    e = str(rec.get("engine") or "unknown")
    return LLAMACPP if e.lower() in _LLAMACPP_NAMES else e


def _build(rec: dict) -> str:
    parts = [str(rec[k]) for k in ("build", "version", "build_source") if rec.get(k) not in (None, "", "unknown")]
    return " / ".join(dict.fromkeys(parts)) or "unknown"


def _stack(rec: dict) -> str:
    """The CUDA stack a record ran on (engine/bench.py cuda_versions), as far as it says."""
    return ", ".join(f"{label} {rec[k]}" for k, label in (("cuda_driver", "CUDA driver API"), ("nvrtc", "NVRTC"),
                                                          ("cublas", "cuBLAS")) if rec.get(k))


def _settings(rec: dict) -> str:
    s = rec.get("settings") or {}
    return ", ".join(f"{k}={v}" for k, v in sorted(s.items())
                     if k not in ("n_prompt", "n_gen") and v not in (None, "", [], {})) or "no settings recorded"


def _test_key(test: str) -> tuple:
    return ({"pp": 0, "tg": 1}.get(test[:2], 2), test)


def _facts(records: list[dict]) -> dict:
    """Per model file (by sha256 and by file name): parameters, weight bytes a
    decode token reads, file size - from whichever record states them (same
    file, same facts, whichever engine measured it)."""
    facts: dict = {}
    for rec in sorted(records, key=_order):
        lb = rec.get("llama_bench")
        lb = lb[0] if isinstance(lb, list) and lb and isinstance(lb[0], dict) else {}
        found = {"n_params": rec.get("n_params") or lb.get("model_n_params"),
                 "params_per_token": rec.get("params_per_token"),
                 "weight_bytes": rec.get("weight_bytes_per_token"),
                 "file_bytes": rec.get("model_bytes") or lb.get("model_size")}
        for key in (rec.get("model_sha256"), Path(str(rec.get("model") or "")).name):
            for k, v in found.items():
                if key and v:
                    facts.setdefault(key, {}).setdefault(k, v)
    return facts


def _rate(rec: dict, test: str, tok_s: float, facts: dict, gb_s=None, roofline=None) -> Rate:
    keys = [k for k in (rec.get("model_sha256"), Path(str(rec.get("model") or "")).name) if k]
    get = lambda what: next((facts[k][what] for k in keys if facts.get(k, {}).get(what)), None)  # noqa: E731
    return dx.rate(test, tok_s, gb_s=gb_s, weight_bytes=get("weight_bytes"), file_bytes=get("file_bytes"),
                   n_params=get("n_params"), params_per_token=get("params_per_token"), roofline=roofline)


def _nvml_for(rec: dict, r: dict) -> tuple[dict | None, dict | None]:
    """(summary, trace) for one test: its own, else the record's (which
    covers the whole run: model load and every test)."""
    for src in (r, rec):
        summary, trace = src.get("nvml"), src.get("nvml_trace")
        if isinstance(summary, dict) and isinstance(summary.get("t"), list):
            summary, trace = None, summary  # a raw trace stored under "nvml"
        if trace and not summary:
            summary = nvml.summarize(trace, {"power_limit_w": rec.get("power_limit_w"),
                                             "sm_clock_max_mhz": rec.get("sm_clock_max_mhz")})
        if summary or trace:
            return summary, trace
    return None, None


def _with_window_length(summary: dict | None, window: dict | None) -> dict | None:
    """The summary with ``window_s``, how long the measured repetitions ran,
    for records saved before harness.ab.measured stored it: the engine's
    window is exact; an estimated one is the repetition time plus the slack."""
    if not summary or not window or "window_s" in summary or "start_s" not in window:
        return summary
    length = window["end_s"] - window["start_s"]
    if str(window.get("source", "")).startswith("estimated"):
        length -= ab.ESTIMATE_SLACK_S
    return dict(summary, window_s=round(length, 3))


def _trace_figure(name: str, title: str, trace: dict, power_limit, window: dict | None = None) -> Figure:
    data = tuple((k, tuple(trace.get(k) or ())) for k in ("t", "sm_mhz", "power_w", "gpu_util"))
    span = (window["start_s"], window["end_s"]) if window and "start_s" in window else None
    return Figure(name, "trace", title, data + (("power_limit_w", power_limit), ("window", span)))


# ---- the builder -------------------------------------------------------------

def _bench_measures(rec: dict, facts: dict, figures: dict, validations=(),
                    rooflines=None) -> list[tuple[dict, Measure]]:
    """Every test of a bench record as a Measure; its NVML trace, if any, into ``figures`` (drawn only if shown)."""
    out = []
    roof = (rooflines or {}).get(rec.get("gpu"))
    backed = backing(rec, model_name(rec), validations) if engine_name(rec) == ANVIL else None
    for r in rec.get("results") or []:
        test, tok = r.get("test"), results.throughput(r)
        if not test or tok is None:
            continue
        rt = _rate(rec, test, float(tok), facts, r.get("gb_s"), roof)
        summary, trace = _nvml_for(rec, r)
        summary = _with_window_length(summary, r.get("nvml_window"))
        fig = None
        if trace:
            own = r.get("nvml_trace") is trace or r.get("nvml") is trace
            fig = f"trace-{_stem(rec)}{'-' + _safe(test) if own else ''}"
            if fig not in figures:
                figures[fig] = lambda fig=fig, own=own, trace=trace, r=r, test=test: _trace_figure(
                    fig, f"{model_name(rec)} {engine_name(rec)} {test if own else 'run'} ({_date(rec)[:10]})",
                    trace, rec.get("power_limit_w"), r.get("nvml_window") if own else None)
        diag = dx.diagnose(test, summary, gb_s=rt.gb_s, tflop_s=rt.tflop_s, power_limit_w=rec.get("power_limit_w"),
                           sm_clock_max_mhz=rec.get("sm_clock_max_mhz"), windowed=bool(r.get("nvml_window")),
                           roofline=roof)
        samples = tuple(float(x) for x in r.get("samples_tok_s") or [] if isinstance(x, (int, float)) and x > 0)
        power = summary.get("power_w_mean") if summary and r.get("nvml_window") else None  # the measured window's
        joules = float(power) / float(tok) if isinstance(power, (int, float)) and tok > 0 else None
        peak = rec.get("peak_device_bytes")
        out.append((rec, Measure(engine_name(rec), test, float(tok), r.get("tok_s_sd"),
                                 len(r.get("samples_tok_s") or []), _date(rec), rec.get("gpu"), rec.get("driver"),
                                 _build(rec), _settings(rec), _file(rec), str(rec.get("note") or ""), rt, diag, fig,
                                 joules,
                                 peak if isinstance(peak, int) else None,
                                 _stack(rec), backed, samples, results.spec_hash(rec, test))))
    return out


def _select(by_engine: dict[str, list[tuple[dict, Measure]]]):
    """THE choice of the numbers a row shows (one model, test and GPU; each
    engine's (record, Measure)s oldest first): the newest pair of the two
    engines measured in one sitting (results.same_sitting) on one spec
    whose Anvil build passed the gate there (validated.py), with their
    ratio; without one, the newest such pair, not validated; without a
    pair, the latest of each engine and no ratio. Returns (anvil, llama.cpp,
    ratio, newer): each a (record, Measure) or None; ``newer``, the newest
    pair where it is newer than a validated one shown, (anvil, llama.cpp, ratio).
    Without a pair, llama.cpp's number is of Anvil's spec or none (another
    model file of the same name is not shown beside it)."""
    pairs = [(a, l) for a in by_engine.get(ANVIL, []) for l in by_engine.get(LLAMACPP, [])
             if l[1].tok_s > 0 and a[1].spec == l[1].spec and results.same_sitting(a[0], l[0])
             and results.comparable(a[0], l[0], a[1].test)]
    newest = lambda ps: max(ps, key=lambda p: (_order(p[0][0]), _order(p[1][0])))  # noqa: E731
    if not pairs:
        a = by_engine[ANVIL][-1] if by_engine.get(ANVIL) else None
        same = [x for x in by_engine.get(LLAMACPP, []) if a is None or x[1].spec == a[1].spec]
        return a, same[-1] if same else None, None, None
    a, l = newest(pairs)
    newer = None
    if validated := [p for p in pairs if p[0][1].validation and p[0][1].validation.ok]:
        if (a, l) != newest(validated):  # the newest is not validated: the row stays on what is
            newer = (a[1], l[1], a[1].tok_s / l[1].tok_s)
        a, l = newest(validated)
    return a, l, a[1].tok_s / l[1].tok_s, newer


def _rows_and_history(measures: list[tuple[dict, Measure]]):
    """One row per (model, test, GPU), its numbers from ``_select``; per
    engine of the row, its history on the row's spec: first record ->
    the row's, with the change-points between."""
    groups: dict[tuple, dict[str, list]] = {}
    for rec, m in measures:
        groups.setdefault((model_name(rec), m.test, m.gpu or ""), {}).setdefault(m.engine, []).append((rec, m))
    rows, hist = [], []
    for (model, test, gpu), by_engine in sorted(groups.items(), key=lambda kv: (kv[0][0], _test_key(kv[0][1]),
                                                                                 kv[0][2])):
        for eng in by_engine:
            by_engine[eng].sort(key=lambda rm: _order(rm[0]))
        a, l, ratio, newer = _select(by_engine)
        shown = a or l
        if shown is None:  # neither engine the scoreboard compares
            continue
        spec_text = ", ".join(f"{k}={v}" for k, v in results.spec(shown[0], test).items())
        spread = _spread(by_engine.get(ANVIL, []), a[1]) if a else None
        rows.append(Row(model, test, gpu or None, shown[1].spec, spec_text, a[1] if a else None,
                        l[1] if l else None, ratio, spread, newer))
        for eng, chosen in ((ANVIL, a), (LLAMACPP, l)):
            if chosen is None:
                continue
            pts = [m for _, m in by_engine[eng] if m.spec == chosen[1].spec]
            after = len(pts) - 1 - pts.index(chosen[1])
            hist.append(History(model, test, eng, gpu or None, chosen[1].spec, pts[0], chosen[1], len(pts),
                                tuple(pts), tuple(change_points(pts)) if eng == ANVIL else (), after))
    return rows, hist


def _spread(measured: list[tuple[dict, Measure]], chosen: Measure) -> tuple[float, int] | None:
    """Run to run: (max - min) / median of the chosen number's build over its
    sittings on the same spec (one value a sitting, the newest record of
    each: separate ``harness bench`` calls), and how many sittings; None under two."""
    by_sitting: dict[str, float] = {}
    for rec, m in sorted(measured, key=lambda rm: _order(rm[0])):
        if m.build == chosen.build and m.spec == chosen.spec and m.tok_s > 0:
            by_sitting[rec.get("sitting") or _file(rec)] = m.tok_s
    if len(by_sitting) < 2:
        return None
    v = sorted(by_sitting.values())
    return (v[-1] - v[0]) / statistics.median(v), len(v)


def _llama_spread(records: list[dict]) -> dict[tuple[str, str], str]:
    """(model, reference set) -> llama.cpp's own max margin shift per variant,
    all from the latest variation record that measured that pair (an older
    record measured other references or other variants)."""
    latest: dict[tuple, dict[str, float]] = {}
    for rec in sorted(records, key=_order):
        this: dict[tuple, dict[str, float]] = {}
        for e in validate_entries(rec):
            if e.get("variant") and e.get("max_margin_shift") is not None:
                key = (model_name({"model_name": e["model"]}), str(e.get("tier")))
                this.setdefault(key, {})[e["variant"]] = e["max_margin_shift"]
        latest.update(this)
    return {k: ", ".join(f"{v} {x:.3g}" for v, x in sorted(by.items())) for k, by in latest.items()}


def _first_seen(records: list[dict], files: dict[str, dict]) -> dict[str, str]:
    """model -> the date of the first record (validate or variation) that names the file the
    catalog pins for it now."""
    first: dict[str, str] = {}
    for rec in sorted(records, key=_order):
        for e in validate_entries(rec):
            m = model_name({"model_name": e["model"]})
            if m not in first and e.get("model_sha256") and e["model_sha256"] == files.get(m, {}).get("sha256"):
                first[m] = _date(rec) or ""
    return first


def _stale(e: dict, date: str, model: str, files: dict[str, dict], first: dict[str, str]) -> bool:
    """Whether a validation entry judged another file of the model than the catalog's now, or
    other references: by the file it names, or, for records from before validations named it,
    by coming before the first record of the current file or before its reference set was made."""
    now = files.get(model)
    if not now:
        return False
    if e.get("model_sha256"):
        return e["model_sha256"] != now.get("sha256")
    made = now.get("refs", {}).get(str(e.get("tier")), "")
    return date < max(first.get(model, ""), made)


def _parity(records: list[dict], variation: list[dict] = (), files: dict[str, dict] | None = None) -> list[Parity]:
    """The newest validation of each (model, reference set, backend). ``files`` (catalog_files):
    a validation of another file of the model, or against earlier references, shows as stale."""
    spread = _llama_spread(list(variation))
    files = files or {}
    first = _first_seen(list(records) + list(variation), files)
    latest: dict[tuple, Parity] = {}
    for rec in sorted(records, key=_order):
        for e in validate_entries(rec):
            drift = e.get("drift") or []
            passed = e.get("passed", not drift)
            near = max(0, int(e.get("flips") or 0) - len(drift))
            failed = sorted({f.get("check", "?") for f in e.get("failures") or [] if isinstance(f, dict)})
            if not passed:
                status = (f"FAIL: {', '.join(failed)}" if failed else
                          f"DRIFT: {len(drift)} flip(s) beyond the near-tie threshold")
            elif e.get("mode") == "exact":
                status = "exact"
            else:
                status = f"teacher-forced: {near} near-tie flip{'s' if near != 1 else ''}"
            g = lambda k: e.get(k, rec.get(k))  # noqa: E731  (entry first, then its record)
            model = model_name({"model_name": e["model"]})
            if _stale(e, _date(rec), model, files, first):
                status, passed = "STALE: judged an earlier file or references of this model (made anew since)", False
            where = (f"{g('gpu')}, driver {g('driver') or '?'}" if g("gpu") else
                     "GPU not recorded" if g("backend") == "cuda" else "CPU run")
            prov = f"{where}, {_date(rec) or '?'}, build {_build(rec)}; {_file(rec)}"
            latest[(model, str(g("tier")), str(g("backend")))] = Parity(
                model, str(g("tier") or "?"), str(g("backend") or "?"), status, bool(passed),
                f"{e.get('matched', '?')}/{e.get('steps', '?')}", e.get("max_logit_diff"), e.get("near_tie"), prov,
                e.get("max_margin_shift"), spread.get((model, str(g("tier")))),
                f"{e['agreement']}/{e.get('steps', '?')}" if "agreement" in e else "—", e.get("max_kl"),
                Path(rec["_path"]).name if rec.get("_path") else "", _date(rec))
    return [latest[k] for k in sorted(latest)]


def _arm_label(desc: dict) -> str:
    """An A/B arm by what a reader knows it as: its commit and subject
    (``harness ab --commits`` records them), else the wheel's directory where
    that names it (a branch or commit someone built into it) and the wheel's
    label, with the build's hash."""
    ident, label = str(desc.get("sha256") or desc.get("build") or desc.get("version") or "")[:12], \
        str(desc.get("label") or desc.get("kind") or "?")
    if desc.get("commit"):
        return f"{str(desc['commit'])[:8]} {desc.get('subject') or ''}".strip() + f" (build {ident[:8]})"
    where = Path(str(desc.get("wheel") or "")).parent.name
    if where and where not in (".", "wheels", "dist") and not re.fullmatch(r"[0-9a-f]{40}", where):
        label = f"{where}: {label}"
    elif re.fullmatch(r"[0-9a-f]{40}", where):  # harness wheel's cache: the directory is the commit
        label = f"{where[:8]}: {label}"
    return label + (f" ({ident})" if ident and ident not in label else "")


def _ab(records: list[dict], facts: dict, rooflines: dict) -> tuple[list[ABTest], list[Run]]:
    """The newest AB_SHOWN A/B records: each test's analysis as recorded, and
    each run diagnosed from its own NVML summary (its trace stays in the record)."""
    tests, runs = [], []
    for rec in sorted(records, key=_order, reverse=True)[:AB_SHOWN]:
        arms = rec.get("arms") or {}
        model = model_name(rec)
        prov = (f"{rec.get('gpu') or 'GPU not recorded'}, driver {rec.get('driver') or '?'}, {_date(rec) or '?'}; "
                f"{_file(rec)}")
        diags: dict[str, list[Diagnosis]] = {"A": [], "B": []}
        for rnd in rec.get("rounds") or []:
            for arm, run in sorted((rnd.get("runs") or {}).items()):
                ts = {t: v for t, v in (run.get("tests") or {}).items() if v}
                test = min(ts, key=lambda t: (not t.startswith("tg"), t)) if ts else None  # decode dominates a run
                if test is None:
                    continue
                roof = rooflines.get(rec.get("gpu"))
                rt = _rate(rec, test, statistics.median(ts[test]), facts, roofline=roof)
                cold = " (cold, dropped)" if rnd.get("cold") else ""
                d = dx.diagnose(test, run.get("nvml"), gb_s=rt.gb_s, tflop_s=rt.tflop_s,
                                windowed=bool(run.get("nvml_window")), roofline=roof)
                if not rnd.get("cold"):
                    diags.setdefault(arm, []).append(d)
                who = f"{arm}: {_arm_label(arms.get(arm, {}))}, round {rnd.get('round')}{cold}"
                runs.append(Run("ab", _file(rec), model, who, test, d, None, prov))
        maj = {k: "{} ({}/{} runs)".format(*dx.majority(v)) if v else "no runs" for k, v in diags.items()}
        notes = []
        if rec.get("aa"):  # one build against itself (harness ab --aa): what later verdicts are judged against
            notes.append("A/A: measures the noise band")
        if not rec.get("complete", True):
            notes.append(f"incomplete ({rec.get('interrupted') or 'interrupted'})")
        if rec.get("skipped_rounds"):
            notes.append(f"{len(rec['skipped_rounds'])} round(s) skipped: GPU busy")
        if rec.get("tokens_identical") is False:
            notes.append("greedy tokens DIFFER")
        elif rec.get("tokens_identical"):
            notes.append("greedy tokens identical")
        for test, t in sorted((rec.get("analysis") or {}).items(), key=lambda kv: _test_key(kv[0])):
            w = t.get("wins") or {}
            try:
                stats = (float(t["A"]["median"]), float(t["B"]["median"]), float(t["ratio"]),
                         (float(t["ci_low"]), float(t["ci_high"])), float(t["p_value"]))
            except (KeyError, TypeError, ValueError):
                continue  # an analysis of another shape: nothing trustworthy to show
            tests.append(ABTest(
                _file(rec), _date(rec), model, _arm_label(arms.get("A", {})), _arm_label(arms.get("B", {})), test,
                *stats, f"{w.get('B', '?')}:{w.get('A', '?')}" + (f" ({w['ties']} ties)" if w.get("ties") else ""),
                str(t.get("verdict", "?")), maj.get("A", "no runs"), maj.get("B", "no runs"), "; ".join(notes), prov))
    return tests, runs


def _ratio_figure(rows: list[Row]) -> Figure | None:
    """Anvil ÷ llama.cpp of every row with a ratio, one bar each (the
    summary at a glance); validated or not, as the row says."""
    gpus = len({r.gpu for r in rows}) > 1
    bars = tuple((f"{r.model} {r.test}" + (f" [{r.gpu}]" if gpus and r.gpu else ""), r.ratio, r.validated)
                 for r in rows if r.ratio is not None)
    if not bars:
        return None
    return Figure("ratios", "bars", "Anvil ÷ llama.cpp, one sitting each (right of 1: Anvil faster)", bars)


_DEPTH_TEST = re.compile(r"^((?:pp|tg)\d+) @ d(\d+)$")  # llama-bench's name of a test after D cached tokens


def _engine_label(engine: str) -> str:
    return "Anvil" if engine == ANVIL else engine


def _ab_marks(records: list[dict]) -> dict[str, tuple]:
    """model -> every A/B test of it, ((date, verdict, "tg128 1.012×"), ...), oldest first: the history's lane."""
    out: dict[str, list] = {}
    for rec in records:
        for test, t in sorted((rec.get("analysis") or {}).items()):
            if isinstance(t, dict) and isinstance(t.get("ratio"), (int, float)) and t.get("verdict"):
                mark = (_date(rec), str(t["verdict"]), f"{test} {t['ratio']:.3f}×")
                out.setdefault(model_name(rec), []).append(mark)
    return {m: tuple(sorted(v)) for m, v in out.items()}


def _history_figure(model: str, hist: list[History], ab_marks: tuple) -> Figure | None:
    """tok/s of every record of each row's spec against the date it was
    measured (one line per engine and test; prefill and decode in their own
    panels), the change-points that are not "no change" marked on Anvil's
    lines, and the model's A/B comparisons in a lane below (marker: verdict).
    None unless some line has two records or more."""
    panels = []
    for prefix, title in (("pp", "prefill t/s"), ("tg", "decode t/s")):
        series, marks = [], []
        for h in hist:
            if not h.test.startswith(prefix):
                continue
            tag = f" [{h.gpu}]" if len({x.gpu for x in hist}) > 1 else ""
            series.append((f"{_engine_label(h.engine)} {h.test}{tag}", tuple((m.date, m.tok_s) for m in h.points)))
            at = {m.date: m.tok_s for m in h.points}
            marks += [(c.date, at.get(c.date), c.label) for c in h.changes if c.label in (
                "regression", "suspicious", "improvement")]
        if series:
            panels.append((title, tuple(series), tuple(marks)))
    if not any(len(pts) > 1 for _, series, _ in panels for _, pts in series):
        return None  # no line to draw: every engine and test has one record
    return Figure(f"history-{_safe(model)}", "lines", f"{model}: tokens/s of each record, by date (UTC)",
                  (("x", "date"), ("panels", tuple(panels)), ("ab", ab_marks)))


def _depth_figure(model: str, rows: list[Row], measures: list[tuple[dict, Measure]]) -> Figure | None:
    """tok/s against the context depth a test ran at (llama-bench's "tg128
    @ d4096"; depth 0 = the plain test), each curve ONE build of one engine
    in one sitting: anchored on a depth row's chosen number, with that
    build's numbers of the same sitting and spec family at the other depths.
    Of the anchors, the curve with the most depths (then the newest). None
    without a curve of two depths."""
    by_rec = [(rec, m) for rec, m in measures if model_name(rec) == model]

    def base_depth(test):
        m = _DEPTH_TEST.match(test)
        return (m.group(1), int(m.group(2))) if m else (test, 0)

    curves: dict[tuple, tuple] = {}  # (base, gpu, engine) -> (n points, anchor order, label, points)
    for row in rows:
        base, depth = base_depth(row.test)
        if depth == 0:
            continue
        for anchor in (row.anvil, row.llamacpp):
            if anchor is None:
                continue
            arec = next(rec for rec, m in by_rec if m is anchor)
            pts: dict[int, tuple] = {}
            for rec, m in by_rec:
                b, d = base_depth(m.test)
                if (b, m.engine, m.gpu, m.build) == (base, anchor.engine, anchor.gpu, anchor.build) \
                        and results.same_sitting(rec, arec):
                    if d not in pts or _order(rec) > pts[d][0]:
                        pts[d] = (_order(rec), m.tok_s)
            key = (base, row.gpu or "", anchor.engine)
            label = (f"{_engine_label(anchor.engine)} {base} · build {fmt_short_build(anchor.build)}, "
                     f"{anchor.date[:10]}")
            cand = (len(pts), _order(arec), label, tuple(sorted((d, v[1]) for d, v in pts.items())))
            if len(pts) > 1 and (key not in curves or cand[:2] > curves[key][:2]):
                curves[key] = cand
    if not curves:
        return None
    panels = []
    for prefix, title in (("pp", "prefill t/s"), ("tg", "decode t/s")):
        series = tuple((label + (f" [{gpu}]" if len({k[1] for k in curves}) > 1 else ""), pts)
                       for (base, gpu, eng), (_, _, label, pts) in sorted(curves.items()) if base.startswith(prefix))
        if series:
            panels.append((title, series, ()))
    return Figure(f"depth-{_safe(model)}", "lines", f"{model}: tokens/s against context depth (cached tokens), "
                  f"one build and sitting per curve", (("x", "depth"), ("panels", tuple(panels)), ("ab", ())))


def _whole_suite(rec: dict) -> bool:
    """The record says it ran every mutant of its backend's suite (records
    from before ``not_run`` was recorded do not say)."""
    return rec.get("not_run") == []


def _mutants(records: list[dict]) -> list[MutantSuite]:
    from ..mutants import for_backend  # the suite as it stands: what a record has no result for shows

    by_backend: dict[str, list[dict]] = {}
    for rec in sorted(records, key=_order):
        by_backend.setdefault(str(rec.get("backend") or "?"), []).append(rec)
    out = []
    for backend, recs in sorted(by_backend.items()):
        whole = [rec for rec in recs if _whole_suite(rec)]
        shown = (whole or recs)[-1]
        results = [r for r in shown.get("mutants") or [] if isinstance(r, dict)]
        rows = tuple((str(r.get("mutant")), str(r.get("bug", "")),
                      f"{r.get('model')} ({r.get('references')})" if r.get("caught")
                      else "NOT JUDGED" if r.get("error") else "NOT CAUGHT",
                      ", ".join(r.get("checks") or []) or str(r.get("error") or ""),
                      ", ".join(r.get("tried") or [])) for r in results)
        names = {row[0] for row in rows}
        not_run = tuple(m.name for m in for_backend(backend) if m.name not in names)
        partial = bool(not_run) or any(r.get("error") for r in results) or shown.get("partial") is True
        where = (f"{shown['gpu']}, driver {shown.get('driver') or '?'}" if shown.get("gpu") else "CPU run")
        history = tuple((_date(rec), str(rec.get("build") or "?")[:8],
                         f"caught {rec.get('caught')} of {len(rec.get('mutants') or [])}",
                         "whole suite" if _whole_suite(rec) else
                         f"{len(rec['not_run'])} not run" if isinstance(rec.get("not_run"), list) else "not recorded",
                         _file(rec)) for rec in reversed(recs) if rec is not shown)
        control = tuple((f"{c.get('model')} ({c.get('references')})", str(c.get("first") or ""))
                        for c in shown.get("control_failed") or [] if isinstance(c, dict))
        out.append(MutantSuite(backend, sum(bool(r.get("caught")) for r in results), len(rows), rows,
                               str(shown.get("build") or "?")[:8], _date(shown), _file(shown), where, partial,
                               not_run, control, history))
    return out


SUITE_RUNS_SHOWN = 5


def _suite_runs(records: list[dict]) -> list[SuiteRun]:
    from ..testrun import verdict

    out = []
    for rec in sorted(records, key=_order, reverse=True)[:SUITE_RUNS_SHOWN]:
        where = ", ".join(x for x in (rec.get("gpu") or "GPU not recorded", f"driver {rec.get('driver') or '?'}",
                                      rec.get("host")) if x)
        out.append(SuiteRun(_file(rec), _date(rec), _build(rec), where, rec["passed"], rec["failed"], rec["errors"],
                            rec["skipped"], rec.get("duration_s"), str(rec["command"]), verdict(rec)))
    return out


def _summary(rows: list[Row]) -> list[SummaryRow]:
    by: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by.setdefault((r.model, r.gpu or ""), {})[r.test] = r
    return [SummaryRow(model, gpu or None, tuple(cells.get(t) for t in SUMMARY_TESTS))
            for (model, gpu), cells in sorted(by.items()) if any(t in cells for t in SUMMARY_TESTS)]


def catalog_files() -> dict[str, dict]:
    """What the catalog pins for each model now: its file's sha256 and when each of its reference
    sets was made (``{"sha256": ..., "refs": {set: created}}``), from references/."""
    from .. import catalog, refs
    out = {}
    for name, e in catalog.load().items():
        made = {}
        for s in e.reference_sets:
            try:
                made[s] = json.loads(refs.reference_path(name, s).read_text()).get("created") or ""
            except (OSError, ValueError):
                continue
        out[name] = {"sha256": e.sha256, "refs": made}
    return out


def build_report(records: list[dict], files: dict[str, dict] | None = None) -> Report:
    """The whole page's content from result records (as results.load_all returns). ``files``:
    what the catalog pins now (catalog_files), which tells a validation of the current file and
    references from one of a file or references since made anew."""
    records = sorted(records, key=_order)
    kind = lambda r: r.get("kind", "bench")  # noqa: E731
    bench = [r for r in records if kind(r) == "bench"]
    rooflines = roofline_.by_gpu(records)
    facts = _facts(bench + [r for r in records if kind(r) == "ab"])
    traces: dict = {}  # name -> a function making the trace Figure: drawn only for runs the page shows
    validations = [r for r in records if kind(r) == "validate"]
    measures = [rm for rec in bench for rm in _bench_measures(rec, facts, traces, validations, rooflines)]
    rows, hist = _rows_and_history(measures)
    parity = _parity(validations, [r for r in records if kind(r) == "variation"], files)
    ab_tests, ab_runs = _ab([r for r in records if kind(r) == "ab"], facts, rooflines)
    marks = _ab_marks([r for r in records if kind(r) == "ab"])

    runs = [Run("bench", "", row.model, m.engine, m.test, m.diagnosis, m.figure, m.provenance)
            for row in rows for m in (row.anvil, row.llamacpp) if m is not None]
    figures = {f.name: f for f in [_ratio_figure(rows)] if f}
    figures.update((run.figure, traces[run.figure]()) for run in runs if run.figure)

    names = sorted({r.model for r in rows} | {p.model for p in parity})
    models = []
    for n in names:
        own_rows, own_hist = [r for r in rows if r.model == n], [h for h in hist if h.model == n]
        figs = tuple(f for f in (_history_figure(n, own_hist, marks.get(n, ())), _depth_figure(n, own_rows, measures))
                     if f)
        figures.update((f.name, f) for f in figs)
        models.append(ModelSection(n, tuple(own_rows), tuple(own_hist), tuple(p for p in parity if p.model == n),
                                   figs))
    sources = tuple(sorted((_file(r), kind(r), model_name(r) if r.get("model") else "",
                            engine_name(r) if kind(r) == "bench" else "", _date(r)) for r in records))
    digest = hashlib.sha256("\n".join(sorted(_canon(r) for r in records)).encode()).hexdigest()
    return Report(tuple(models), tuple(parity), tuple(ab_tests), tuple(runs + ab_runs),  # both already in page order
                  tuple(figures[k] for k in sorted(figures)), sources, digest,
                  max((_date(r) for r in records), default=""),
                  tuple(_mutants([r for r in records if kind(r) == "mutants"])),
                  suite_runs=tuple(_suite_runs([r for r in records if kind(r) == "tests"])),
                  summary=tuple(_summary(rows)), rooflines=tuple(rooflines[g] for g in sorted(rooflines)))


def merge_stores(stores: list[list[dict]]) -> list[dict]:
    """The records of several results stores (results.load_all each), a
    record that is in more than one of them (by file name, or by content
    under another name: a store copied from a GPU host) once, the first
    store's copy; oldest first, as one store's."""
    if len(stores) == 1:
        return stores[0]
    seen_names, seen_content, out = set(), set(), []
    for recs in stores:
        for rec in recs:
            name, content = rec.get("_path") and _file(rec), hashlib.sha256(_canon(rec).encode()).hexdigest()
            if name in seen_names or content in seen_content:
                continue
            seen_names.add(name)
            seen_content.add(content)
            out.append(rec)
    return sorted(out, key=_order)


class _Progress:
    """Plain lines on stderr, each with the seconds since the start: the report takes seconds, not silence."""

    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, what: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.1f} s] {what}", file=sys.stderr, flush=True)


def main_report(args) -> int:
    """``harness report``: args.format ("html" | "md"), args.out (default
    reports/index.html; for md, stdout), args.results_dir (default the store's)."""
    fmt = getattr(args, "format", None) or "html"
    if fmt not in ("html", "md"):
        raise AnvilError(f"unknown report format {fmt!r}; one of html, md")
    rdirs = getattr(args, "results_dir", None)
    rdirs = [rdirs] if isinstance(rdirs, (str, Path)) else list(rdirs or [])
    for d in rdirs:
        if not Path(d).is_dir():
            raise AnvilError(f"{d}: no such results directory")
    rdir = rdirs[0] if len(rdirs) == 1 else None  # one store: the page links its records
    say = _Progress()
    skipped: list = []
    with warnings.catch_warnings():  # each skipped file is said once, below, as one line
        warnings.simplefilter("ignore", results.ResultsWarning)
        records = merge_stores([results.load_all(d, skipped=skipped) for d in rdirs or [None]])
    for path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    say(f"read {len(records)} record(s) from {', '.join(map(str, rdirs)) or results.DEFAULT_DIR}")
    rep = dataclasses.replace(build_report(records, catalog_files()), skipped=tuple(skipped))
    say(f"built the scoreboard: {len(rep.rows)} row(s), {len(rep.figures)} figure(s) to draw")
    out = getattr(args, "out", None)
    if fmt == "md":
        text = render_md(rep)
        if out is None or Path(out) == DEFAULT_OUT or str(out).endswith(".html"):
            sys.stdout.write(text)  # the html default is no place for markdown
        else:
            atomic_write(Path(out), text.encode())
            print(f"wrote {out}", file=sys.stderr)
        return 0
    if getattr(args, "readme", False):
        path = project.ROOT / "README.md"
        try:
            text = update_readme(path.read_text(), render_readme_table(rep))
        except (OSError, ValueError) as e:
            raise AnvilError(f"{path}: {e}") from None
        atomic_write(path, text.encode())
        print(f"wrote the speed table of {path} from {len(records)} record(s)", file=sys.stderr)
        return 0
    out = Path(out) if out is not None else DEFAULT_OUT
    store = Path(rdir) if rdir is not None else results.DEFAULT_DIR
    rep = dataclasses.replace(rep, records_href="" if len(rdirs) > 1 else  # several stores: no one place to link
                              Path(os.path.relpath(os.path.abspath(store), os.path.abspath(out.parent))).as_posix())
    page = write_html(rep, out.parent, name=out.name, progress=say)
    say(f"wrote {page} ({page.stat().st_size / 1e3:.0f} kB, {len(rep.figures)} inline figure(s)) "
        f"from {len(records)} record(s)")
    return 0


__all__ = ["Report", "build_report", "write_html", "render_md", "main_report"]
