"""User-facing errors.

Everything a user can cause (a bad file, a missing key, a wrong option) raises
an ``AnvilError`` whose message is one line naming the file and the key,
tensor or value at fault. The CLIs print that line and exit non-zero, with no
traceback; anything else escaping is a bug in Anvil.
"""

import argparse
import os
import re
from pathlib import Path

LOG_ENV = "ANVIL_LOG_DIR"
LOGS_KEPT = 200  # the newest logs kept; older ones are removed as new ones are written
TRACEBACK_ENV = "ANVIL_TRACEBACK"  # =1: an internal error raises (with its traceback) instead of one line


class AnvilError(Exception):
    """A problem with the user's input, reported as one line."""


class GGUFError(AnvilError):
    """A GGUF file that cannot be used: not a GGUF, truncated, missing a key,
    an unsupported architecture or tensor type, or a tensor of the wrong shape."""

    def __init__(self, path, what: str):
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


class NonFiniteLogits(AnvilError):
    """The forward pass produced a NaN or an infinity: the model's weights (or
    the engine) are broken, and no token can be chosen from such logits."""

    def __init__(self, path, position: int, step: int | None = None):
        self.path, self.position, self.step = path, position, step
        at = f"step {step} (position {position})" if step is not None else f"position {position}"
        super().__init__(f"{path}: non-finite logits (NaN or Inf) at {at}: the weights or the engine "
                         f"produced garbage, so no token is chosen")


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut at ``limit`` characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def log_dir() -> Path:
    """Where whole logs go that a one-line error points to (a failed child's
    output, an internal error's traceback): ``$ANVIL_LOG_DIR``, else
    ``~/.cache/anvil/logs``."""
    return Path(os.environ.get(LOG_ENV) or Path.home() / ".cache" / "anvil" / "logs")


def write_log(name: str, text: str) -> Path | None:
    """``text`` in a new file under ``log_dir()`` (named by the time, ``name``
    and this process), the oldest pruned past LOGS_KEPT; None where nothing
    can be written (the one-line error then stands alone)."""
    import tempfile
    import time

    stem = f"{time.strftime('%Y%m%dT%H%M%S')}-{re.sub(r'[^A-Za-z0-9._-]+', '-', name).strip('-')[:60]}-{os.getpid()}"
    for d in (log_dir(), Path(tempfile.gettempdir()) / f"anvil-logs-{os.getuid()}"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{stem}.log"
            path.write_text(text)
            for old in sorted(d.glob("*.log"), key=lambda f: f.stat().st_mtime)[:-LOGS_KEPT]:
                old.unlink(missing_ok=True)
            return path
        except OSError:
            continue
    return None


def run_command(command, args) -> int:
    """Run one CLI command: a user error becomes one line on stderr and exit
    status 1, Ctrl-C exit status 130, never a traceback. Anything else is a
    bug in Anvil: one line too, the traceback in a log file it names
    (``ANVIL_TRACEBACK=1`` raises it instead)."""
    import sys

    try:
        return command(args)
    except AnvilError as e:
        print(f"error: {e}" + "".join(f" ({note})" for note in getattr(e, "__notes__", ())), file=sys.stderr)
        return 1
    except OSError as e:  # a path given (or set in the environment) that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError as e:  # a size the machine cannot hold (NumPy says how much it wanted)
        print(f"error: out of memory{f': {e}' if str(e) else ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        import traceback

        log = write_log("internal-error", "".join(traceback.format_exception(e)))
        said = first_line(str(e))
        where = f"traceback: {log}" if log else "no log could be written"
        print(f"error: internal error (a bug in Anvil): {type(e).__name__}{f': {said}' if said else ''} "
              f"({where}; {TRACEBACK_ENV}=1 prints it here)", file=sys.stderr)
        return 1


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return n
    return parse


# argparse types shared by the engine's and the harness's command lines
positive_int = _int_at_least(1, "a positive integer")
count_int = _int_at_least(0, "a non-negative integer")
