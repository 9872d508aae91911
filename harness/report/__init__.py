"""``harness report``: the scoreboard of prefill and decode, as static HTML
(or GitHub markdown), built from the results store alone.

    rep = build_report(results.load_all())  # pure: same records -> same Report
    write_html(rep, "reports")              # reports/index.html + reports/figures/*.png
    print(render_md(rep))

``build_report`` reads no clock and no environment: every list is sorted and
every "latest" is the latest *record* (by its own date), so the same records
render to byte-identical HTML and PNGs. Numbers are only ever compared
within one benchmark spec (``results.spec_hash``) on one GPU.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import nvml, results
from .diagnose import MEASURED_BF16_TFLOPS, MEASURED_HBM_GBS, Diagnosis, diagnose, majority

ANVIL, LLAMACPP = "anvil", "llama.cpp"
_LLAMACPP_NAMES = {"llama.cpp", "llamacpp", "llama-cpp-python", "llama-bench"}
AB_SHOWN = 10  # most recent A/B records on the page (each with one trace figure per run)
# Q4_K_M mixes Q4_K with Q6_K: ~4.9 bits per weight over the matrices an 8B
# model reads per token (qwen3-8b: 4.67 GB for 7.57 G matrix params). Used only
# to estimate parameters when no record of the model file states them.
Q4_K_M_BITS_PER_WEIGHT = 4.9
DEFAULT_OUT = results.DEFAULT_DIR.parent / "index.html"


@dataclass(frozen=True)
class Measure:
    """One test of one bench record, with what the page says about it."""
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
    rate: str             # "1121 GB/s" or "~292 TFLOP/s", "" when unknown
    rate_note: str        # where the rate came from
    roofline: float | None  # fraction of MEASURED_HBM_GBS (decode) / MEASURED_BF16_TFLOPS (prefill)
    diagnosis: Diagnosis
    figure: str | None    # trace figure file name

    @property
    def provenance(self) -> str:
        return (f"{self.engine} on {self.gpu or 'unknown GPU'}, driver {self.driver or '?'}, {self.date}, "
                f"build {self.build}, {self.settings}; {self.n} samples; {self.file}")


@dataclass(frozen=True)
class Row:
    """One model x test x GPU x spec: the latest Anvil and llama.cpp numbers."""
    model: str
    test: str
    gpu: str | None
    spec: str
    spec_text: str
    anvil: Measure | None
    llamacpp: Measure | None
    ratio: float | None   # anvil / llama.cpp, only for comparable records


@dataclass(frozen=True)
class History:
    model: str
    test: str
    engine: str
    gpu: str | None
    spec: str
    first: Measure
    latest: Measure
    n_records: int

    @property
    def gain(self) -> float:
        return self.latest.tok_s / self.first.tok_s


@dataclass(frozen=True)
class Parity:
    model: str
    tier: str
    backend: str
    status: str
    ok: bool
    matched: str
    max_logit_diff: float | None
    near_tie: float | None
    provenance: str


@dataclass(frozen=True)
class ABTest:
    file: str
    date: str
    model: str
    arm_a: str
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
    """A diagnosed run, listed in the page's diagnosis section."""
    source: str           # "bench" or "ab"
    model: str
    who: str              # engine, or "A: label"
    test: str
    diagnosis: Diagnosis
    figure: str | None
    provenance: str


@dataclass(frozen=True)
class Figure:
    name: str             # file name under figures/
    kind: str             # "bars" or "trace"
    title: str
    data: tuple           # bars: ((label, ((series, value, sd), ...)), ...); trace: ((key, values), ...)


@dataclass(frozen=True)
class ModelSection:
    name: str
    rows: tuple[Row, ...]
    history: tuple[History, ...]
    parity: tuple[Parity, ...]


@dataclass(frozen=True)
class Report:
    models: tuple[ModelSection, ...]
    parity: tuple[Parity, ...]
    ab: tuple[ABTest, ...]
    runs: tuple[Run, ...]
    figures: tuple[Figure, ...]
    sources: tuple[tuple[str, str, str, str, str], ...]  # (file, kind, model, engine, date)
    digest: str           # sha256 of the records' content: which evidence this page shows
    notes: tuple[str, ...] = field(default=())

    @property
    def rows(self) -> tuple[Row, ...]:
        return tuple(r for m in self.models for r in m.rows)

    @property
    def history(self) -> tuple[History, ...]:
        return tuple(h for m in self.models for h in m.history)


# ---- record helpers ----------------------------------------------------------

def _file(rec: dict) -> str:
    return Path(rec["_path"]).name if rec.get("_path") else "(unsaved record)"


def _order(rec: dict) -> tuple:
    return (str(rec.get("date") or rec.get("saved_at") or ""), str(rec.get("saved_at") or ""), _file(rec))


def _stem(rec: dict) -> str:
    name = Path(rec["_path"]).stem if rec.get("_path") else hashlib.sha256(_canon(rec).encode()).hexdigest()[:12]
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _canon(rec: dict) -> str:
    return json.dumps({k: v for k, v in rec.items() if k != "_path"}, sort_keys=True, default=str)


def model_name(rec: dict) -> str:
    name = rec.get("model_name") or Path(str(rec.get("model") or "unknown")).name
    return name[:-5] if name.endswith(".gguf") else name


def engine_name(rec: dict) -> str:
    e = str(rec.get("engine") or "unknown")
    return LLAMACPP if e.lower() in _LLAMACPP_NAMES else e


def _build(rec: dict) -> str:
    b, v = rec.get("build"), rec.get("version")
    return " / ".join(str(x) for x in (b, v) if x not in (None, "")) or "unknown"


def _settings(rec: dict) -> str:
    s = rec.get("settings") or {}
    items = [f"{k}={v}" for k, v in sorted(s.items())
             if k not in ("n_prompt", "n_gen") and v not in (None, "", [], {})]
    return ", ".join(items) or "no settings recorded"


def _short_date(d: str) -> str:
    return d[:16].replace("T", " ") if d else "?"


def _facts(records: list[dict]) -> dict:
    """Per model file (sha256 and file name): parameters, weight bytes a decode
    token reads, file size - from whichever record states them (same file,
    same facts, whichever engine measured it)."""
    facts: dict = {}
    for rec in sorted(records, key=_order):
        lb = (rec.get("llama_bench") or [{}])[0] if isinstance(rec.get("llama_bench"), list) else {}
        found = {"n_params": rec.get("n_params") or lb.get("model_n_params"),
                 "weight_bytes": rec.get("weight_bytes_per_token"),
                 "file_bytes": rec.get("model_bytes") or lb.get("model_size")}
        for key in (rec.get("model_sha256"), Path(str(rec.get("model") or "")).name or None):
            if key:
                f = facts.setdefault(key, {})
                for k, v in found.items():
                    if v and k not in f:
                        f[k] = v
    return facts


def _fact(rec: dict, facts: dict, key: str):
    for k in (rec.get("model_sha256"), Path(str(rec.get("model") or "")).name):
        if k and facts.get(k, {}).get(key):
            return facts[k][key]
    return None


def achieved(rec: dict, test: str, tok_s: float, facts: dict, gb_s=None):
    """(gb_s, tflop_s, text, note) for one measured rate."""
    if test.startswith("tg"):
        if gb_s is not None:
            return gb_s, None, f"{gb_s:.0f} GB/s", "recorded"
        wb = _fact(rec, facts, "weight_bytes")
        if wb:
            g = wb * tok_s / 1e9
            return g, None, f"{g:.0f} GB/s", "weight bytes per token x tok/s"
        fb = _fact(rec, facts, "file_bytes")
        if fb:
            g = fb * tok_s / 1e9
            return g, None, f"~{g:.0f} GB/s", "file size x tok/s (over-estimate: counts the embedding table)"
    if test.startswith("pp"):
        n = _fact(rec, facts, "n_params")
        note = "2 x n_params FLOPs per token (attention not counted)"
        if not n and _fact(rec, facts, "weight_bytes"):
            n = _fact(rec, facts, "weight_bytes") * 8 / Q4_K_M_BITS_PER_WEIGHT
            note = f"2 x n_params FLOPs per token, n_params estimated from weight bytes at " \
                   f"{Q4_K_M_BITS_PER_WEIGHT} bits/weight"
        if n:
            tf = 2 * n * tok_s / 1e12
            return None, tf, f"~{tf:.0f} TFLOP/s", note
    return None, None, "", ""


def _trace_figure(name: str, title: str, trace: dict, limit) -> Figure:
    keys = ("t", "sm_mhz", "power_w", "gpu_util")
    data = tuple((k, tuple(trace.get(k) or ())) for k in keys) + (("power_limit_w", limit),)
    return Figure(name, "trace", title, data)


def _nvml_for(rec: dict, r: dict) -> tuple[dict | None, dict | None, str]:
    """(summary, trace, scope) of one test: its own, else the record's (which
    covers the whole run: model load and every test)."""
    for src, scope in ((r, ""), (rec, "(the NVML trace covers the whole run, load included)")):
        summary, trace = src.get("nvml"), src.get("nvml_trace")
        if isinstance(summary, dict) and isinstance(summary.get("t"), list):
            summary, trace = None, summary  # a raw trace stored under "nvml"
        if trace and not summary:
            summary = nvml.summarize(trace, {"power_limit_w": rec.get("power_limit_w"),
                                             "sm_clock_max_mhz": rec.get("sm_clock_max_mhz")})
        if summary or trace:
            return summary, trace, scope
    return None, None, ""


from .build import build_report  # noqa: E402  (the builder uses the types above)
from .html import render_md, write_html  # noqa: E402


def main_report(args) -> int:
    """``harness report``: args.format ("html" | "md"), args.out (default
    reports/index.html; for md, stdout), args.results_dir (default the store's)."""
    fmt = getattr(args, "format", None) or "html"
    records = results.load_all(getattr(args, "results_dir", None))
    rep = build_report(records)
    out = getattr(args, "out", None)
    if fmt == "md":
        text = render_md(rep)
        if out is None or str(out) == str(DEFAULT_OUT):
            sys.stdout.write(text)
        else:
            from .html import atomic_write

            atomic_write(Path(out), text.encode())
            print(f"wrote {out}", file=sys.stderr)
        return 0
    out = Path(out) if out is not None else DEFAULT_OUT
    written = write_html(rep, out.parent, name=out.name)
    print(f"wrote {out} and {len(written) - 1} figures from {len(records)} records", file=sys.stderr)
    return 0


__all__ = ["Report", "build_report", "write_html", "render_md", "main_report",
           "MEASURED_HBM_GBS", "MEASURED_BF16_TFLOPS"]
