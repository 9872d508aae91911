"""Bytes a sitting's commit adds to the repository, as committed and as the
current code writes it (reports/notes/scoreboard-size.md).

    python scripts/sitting_bytes.py COMMIT [COMMIT ...]

"Adds": every blob the commit adds or changes under reports/results,
reports/index.html and reports/figures, zlib-compressed as git stores a
loose object (a pack's deltas can only make it smaller). "Now": the same
commit's new records re-encoded as harness/results.py writes records now
(compact, NVML traces rounded), and the page `harness report` renders now
from the store as it stood at that commit (one file; no figures beside it).
"""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path

from harness import nvml, results
from harness.report import build_report
from harness.report.html import render_html


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], capture_output=True, check=True).stdout


def z(data: bytes) -> int:
    return len(zlib.compress(data))


def measure(commit: str) -> dict:
    raw = git("diff-tree", "-r", "--no-commit-id", "--diff-filter=AM", "-z", "--raw", commit).decode().split("\0")
    then = {"records": 0, "index.html": 0, "figures": 0}
    now = {"records": 0, "index.html": 0}
    n = 0
    for meta, path in zip(raw[0::2], raw[1::2]):
        blob = git("cat-file", "blob", meta.split()[3])
        if path.startswith("reports/results/") and path.endswith(".json"):
            n += 1
            then["records"] += z(blob)
            rec = json.loads(blob)
            now["records"] += z((json.dumps(nvml.compact(rec), separators=(",", ":")) + "\n").encode())
        elif path == "reports/index.html":
            then["index.html"] += z(blob)
        elif path.startswith("reports/figures/"):
            then["figures"] += z(blob)
    with tempfile.TemporaryDirectory() as tmp:
        tarfile.open(fileobj=io.BytesIO(git("archive", commit, "reports/results")), mode="r").extractall(tmp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", results.ResultsWarning)
            rep = build_report(results.load_all(Path(tmp) / "reports" / "results"))
        now["index.html"] = z(render_html(dataclasses.replace(rep, records_href="results")).encode())
    return {"commit": commit, "records": n, "then": then, "now": now}


def main(commits: list[str]) -> None:
    def kb(d: dict) -> str:
        return " + ".join(f"{k} {v / 1e3:.0f}" for k, v in d.items() if v) + f" = {sum(d.values()) / 1e3:.0f} kB"

    for c in commits:
        m = measure(c)
        print(f"{c} ({m['records']} records): committed {kb(m['then'])}; now {kb(m['now'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
