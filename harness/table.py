"""One way to print a table: GitHub markdown, readable in a terminal too."""

from __future__ import annotations


def markdown(header: list[str], rows: list[list], empty: str | None = None) -> str:
    """``| a | b |`` rows under a header; a cell's ``|`` and newlines escaped.
    With no rows: ``empty`` if given, else the header alone."""
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    if not rows and empty is not None:
        return empty
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
