"""``harness mutants``: the gate against deliberate engine bugs."""

from __future__ import annotations

from engine.errors import positive_int

from .. import distribute


def add(sub) -> None:
    mu = sub.add_parser("mutants", help="run the gate on deliberately broken engines: every mutant must be caught")
    mu.add_argument("--mutant", action="append", help="one mutant (repeatable; default: the whole suite)")
    mu.add_argument("--model", action="append", help="only these catalog models (repeatable; default: all)")
    mu.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                    help="default: cpu with the NumPy backend, every tier with CUDA")
    mu.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto")
    mu.add_argument("--jobs", "-j", type=positive_int, default=None,
                    help="mutants at a time, each in its own process (default: one per CPU with numpy, 1 with cuda)")
    mu.add_argument("--save", action="store_true",
                    help="save the run as one record (reports/results): every mutant's result on this build, "
                         "and the mutants not run or not judged")
    distribute.add_options(mu, "mutants")
    mu.set_defaults(func=run)


def run(args) -> int:
    from ..mutants import main_suite

    return main_suite(args)
