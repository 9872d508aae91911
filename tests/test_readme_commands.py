"""Every command line of README.md's "Using it" block, pasted on this machine,
under an 8 GB address-space cap: none crashes (a traceback, a signal), none
outgrows the cap, none hangs, and one that cannot run here (no GPU, a
placeholder path, no network) says so in one line.

The lines are read from the README, so a new one must be placed in PLAN
(how it runs here) before this test passes. Each runs as on a machine
without a GPU (CUDA_VISIBLE_DEVICES empty: a CUDA process reserves more
address space than the cap). Catalog-wide runs (every model, every mutant,
every reference set) take one CPU model here, and benchmarks short tests:
the same command and code path, minutes shorter (tests/test_parity_cpu.py
and tests/test_mutants.py run the catalog). MODEL.gguf is tiny-qwen3.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CAP = 8 << 30  # RLIMIT_AS of every command: what a small CPU machine has, and far below qwen3-8b's 33 GB in float32
TIMEOUT_S = 300

ONE = ["--model", "tiny-llama"]
QUICK = ["-p", "32", "-n", "8", "-r", "1"]  # short tests: the same processes, models and memory
# README line (its command, comments dropped) -> (extra arguments, what it may do here):
#   "runs": exit 0, or 1 for a verdict (a mutant missed, an op that departs) with no error line;
#   "refuses": exit != 0, the last line one error; "either": one or the other (it depends on the
#   checkout: HEAD~1 and HEAD may be one engine build, a shallow clone lacks HEAD~3);
#   a string instead: not run, and why.
PLAN = {
    "harness validate-catalog": (ONE, "runs"),
    "harness mutants": (ONE + ["--mutant", "rope-base"], "runs"),
    'harness diff gemma3-270m --prompt "..."': ([], "runs"),
    "harness ab --rounds 8 base.whl candidate.whl --model qwen3-8b": ([], "refuses"),  # placeholder wheels
    "harness ab --aa base.whl --save": ([], "refuses"),  # a placeholder wheel
    "harness ab --commits HEAD~1 HEAD": (["--rounds", "4", *QUICK], "either"),
    "harness bisect GOOD BAD --test tg128": ([], "refuses"),  # placeholder revisions
    "harness wheel HEAD~3": ([], "either"),
    "harness bench --llamacpp llama-bench:/path/to/llama-bench": ([], "refuses"),  # a placeholder path
    "harness bench -d 0,4096 -o csv": (QUICK, "runs"),
    "harness report": ([], "runs"),
    "harness roofline --save": ([], "refuses"),  # measures a GPU, and none is here
    "harness doctor": ([], "runs"),
    "harness models": ([], "either"),  # with no network, a model not yet cached is one error line
    "harness synth --preset qwen3-8b q8b.gguf": "writes 5 GB; the next line runs the same command",
    "harness synth --preset tiny-gemma3 t.gguf --margin": ([], "runs"),
    "harness reference --tier cpu": (ONE, "either"),  # without llama-cpp-python: one line saying how to get it
    "harness reference --variation": "70 s a model on two cores; tests/test_validate.py runs it on tiny-llama-f32",
    "harness reference --variation --faithful": (["--model", "tiny-llama-f32"], "runs"),
    'python -m engine generate MODEL.gguf --prompt "The capital of France is" -n 32': ([], "runs"),
    "python -m engine bench MODEL.gguf": (["-r", "1"], "runs"),
    "python -m engine launches MODEL.gguf": ([], "runs"),
    "python -m engine launches MODEL.gguf --resources": ([], "runs"),
}
MODEL = "tiny-qwen3"  # MODEL.gguf
# lines that write into the project (references, the scoreboard) run in a copy of it
WRITES_PROJECT = ("harness report", "harness reference", "harness roofline", "harness ab --aa")


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = []
    for line in block.splitlines():
        cmd = line.split("  #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if cmd:
            lines.append(cmd)
    return lines


def test_every_readme_line_is_planned():
    assert sorted(readme_commands()) == sorted(PLAN), "place each README line in PLAN: how it runs here"


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory):
    """The project's catalog and references, and a few of its records (the
    scoreboard of all of them is tests/test_report.py's, and takes minutes)."""
    d = tmp_path_factory.mktemp("project")
    shutil.copytree(REPO / "references", d / "references")
    (d / "reports" / "results").mkdir(parents=True)
    for kind in ("bench", "validate", "ab"):
        for f in sorted((REPO / "reports" / "results").glob(f"{kind}-*.json"))[-6:]:
            shutil.copy(f, d / "reports" / "results")
    return d


@pytest.mark.parametrize("line", list(PLAN))
def test_readme_line_runs_under_a_memory_cap(line, tmp_path, project_copy, model_path):
    if isinstance(PLAN[line], str):
        pytest.skip(PLAN[line])
    extra, expect = PLAN[line]
    model = model_path(MODEL)  # fetched or generated beforehand: not this test's subject
    model_path("tiny-llama")
    argv = [a.replace("MODEL.gguf", str(model)) for a in shlex.split(line)] + extra
    if argv[0] == "harness":
        argv = [sys.executable, "-m", "harness.cli", *argv[1:]]
    elif argv[:3] == ["python", "-m", "engine"]:
        argv = [sys.executable, *argv[1:]]
    env = {**os.environ, "ANVIL_LOG_DIR": str(tmp_path / "logs"), "ANVIL_WHEELS_DIR": str(tmp_path / "wheels"),
           "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    env["ANVIL_PROJECT"] = str(project_copy if line.startswith(WRITES_PROJECT) else REPO)
    work = tmp_path / "cwd"
    work.mkdir()
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S,
                       stdin=subprocess.DEVNULL, preexec_fn=_cap)
    said = f"{line!r}: exit {r.returncode} in {time.monotonic() - t0:.0f} s\n{r.stderr[-3000:]}"
    assert r.returncode >= 0, said  # not killed by a signal
    assert "Traceback" not in r.stderr + r.stdout and "internal error" not in r.stderr, said
    assert "MemoryError" not in r.stderr and "out of memory" not in r.stderr, said
    last = (r.stderr.strip().splitlines() or [""])[-1]
    refused = r.returncode != 0 and last.startswith("error: ")
    if expect == "refuses":
        assert refused, said
    elif expect == "runs":
        assert r.returncode in (0, 1) and not refused, said
    else:
        assert r.returncode in (0, 1) and (refused or not last.startswith("error: ")), said
