"""``harness report``: the scoreboard from the results store."""

from __future__ import annotations


def add(sub) -> None:
    rp = sub.add_parser("report", help="render the scoreboard from the results store")
    rp.add_argument("--format", choices=["html", "md"], default="html")
    rp.add_argument("--out", default=None, help="output file (default reports/index.html; md prints to stdout)")
    rp.add_argument("--results-dir", action="append", default=None,
                    help="results store (default reports/results); repeatable: the stores of several hosts or GPUs "
                         "on one scoreboard, a record in two of them shown once")
    rp.add_argument("--readme", action="store_true",
                    help="instead, rewrite the speed table of the project's README.md from the records")
    rp.set_defaults(func=run)


def run(args) -> int:
    from ..report import main_report

    return main_report(args)
