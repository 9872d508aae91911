"""The harness finds its project (catalog, references, results store) from
--project, $ANVIL_PROJECT or the directory it runs in, not from where the
package is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def harness(*args, cwd, project=None):
    env = {k: v for k, v in os.environ.items() if k != "ANVIL_PROJECT"}
    if project is not None:
        env["ANVIL_PROJECT"] = str(project)
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_project_is_found_from_the_directory_or_named(tmp_path):
    proj = tmp_path / "proj"
    shutil.copytree(REPO / "references", proj / "references", ignore=shutil.ignore_patterns("cpu", "gpu", "twin",
                                                                                             "oracle"))
    (proj / "reports" / "results").mkdir(parents=True)
    (proj / "sub" / "dir").mkdir(parents=True)
    # from a directory inside the project: its (empty) results store, not the checkout's
    r = harness("report", "--format", "md", cwd=proj / "sub" / "dir")
    assert r.returncode == 0 and "From 0 result records" in r.stdout, r.stderr
    # named, from anywhere; and an empty directory named is refused in one line
    r = harness("--project", str(proj), "report", "--format", "md", cwd=tmp_path)
    assert r.returncode == 0 and "From 0 result records" in r.stdout, r.stderr
    (tmp_path / "empty").mkdir()
    r = harness("models", cwd=tmp_path, project=tmp_path / "empty")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'empty' / 'references' / 'catalog.toml'}: no catalog here: run harness inside an "
        "Anvil checkout, or name one with --project DIR or ANVIL_PROJECT")
