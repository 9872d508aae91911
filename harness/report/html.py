"""Render a Report: one self-contained HTML page (its figures inline SVG,
nothing beside it to commit or to go stale), or GitHub markdown.

The template is inline (not a package-data file) so the page renders from
any install of the harness, wheel included. The page is written atomically
(engine/atomic.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2

from markupsafe import Markup, escape

from engine.atomic import atomic_open

from .. import stats
from ..table import markdown
from . import changes, diagnose, figures, validated


def fmt_tok(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def fmt_measure(m) -> str:
    """median ± sd of the repetitions, the sd to the median's decimals:
    "17804 ± 132", "240.0 ± 0.8"."""
    if m is None:
        return "—"
    center = fmt_tok(m.tok_s)
    if m.tok_s_sd is None:
        return center
    decimals = len(center.split(".")[1]) if "." in center else 0
    return f"{center} ± {m.tok_s_sd:.{decimals}f}"


def fmt_spread(s) -> str:
    """A build's run-to-run spread over its sittings: "spread 1.2% over 3 sittings"."""
    return "" if s is None else f"spread {100 * s[0]:.1f}% over {s[1]} sittings"


def fmt_build(b: str) -> str:
    """A hex build hash to 12 characters; a version string whole."""
    return b[:12] if re.fullmatch(r"[0-9a-f]{13,}", b) else b


def fmt_short_build(b: str) -> str:
    """A build as a few words for a narrow cell (the whole string is in its
    tooltip): a hex hash to 8 characters; llama.cpp vendored in a
    llama-cpp-python sdist as that sdist; else the version without its
    "(build 0, commit unknown)"."""
    if re.fullmatch(r"[0-9a-f]{9,}", b):
        return b[:8]
    m = re.search(r"vendored in llama_cpp_python-([\w.]+?)\s", b + " ")
    if m:
        return f"(llama-cpp-python {m.group(1)})"
    m = re.search(r"version: (\S+) \(build (\d+), commit (\w+)\)", b)
    if m:
        return m.group(1) + ("" if m.group(3) == "unknown" else f" {m.group(3)[:8]}")
    return fmt_build(b)


def fmt_engine(e: str) -> str:
    return "Anvil" if e == "anvil" else e


def fmt_pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def fmt_energy(m) -> str:
    """Joules per token, to 3 significant digits ("0.752 J", "18.3 mJ")."""
    if m is None or m.j_per_token is None:
        return "—"
    j = m.j_per_token
    return f"{j:.3g} J" if j >= 1 else f"{j * 1e3:.3g} mJ"


def fmt_memory(m) -> str:
    """Peak device memory in GB ("19.3 GB"), or "—" where the record has none."""
    return "—" if m is None or m.peak_bytes is None else f"{m.peak_bytes / 1e9:.1f} GB"


def fmt_achieved(m) -> str:
    """ "1121 GB/s · 26% of copy BW" or "~292 TFLOP/s · 37% of bf16" (the rooflines measured on its GPU), or
    "1121 GB/s · no roofline measured" """
    if m is None or not m.rate.text:
        return "—"
    if m.rate.ceiling is None:
        return f"{m.rate.text} · no roofline"
    what = "copy BW" if m.rate.gb_s is not None else "bf16"
    return f"{m.rate.text} · {fmt_pct(m.rate.roofline)} of {what}"


def fmt_roofpct(m) -> str:
    """A number's share of its GPU's roofline ("32%"), "no roofline" where the GPU has none measured."""
    if m is None or not m.rate.text:
        return "—"
    return fmt_pct(m.rate.roofline) if m.rate.ceiling else "no roofline"


def fmt_validation(row) -> str:
    """The validate record behind a row's Anvil number, or why there is none ("—": no Anvil number)."""
    v = row.anvil.validation if row.anvil else None
    if v is None:
        return "—"
    return f"validated by {v.record}" if v.ok else v.note


def slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "x"


_TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Anvil scoreboard</title>
<script>
// Self-check for headless browsers (tests/test_browser.py): script errors,
// console.error calls and resources that failed to load are written into
// #selfcheck once the page has loaded, with every inline figure that drew
// nothing and whether the page is wider than the window; `chromium
// --dump-dom` shows them. The page loads nothing: its figures are inline SVG.
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    errors.push(t && t !== window && t.tagName ? "failed to load " + t.tagName.toLowerCase() + " " +
                (t.getAttribute("src") || t.getAttribute("href") || "") : "error: " + e.message);
  }, true);
  window.addEventListener("unhandledrejection", function (e) { errors.push("unhandled rejection: " + e.reason); });
  var consoleError = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
  window.addEventListener("load", function () {
    var figs = document.querySelectorAll("figure.fig"), empty = [];
    for (var i = 0; i < figs.length; i++) {
      var svg = figs[i].querySelector("svg"), box = svg && svg.getBoundingClientRect();
      if (!svg || !box.width || !box.height || !svg.querySelector("path, polyline, rect, line, text"))
        empty.push(figs[i].getAttribute("data-fig"));
    }
    var el = document.getElementById("selfcheck");
    var wide = document.documentElement.scrollWidth > window.innerWidth + 1;
    el.setAttribute("data-figures", String(figs.length));
    el.setAttribute("data-empty", empty.join(" "));
    el.setAttribute("data-images", String(document.images.length));
    el.setAttribute("data-errors", errors.join(" | "));
    el.setAttribute("data-overflow", wide ? document.documentElement.scrollWidth + " > " + window.innerWidth : "");
    el.setAttribute("data-status", empty.length || errors.length || wide ? "fail" : "ok");
  });
})();
</script>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1360px;
       padding: 0 20px 40px; color: #1d1d1f; }
header { border-bottom: 2px solid #d9541e; margin-bottom: 8px; }
h1 { margin: 18px 0 2px; } h2 { margin-top: 30px; border-bottom: 1px solid #ddd; } h3 { margin: 18px 0 6px; }
nav a { margin-right: 14px; } .sub, .muted, small { color: #666; }
table { border-collapse: collapse; margin: 6px 0 10px; width: 100%; }
th, td { border-bottom: 1px solid #e5e5e5; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; font-weight: 600; white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.prov { font-size: 12px; color: #555; min-width: 200px; }
table.summary { font-size: 13px; } table.summary th, table.summary td { padding: 3px 6px; }
table.summary th.grp { text-align: center; border-left: 2px solid #fff; } table.summary td.first { border-left: 2px solid #eee; }
table.summary td.model { font-weight: 600; white-space: nowrap; }
.ok-mark { color: #1a7f37; font-weight: 700; } .nv-mark { color: #b42318; font-size: 11px; }
table.scores td.num small { white-space: normal; display: inline-block; min-width: 130px; max-width: 190px; }
table.scores td.prov { min-width: 210px; max-width: 260px; overflow-wrap: anywhere; line-height: 1.25; }
table.scores th, table.parity th { font-size: 13px; white-space: normal; }
table.parity td.num small { white-space: normal; display: inline-block; max-width: 170px; text-align: right; } table.scores .badge, table.runs .badge { white-space: normal; }
table.runs td { min-width: 90px; }
td.rate { text-align: right; font-size: 13px; } td:first-child, td.nw { white-space: nowrap; }
td.hist { font-variant-numeric: tabular-nums; min-width: 200px; }
.win { color: #1a7f37; font-weight: 600; } .loss { color: #b42318; font-weight: 600; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 12px; white-space: nowrap;
         background: #eee; }
.badge.ok { background: #dcf5e3; } .badge.bad { background: #fde2e1; } .badge.warn { background: #fff1c2; }
.badge.memory { background: #dcf5e3; } .badge.compute { background: #dceaf5; }
.badge.launch { background: #fff1c2; } .badge.kernel { background: #ffe0b8; } .badge.hostsync { background: #fde2e1; } .badge.unknown { background: #eee; }
.meter { display: inline-block; width: 60px; height: 7px; background: #eee; margin-left: 6px; vertical-align: middle; }
.meter span { display: block; height: 100%; background: #d9541e; }
figure.fig { margin: 8px 0; } figure.fig svg { max-width: 100%; height: auto; }
table.runs figure.fig { margin: 0; } table.runs figure.fig svg { width: 330px; max-width: none; }
code { background: #f4f4f4; padding: 0 3px; }
details { margin: 8px 0; } summary { cursor: pointer; }
</style></head>
<body>
<header>
<h1>Anvil scoreboard</h1>
<p class="sub">Prefill (pp) and decode (tg) tokens/s of Anvil and llama.cpp, from {{ r.sources|length }} result
record{{ '' if r.sources|length == 1 else 's' }} (latest {{ r.latest_date or 'none' }}; evidence digest
<code>{{ r.digest[:16] }}</code>). Hover a number for where it comes from.</p>
<nav><a href="#summary">Summary</a><a href="#scoreboard">Scoreboard</a><a href="#figures">Figures</a><a href="#history">History</a>
<a href="#parity">Parity</a><a href="#gpu-tests">GPU tests</a><a href="#mutants">Mutants</a><a href="#ab">A/B</a><a href="#diagnosis">Diagnosis</a><a href="#provenance">Provenance</a></nav>
</header>

<section id="summary"><h2>Summary</h2>
<p class="muted">Per model: Anvil and llama.cpp tokens/s (medians of the repetitions), Anvil ÷ llama.cpp of one sitting
(<span class="ok-mark">✔</span> the Anvil build passed <code>harness validate-catalog</code> on the model in that sitting,
<span class="nv-mark">✗</span> not validated), and Anvil's share of the roofline measured on the GPU: decode of its copy
bandwidth, prefill of its bf16 GEMM rate ({% for rf in r.rooflines %}{{ rf.text }}{{ '; ' if not loop.last }}{% else %}<b>no roofline measured</b>: <code>harness roofline --save</code> on the GPU records one{% endfor %}).
The same numbers as the rows below; a test's number is the newest validated sitting.</p>
{% for gpu, summary in r.summary_by_gpu %}
<h3 id="summary-{{ (gpu or 'no-gpu')|slug }}">{{ gpu or 'GPU not recorded' }}</h3>
<table class="summary"><thead><tr><th rowspan="2">model</th>{% for t in r.summary_tests %}<th colspan="4" class="grp">{{ t }}</th>{% endfor %}</tr>
<tr>{% for t in r.summary_tests %}<th>Anvil</th><th>llama.cpp</th><th>ratio</th><th>{{ 'of BW' if t.startswith('tg') else 'of bf16' }}</th>{% endfor %}</tr></thead><tbody>
{% for s in summary %}
<tr><td class="model"><a href="#model-{{ s.model|slug }}">{{ s.model }}</a></td>
{% for c in s.cells %}{% if c %}
<td class="num first"{% if c.anvil %} title="{{ c.anvil.provenance }}"{% endif %}>{{ c.anvil.tok_s|tok if c.anvil else '—' }}</td>
<td class="num"{% if c.llamacpp %} title="{{ c.llamacpp.provenance }}"{% endif %}>{{ c.llamacpp.tok_s|tok if c.llamacpp else '—' }}</td>
<td class="num {{ 'win' if c.validated and c.ratio and c.ratio > 1 else 'loss' if c.validated and c.ratio else '' }}">{{ c.ratio|ratio }}{% if c.anvil %}{% if c.validated %} <span class="ok-mark" title="validated by {{ c.anvil.validation.record }}">✔</span>{% else %} <span class="nv-mark" title="{{ c.anvil.validation.note if c.anvil.validation else 'not validated' }}">✗</span>{% endif %}{% endif %}</td>
<td class="num" title="{{ c.anvil.rate.note if c.anvil else '' }}">{{ c.anvil|roofpct }}</td>
{% else %}<td class="num first">—</td><td class="num">—</td><td class="num">—</td><td class="num">—</td>{% endif %}{% endfor %}</tr>
{% endfor %}
</tbody></table>
{% else %}<p class="muted">No bench records yet: <code>harness bench --save</code> appends them to the results store.</p>{% endfor %}
</section>

<section id="scoreboard"><h2>Scoreboard</h2>
<p class="muted">Per model, test and GPU: the newest pair of records of the two engines measured in
one sitting (one <code>harness bench</code> call) on one benchmark spec whose Anvil build passed <code>harness validate-catalog</code> on the
model in the same sitting (against llama.cpp with CUDA; same build, GPU and host, within {{ sitting_min }} minutes),
and their ratio; where no such pair exists, the newest pair, marked <span class="badge bad">not validated</span>; where
there is no pair, the latest record of each engine and no ratio. t/s: the median of a test's repetitions ± their sd
(llama-bench's first timed prefill repetition runs slow even after its warm-up; a mean would carry it into
the ratio). Decode is shown against the copy bandwidth measured on the GPU, prefill against its measured bf16 GEMM
rate (at 2 × parameters FLOPs per token).</p>
{% for m in r.models if m.rows %}
<section class="model" id="model-{{ m.name|slug }}">
<h3>{{ m.name }}
{% for p in m.parity %} <span class="badge {{ 'ok' if p.ok else 'bad' }}" title="{{ p.provenance }}">parity ({{ p.backend }}, {{ p.tier }} refs): {{ p.status }}</span>{% endfor %}</h3>
{% for gpu, rows in m.rows_by_gpu %}
{% if m.rows_by_gpu|length > 1 %}<h4>{{ gpu or 'GPU not recorded' }}</h4>{% endif %}
<table class="scores"><thead><tr><th>test</th><th>Anvil t/s</th><th>llama.cpp t/s</th><th>Anvil ÷ llama.cpp</th><th>validation</th>
<th>Anvil vs roofline</th><th>llama.cpp vs roofline</th><th>J / token<br><small>Anvil · llama.cpp</small></th><th>peak device memory<br><small>Anvil</small></th><th>Anvil diagnosis</th><th>provenance</th></tr></thead><tbody>
{% for row in rows %}
<tr><td title="spec {{ row.spec }}: {{ row.spec_text }}">{{ row.test }}</td>
{% for x in (row.anvil, row.llamacpp) %}<td class="num"{% if x %} title="{{ x.provenance }}"{% endif %}>{{ x|measure }}{% if loop.first and row.anvil_spread %}<br><small title="this build's results in separate sittings (harness bench calls): (max - min) / median">{{ row.anvil_spread|spread }}</small>{% endif %}</td>{% endfor %}
<td class="num {{ '' if not row.validated else 'win' if row.ratio and row.ratio > 1 else 'loss' if row.ratio else '' }}"
 title="{{ ('one sitting, same spec ' ~ row.spec ~ ' on ' ~ row.gpu ~ ('' if row.validated else '; NOT VALIDATED')) if row.ratio else 'no comparable pair (same spec, same GPU, one sitting)' }}">{{ row.ratio|ratio }}{% if row.newer_unvalidated %}<br><small class="muted" title="{{ row.newer_unvalidated[0].validation.note }}; {{ row.newer_unvalidated[0].file }}">newer: {{ row.newer_unvalidated[2]|ratio }} ({{ row.newer_unvalidated[0].build|short_build }}, {{ row.newer_unvalidated[0].date[:10] }}), not validated</small>{% endif %}</td>
<td>{% if row.anvil and row.anvil.validation %}{% set v = row.anvil.validation %}{% if v.ok %}{% if r.records_href %}<a href="{{ r.records_href }}/{{ v.record }}" title="{{ v.note }}">{% else %}<span title="{{ v.note }}">{% endif %}<span class="badge ok">validated</span><br><small>{{ v.record }}</small>{{ '</a>'|safe if r.records_href else '</span>'|safe }}{% else %}<span class="badge bad" title="{{ v.note }}">not validated</span><br><small>{{ v.note|replace('not validated: ', '') }}</small>{% endif %}{% else %}—{% endif %}</td>
{% for x in (row.anvil, row.llamacpp) %}<td class="rate"{% if x %} title="{{ x.rate.note }}"{% endif %}>{{ x|achieved }}{% if x and x.rate.roofline is not none %}<span class="meter"><span style="width: {{ [100, (x.rate.roofline * 100)|round(1)]|min }}%"></span></span>{% endif %}</td>{% endfor %}
<td class="num" title="{{ (row.anvil or row.llamacpp).energy_note if (row.anvil or row.llamacpp) else '' }}">{{ row.anvil|energy }} · {{ row.llamacpp|energy }}</td>
<td class="num" title="what the engine allocated on the device: weights, KV cache, workspace">{{ row.anvil|memory }}</td>
<td>{% if row.anvil %}<span class="badge {{ row.anvil.diagnosis.css }}" title="{{ row.anvil.diagnosis.sentence }}">{{ row.anvil.diagnosis.label }}</span>{% else %}—{% endif %}</td>
{% set first = row.anvil or row.llamacpp %}
<td class="prov">{% for x in (row.anvil, row.llamacpp) %}{% if x %}{% if r.records_href %}<a href="{{ r.records_href }}/{{ x.file }}" title="{{ x.provenance }}">{% else %}<span title="{{ x.provenance }}">{% endif %}{{ x.engine|engine }} {{ x.build|short_build }}{{ '</a>'|safe if r.records_href else '</span>'|safe }}<br>{% endif %}{% endfor %}
<small>{{ first.date[:16]|replace('T', ' ') }} · {{ row.gpu or 'GPU not recorded' }} · driver {{ first.driver or '?' }}{% if first.stack %} · {{ first.stack }}{% endif %}</small></td></tr>
{% endfor %}
</tbody></table>
{% endfor %}
{% for f in m.figures %}{{ fig(f.name) }}{% endfor %}
</section>
{% else %}<p class="muted">No bench records yet: <code>harness bench --save</code> appends them to the results store.</p>
{% endfor %}
{% set parity_only = r.models|rejectattr('rows')|map(attribute='name')|list %}
{% if parity_only %}<p class="muted">Checked for parity only (no speed records; see <a href="#parity">Parity</a>):
{{ parity_only|join(', ') }}.</p>{% endif %}
</section>

<section id="figures"><h2>Figures</h2>
{% for f in r.figures if f.kind == 'bars' %}{{ fig(f.name) }}
{% else %}<p class="muted">No pair of records to compare.</p>{% endfor %}
</section>

<section id="history"><h2>History: published → today</h2>
<p class="muted">Per row of the scoreboard and engine: its first record of the row's spec ("published") and the row's
own number ("today"), and, for Anvil, where the build last changed between two records, what the speed did:
<span class="badge bad">regression</span> slower beyond {{ factor }}× and significant (Mann-Whitney p &lt; {{ alpha }} over
the repetitions); <span class="badge warn">suspicious</span> beyond {{ factor }}× but not significant, or significantly
slower by less; <span class="badge ok">improvement</span>; <span class="badge">no change</span>;
<span class="badge">insufficient data</span> (fewer than {{ min_reps }} repetitions a side). A history mixes sittings:
a label points to an A/B (<code>harness ab --commits</code>), it is not one.</p>
<table><thead><tr><th>model</th><th>test</th><th>engine</th><th>published (first record)</th><th>today (the scoreboard's)</th>
<th>gain</th><th>records</th><th>last change of build</th></tr></thead><tbody>
{% for h in r.history %}
<tr><td>{{ h.model }}</td><td title="spec {{ h.spec }}">{{ h.test }}</td><td>{{ h.engine }}</td>
{% for x in (h.first, h.latest) %}<td class="hist" title="{{ x.provenance }}"><b>{{ x|measure }}</b> t/s<br><small>{{ x.date[:16]|replace('T', ' ') }} · {{ x.build|build }}{% if x.note %} · {{ x.note }}{% endif %}</small></td>{% endfor %}
<td class="num {{ '' if h.n_records < 2 or h.gain is none else 'win' if h.gain > 1 else 'loss' if h.gain < 1 else '' }}">{{ h.gain|ratio if h.n_records > 1 else '—' }}</td><td class="num">{{ h.n_records }}{% if h.newer %}<br><small title="records of this spec after today's, none validated">{{ h.newer }} newer</small>{% endif %}</td>
<td>{% set c = h.last_change %}{% if c %}<span class="badge {{ c.css }}" title="{{ c.text }}">{{ c.label }}</span><br><small>{{ c.before|short_build }} → {{ c.after|short_build }}, {{ c.date[:10] }}{% if c.ratio == c.ratio %}, {{ '%.3f'|format(c.ratio) }}×{% endif %}</small>{% elif h.engine == 'anvil' %}<small class="muted">one build</small>{% else %}—{% endif %}</td></tr>
{% else %}<tr><td colspan="8" class="muted">No bench records yet.</td></tr>{% endfor %}
</tbody></table>
{% if r.flagged %}<details><summary class="muted">Every change of build that is not "no change" ({{ r.flagged|length }})</summary><ul>
{% for h, c in r.flagged %}<li>{{ c.date[:16]|replace('T', ' ') }} {{ h.model }} {{ h.test }}: <span class="badge {{ c.css }}">{{ c.label }}</span> {{ c.before|short_build }} → {{ c.after|short_build }} <small>{{ c.text }}</small></li>{% endfor %}
</ul></details>{% endif %}
</section>

<section id="parity"><h2>Parity with llama.cpp</h2>
<p class="muted">Free-run prefix: the engine's own greedy tokens equal to llama.cpp's, up to the first difference.
Teacher-forced agreement: steps where the engine, fed llama.cpp's tokens, picks llama.cpp's token. Every step is also
judged on its logits (max Δlogit and KL over llama.cpp's stored top-k, and the shift of llama.cpp's top-2 margin),
each against the model's gate in the catalog, set from llama.cpp's own spread (beside it) or a stated precision budget.
A flip counts as a near-tie only where llama.cpp's margin is below the near-tie threshold.</p>
<table class="parity"><thead><tr><th>model</th><th>references · engine</th><th>result</th><th>free-run prefix</th>
<th>teacher-forced agreement</th><th>max Δlogit</th><th>max KL</th>
<th>margin shift<br><small>llama.cpp's own</small></th><th>near-tie threshold</th><th>record</th></tr></thead><tbody>
{% for p in r.parity %}
<tr title="{{ p.provenance }}"><td>{{ p.model }}</td><td class="nw">{{ p.tier }} · {{ p.backend }}</td><td><span class="badge {{ 'ok' if p.ok else 'bad' }}">{{ p.status }}</span></td>
<td class="num">{{ p.matched }}</td><td class="num">{{ p.agreement }}</td>
<td class="num">{{ '%.4f'|format(p.max_logit_diff) if p.max_logit_diff is not none else '—' }}</td>
<td class="num">{{ '%.3g'|format(p.max_kl) if p.max_kl is not none else '—' }}</td>
<td class="num">{{ '%.3g'|format(p.margin_shift) if p.margin_shift is not none else '—' }}{% if p.llama_spread %}<br><small>{{ p.llama_spread }}</small>{% endif %}</td>
<td class="num">{{ p.near_tie if p.near_tie is not none else '—' }}</td>
<td class="nw">{% if r.records_href and p.file %}<a href="{{ r.records_href }}/{{ p.file }}">{{ p.date[:10] }}</a>{% else %}{{ p.date[:10] }}{% endif %}</td></tr>
{% else %}<tr><td colspan="10" class="muted">No validate records yet (<code>harness validate-catalog</code>).</td></tr>{% endfor %}
</tbody></table>
</section>

<section id="gpu-tests"><h2>GPU test suite</h2>
<p class="muted">The whole <code>pytest -m gpu</code> suite on the GPU host (<code>scripts/gpu/check.sh tests</code>,
with <code>ANVIL_REQUIRE_GPU=1</code>: a missing or broken GPU stops the run instead of skipping its tests). A run
stands when no test failed or errored and some test ran. Newest first:</p>
<table><thead><tr><th>date</th><th>result</th><th>passed</th><th>failed</th><th>errors</th><th>skipped</th><th>time</th>
<th>build</th><th>where</th><th>command</th></tr></thead><tbody>
{% for t in r.suite_runs %}
<tr><td class="nw">{% if r.records_href %}<a href="{{ r.records_href }}/{{ t.file }}">{{ t.date[:16]|replace('T', ' ') }}</a>{% else %}{{ t.date[:16]|replace('T', ' ') }}{% endif %}</td>
<td><span class="badge {{ 'bad' if t.problem else 'ok' }}">{{ t.problem or 'pass' }}</span></td>
<td class="num">{{ t.passed }}</td><td class="num">{{ t.failed }}</td><td class="num">{{ t.errors }}</td><td class="num">{{ t.skipped }}</td>
<td class="num">{{ '%.0f s'|format(t.duration_s) if t.duration_s is not none else '—' }}</td><td>{{ t.build|short_build }}</td>
<td class="prov">{{ t.where }}</td><td class="prov"><code>{{ t.command }}</code></td></tr>
{% else %}<tr><td colspan="10" class="muted">No tests records yet (<code>scripts/gpu/check.sh tests</code> on the GPU host).</td></tr>{% endfor %}
</tbody></table>
</section>

<section id="mutants"><h2>Mutation suite: does the gate catch bugs?</h2>
<p class="muted">Each row is one deliberate engine bug (<code>harness mutants</code>), switched on in its own process; the
gate must fail on a catalog model that has the feature it breaks. Shown: the model and reference set that caught it
first, the checks that failed there, and the models tried. Each engine's table is one record, one sitting on one build:
the latest that ran the whole suite (else the latest, marked partial); records are never merged.</p>
{% for m in r.mutants %}
<h3>{{ m.backend }} engine: <span class="badge {{ 'ok' if m.caught == m.total and not m.partial else 'bad' }}">caught {{ m.caught }} of {{ m.total }}</span>
at build {{ m.build }}, {{ m.date[:10] }}
{% if m.partial %}<span class="badge bad">partial{% if m.not_run %}: {{ m.not_run|length }} not run{% endif %}</span>{% endif %}
<small class="prov">{{ m.provenance }}, {% if r.records_href %}<a href="{{ r.records_href }}/{{ m.file }}">{{ m.file }}</a>{% else %}{{ m.file }}{% endif %}</small></h3>
{% if m.not_run %}<p class="muted">Not in this record: {{ m.not_run|join(', ') }}.</p>{% endif %}
{% if m.control_failed %}<p><span class="badge bad">{{ m.control_failed|length }} pair(s) not tried</span> the build itself
failed {% for c in m.control_failed %}{{ c[0] }} ({{ c[1] }}){{ '; ' if not loop.last else '' }}{% endfor %}: no mutant was
tried there.</p>{% endif %}
<table><thead><tr><th>mutant</th><th>bug</th><th>caught by</th><th>checks that failed</th><th>models tried</th></tr></thead><tbody>
{% for row in m.rows %}<tr><td>{{ row[0] }}</td><td>{{ row[1] }}</td><td>{{ row[2] }}</td><td>{{ row[3] }}</td><td class="prov">{{ row[4] }}</td></tr>{% endfor %}
</tbody></table>
{% if m.history %}<details><summary class="muted">The {{ m.backend }} engine's other records ({{ m.history|length }}), each its own build's result, not merged</summary>
<table><thead><tr><th>date</th><th>build</th><th>result</th><th>run</th><th>record</th></tr></thead><tbody>
{% for h in m.history %}<tr><td class="nw">{{ h[0][:16]|replace('T', ' ') }}</td><td>{{ h[1] }}</td><td>{{ h[2] }}</td><td>{{ h[3] }}</td><td class="prov">{% if r.records_href %}<a href="{{ r.records_href }}/{{ h[4] }}">{{ h[4] }}</a>{% else %}{{ h[4] }}{% endif %}</td></tr>{% endfor %}
</tbody></table></details>{% endif %}
{% else %}<p class="muted">No mutants records yet (<code>harness mutants --save</code>).</p>{% endfor %}
</section>

<section id="ab"><h2>A/B comparisons</h2>
<table><thead><tr><th>date</th><th>model</th><th>test</th><th>A (base) / B (candidate)</th><th>median t/s A / B</th>
<th>B/A [95% CI]</th><th>p</th><th>wins B:A</th><th>verdict</th><th>diagnosis A / B</th><th>notes</th></tr></thead><tbody>
{% for t in r.ab %}
<tr title="{{ t.provenance }}"><td>{{ t.date[:10] }}<br><small>{{ t.date[11:16] }}</small></td><td class="nw">{{ t.model }}</td><td>{{ t.test }}</td>
<td><small>A: {{ t.arm_a }}<br>B: {{ t.arm_b }}</small></td>
<td class="num">{{ t.a_median|tok }}<br>{{ t.b_median|tok }}</td>
<td class="num">{{ '%.3f'|format(t.ratio) }}<br><small>[{{ '%.3f'|format(t.ci[0]) }}, {{ '%.3f'|format(t.ci[1]) }}]</small></td>
<td class="num">{{ '%.3g'|format(t.p_value) }}</td><td class="num">{{ t.wins }}</td>
<td><span class="badge {{ 'ok' if t.verdict|lower == 'faster' else 'bad' if t.verdict|lower == 'slower' else '' }}">{{ t.verdict }}</span></td>
<td><small>A: {{ t.diag_a }}<br>B: {{ t.diag_b }}</small></td><td><small>{{ t.notes }}</small></td></tr>
{% else %}<tr><td colspan="11" class="muted">No A/B records yet (<code>harness ab --rounds 8 BASE CANDIDATE</code>).</td></tr>{% endfor %}
</tbody></table>
</section>

<section id="diagnosis"><h2>Diagnosis: why each run is as fast as it is</h2>
<p class="muted">From each run's NVML summary (SM clock, power, utilisation) and its achieved rate; first matching rule wins.</p>
<ol>{% for label, rule in rules %}<li><span class="badge">{{ label }}</span> {{ rule }}</li>{% endfor %}</ol>
{% macro run_rows(runs) %}
<table class="runs"><thead><tr><th>run</th><th>test</th><th>diagnosis</th><th>evidence</th><th>NVML trace</th></tr></thead><tbody>
{% for run in runs %}
<tr title="{{ run.provenance }}"><td>{{ run.model }} · {{ run.who }}</td><td>{{ run.test }}</td>
<td><span class="badge {{ run.diagnosis.css }}">{{ run.diagnosis.label }}</span></td><td>{{ run.diagnosis.sentence }}</td>
<td>{% if run.figure %}{{ fig(run.figure) }}{% else %}—{% endif %}</td></tr>
{% else %}<tr><td colspan="5" class="muted">No bench runs yet.</td></tr>{% endfor %}
</tbody></table>
{% endmacro %}
<h3>Latest bench runs</h3>
{{ run_rows(r.runs|selectattr("source", "equalto", "bench")|list) }}
{% for group in r.runs|selectattr("source", "equalto", "ab")|groupby("group")|reverse %}
<details><summary>A/B runs of <code>{{ group.grouper }}</code> ({{ group.list|length }} runs, cold round included; their NVML traces are in the record)</summary>
{{ run_rows(group.list) }}
</details>
{% endfor %}
</section>

<section id="provenance"><h2>Provenance</h2>
<p>Rooflines: the newest <code>roofline</code> record of each GPU (<code>harness roofline --save</code>: the
device-to-device copy bandwidth, bytes read and written, and a cuBLAS bf16 GEMM's rate, measured on that GPU, not the
datasheet's):
{% for rf in r.rooflines %}{{ rf.text }}{{ '; ' if not loop.last else '.' }}{% else %}no roofline measured; the
scoreboard shows no share of one.{% endfor %} Decode GB/s = weight bytes one token reads ×
tokens/s; prefill TFLOP/s ≈ 2 × parameters × tokens/s. The page is a pure function of these records (sha256 of
their content <code>{{ r.digest }}</code>).</p>
<table><thead><tr><th>record</th><th>kind</th><th>model</th><th>engine</th><th>date</th></tr></thead><tbody>
{% for s in r.sources %}<tr><td><code>{{ s[0] }}</code></td><td>{{ s[1] }}</td><td>{{ s[2] }}</td><td>{{ s[3] }}</td><td>{{ s[4] }}</td></tr>
{% else %}<tr><td colspan="5" class="muted">The results store is empty.</td></tr>{% endfor %}
</tbody></table>
{% if r.skipped %}<p class="bad">{{ r.skipped|length }} file(s) in the results store were skipped, not shown:</p>
<ul>{% for f, why in r.skipped %}<li><code>{{ f }}</code>: {{ why }}</li>{% endfor %}</ul>{% endif %}
</section>
<div id="selfcheck" hidden data-status="pending"></div>
</body></html>
"""


def _env() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters.update(spread=fmt_spread, build=fmt_build, short_build=fmt_short_build, engine=fmt_engine, tok=fmt_tok,
                       measure=fmt_measure, pct=fmt_pct, ratio=fmt_ratio, achieved=fmt_achieved, roofpct=fmt_roofpct,
                       energy=fmt_energy, memory=fmt_memory, slug=slug)
    return env


def _figure(name: str, svg: str) -> Markup:
    # the one wrapper of a figure on the page: the self-check and the tests find figures by it
    return Markup(f'<figure class="fig" data-fig="{escape(name)}">{svg}</figure>')


FIGURE_RE = re.compile(r'(<figure class="fig" data-fig="([^"]*)">).*?(</figure>)', re.S)


def render_html(report, draw=None, progress=None) -> str:
    """The page, every figure inline (``draw``: Figure -> SVG markup,
    default figures.render; ``progress``: called with a line per figure)."""
    draw = draw or figures.render
    svgs = {}
    for i, f in enumerate(report.figures):
        if progress:
            progress(f"figure {i + 1}/{len(report.figures)}: {f.name}")
        svgs[f.name] = _figure(f.name, draw(f))
    return _env().from_string(_TEMPLATE).render(
        r=report, fig=lambda name: svgs[name], rules=diagnose.RULES, sitting_min=validated.SITTING_S // 60,
        factor=changes.FACTOR, alpha=stats.ALPHA, min_reps=stats.min_rounds())


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def write_html(report, out_dir, name: str = "index.html", progress=None) -> Path:
    """Write the one self-contained page ``out_dir/name`` (atomically) and return its path."""
    page = Path(out_dir) / name
    atomic_write(page, render_html(report, progress=progress).encode())
    return page


# ---- markdown ----------------------------------------------------------------

def _md_table(header: list[str], rows: list[list[str]], empty: str) -> list[str]:
    return markdown(header, rows, empty).split("\n")


def _md_prov(m) -> str:
    return "" if m is None else f"{m.engine}: {m.date[:16].replace('T', ' ')}, build {fmt_build(m.build)}, {m.file}"


README_BEGIN = "<!-- speed table: `harness report --readme` writes it from reports/results; a test checks it -->"
README_END = "<!-- end of speed table -->"


def _newest_per_test(rows) -> dict:
    newest: dict[tuple, object] = {}
    for row in rows:
        key = (row.model, row.test, row.gpu)
        if key not in newest or row.anvil.date > newest[key].anvil.date:
            newest[key] = row
    return newest


def render_readme_table(report) -> str:
    """The README's speed table: per model, test and GPU, the newest
    scoreboard row with both engines measured in one sitting and Anvil's
    build validated on the model in that sitting (validated.py; rows of
    other benchmark settings are on the scoreboard), with the date, Anvil's
    build, the two bench records and the validate record. Below it, the
    newest pairs left out as not validated."""
    paired = [row for row in report.rows if row.ratio is not None and row.gpu]
    shown = _newest_per_test(row for row in paired if row.validated)
    rows = [[row.model, row.test, fmt_measure(row.anvil), fmt_measure(row.llamacpp), fmt_ratio(row.ratio),
             f"{row.anvil.n} / {row.llamacpp.n}", row.anvil.date[:10], fmt_short_build(row.anvil.build),
             f"`{row.anvil.file}`, `{row.llamacpp.file}`", f"`{row.anvil.validation.record}`"]
            for row in paired if shown.get((row.model, row.test, row.gpu)) is row]
    table = markdown(["model", "test", "Anvil t/s", "llama.cpp t/s", "Anvil ÷ llama.cpp", "repetitions", "date",
                      "Anvil build", "records (reports/results)", "validated by"], rows,
                     "No validated GPU records yet.")
    # what is not above: a test with no validated pair, or a pair newer than the validated one shown
    left_out = [(row.model, row.test, row.anvil, row.ratio) for key, row in
                _newest_per_test(r for r in paired if not r.validated).items() if key not in shown]
    left_out += [(row.model, row.test, *row.newer_unvalidated[::2]) for row in shown.values() if row.newer_unvalidated]
    if not left_out:
        return table
    lines = [f"- {model} {test}: {fmt_ratio(ratio)}, build {fmt_short_build(a.build)}, {a.date[:10]} "
             f"({a.validation.note.removeprefix('not validated: ')})"
             for model, test, a, ratio in sorted(left_out, key=lambda x: (x[0], x[1], x[2].date))]
    return (f"{table}\n\nNot validated, so not in the table (Anvil's build did not pass `harness validate-catalog` "
            f"on the model in the sitting of the benchmark):\n\n" + "\n".join(lines))


def update_readme(text: str, table: str) -> str:
    """``text`` (a README) with the block between README_BEGIN and README_END replaced by ``table``."""
    try:
        head, rest = text.split(README_BEGIN + "\n", 1)
        _, tail = rest.split(README_END, 1)
    except ValueError:
        raise ValueError(f"the README has no speed-table block ({README_BEGIN} ... {README_END})") from None
    return f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}"


def render_md(report) -> str:
    r = report
    roofs = "; ".join(rf.text for rf in r.rooflines) or f"{diagnose.NO_ROOFLINE} (harness roofline --save)"
    lines = ["# Anvil scoreboard", "",
             f"From {len(r.sources)} result records (latest {r.latest_date or 'none'}; evidence digest "
             f"`{r.digest[:16]}`). Rooflines: {roofs}.", "", "## Summary", ""]
    head = ["model"] + [f"{t} {what}" for t in r.summary_tests for what in ("Anvil", "llama.cpp", "ratio", "of roof")]
    cells = lambda c: ["—"] * 4 if c is None else [  # noqa: E731
        fmt_tok(c.anvil.tok_s) if c.anvil else "—", fmt_tok(c.llamacpp.tok_s) if c.llamacpp else "—",
        fmt_ratio(c.ratio) + ("" if c.anvil is None else " ✔" if c.validated else " ✗"), fmt_roofpct(c.anvil)]
    for i, (gpu, summary) in enumerate(r.summary_by_gpu):  # a section per kind of GPU
        lines += [""] * bool(i) + [f"### {gpu or 'GPU not recorded'}", ""]
        lines += _md_table(head, [[s.model] + [x for c in s.cells for x in cells(c)] for s in summary], "")
    if not r.summary:
        lines += ["No bench records yet."]
    lines += ["", "## Scoreboard", ""]
    lines += _md_table(
        ["model", "test", "Anvil t/s", "llama.cpp t/s", "Anvil ÷ llama.cpp", "validation", "Anvil run to run",
         "Anvil achieved",
         "llama.cpp achieved", "Anvil J/token", "llama.cpp J/token", "Anvil peak memory", "Anvil diagnosis", "GPU",
         "provenance"],
        [[row.model, row.test, fmt_measure(row.anvil), fmt_measure(row.llamacpp), fmt_ratio(row.ratio),
          fmt_validation(row), fmt_spread(row.anvil_spread) or "—", fmt_achieved(row.anvil), fmt_achieved(row.llamacpp), fmt_energy(row.anvil), fmt_energy(row.llamacpp),
          fmt_memory(row.anvil),
          row.anvil.diagnosis.label if row.anvil else "—",
          row.gpu or "?", "; ".join(p for p in (_md_prov(row.anvil), _md_prov(row.llamacpp)) if p)]
         for row in r.rows], "No bench records yet.")
    lines += ["", "## History: published → today", ""]
    lines += _md_table(["model", "test", "engine", "published", "today", "gain", "records"],
                       [[h.model, h.test, h.engine, f"{fmt_measure(h.first)} ({h.first.date[:10]}, {fmt_build(h.first.build)})",
                         f"{fmt_measure(h.latest)} ({h.latest.date[:10]}, {fmt_build(h.latest.build)})",
                         fmt_ratio(h.gain) if h.n_records > 1 else "—",
                         str(h.n_records)] for h in r.history], "No bench records yet.")
    lines += ["", "## Parity with llama.cpp", ""]
    lines += _md_table(["model", "references", "backend", "result", "free-run prefix", "teacher-forced agreement",
                        "max Δlogit", "max KL", "margin shift", "llama.cpp's own", "provenance"],
                       [[p.model, p.tier, p.backend, p.status, p.matched, p.agreement,
                         f"{p.max_logit_diff:.4f}" if p.max_logit_diff is not None else "—",
                         f"{p.max_kl:.3g}" if p.max_kl is not None else "—",
                         f"{p.margin_shift:.3g}" if p.margin_shift is not None else "—", p.llama_spread or "—",
                         p.provenance]
                        for p in r.parity], "No validate records yet.")
    lines += ["", "## GPU test suite", ""]
    lines += _md_table(["date", "result", "passed", "failed", "errors", "skipped", "time", "build", "where", "command",
                        "record"],
                       [[t.date[:16].replace("T", " "), t.problem or "pass", str(t.passed), str(t.failed),
                         str(t.errors), str(t.skipped), "—" if t.duration_s is None else f"{t.duration_s:.0f} s",
                         fmt_short_build(t.build), t.where, f"`{t.command}`", t.file] for t in r.suite_runs],
                       "No tests records yet.")
    lines += ["", "## Mutation suite", ""]
    for m in r.mutants:
        lines += [f"{m.backend} engine: caught {m.caught} of {m.total} at build {m.build}, {m.date[:10]}"
                  f"{', partial' if m.partial else ''} ({m.provenance}, {m.file})", ""]
        if m.not_run:
            lines += [f"Not in this record: {', '.join(m.not_run)}.", ""]
        if m.control_failed:
            lines += [f"Not tried where the build itself failed: {'; '.join(f'{c[0]} ({c[1]})' for c in m.control_failed)}.",
                      ""]
        lines += _md_table(["mutant", "bug", "caught by", "checks that failed", "models tried"],
                           [list(x) for x in m.rows], "")
        lines += [""]
        if m.history:
            lines += [f"The {m.backend} engine's other records, each its own build's result, not merged:", ""]
            lines += _md_table(["date", "build", "result", "run", "record"],
                               [[h[0][:16].replace("T", " "), *h[1:]] for h in m.history], "")
            lines += [""]
    if not r.mutants:
        lines += ["No mutants records yet."]
    lines += ["", "## A/B comparisons", ""]
    lines += _md_table(["date", "model", "test", "A", "B", "A median", "B median", "B/A [95% CI]", "p", "wins B:A",
                        "verdict", "notes"],
                       [[t.date[:16].replace("T", " "), t.model, t.test, t.arm_a, t.arm_b, fmt_tok(t.a_median),
                         fmt_tok(t.b_median), f"{t.ratio:.3f} [{t.ci[0]:.3f}, {t.ci[1]:.3f}]", f"{t.p_value:.3g}",
                         t.wins, t.verdict, t.notes] for t in r.ab], "No A/B records yet.")
    lines += ["", "## Diagnosis", ""]
    lines += _md_table(["run", "test", "diagnosis", "evidence"],
                       [[f"{x.model} · {x.who} ({x.source})", x.test, x.diagnosis.label, x.diagnosis.sentence]
                        for x in r.runs], "No runs yet.")
    lines += ["", "## Sources", ""]
    lines += _md_table(["record", "kind", "model", "engine", "date"], [list(s) for s in r.sources],
                       "The results store is empty.")
    if r.skipped:
        lines += ["", f"{len(r.skipped)} file(s) in the results store were skipped, not shown:", ""]
        lines += [f"- `{f}`: {why}" for f, why in r.skipped]
    return "\n".join(lines) + "\n"
