"""The scoreboard's figures as inline SVG, deterministically.

Same Figure -> same markup: matplotlib's object API on an Agg-free SVG
canvas (no pyplot, no global figure state), fixed sizes, text left as
text (``svg.fonttype: none``: the page's font draws it, and no glyph
outlines are embedded), ids salted with the figure's name (so two figures
on one page never share one) and no date or creator metadata. NVML traces,
a few dozen on a page, are small hand-written SVG sparklines instead: a
matplotlib figure each was most of what ``harness report`` took.
"""

from __future__ import annotations

import datetime
import html
import io
import re

import matplotlib
from matplotlib import dates as mdates
from matplotlib.figure import Figure as MplFigure

WIDTH_IN = 9.0
BAR_ROW_IN = 0.2       # height per bar of the ratio figure
LINES_PANEL_IN = 2.3   # height per panel of a lines figure
AB_LANE_IN = 0.22      # height per lane of A/B markers under a history
# DejaVu Sans ships with matplotlib; as text in the SVG the browser's sans-serif draws it
STYLE = {"font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.spines.top": False,
         "axes.spines.right": False, "svg.fonttype": "none"}
ENGINE_COLOURS = {"Anvil": "#d9541e", "llama.cpp": "#6b6b6b"}
STYLES = ("-", "--", ":", "-.")
# change-points (changes.py) and A/B verdicts (stats.py): marker, colour
CHANGE_MARKS = {"regression": ("v", "#b42318"), "suspicious": ("X", "#c77700"), "improvement": ("^", "#1a7f37")}
AB_MARKS = {"faster": ("^", "#1a7f37"), "slower": ("v", "#b42318"), "no significant change": ("o", "#8a8a8a")}


def _svg(fig: MplFigure, name: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": name, "svg.id": f"fig-{name}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):].strip()  # inline: no XML declaration or DOCTYPE
    # matplotlib names its groups figure_1, axes_1, ... in every figure: on one page those ids would
    # repeat. Nothing refers to a group (references go to the salted clip-path and marker ids): drop them
    return re.sub(r'<g id="[^"]*"', "<g", text)


def _when(iso: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).replace(tzinfo=None)  # UTC, naive


def bars(name: str, title: str, bars: tuple) -> str:
    """Horizontal bars of Anvil ÷ llama.cpp, one per (label, ratio,
    validated), top to bottom in the given order; a not-validated bar pale
    and hatched; a line at 1."""
    with matplotlib.rc_context(STYLE):
        n = max(1, len(bars))
        fig = MplFigure(figsize=(WIDTH_IN, 0.9 + BAR_ROW_IN * n))
        ax = fig.add_subplot()
        top = max([b[1] for b in bars] + [1.0])
        for i, (label, ratio, ok) in enumerate(bars):
            colour = ENGINE_COLOURS["Anvil"] if ratio >= 1 else ENGINE_COLOURS["llama.cpp"]
            ax.barh(i, ratio, height=0.7, color=colour, alpha=1.0 if ok else 0.35, hatch=None if ok else "///",
                    edgecolor=colour, linewidth=0.5)
            ax.text(ratio + top * 0.01, i, f"{ratio:.2f}×" + ("" if ok else " (not validated)"), va="center",
                    fontsize=7.5)
        ax.axvline(1.0, color="#222222", linewidth=0.8)
        ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=7.5)
        ax.invert_yaxis()  # first row at the top, as in the tables
        ax.set_xlim(0, top * 1.22)
        ax.set_xlabel("Anvil t/s ÷ llama.cpp t/s")
        ax.set_title(title, loc="left")
        ax.grid(axis="x", color="#e6e6e6", linewidth=0.6)
        ax.set_axisbelow(True)
        fig.tight_layout()
        return _svg(fig, name)


def _lanes(xs: list[float], gap: float) -> list[int]:
    """A lane for each sorted x so that no two markers of a lane are closer than ``gap``."""
    last: list[float] = []
    out = []
    for x in xs:
        lane = next((i for i, v in enumerate(last) if x - v >= gap), len(last))
        if lane == len(last):
            last.append(x)
        last[lane] = x
        out.append(lane)
    return out


def lines(name: str, title: str, data: tuple) -> str:
    """Panels of tok/s lines: data (("x", "date" | "depth"), ("panels",
    ((title, ((label, ((x, y), ...)), ...), ((x, y, change label), ...)), ...)),
    ("ab", ((date, verdict, text), ...))). Dates are ISO strings on a real
    time axis; colour = engine (the label's first word), line style = the
    rest of the label within the panel. Change-points are marked on their
    line; A/B comparisons sit in lanes of their own under the panels, one
    marker each (shape and colour: the verdict; no text, so none overlap)."""
    d = dict(data)
    by_date = d.get("x") == "date"
    panels = d.get("panels") or ()
    ab = d.get("ab") or () if by_date else ()
    X = _when if by_date else (lambda x: x)  # noqa: E731
    with matplotlib.rc_context(STYLE):
        lanes = []
        if ab:
            xs = [mdates.date2num(_when(a[0])) for a in ab]
            span = max(xs + [mdates.date2num(X(x)) for _, s, _ in panels for _, pts in s for x, _ in pts]) - \
                min(xs + [mdates.date2num(X(x)) for _, s, _ in panels for _, pts in s for x, _ in pts])
            lanes = _lanes(xs, max(span, 1e-3) / 60)
        n_lanes = max(lanes, default=-1) + 1
        heights = [LINES_PANEL_IN] * max(1, len(panels)) + ([AB_LANE_IN * n_lanes + 0.3] if n_lanes else [])
        fig = MplFigure(figsize=(WIDTH_IN, 0.9 + sum(heights)))
        axes = fig.subplots(len(heights), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
        for ax, (ptitle, series, marks) in zip(axes, panels):
            styles: dict[str, str] = {}
            for label, pts in series:
                engine, _, rest = label.partition(" ")
                style = styles.setdefault(rest.split(" · ")[0], STYLES[len(styles) % len(STYLES)])
                ax.plot([X(x) for x, _ in pts], [y for _, y in pts], style, marker="o", markersize=3,
                        linewidth=1.2, color=ENGINE_COLOURS.get(engine, "#1f77b4"), label=label)
            for kind in CHANGE_MARKS:
                pts = [(X(x), y) for x, y, k in marks if k == kind and y is not None]
                if pts:
                    marker, colour = CHANGE_MARKS[kind]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, markersize=8, color=colour,
                            linestyle="none", label=f"change-point: {kind}", zorder=5)
            ax.set_ylabel(ptitle, fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(color="#eeeeee", linewidth=0.5)
            # beside the panel: a legend never covers a line
            ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if n_lanes:
            lane_ax = axes[-1]
            for verdict, (marker, colour) in AB_MARKS.items():
                pts = [(_when(a[0]), lane) for a, lane in zip(ab, lanes) if a[1] == verdict]
                if pts:
                    lane_ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=colour, markersize=6,
                                 linestyle="none", label=f"A/B: {verdict}")
            lane_ax.set_ylim(n_lanes - 0.5, -0.5)
            lane_ax.set_yticks([])
            lane_ax.set_ylabel("A/B", fontsize=8, rotation=0, ha="right", va="center")
            lane_ax.spines["left"].set_visible(False)
            lane_ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if by_date:
            loc = mdates.AutoDateLocator()
            axes[-1].xaxis.set_major_locator(loc)
            axes[-1].xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))
            axes[-1].set_xlabel("date measured (UTC)", fontsize=8)
        else:
            axes[-1].set_xlabel("context depth (tokens already in the cache)", fontsize=8)
        axes[0].set_title(title, loc="left")
        fig.tight_layout()
        return _svg(fig, name)


TRACE_W, TRACE_PANEL_H, TRACE_LEFT, TRACE_MAX_POINTS = 330, 30, 62, 120
_TRACE_PANELS = (("sm_mhz", "SM MHz", "#1f77b4"), ("power_w", "power W", "#d62728"), ("gpu_util", "util %", "#2ca02c"))


def _path(pts: list[tuple[int, int]]) -> str:
    """An SVG path through integer points, each step relative to the last: a
    trace's steps are mostly the same (x) and none (y), which compresses."""
    out = [f"M{pts[0][0]} {pts[0][1]}"]
    for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
        out.append(f"l{xb - xa} {yb - ya}")
    return "".join(out)


def trace(name: str, title: str, data: tuple) -> str:
    """SM clock, power (the limit dashed) and GPU utilisation against time,
    the measured window shaded: three sparklines, at most TRACE_MAX_POINTS
    points each."""
    d = dict(data)
    t = list(d.get("t") or ())
    top, gap = 16, 6
    height = top + 3 * (TRACE_PANEL_H + gap) + 10
    x0, x1 = TRACE_LEFT, TRACE_W - 6
    t0, t1 = (t[0], t[-1]) if len(t) > 1 and t[-1] > t[0] else (0.0, 1.0)
    sx = lambda v: x0 + (v - t0) / (t1 - t0) * (x1 - x0)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="fig-{html.escape(name)}" class="trace" '
           f'viewBox="0 0 {TRACE_W} {height}" width="{TRACE_W}" height="{height}" font-family="sans-serif" '
           f'font-size="9"><title>{html.escape(title)}</title>',
           f'<text x="2" y="10" font-size="10">{html.escape(title)}</text>']
    window = d.get("window")
    for i, (key, label, colour) in enumerate(_TRACE_PANELS):
        y0 = top + i * (TRACE_PANEL_H + gap)
        vals = list(d.get(key) or ())
        pts = [(a, float(b)) for a, b in zip(t, vals) if a is not None and b is not None]
        limit = d.get("power_limit_w") if key == "power_w" else 100.0 if key == "gpu_util" else None
        ymax = max([p[1] for p in pts] + [limit or 0.0, 1e-9])
        sy = lambda v: y0 + TRACE_PANEL_H - v / ymax * TRACE_PANEL_H  # noqa: E731
        out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{TRACE_PANEL_H}" fill="#fafafa" '
                   f'stroke="#e5e5e5"/>')
        if window:
            wa, wb = max(x0, sx(window[0])), min(x1, sx(window[1]))
            if wb > wa:
                out.append(f'<rect x="{wa:.1f}" y="{y0}" width="{wb - wa:.1f}" height="{TRACE_PANEL_H}" '
                           f'fill="#ffd54f" fill-opacity="0.45"/>')
        if limit and key == "power_w":
            out.append(f'<line x1="{x0}" x2="{x1}" y1="{sy(limit):.1f}" y2="{sy(limit):.1f}" stroke="{colour}" '
                       f'stroke-dasharray="3 2" stroke-width="0.7"/>')
        step = max(1, -(-len(pts) // TRACE_MAX_POINTS))
        pts = pts[::step] + (pts[-1:] if pts and (len(pts) - 1) % step else [])
        if pts:
            out.append(f'<path d="{_path([(round(sx(a)), round(sy(b))) for a, b in pts])}" fill="none" '
                       f'stroke="{colour}" stroke-width="1.1"/>')
        else:
            out.append(f'<text x="{(x0 + x1) / 2:.0f}" y="{y0 + TRACE_PANEL_H / 2 + 3:.0f}" fill="#888" '
                       f'text-anchor="middle">no samples</text>')
        out.append(f'<text x="{x0 - 4}" y="{y0 + 10}" text-anchor="end" fill="{colour}">{label}</text>'
                   f'<text x="{x0 - 4}" y="{y0 + TRACE_PANEL_H}" text-anchor="end" fill="#666">'
                   f'0–{ymax:.0f}</text>')
    out.append(f'<text x="{x1}" y="{height - 1}" text-anchor="end" fill="#666">{t1 - t0:.1f} s</text></svg>')
    return "".join(out)


def render(fig) -> str:
    """The inline SVG markup of a report Figure (kind "bars", "lines" or "trace")."""
    if fig.kind == "bars":
        return bars(fig.name, fig.title, fig.data)
    if fig.kind == "lines":
        return lines(fig.name, fig.title, fig.data)
    if fig.kind == "trace":
        return trace(fig.name, fig.title, fig.data)
    raise ValueError(f"unknown figure kind {fig.kind!r}")
