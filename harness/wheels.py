"""Engine wheels built from git revisions (``harness wheel``, ``harness ab
--commits``): a detached worktree of the commit, ``pip wheel --no-deps`` of
it into a cache named by the commit, the worktree removed. A commit's wheel
is built once; ``ANVIL_WHEELS_DIR`` moves the cache (default
``~/.cache/anvil/wheels``), e.g. to carry wheels to an offline machine.
Beside each wheel, COMMIT_FILE names its commit and subject, so an A/B arm
(or a bisect step) is named by what changed, not by a wheel's hash.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.atomic import atomic_open
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


def subject_of(sha: str, repo: Path | None = None) -> str | None:
    """The first line of commit ``sha``'s message, None where ``repo`` has no such commit."""
    try:
        p = _git(repo or project.ROOT, "log", "-1", "--format=%s", sha, "--")
    except AnvilError:  # no git here
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def first_parent(good: str, bad: str, repo: Path | None = None) -> list[tuple[str, str]]:
    """(commit, subject) of each commit after ``good`` up to ``bad`` on
    ``bad``'s first-parent line, oldest first (``git rev-list --first-parent``:
    a merged branch is one commit, its merge)."""
    repo = repo or project.ROOT
    g, b = commit_of(good, repo), commit_of(bad, repo)
    if _git(repo, "merge-base", "--is-ancestor", g, b).returncode != 0:
        raise AnvilError(f"{good} ({g[:12]}) is not an ancestor of {bad} ({b[:12]}): nothing lies between them")
    p = _git(repo, "log", "--first-parent", "--reverse", "--format=%H %s", f"{g}..{b}", "--")
    if p.returncode != 0:
        raise AnvilError(f"git log {g[:12]}..{b[:12]} failed: {p.stderr.strip()[-300:]}")
    return [tuple(line.split(" ", 1)) if " " in line else (line, "") for line in p.stdout.splitlines()]


COMMIT_FILE = "commit.json"  # beside a cached wheel: {"commit", "subject"}


def commit_info(wheel) -> dict | None:
    """The commit a cached wheel was built from, {"commit", "subject"}: from
    COMMIT_FILE beside it, else (a wheel cached before that file) from the
    commit its directory is named by; None for a wheel from elsewhere."""
    d = Path(wheel).resolve().parent
    try:
        info = json.loads((d / COMMIT_FILE).read_text())
        if isinstance(info, dict) and info.get("commit"):
            return info
    except (OSError, ValueError):
        pass
    if re.fullmatch(r"[0-9a-f]{40}", d.name):
        return {"commit": d.name, "subject": subject_of(d.name)}
    return None


def looks_like_revision(spec: str, repo: Path | None = None) -> bool:
    """Whether ``spec``, given where a build (a wheel, 'installed', a
    llama.cpp arm) was expected, is no file but a commit of the project."""
    if spec == "installed" or spec.startswith(("llama-bench", "llama-cpp-python")) or spec.endswith(".whl") \
            or Path(spec).exists():
        return False
    try:
        commit_of(spec, repo)
    except AnvilError:
        return False
    return True


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
        with atomic_open(out / COMMIT_FILE, "w") as f:
            json.dump({"commit": sha, "subject": subject_of(sha, repo)}, f)
        final = out / wheels[0].name
        os.replace(wheels[0], final)  # the cache holds whole wheels only
    return final
