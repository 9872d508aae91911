"""``harness``: the workbench around the engine.

    harness models [NAME ...]                 fetch/generate catalog models, print their paths
    harness synth --preset NAME OUT.gguf      write a random-weight GGUF at a real model shape
    harness reference [--model NAME] [--tier cpu|gpu] [--force]
                                              regenerate llama.cpp references (needs llama-cpp-python)
    harness validate-catalog [--tier cpu|gpu] [--model NAME] [--backend cuda|numpy] [--json] [--save]
                                              greedy parity with llama.cpp; exit 0 only if every model passes
    harness diff MODEL --prompt TEXT [--backend numpy|cuda] [--against llama.cpp|numpy] [--mutant NAME]
                                              per-layer, per-op error; marks the first op that diverges
    harness mutants [--backend cuda|numpy] [--mutant NAME]
                                              the gate against deliberate engine bugs; exit 0 only if all are caught
    harness ab --rounds 8 BASE CANDIDATE [--model NAME|FILE] [--commits]
                                              interleaved A/B of two engine wheels (or git revisions, or a llama.cpp arm)
    harness ab --aa BASE                      BASE against itself: the noise band later A/Bs here are judged by
    harness bisect GOOD BAD [--test tg128] [--model NAME|FILE]
                                              the first commit from GOOD to BAD that made the test slower
    harness wheel REV [REV ...]               the engine wheel of each git revision (built once, cached)
    harness bench [--engine installed|WHEEL] [--llamacpp SPEC] [--model NAME|FILE ...]
                                              pp512/tg128 beside llama.cpp, appended to reports/results
    harness roofline [--save]                 this GPU's copy bandwidth and bf16 GEMM rate (the scoreboard's rooflines)
    harness doctor                            what this machine can do, and how to fix what is missing
    harness report [--format html|md]         the scoreboard (reports/index.html) from the results store
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from engine.errors import run_command

from .commands import COMMANDS


class _Help(argparse.HelpFormatter):
    """--help shows each option's default (where it has one its help does not already name)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        default = ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        return f"{text} (default: {default})" if text else f"default: {default}"


def build_parser() -> argparse.ArgumentParser:
    import functools

    from engine import __version__

    p = argparse.ArgumentParser(prog="harness", description="Anvil workbench: correctness and speed against llama.cpp",
                                formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"harness (anvil) {__version__}")
    p.add_argument("--project", metavar="DIR",
                   help="the project: its references/ (catalog, references) and reports/ (results, scoreboard); "
                        "default $ANVIL_PROJECT, else the checkout holding the current directory")
    sub = p.add_subparsers(dest="command", required=True,
                           parser_class=functools.partial(argparse.ArgumentParser, formatter_class=_Help))

    for command in COMMANDS:
        command.add(sub)
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.project:
        import os

        if not Path(args.project).expanduser().is_dir():
            parser.error(f"--project {args.project}: no such directory (the project holds references/catalog.toml)")
        named = Path(args.project).expanduser().resolve()
        if "harness.project" in sys.modules and sys.modules["harness.project"].ROOT != named:
            raise SystemExit("error: --project must be given before any harness module is loaded (use ANVIL_PROJECT)")
        os.environ["ANVIL_PROJECT"] = str(named)  # read once, as the modules load

    # `kill` or a closed terminal stops the harness the way Ctrl-C does: its
    # benchmark children (each in its own process group) are killed first
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
