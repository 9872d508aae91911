"""harness ab measures exactly the two wheels, and Ctrl-C leaves nothing behind.

- A wheel that lacks an engine module is refused, naming the module, even
  though this checkout is installed in editable mode (its ``.pth`` finder
  would serve the missing module from the checkout).
- Two wheels of one engine build (same sources, different wheel files) are
  refused unless --allow-same.
- A restructured engine (its modules renamed) is still measured: the
  harness asks the build about itself only through ``python -m engine``.
- SIGINT to a running ``harness ab`` / ``harness bench`` kills the benchmark
  child, says how many rounds were saved, and leaves no temp files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from engine.errors import AnvilError
from harness import ab

# ---- real wheels of this checkout, edited ------------------------------------------


def _drop_generate(src: Path) -> None:
    (src / "engine" / "generate.py").unlink()


def _touch_outside_engine(src: Path) -> None:
    # the wheel file changes (README is its long description), the engine's sources do not
    (src / "README.md").write_text((src / "README.md").read_text() + "\n<!-- another wheel, same engine -->\n")


def _rename_bench(src: Path) -> None:
    """A restructured engine: engine/bench.py becomes engine/perf/timing.py."""
    pkg = src / "engine"
    (pkg / "perf").mkdir()
    (pkg / "perf" / "__init__.py").write_text("")
    (pkg / "bench.py").rename(pkg / "perf" / "timing.py")
    timing = pkg / "perf" / "timing.py"
    # its own relative imports now go one package up, and build_hash hashes the whole engine
    timing.write_text(timing.read_text().replace("from .", "from ..")
                      .replace("Path(__file__).resolve().parent", "Path(__file__).resolve().parents[1]"))
    for p in pkg.rglob("*.py"):
        t = p.read_text()
        t2 = t.replace("from .bench import", "from .perf.timing import").replace('"engine.bench"', '"engine.perf.timing"')
        if t2 != t:
            p.write_text(t2)


def test_a_wheel_missing_a_module_is_refused_by_name(build_engine_wheel, tmp_path):
    import engine

    # the situation the check exists for: this checkout is importable through an editable finder
    assert Path(engine.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]
    plain, broken = build_engine_wheel("plain"), build_engine_wheel("no-generate", _drop_generate)
    with zipfile.ZipFile(broken) as z:
        assert "engine/generate.py" not in z.namelist()
    with pytest.raises(AnvilError, match=r"lacks module engine\.generate"):
        ab.prepare_arms(str(plain), str(broken), tmp_path / "work")


def test_two_wheels_of_one_build_are_refused(build_engine_wheel, tmp_path):
    a, b = build_engine_wheel("plain"), build_engine_wheel("readme", _touch_outside_engine)
    assert hashlib.sha256(a.read_bytes()).digest() != hashlib.sha256(b.read_bytes()).digest()
    with pytest.raises(AnvilError, match="same build \\(engine build"):
        ab.prepare_arms(str(a), str(b), tmp_path / "work")
    arms = ab.prepare_arms(str(a), str(b), tmp_path / "work", allow_same=True)
    assert arms["A"].describe()["build"] == arms["B"].describe()["build"]


def test_a_restructured_engine_is_measured(build_engine_wheel, model_path, tmp_path):
    base, moved = build_engine_wheel("plain"), build_engine_wheel("restructured", _rename_bench)
    with zipfile.ZipFile(moved) as z:
        assert "engine/bench.py" not in z.namelist() and "engine/perf/timing.py" in z.namelist()
    cfg = ab.ABConfig(model=model_path("tiny-qwen3"), n_prompt=8, n_gen=4, reps=1, rounds=2)
    rec = ab.run_ab(str(base), str(moved), cfg, tmp_path / "work", results_dir=tmp_path / "res")
    assert rec["complete"] and rec["tokens_identical"] is True
    assert rec["arms"]["A"]["build"] != rec["arms"]["B"]["build"]


# ---- a fake engine that can hang on demand: Ctrl-C ---------------------------------

_FAKE_INIT = "BUILD = {build!r}\n"
_FAKE_MAIN = r'''
import json, os, sys, time
import engine
cmd = sys.argv[1]
if cmd == "info":
    print(json.dumps({"engine_file": engine.__file__, "build": engine.BUILD, "version": "0",
                      "cache_dir": os.environ["ANVIL_CACHE_DIR"], "python": "3",
                      "modules": {"engine": engine.__file__, "engine.__main__": __file__}}))
    sys.exit(0)
runs = os.environ["FAKE_RUNS_DIR"]
n = len(os.listdir(runs))
open(os.path.join(runs, f"{n:03d}-{os.getpid()}"), "w").close()
if n >= int(os.environ["FAKE_HANG_AT"]):
    time.sleep(600)  # a benchmark that is still running when Ctrl-C comes
print(json.dumps({"build": engine.BUILD, "tokens": [1, 2],
                  "results": [{"test": "tg4", "samples_tok_s": [100.0 + n], "tok_s_mean": 100.0 + n}]}))
'''


def _fake_wheel(dest: Path, build: str, main: str = _FAKE_MAIN) -> Path:
    """A minimal installable wheel of a fake ``engine`` package."""
    files = {"engine/__init__.py": _FAKE_INIT.format(build=build), "engine/__main__.py": main,
             "fake_engine-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: fake-engine\nVersion: 0.1\n",
             "fake_engine-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files["fake_engine-0.1.dist-info/RECORD"] = "\n".join(record + ["fake_engine-0.1.dist-info/RECORD,,"]) + "\n"
    path = dest / "fake_engine-0.1-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupt(args: list[str], tmp_path: Path, hang_at: int) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``harness ARGS`` until the benchmark child number ``hang_at`` hangs,
    then SIGINT the harness; (its result, the directory of run stamps)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "ANVIL_MODELS_DIR": str(tmp_path / "models"), "FAKE_RUNS_DIR": str(runs),
           "FAKE_HANG_AT": str(hang_at)}
    # started as from a shell, with SIGINT at its default: a test runner's worker
    # process may ignore it (pytest-xdist's do), and an ignored signal stays
    # ignored in the child, which would then never see the Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while len(os.listdir(runs)) <= hang_at and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    assert len(os.listdir(runs)) == hang_at + 1, "the hanging run never started"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), runs


def _leftovers(tmp_path: Path) -> list[str]:
    return [str(p) for p in tmp_path.rglob("*") if p.name.startswith(".") and ("tmp" in p.name or "fetch" in p.name)]


@pytest.mark.parametrize("hang_at,measured", [(0, 0), (4, 1)])
def test_ctrl_c_during_ab_kills_the_child_and_says_what_was_saved(tmp_path, hang_at, measured):
    a, b = _fake_wheel(tmp_path / "a", "fake-a"), _fake_wheel(tmp_path / "b", "fake-b")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read by the fake engine")
    res = tmp_path / "results"
    r, runs = _interrupt(["ab", str(a), str(b), "--model", str(model), "--rounds", "4", "-p", "0", "-n", "4",
                          "-r", "1", "--results-dir", str(res)], tmp_path, hang_at)
    assert r.returncode == 130, r.stderr
    assert "Traceback" not in r.stderr
    pids = [int(p.name.split("-")[1]) for p in sorted(runs.iterdir())]
    assert not any(_alive(p) for p in pids), "a benchmark child outlived the harness"
    saved = sorted(res.glob("*.json")) if res.exists() else []
    if measured:
        assert f"interrupted: 1 measured round saved in {saved[0]}" in r.stderr and len(saved) == 1
        rec = json.loads(saved[0].read_text())
        assert not rec["complete"] and len(rec["rounds"]) == 2 and "KeyboardInterrupt" in rec["interrupted"]
    else:
        assert "interrupted: no round was measured, nothing saved" in r.stderr and not saved
    assert not _leftovers(tmp_path)


def test_ctrl_c_during_bench_kills_the_child(tmp_path):
    a = _fake_wheel(tmp_path / "a", "fake-a")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    r, runs = _interrupt(["bench", "--engine", str(a), "--model", str(model), "-p", "0", "-n", "4", "-r", "1",
                          "--results-dir", str(tmp_path / "results")], tmp_path, 0)
    assert r.returncode == 130 and "interrupted" in r.stderr and "Traceback" not in r.stderr
    assert not any(_alive(int(p.name.split("-")[1])) for p in runs.iterdir())
    assert not (tmp_path / "results").exists() and not _leftovers(tmp_path)


# ---- a build from before `python -m engine info` ----------------------------------

# The command line engines had before `info` (2026-11-30): generate and bench only.
_OLD_MAIN = r'''
import argparse, json
import engine
p = argparse.ArgumentParser(prog="python -m engine")
sub = p.add_subparsers(dest="command", required=True)
sub.add_parser("generate")
b = sub.add_parser("bench")
b.add_argument("model")
for flag in ("-p", "-n", "-r"):
    b.add_argument(flag, type=int)
b.add_argument("--json", action="store_true")
args = p.parse_args()
if engine.BUILD == "crash":
    raise SystemExit("this build cannot run")
print(json.dumps({"build": engine.BUILD, "backend": "numpy", "tokens": [1, 2],
                  "results": [{"test": f"tg{args.n}", "samples_tok_s": [100.0] * args.r, "tok_s_mean": 100.0}]}))
'''


def _old_ab(tmp_path, a: Path, b: Path, monkeypatch, **kw) -> dict:
    monkeypatch.setenv("FAKE_RUNS_DIR", str(tmp_path / "runs"))  # the newer fake's stamps (it never hangs here)
    monkeypatch.setenv("FAKE_HANG_AT", "1000")
    (tmp_path / "runs").mkdir(exist_ok=True)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read by the fake engines")
    cfg = ab.ABConfig(model=model, n_prompt=0, n_gen=4, reps=1, rounds=4, **kw)
    return ab.run_ab(str(a), str(b), cfg, tmp_path / "work", results_dir=tmp_path / "res")


def test_a_build_without_info_is_probed_by_its_bench_record(tmp_path, monkeypatch):
    """An old build is measured as a base: the probe falls back to the
    build's own bench record for its build hash, and the record names it."""
    old = _fake_wheel(tmp_path / "old", "fake-old", _OLD_MAIN)
    new = _fake_wheel(tmp_path / "new", "fake-new")
    arms = ab.prepare_arms(str(old), str(new), tmp_path / "work")
    assert arms["A"].describe()["build"] is None and "no `python -m engine info`" in arms["A"].describe()["probe"]
    rec = _old_ab(tmp_path, old, new, monkeypatch)
    assert rec["complete"] and rec["builds"] == {"A": "fake-old", "B": "fake-new"}
    assert rec["arms"]["A"]["build"] == "fake-old" and rec["arms"]["B"]["probe"] == "info --json"
    assert set(rec["analysis"]) == {"tg4"}


def test_two_copies_of_one_old_build_are_refused_once_it_names_itself(tmp_path, monkeypatch):
    a = _fake_wheel(tmp_path / "a", "fake-old", _OLD_MAIN)
    b = _fake_wheel(tmp_path / "b", "fake-old", _OLD_MAIN + "\n# another wheel file, the same build\n")
    with pytest.raises(AnvilError, match="same build \\(engine build fake-old"):
        _old_ab(tmp_path, a, b, monkeypatch)


def test_a_failed_probe_shows_the_command_not_the_bootstrap_source(tmp_path):
    broken = _fake_wheel(tmp_path / "broken", "crash", _OLD_MAIN.replace('sub.add_parser("generate")', "1 / 0"))
    with pytest.raises(AnvilError) as e:
        ab.prepare_arms(str(broken), str(broken), tmp_path / "work", allow_same=True)
    said = str(e.value)  # one line: the child's own error and where its whole output went
    assert "ZeroDivisionError: division by zero (full log: " in said and "\n" not in said and "sys.path[:]" not in said
    assert "sys.path[:]" in e.value.log.read_text()  # the command, bootstrap and all, is in the log


def test_an_arm_from_the_wheel_cache_is_named_by_its_commit_and_subject(tmp_path):
    from harness import wheels
    from harness.runners.engine_wheel import EngineWheelRunner

    sha = "0123456789abcdef" * 2 + "01234567"
    wheel = _fake_wheel(tmp_path / "wheels" / sha, "fake-a")
    (wheel.parent / wheels.COMMIT_FILE).write_text(json.dumps({"commit": sha, "subject": "Decode GEMVs fed by "
                                                                                           "bulk copies"}))
    d = EngineWheelRunner(wheel, tmp_path / "work").describe()
    assert d["label"] == "0123456789 Decode GEMVs fed by bulk copies" and (d["commit"], d["subject"]) == (
        sha, "Decode GEMVs fed by bulk copies")
    # a wheel cached before the commit file: its directory names the commit, git its subject
    head = wheels.commit_of("HEAD")
    older = _fake_wheel(tmp_path / "wheels" / head, "fake-b")
    assert EngineWheelRunner(older, tmp_path / "work").label == f"{head[:10]} {wheels.subject_of(head)[:60]}".rstrip()
    # a wheel from anywhere else: its file name and hash, as before
    elsewhere = _fake_wheel(tmp_path / "x", "fake-c")
    assert EngineWheelRunner(elsewhere, tmp_path / "work").label.startswith("fake_engine-0.1@")
