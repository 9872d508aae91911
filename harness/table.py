"""The two ways a table is printed: GitHub markdown (``markdown``: files,
pipes, CI logs, the scoreboard), and in a terminal drawn by rich within
WIDTH columns, its cells wrapped (``show`` picks)."""

from __future__ import annotations

import shutil
import sys

WIDTH = 120  # the widest a table drawn in a terminal is


def markdown(header: list[str], rows: list[list], empty: str | None = None) -> str:
    """``| a | b |`` rows under a header; a cell's ``|`` and newlines escaped.
    With no rows: ``empty`` if given, else the header alone."""
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    if not rows and empty is not None:
        return empty
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def terminal(header: list[str], rows: list[list], width: int = WIDTH) -> str:
    """The table drawn by rich in at most ``width`` columns: where it is
    wider, the widest columns give way first, down to their longest word
    (cells wrap between words). Cells are plain text (``[1.0, 1.2]`` is no markup)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cells = [[str(c) for c in row] for row in rows]

    def table(widths: list[int]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for h, w in zip(header, widths):
            t.add_column(Text(h, style="bold", overflow="fold"), width=w, overflow="fold")
        for row in cells:
            t.add_row(*(Text(c, overflow="fold") for c in row))
        return t

    columns = [[h, *(r[k] for r in cells)] for k, h in enumerate(header)]
    widths = [max(map(len, col)) for col in columns]
    least = [max(len(w) for text in col for w in text.split() or [""]) for col in columns]
    overhead = max(map(len, _render(table(widths), 1 << 16).splitlines())) - sum(widths)  # rules and padding
    while sum(widths) + overhead > width:
        # the widest column that can still wrap between words gives way; once none can, the widest folds its words
        wrap = [i for i, w in enumerate(widths) if w > least[i]]
        k = max(wrap or range(len(widths)), key=widths.__getitem__)
        if widths[k] <= 1:
            break
        widths[k] -= 1
    return _render(table(widths), width)


def _render(renderable, width: int) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())


def show(header: list[str], rows: list[list], file=None, tty: bool | None = None) -> None:
    """Print a table: drawn for a terminal (``tty``, default: whether
    ``file`` is one) within its width and at most WIDTH columns, else markdown."""
    file = file or sys.stdout
    if tty is None:
        tty = file.isatty()
    if tty:
        print(terminal(header, rows, min(shutil.get_terminal_size().columns, WIDTH)), file=file)
    else:
        print(markdown(header, rows), file=file)
