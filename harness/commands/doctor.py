"""``harness doctor``: what this machine can do, with fixes."""

from __future__ import annotations


def add(sub) -> None:
    d = sub.add_parser("doctor", help="what this machine can do, with fixes")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=run)


def run(args) -> int:
    from ..doctor import main_doctor

    return main_doctor(args)
