"""Engine wheels built from git revisions (``harness wheel``, ``harness ab
--commits``): a detached worktree of the commit, ``pip wheel --no-deps`` of
it into a cache named by the commit, the worktree removed. A commit's wheel
is built once; ``ANVIL_WHEELS_DIR`` moves the cache (default
``~/.cache/anvil/wheels``), e.g. to carry wheels to an offline machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.errors import AnvilError

from . import project


def cache_dir() -> Path:
    return Path(os.environ.get("ANVIL_WHEELS_DIR") or Path.home() / ".cache" / "anvil" / "wheels")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise AnvilError("git is not installed: building wheels from revisions needs it") from None


def commit_of(rev: str, repo: Path | None = None) -> str:
    """The full commit id ``rev`` names in ``repo`` (default: the project)."""
    repo = repo or project.ROOT
    p = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if p.returncode != 0:
        raise AnvilError(f"{rev!r} is not a commit of {repo} (git rev-parse)")
    return p.stdout.strip()


def describe_commit(rev: str, repo: Path | None = None) -> dict:
    """What an A/B record names an arm built from ``rev`` by: {"commit": full id, "subject": its first line}."""
    repo = repo or project.ROOT
    sha = commit_of(rev, repo)
    p = _git(repo, "log", "-1", "--format=%s", sha)
    return {"commit": sha, "subject": p.stdout.strip() if p.returncode == 0 else ""}


def build_isolation_args() -> list[str]:
    """pip's build isolation installs the build backend from the package
    index; where this Python has it already (pyproject's setuptools >= 77),
    build without isolation, so wheels build on machines with no index (the
    GPU hosts: carry a setuptools wheel there)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("setuptools").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if major >= 77 else []


def wheel_for(rev: str, repo: Path | None = None, progress: bool = True) -> Path:
    """The engine wheel of commit ``rev``: from the cache, or built now."""
    repo = repo or project.ROOT
    sha = commit_of(rev, repo)
    out = cache_dir() / sha
    found = sorted(out.glob("anvil-*.whl"))
    if found:
        return found[0]
    if progress:
        print(f"building the engine wheel of {rev} ({sha[:12]})...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="anvil-wheel-") as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        p = _git(repo, "worktree", "add", "--detach", "--quiet", str(src), sha)
        if p.returncode != 0:
            raise AnvilError(f"git worktree add of {sha[:12]} failed: {p.stderr.strip()[-300:]}")
        try:
            b = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                                *build_isolation_args(), "-w", str(dist), str(src)],
                               capture_output=True, text=True, timeout=900)
        finally:
            _git(repo, "worktree", "remove", "--force", str(src))
        wheels = sorted(dist.glob("anvil-*.whl"))
        if b.returncode != 0 or not wheels:
            tail = (b.stderr or b.stdout).strip().splitlines()[-1:] or ["no wheel written"]
            raise AnvilError(f"pip wheel of {rev} ({sha[:12]}) failed: {tail[0]}")
        out.mkdir(parents=True, exist_ok=True)
        final = out / wheels[0].name
        os.replace(wheels[0], final)  # the cache holds whole wheels only
    return final
