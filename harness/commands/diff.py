"""``harness diff``: the first layer and op where the engine departs from llama.cpp (or NumPy)."""

from __future__ import annotations

from . import common


def add(sub) -> None:
    df = sub.add_parser("diff", help="the first layer and op where the engine departs from llama.cpp (or NumPy)")
    df.add_argument("model", help="catalog model name or a .gguf path")
    df.add_argument("--prompt", required=True, help="text to prefill (at least two tokens)")
    df.add_argument("--backend", choices=["numpy", "cuda"], default="numpy", help="the engine under test")
    df.add_argument("--against", choices=["llama.cpp", "numpy", "faithful"], default="llama.cpp",
                    help="the reference side: llama.cpp on the CPU (default), the NumPy engine, or the NumPy "
                         "engine rounding as the CUDA engine does (faithful)")
    df.add_argument("--no-twin", action="store_true",
                    help="run llama.cpp on the quantised file itself, not its F32 twin (8-bit activation noise)")
    df.add_argument("--mutant", help="switch on a mutant of `harness mutants` in the engine under test")
    df.add_argument("--tol", type=float, default=1e-3, help="normalised error that counts as divergence (default 1e-3)")
    df.set_defaults(func=run)


def run(args) -> int:
    from .. import reference  # noqa: F401  (first: llama.cpp loads before NumPy)
    from ..diff import main_diff

    return main_diff(args, common.model(args.model)[0])
