"""The scoreboard's figures as PNG bytes, deterministically.

Same Figure -> same bytes: matplotlib's object API on an Agg canvas (no
pyplot, so no global figure state and no backend switch for the caller),
fixed sizes and dpi, a fixed bundled font, and no "Software" metadata
(which would embed the matplotlib version into every PNG).
"""

from __future__ import annotations

import io

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure

DPI = 100
WIDTH_IN = 9.0
BAR_ROW_IN = 0.62      # height per model x test group of bars
TRACE_SIZE_IN = (4.4, 3.0)
# series of the bar figures, in drawing order, with fixed colours: grey for
# llama.cpp, orange for Anvil; pale for the first record, full for the latest
SERIES = {"llama.cpp first": "#c8c8c8", "llama.cpp latest": "#6b6b6b",
          "Anvil first": "#f6c39f", "Anvil latest": "#d9541e"}
# DejaVu Sans ships with matplotlib: the same glyphs on every machine
STYLE = {"font.family": "DejaVu Sans", "font.size": 9, "axes.titlesize": 10, "axes.spines.top": False,
         "axes.spines.right": False}


def _png(fig: MplFigure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def bars(title: str, groups: tuple) -> bytes:
    """Horizontal grouped bars: one group per (label, ((series, tok_s, sd), ...)),
    top to bottom in the given order, the value printed at each bar's end."""
    with matplotlib.rc_context(STYLE):
        n = max(1, len(groups))
        fig = MplFigure(figsize=(WIDTH_IN, 1.3 + BAR_ROW_IN * n * 1.4))
        ax = fig.add_subplot()
        width = 0.8 / len(SERIES)
        top = max((v for _, ss in groups for _, v, _ in ss), default=1.0)
        used = set()
        for gi, (label, series) in enumerate(groups):
            present = [s for s in SERIES if any(k == s for k, _, _ in series)]
            for si, key in enumerate(present):
                _, v, sd = next(x for x in series if x[0] == key)
                y = gi + (si - (len(present) - 1) / 2) * width
                ax.barh(y, v, height=width * 0.9, color=SERIES[key], xerr=sd or None,
                        error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#222222"},
                        label=key if key not in used else None)
                used.add(key)
                ax.text(v + top * 0.01 + (sd or 0), y, f"{v:.0f}" if v >= 100 else f"{v:.1f}",
                        va="center", fontsize=8)
        ax.set_yticks(range(len(groups)), [g[0] for g in groups])
        ax.invert_yaxis()  # first group at the top, as in the tables
        ax.set_xlim(0, top * 1.15)
        ax.set_xlabel("tokens / s")
        ax.set_title(title, loc="left")
        ax.grid(axis="x", color="#e6e6e6", linewidth=0.6)
        ax.set_axisbelow(True)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: list(SERIES).index(labels[i]))
        # below the axis, one row: never over a bar
        ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper center",
                  bbox_to_anchor=(0.5, -0.5 / n ** 0.7 - 0.06), ncol=len(order), fontsize=8, frameon=False)
        fig.tight_layout()
        return _png(fig)


def _pairs(t, ys):
    pts = [(a, b) for a, b in zip(t, ys) if a is not None and b is not None]
    return [a for a, _ in pts], [b for _, b in pts]


def trace(title: str, data: tuple) -> bytes:
    """SM clock, power (with the limit dashed) and GPU utilisation against
    time; the measured window, when known, shaded."""
    d = dict(data)
    t = d.get("t") or ()
    with matplotlib.rc_context(STYLE):
        fig = MplFigure(figsize=TRACE_SIZE_IN)
        axes = fig.subplots(3, 1, sharex=True)
        panels = (("sm_mhz", "SM MHz", "#1f77b4"), ("power_w", "power W", "#d62728"),
                  ("gpu_util", "util %", "#2ca02c"))
        for ax, (key, ylabel, color) in zip(axes, panels):
            xs, ys = _pairs(t, d.get(key) or ())
            if xs:
                ax.plot(xs, ys, color=color, linewidth=1.0, drawstyle="steps-post")
            else:
                ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center", color="#888888")
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(color="#eeeeee", linewidth=0.5)
            ax.set_ylim(bottom=0)
        window = d.get("window")
        if window:  # the measured repetitions, the part the diagnosis reads
            for ax in axes:
                ax.axvspan(window[0], window[1], color="#ffd54f", alpha=0.35, linewidth=0)
        if d.get("power_limit_w"):
            axes[1].axhline(d["power_limit_w"], color="#d62728", linestyle="--", linewidth=0.7)
        axes[2].set_ylim(0, 105)
        axes[-1].set_xlabel("seconds", fontsize=8)
        axes[0].set_title(title, loc="left", fontsize=9)
        fig.tight_layout(h_pad=0.3)
        return _png(fig)


LINES_PANEL_IN = 2.6  # height per panel of a lines figure
ENGINE_COLOURS = {"Anvil": "#d9541e", "llama.cpp": "#6b6b6b"}
STYLES = ("-", "--", ":", "-.")


def lines(title: str, data: tuple) -> bytes:
    """Panels of tok/s lines: data (("x", "date" | "depth"), ("panels",
    ((title, ((label, ((x, y), ...)), ...), ((x, y, text), ...)), ...))).
    Dates are categories in time order (one column per record date, shared
    by the panels); depths are numbers. Colour = engine (the label's first
    word), line style = the test within the panel; marks (A/B results) are
    drawn as black diamonds with their text."""
    d = dict(data)
    by_date = d.get("x") == "date"
    panels = d.get("panels") or ()
    cats = sorted({x for _, series, marks in panels for _, pts in series for x, _ in pts} |
                  {x for _, _, marks in panels for x, _, _ in marks}) if by_date else []
    pos = {c: i for i, c in enumerate(cats)}
    X = (lambda x: pos[x]) if by_date else (lambda x: x)  # noqa: E731
    with matplotlib.rc_context(STYLE):
        fig = MplFigure(figsize=(WIDTH_IN, 0.9 + LINES_PANEL_IN * max(1, len(panels)) + (0.8 if by_date else 0)))
        axes = fig.subplots(max(1, len(panels)), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (ptitle, series, marks) in zip(axes, panels):
            tests: dict[str, str] = {}
            for label, pts in series:
                engine, _, test = label.partition(" ")
                style = tests.setdefault(test, STYLES[len(tests) % len(STYLES)])
                xs, ys = [X(x) for x, _ in pts], [y for _, y in pts]
                ax.plot(xs, ys, style, marker="o", markersize=4, linewidth=1.3,
                        color=ENGINE_COLOURS.get(engine, "#1f77b4"), label=label)
            for x, y, text in marks:
                ax.plot([X(x)], [y], marker="D", markersize=6, color="#111111", linestyle="none")
                ax.annotate(text, (X(x), y), textcoords="offset points", xytext=(4, 6), fontsize=7)
            ax.set_ylabel(ptitle, fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(color="#eeeeee", linewidth=0.5)
            ax.legend(fontsize=7, frameon=False, loc="lower left", ncol=2)
        if by_date:
            axes[-1].set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=7)
            axes[-1].set_xlabel("record date (UTC)", fontsize=8)
        else:
            axes[-1].set_xlabel("context depth (tokens already in the cache)", fontsize=8)
        axes[0].set_title(title, loc="left")
        fig.tight_layout()
        return _png(fig)


def render(fig) -> bytes:
    """PNG bytes of a report Figure (kind "bars", "trace" or "lines")."""
    if fig.kind == "bars":
        return bars(fig.title, fig.data)
    if fig.kind == "lines":
        return lines(fig.title, fig.data)
    if fig.kind == "trace":
        return trace(fig.title, fig.data)
    raise ValueError(f"unknown figure kind {fig.kind!r}")
