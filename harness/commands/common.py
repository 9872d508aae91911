"""What several commands share: naming a model, the runners' work directory,
whether to save, and the argument types."""

from __future__ import annotations

import argparse
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
