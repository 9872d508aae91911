"""Runners: one benchmark of one build, each run in a fresh process.

A runner wraps one thing under test: an engine wheel (``engine_wheel.py``),
the engine importable here (``installed``), or llama.cpp (``llamacpp.py``:
the ``llama-bench`` binary or llama-cpp-python). Every ``run()`` starts a
new process, so nothing (a warm allocator, a loaded module, a compiled
kernel held in memory) leaks from one measurement into the next, and every
runner returns the same ``RunResult``: llama-bench test names (``pp512``,
``tg128``) mapped to their per-repetition tokens/s.

    runner = make_runner("candidate.whl", workdir)
    runner.prepare()                       # one-time set-up (install, probe)
    res = runner.run(model, n_prompt=512, n_gen=128, reps=5, timeout_s=900)
    res.tests["tg128"]                     # [t/s, ...] one per repetition
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import AnvilError, first_line, write_log

STDERR_TAIL_LINES = 20
# a line of a child's output that states its error (the engine's "error: ...", a
# Python exception's last line, llama.cpp's "main: error: ...", a CUDA error)
_ERROR_LINE = re.compile(r"(^|\b)(error|fatal|abort(ed)?|\w+(Error|Exception))\b|failed|not found|no such", re.I)


def error_line(*texts: str) -> str:
    """The line of a child's output that says why it failed: the last
    error-looking line of the first text that has one (stderr, then
    stdout), else stderr's last line; a leading ``error: `` dropped (the
    harness says it once)."""
    for text in texts:
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        hits = [ln for ln in lines if _ERROR_LINE.search(ln)]
        if hits:
            return first_line(re.sub(r"^error:\s*", "", hits[-1]))
    lines = [ln.strip() for ln in (texts[0] if texts else "").splitlines() if ln.strip()]
    return first_line(lines[-1]) if lines else ""


class RunnerError(AnvilError):
    """A child process that failed, timed out or printed no usable result, as
    one line: what failed, its exit status and the child's own error line,
    and where the whole log (command, exit status, stderr, stdout) was written."""

    def __init__(self, what: str, cmd: list[str], returncode: int | None, stderr: str = "", stdout: str = ""):
        self.what, self.cmd, self.returncode = what, [str(c) for c in cmd], returncode
        self.stderr_tail = "\n".join(stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        self.log = write_log(what.split(":")[0], f"{what}\ncommand: {shlex.join(self.cmd)}\nexit status: {returncode}\n"
                                                  f"\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}\n")
        msg = what + (f" (exit status {returncode})" if returncode and returncode > 0 else "")
        said = error_line(stderr, stdout) if returncode else ""  # a child that exited 0 said no error
        if said and said not in what:
            msg += f": {said}"
        if self.log:
            msg += f" (full log: {self.log})"
        super().__init__(msg)


@dataclass
class RunResult:
    tests: dict[str, list[float]]  # "pp512" -> tokens/s of each repetition (warm-up excluded)
    tokens: list[int] | None  # greedy tokens of the tg test, when the runner produces them
    raw: dict  # the child's parsed output (its whole result record)
    wall_s: float  # the child process, start to exit (load + warm-up included)
    cmd: list[str]
    returncode: int

    def mean(self, test: str) -> float:
        s = self.tests[test]
        return sum(s) / len(s)

    def to_dict(self) -> dict:
        return asdict(self)


class Runner:
    """One build under test. Subclasses set ``kind`` and implement the three methods."""

    kind = "runner"
    label = ""

    def describe(self) -> dict:
        """What is measured: kind, label and identity (wheel path + sha256,
        binary path + version, engine file + build hash)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """One-time set-up before the first run (install, probe); idempotent."""

    def run(self, model_path, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, depth: int = 0,
            timeout_s: float = 1800) -> RunResult:
        """pp/tg tests (llama-bench's semantics), each after ``depth`` context tokens."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


def check_model(model_path) -> Path:
    p = Path(model_path)
    if not p.is_file():
        raise AnvilError(f"{p}: model file not found")
    return p.resolve()


def run_process(cmd: list, *, env: dict | None = None, cwd=None, timeout_s: float | None = None,
                what: str = "benchmark") -> tuple[str, str, float]:
    """Run ``cmd`` to completion; (stdout, stderr, wall seconds). A non-zero
    exit or a timeout raises RunnerError. The child leads its own process
    group, so a timeout, Ctrl-C or any other exception here kills whatever
    it started too (and nothing else), and waits for it: no benchmark is
    left running on the GPU after the harness is gone."""
    cmd = [str(c) for c in cmd]
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=cwd, start_new_session=True)
    except OSError as e:
        raise RunnerError(f"{what}: cannot start {cmd[0]}: {e.strerror or e}", cmd, None) from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise RunnerError(f"{what}: timed out after {timeout_s:g} s (killed)", cmd, proc.returncode, err, out) from None
    except BaseException:  # Ctrl-C (or SIGTERM turned into one): the child goes with us
        kill_group(proc)
        proc.communicate()
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RunnerError(f"{what} failed", cmd, proc.returncode, err, out)
    return out, err, wall


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (it and all it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def parse_json_output(stdout: str, cmd: list, stderr: str = "", what: str = "benchmark"):
    """The JSON a child printed: all of stdout, else its last line that parses
    (a library may print a banner first)."""
    try:
        return json.loads(stdout)
    except ValueError:
        pass
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except ValueError:
                break
    head = stdout.strip()[:200] or "(nothing)"
    raise RunnerError(f"{what}: the output is not JSON: {head!r}", cmd, 0, stderr, stdout)


def tests_from_results(raw: dict, cmd: list, stderr: str = "") -> dict[str, list[float]]:
    """{test: samples} from a record's ``results`` list (the engine's shape)."""
    try:
        tests = {r["test"]: [float(x) for x in r["samples_tok_s"]] for r in raw["results"]}
    except (KeyError, TypeError, ValueError) as e:
        raise RunnerError(f"result record lacks results[].test/samples_tok_s ({type(e).__name__}: {e})",
                          cmd, 0, stderr) from None
    if not tests:
        raise RunnerError("result record has no tests", cmd, 0, stderr)
    return tests


def pythonpath_without(package: str, entries: list[str]) -> list[str]:
    """``entries`` minus those that hold ``package`` (a directory with its
    ``__init__.py``): an inherited PYTHONPATH pointing at a checkout must not
    put a second engine in front of, or behind, the one under test."""
    return [e for e in entries if e and not (Path(e) / package / "__init__.py").exists()]


def inherited_pythonpath() -> list[str]:
    return [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]


def make_runner(spec: str, workdir, **options) -> Runner:
    """A runner from a command-line spec:

    - ``path/to/x.whl``: an engine wheel, installed into its own site dir
    - ``installed``: the engine importable in this interpreter
    - ``llama-bench:/path/to/llama-bench``, or a path named ``llama-bench``
    - ``llama-cpp-python`` or ``llama-cpp-python:/site/dir`` (llama_cpp found there)

    ``options`` go to the runner's constructor (``label``, ``extra_args``, ...).
    """
    from .engine_wheel import EngineWheelRunner, InstalledEngineRunner
    from .llamacpp import LlamaBenchRunner, LlamaCppPythonRunner

    workdir = Path(workdir)
    if spec == "installed":
        return InstalledEngineRunner(workdir, **options)
    if spec == "llama-cpp-python" or spec.startswith("llama-cpp-python:"):
        site = spec.partition(":")[2] or None
        return LlamaCppPythonRunner(site_dir=site, workdir=workdir, **options)
    if spec.startswith("llama-bench:"):
        return LlamaBenchRunner(spec.partition(":")[2], **options)
    if Path(spec).name == "llama-bench":
        return LlamaBenchRunner(spec, **options)
    if spec.endswith(".whl"):
        return EngineWheelRunner(spec, workdir, **options)
    raise AnvilError(f"cannot tell what to run from {spec!r}: expected an engine wheel (*.whl), 'installed', "
                     f"'llama-bench:/path/to/llama-bench' (or a path named llama-bench), "
                     f"or 'llama-cpp-python[:/site/dir]'")


__all__ = ["Runner", "RunResult", "RunnerError", "make_runner", "run_process", "parse_json_output",
           "tests_from_results", "check_model", "pythonpath_without"]
