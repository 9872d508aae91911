"""What several commands share: naming a model, the runners' work directory,
whether to save, and the argument types."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import AnvilError, count_int, positive_int

NOT_SAVED = "not saved: --save keeps the records in reports/results (or --results-dir DIR)"


def model(name_or_path: str, check_only: bool = False) -> tuple[Path, dict] | None:
    """A catalog model (fetched or generated) or a .gguf path, and what result
    records say about it: its name and, for a catalog model, the sha256 the
    catalog pins (catalog.model_path has verified the file). ``check_only``:
    only say whether the name is good (nothing fetched or generated)."""
    from .. import catalog

    p = Path(name_or_path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise AnvilError(f"{p}: no such model file")
        return None if check_only else (p, {"model_name": p.stem})
    entry = catalog.entry(name_or_path)  # an unknown name fails here
    if check_only:
        return None
    return catalog.model_path(name_or_path), {"model_name": name_or_path, "model_sha256": entry.sha256 or None}


# The model `bench` and `ab` measure when not given --model: the scoreboard's
# qwen3-8b where a GPU is usable; else a tiny one, because the NumPy engine
# holds a model in float32 (qwen3-8b: a 5 GB file generated first, then 33 GB
# of weights, which froze a 24 GB machine).
GPU_DEFAULT_MODEL = "qwen3-8b"
CPU_DEFAULT_MODEL = "tiny-qwen3"


def default_model(command: str) -> str:
    """The model for ``harness COMMAND`` without --model; the CPU choice is said on stderr."""
    from engine.backends.cuda.device import gpu_probe

    if gpu_probe() is None:
        return GPU_DEFAULT_MODEL
    print(f"{command}: no --model and no usable GPU (`harness doctor` says why): measuring {CPU_DEFAULT_MODEL} "
          f"on the NumPy engine ({GPU_DEFAULT_MODEL} needs a GPU; --model NAME|FILE picks another)",
          file=sys.stderr, flush=True)
    return CPU_DEFAULT_MODEL


def progress_bar(unit: str):
    """A progress bar on stderr for a long run (in a terminal): the task's
    description, the bar, done/total ``unit``, time taken and left. It
    clears itself at the end; ``say`` prints above it."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                    TextColumn(unit), TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)


def say(line: str, bar=None) -> None:
    """One line on stderr, above ``bar`` (a progress_bar) if there is one."""
    if bar is not None:
        bar.console.print(line, markup=False, highlight=False)
    else:
        print(line, file=sys.stderr, flush=True)


def something_to_measure(args) -> None:
    """-p 0 -n 0 is refused before any build or model is touched (as ``python -m engine bench`` does)."""
    if not (args.n_prompt or args.n_gen):
        raise AnvilError("nothing to measure: -p/--n-prompt and -n/--n-gen are both 0")


def workdir() -> Path:
    from .. import fetch

    d = fetch.models_dir().parent / "harness"
    d.mkdir(parents=True, exist_ok=True)
    return d


def saving(args) -> bool:
    """Records enter a store only when asked: --save (the committed store) or an explicit --results-dir."""
    return bool(args.save or args.results_dir)


def verdict_rounds(text: str) -> int:
    """Rounds of an A/B: enough that a verdict can be reached at all."""
    from .. import stats

    n, least = positive_int(text), stats.min_rounds()
    if n < least:
        raise argparse.ArgumentTypeError(
            f"expected at least {least} rounds, got {text!r}: with {n} against {n} no Mann-Whitney p can fall below "
            f"{stats.ALPHA:g} (smallest {stats.smallest_p(n, n):.3g}), so no verdict could be \"faster\" or \"slower\"")
    return n


def factor_above_one(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x > 1 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a ratio above 1 (e.g. 1.05), got {text!r}")
    return x


def depth_list(text: str) -> list[int]:
    """``0,4096,16384``: the depths of a sweep, each a token count >= 0."""
    try:
        return [count_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected token counts >= 0 separated by commas (e.g. 0,4096), "
                                         f"got {text!r}") from None
