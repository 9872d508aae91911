"""Runners: an engine wheel installed into its own site dir and run as a
fresh process, llama-bench output parsing (a fake binary), and the
llama-cpp-python child on the CPU build installed here."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from engine.errors import AnvilError
from harness.runners import RunnerError, RunResult, make_runner, parse_json_output, pythonpath_without
from harness.runners.engine_wheel import EngineWheelRunner, InstalledEngineRunner, check_wheel, sha256_file
from harness.runners.llamacpp import LlamaBenchRunner, LlamaCppPythonRunner, llama_bench_test_name

REPO = Path(__file__).resolve().parents[1]


# ---- check_wheel ------------------------------------------------------------

def _zip(path: Path, members: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    return path


def test_check_wheel_missing_file(tmp_path):
    with pytest.raises(AnvilError, match="wheel not found"):
        check_wheel(tmp_path / "anvil-0.1.0-py3-none-any.whl")


def test_check_wheel_not_a_zip(tmp_path):
    p = tmp_path / "anvil-0.1.0-py3-none-any.whl"
    p.write_text("not a zip at all")
    with pytest.raises(AnvilError, match="not a zip archive"):
        check_wheel(p)


def test_check_wheel_zip_without_engine(tmp_path):
    p = _zip(tmp_path / "other-1.0-py3-none-any.whl", {"other/__init__.py": "", "engine/__main__.py": ""})
    with pytest.raises(AnvilError, match=r"not an engine wheel: it lacks engine/__init__\.py"):
        check_wheel(p)


def test_check_wheel_names(tmp_path):
    members = {"engine/__init__.py": "", "engine/__main__.py": ""}
    with pytest.raises(AnvilError, match=r"must end in \.whl"):
        check_wheel(_zip(tmp_path / "anvil.zip", members))
    with pytest.raises(AnvilError, match="not a valid wheel file name"):
        check_wheel(_zip(tmp_path / "anvil.whl", members))
    with pytest.raises(AnvilError, match="not a file"):
        check_wheel(tmp_path)


def test_check_wheel_returns_sha256(tmp_path):
    p = _zip(tmp_path / "anvil-0.1.0-py3-none-any.whl", {"engine/__init__.py": "", "engine/__main__.py": "x = 1\n"})
    assert check_wheel(p) == sha256_file(p) == hashlib.sha256(p.read_bytes()).hexdigest()


# ---- a real engine wheel ------------------------------------------------------

@pytest.fixture(scope="session")
def engine_wheel(build_engine_wheel) -> Path:
    return build_engine_wheel("plain")


@pytest.fixture(scope="session")
def tiny_qwen3(model_path):
    return model_path("tiny-qwen3")


def test_engine_wheel_runs_isolated(engine_wheel, tiny_qwen3, tmp_path, monkeypatch):
    # a PYTHONPATH that puts this checkout's engine first must not leak into the child
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(tmp_path / "elsewhere")]))
    work = tmp_path / "work"
    runner = make_runner(str(engine_wheel), work, extra_args=["--backend", "numpy"])
    assert isinstance(runner, EngineWheelRunner)
    sha = sha256_file(engine_wheel)
    site, cache = work / "sites" / sha[:12], work / "kernels" / sha[:12]
    runner.prepare()
    d = runner.describe()
    assert d["kind"] == "engine-wheel" and d["sha256"] == sha and d["wheel"] == str(engine_wheel.resolve())
    assert Path(d["engine_file"]).resolve().is_relative_to(site.resolve())
    assert Path(d["cache_dir"]) == cache and cache.is_dir()
    # isolated: -I -S (no PYTHONPATH, no .pth editable finders), the wheel's site dir as the engine's root
    cmd = runner.command("info")
    assert cmd[:4] == [sys.executable, "-I", "-S", "-c"] and cmd[5] == str(site)
    assert str(REPO) not in cmd[6].split(os.pathsep)
    assert d["modules"] > 10 and d["isolation"].startswith("python -I -S")

    res = runner.run(tiny_qwen3, n_prompt=8, n_gen=4, reps=2, timeout_s=300)
    assert isinstance(res, RunResult) and res.returncode == 0 and res.wall_s > 0
    assert set(res.tests) == {"pp8", "tg4"}
    assert all(len(s) == 2 and all(v > 0 for v in s) for s in res.tests.values())
    assert len(res.tokens) == 4 and all(isinstance(t, int) for t in res.tokens)
    assert res.raw["build"] == d["build"] and res.raw["backend"] == "numpy"
    assert res.cmd[:4] == [sys.executable, "-I", "-S", "-c"] and res.cmd[7:9] == ["bench", str(tiny_qwen3)]
    assert res.cmd[-2:] == ["--backend", "numpy"]

    # a second runner on the same wheel reuses the install (no pip, same site dir)
    marker = site / ".anvil-wheel.json"
    mtime = marker.stat().st_mtime_ns
    again = EngineWheelRunner(engine_wheel, work)
    assert again.installed()
    again.prepare()
    assert marker.stat().st_mtime_ns == mtime and again.describe()["engine_file"] == d["engine_file"]


def test_installed_runner_matches_the_wheel(engine_wheel, tiny_qwen3, tmp_path):
    """The engine importable here, run the same way: same build, same tokens."""
    import engine.bench

    runner = make_runner("installed", tmp_path, extra_args=["--backend", "numpy"])
    assert isinstance(runner, InstalledEngineRunner)
    runner.prepare()
    assert runner.describe()["build"] == engine.bench.build_hash()
    res = runner.run(tiny_qwen3, n_prompt=8, n_gen=4, reps=2, timeout_s=300)
    wheel = EngineWheelRunner(engine_wheel, tmp_path, extra_args=["--backend", "numpy"])
    assert res.tokens == wheel.run(tiny_qwen3, n_prompt=8, n_gen=4, reps=2, timeout_s=300).tokens


def test_engine_failure_reports_command_and_stderr(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"definitely not a gguf file" * 10)
    runner = InstalledEngineRunner(tmp_path)
    with pytest.raises(RunnerError) as e:
        runner.run(bad, n_prompt=8, n_gen=4, reps=1, timeout_s=120)
    assert e.value.returncode == 1 and "bad.gguf" in e.value.stderr_tail
    # one line: what failed, its exit status, the child's own error, and where the whole log is
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("engine bench (installed@") and "failed (exit status 1): " in msg
    assert f"{bad}: not a GGUF file" in msg and msg.endswith(f"(full log: {e.value.log})")
    log = e.value.log.read_text()
    assert "python" in log and "-I -S" in log and "bench" in log and "not a GGUF file" in log
    with pytest.raises(AnvilError, match="model file not found"):
        runner.run(tmp_path / "nope.gguf", n_prompt=8, n_gen=4, reps=1)


# ---- llama-bench (a fake binary printing recorded output) ----------------------

def _record(n_prompt, n_gen, samples):
    return {"build_commit": "abc1234", "build_number": 6000, "cpu_info": "Intel(R) Xeon(R) Processor",
            "gpu_info": "NVIDIA H200", "backends": "CUDA", "model_filename": "m.gguf", "n_batch": 2048,
            "n_ubatch": 512, "n_threads": 16, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99,
            "flash_attn": 1, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": 0, "avg_ts": sum(samples) / len(samples),
            "stddev_ts": 1.5, "samples_ts": samples}


def _fake_llama_bench(tmp_path, stdout: str, rc: int = 0, sleep: float = 0) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "llama-bench"
    exe.write_text(f"""#!{sys.executable}
import json, sys, time
if sys.argv[1:] == ["--version"]:
    print("version: 6000 (abc1234)", file=sys.stderr)
    print("built with cc for x86_64-linux-gnu", file=sys.stderr)
    sys.exit(0)
open({str(d / 'argv.json')!r}, "w").write(json.dumps(sys.argv[1:]))
time.sleep({sleep})
print("ggml_cuda_init: found 1 CUDA devices", file=sys.stderr)
sys.stdout.write({stdout!r})
sys.exit({rc})
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_llama_bench_runner_parses_records(tmp_path):
    records = [_record(8, 0, [8188.98, 9789.6]), _record(0, 4, [276.1, 277.3])]
    exe = _fake_llama_bench(tmp_path, json.dumps(records, indent=1))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = make_runner(f"llama-bench:{exe}", tmp_path)
    assert isinstance(runner, LlamaBenchRunner)
    assert isinstance(make_runner(str(exe), tmp_path), LlamaBenchRunner)  # by its name
    runner.prepare()
    d = runner.describe()
    assert d["kind"] == "llama-bench" and d["version"] == "version: 6000 (abc1234)"
    assert d["sha256"] == sha256_file(exe) and d["settings"]["flash_attn"] == 1
    res = runner.run(model, n_prompt=8, n_gen=4, reps=2, timeout_s=60)
    assert res.tests == {"pp8": [8188.98, 9789.6], "tg4": [276.1, 277.3]} and res.tokens is None
    argv = json.loads((exe.parent / "argv.json").read_text())
    assert argv == ["-m", str(model.resolve()), "-p", "8", "-n", "4", "-r", "2", "-fa", "1", "-ngl", "99",
                    "-o", "json"]
    raw = res.raw
    assert raw["engine"] == "llama.cpp" and raw["build"] == "abc1234" and raw["gpu"] == "NVIDIA H200"
    assert raw["results"][1] == {"test": "tg4", "samples_tok_s": [276.1, 277.3],
                                 "tok_s_mean": pytest.approx(276.7), "tok_s_sd": 1.5}
    assert raw["settings"]["type_k"] == "f16" and raw["llama_bench"] == records
    assert runner.describe()["build_commit"] == "abc1234"
    assert raw["build_source"] is None  # no BUILD-SOURCE beside the binary
    runner.run(model, n_prompt=8, n_gen=0, reps=2, depth=4096, timeout_s=60)  # llama-bench's own -d
    argv = json.loads((exe.parent / "argv.json").read_text())
    assert argv[argv.index("-d") + 1] == "4096" and argv[argv.index("-p") + 1] == "8"


def test_llama_bench_build_source_beside_the_binary(tmp_path):
    """A build that cannot know its commit (a source tarball) says what it was
    built from in BUILD-SOURCE; the record and the scoreboard's build show it."""
    from harness.report import _build

    rec = dict(_record(0, 4, [276.1, 277.3]), build_commit="unknown", build_number=0)
    exe = _fake_llama_bench(tmp_path, json.dumps([rec]))
    (exe.parent / "BUILD-SOURCE").write_text("llama.cpp vendored in llama_cpp_python-0.3.36 (sdist sha256 0123abcd)\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = LlamaBenchRunner(exe)
    raw = runner.run(model, n_prompt=0, n_gen=4, reps=2, timeout_s=60).raw
    assert raw["build_source"] == "llama.cpp vendored in llama_cpp_python-0.3.36 (sdist sha256 0123abcd)"
    assert runner.describe()["build_source"] == raw["build_source"]
    assert _build(raw) == "version: 6000 (abc1234) / " + raw["build_source"]  # "unknown" dropped


def test_llama_bench_test_names():
    assert llama_bench_test_name({"n_prompt": 512, "n_gen": 0}) == "pp512"
    assert llama_bench_test_name({"n_prompt": 0, "n_gen": 128}) == "tg128"
    assert llama_bench_test_name({"n_prompt": 512, "n_gen": 128}) == "pp512+tg128"
    assert llama_bench_test_name({"n_prompt": 512, "n_gen": 0, "n_depth": 4096}) == "pp512 @ d4096"


def test_llama_bench_errors(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    exe = _fake_llama_bench(tmp_path, "main: error: failed to load model\n", rc=1)
    with pytest.raises(RunnerError, match=r"^llama-bench failed \(exit status 1\): main: error: failed to load model "
                                          r"\(full log: .*\)$") as e:
        LlamaBenchRunner(exe).run(model, n_prompt=8, n_gen=4, reps=1)
    assert e.value.cmd[0] == str(exe) and "ggml_cuda_init" in e.value.log.read_text()
    exe = _fake_llama_bench(tmp_path, "| model | size |\n| --- | --- |\n")
    with pytest.raises(RunnerError, match="not JSON"):
        LlamaBenchRunner(exe).run(model, n_prompt=8, n_gen=4, reps=1)
    exe = _fake_llama_bench(tmp_path, "[]", sleep=30)
    with pytest.raises(RunnerError, match="timed out after 1 s"):
        LlamaBenchRunner(exe).run(model, n_prompt=8, n_gen=4, reps=1, timeout_s=1)
    with pytest.raises(AnvilError, match="llama-bench not found"):
        LlamaBenchRunner(tmp_path / "nothing" / "llama-bench").prepare()


# ---- llama-cpp-python -----------------------------------------------------------

@pytest.mark.filterwarnings("ignore::FutureWarning")  # pynvml notice from engine.bench
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (scripts/llamacpp-python.sh)")
def test_llama_cpp_python_runner(tiny_qwen3, tmp_path):
    runner = make_runner("llama-cpp-python", tmp_path)
    assert isinstance(runner, LlamaCppPythonRunner)
    runner.prepare()
    assert runner.describe()["version"]
    res = runner.run(tiny_qwen3, n_prompt=8, n_gen=4, reps=2, timeout_s=300)
    assert set(res.tests) == {"pp8", "tg4"} and all(len(s) == 2 for s in res.tests.values())
    assert res.raw["engine"] == "llama.cpp" and res.raw["settings"]["flash_attn"] is True
    assert len(res.tokens) == 4
    # same start token as engine.bench, and tiny-qwen3's margins are decisive:
    # llama.cpp greedy-decodes the same tokens as the engine
    import engine
    from engine.bench import bench

    assert res.tokens == bench(engine.load(tiny_qwen3), n_prompt=0, n_gen=4, reps=1)["tokens"]
    # at depth: the same context tokens before the test, so again the same greedy tokens
    res = runner.run(tiny_qwen3, n_prompt=8, n_gen=4, reps=1, depth=24, timeout_s=300)
    assert set(res.tests) == {"pp8 @ d24", "tg4 @ d24"} and res.raw["settings"]["n_depth"] == 24
    assert res.tokens == bench(engine.load(tiny_qwen3), n_prompt=0, n_gen=4, reps=1, depth=24)["tokens"]


def test_llama_cpp_python_missing_site(tmp_path):
    with pytest.raises(AnvilError, match="no such directory"):
        make_runner(f"llama-cpp-python:{tmp_path / 'nope'}", tmp_path).prepare()
    empty = tmp_path / "empty-site"
    empty.mkdir()
    runner = LlamaCppPythonRunner(site_dir=empty)
    if importlib.util.find_spec("llama_cpp") is None:
        with pytest.raises(AnvilError, match="not importable"):
            runner.prepare()
    else:  # importable from this environment, but not from the named site dir
        with pytest.raises(RunnerError, match="not from"):
            runner.prepare()


# ---- helpers ----------------------------------------------------------------------

def test_make_runner_rejects_unknown(tmp_path):
    with pytest.raises(AnvilError, match="cannot tell what to run"):
        make_runner("something-else", tmp_path)


def test_parse_json_output_takes_last_json_line():
    assert parse_json_output('{"a": 1}', ["x"]) == {"a": 1}
    assert parse_json_output('banner\n{"a": 2}\n', ["x"]) == {"a": 2}
    with pytest.raises(RunnerError, match="not JSON"):
        parse_json_output("no json here", ["x"], "stderr line")


def test_pythonpath_without_engine(tmp_path):
    (tmp_path / "a" / "engine").mkdir(parents=True)
    (tmp_path / "a" / "engine" / "__init__.py").write_text("")
    (tmp_path / "b").mkdir()
    assert pythonpath_without("engine", [str(tmp_path / "a"), str(tmp_path / "b"), ""]) == [str(tmp_path / "b")]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # pynvml notice from engine.bench
def test_engine_bench_keeps_the_warm_up_top_logits(tiny_qwen3):
    """engine bench's record holds each decode step's top logits from the
    warm-up (harness ab judges a token difference with them): the step's
    token first, TOP_K of them, largest first, on the path the timed runs
    decode, and the model's own logits."""
    import numpy as np

    import engine
    from engine.bench import TOP_K, bench, depth_context

    m = engine.load(tiny_qwen3)
    rec = bench(m, n_prompt=0, n_gen=6, reps=1, depth=8)
    tops = rec["token_tops"]
    assert len(tops) == 6 and [t["ids"][0] for t in tops] == rec["tokens"]
    for t in tops:
        assert len(t["ids"]) == len(set(t["ids"])) == TOP_K and t["logits"] == sorted(t["logits"], reverse=True)
    # step 0 decoded again by hand after the same context
    m.reset()
    m.forward(depth_context(m.config.n_vocab, 8))
    m.decode_next(int(np.random.default_rng(0).integers(0, m.config.n_vocab)))
    logits = m.decode_logits()
    assert tops[0]["logits"] == pytest.approx([float(logits[i]) for i in tops[0]["ids"]])
    assert tops[0]["logits"][-1] == pytest.approx(float(np.sort(logits)[-TOP_K]))
