"""User-facing errors.

Everything a user can cause (a bad file, a missing key, a wrong option) raises
an ``AnvilError`` whose message is one line naming the file and the key,
tensor or value at fault. The CLIs print that line and exit non-zero, with no
traceback; anything else escaping is a bug in Anvil.
"""

import argparse


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


def run_command(command, args) -> int:
    """Run one CLI command: a user error becomes one line on stderr and exit
    status 1, Ctrl-C exit status 130, never a traceback."""
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
