"""One way to write a file that readers see whole or not at all.

The data goes to a temporary file in the target's directory (``os.replace``
is atomic within one filesystem), is flushed to disk, and only then takes the
final name; any failure, Ctrl-C included, removes the temporary file and
leaves the old file, if any, untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import AnvilError


def check_writable(path) -> Path:
    """``path`` if a file can be made there: no existing ancestor is a
    plain file. Callers with slow work before the write check this first."""
    path = Path(path)
    for d in (path.parent, *path.parent.parents):
        if d.exists():
            if not d.is_dir():
                raise AnvilError(f"{d}: not a directory, so {path} cannot be written")
            break
    return path


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb"):
    """``with atomic_open(path) as f: f.write(...)``; text or binary ``mode``."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    path = check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only: give it a new file's mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask
