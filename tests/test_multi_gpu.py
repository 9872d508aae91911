"""--gpus and --ray (harness/pool.py, harness/distribute.py) on a machine
without a GPU: workers pinned to "GPUs" that NVML (faked) reports, running
fake units or the NumPy engine; a worker that dies, Ctrl-C, two workers
asking for one model; and --ray on a local Ray instance (skipped only where
Ray cannot be imported)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import pool

ROOT = Path(__file__).resolve().parents[1]
FAKE_GPUS = ["Fake GPU A", "Fake GPU B"]


# ---- units a worker runs (module level: a spawned worker imports them by name) -------------------

def where_am_i(name: str, log: str | None = None) -> dict:
    if log:
        with open(log, "a") as f:
            f.write(f"{name}\n")
    time.sleep(0.3)
    return {"name": name, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "order": os.environ.get("CUDA_DEVICE_ORDER"), "pid": os.getpid()}


def dies(code: int) -> None:
    print("loading the model... CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
    if code < 0:
        os.kill(os.getpid(), -code)
    os._exit(code)


def raises() -> None:
    from engine.errors import AnvilError

    raise AnvilError("tiny-x: no such reference\nsecond line: the one that counts")


def sleeper(tag_dir: str) -> None:
    """Write this worker's pid, start a benchmark-like child (its own process
    group, as runners start them) that writes its pid, and wait for ever."""
    from harness.runners import run_process

    Path(tag_dir, f"worker-{os.getpid()}").touch()
    run_process([sys.executable, "-c", "import os, sys, time; open(os.path.join(sys.argv[1], f'child-{os.getpid()}'), "
                 "'w').close(); time.sleep(600)", tag_dir])


def model_unit(name: str) -> str:
    from harness import catalog

    return str(catalog.model_path(name))


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """NVML reports two GPUs here (only the parent asks it); the workers' logs go to tmp_path."""
    from harness import nvml
    from harness.commands import common

    monkeypatch.setattr(nvml, "devices", lambda: (list(FAKE_GPUS), ""))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path / "work")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ---- which GPUs ---------------------------------------------------------------------------------

def test_gpus_names_all_or_indices_and_says_in_one_line_where_there_is_none(monkeypatch, capsys):
    import argparse

    from harness import cli, nvml

    assert pool.gpu_list("all") == "all" and pool.gpu_list("0,3") == "0,3"
    for bad in ("0,x", "1,1", "", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="'all' or distinct GPU indices"):
            pool.gpu_list(bad)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "devices", lambda: (["H200"] * 4, ""))
    assert pool.resolve_gpus("all") == [0, 1, 2, 3] and pool.resolve_gpus("3,1") == [3, 1]
    with pytest.raises(pool.AnvilError, match=r"--gpus 1,4: no GPU 4 here \(NVML reports 4: 0 H200, 1 H200"):
        pool.resolve_gpus("1,4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # "all" of what this process may see
    assert pool.resolve_gpus("all") == [2, 3]
    monkeypatch.setattr(nvml, "devices", lambda: ([], "NVML unavailable: NVMLError_LibraryNotFound"))
    for command in (["validate-catalog", "--backend", "numpy", "--model", "tiny-llama"], ["mutants", "--backend",
                    "numpy", "--mutant", "rope-base"], ["bench", "--model", "tiny-llama"]):
        assert cli.main([*command, "--gpus", "all"]) == 1
        err = capsys.readouterr().err
        assert err == "error: --gpus all: no NVIDIA GPU here (NVML unavailable: NVMLError_LibraryNotFound)\n"


def test_ray_without_ray_names_the_extra(monkeypatch, capsys):
    from harness import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert cli.main(["validate-catalog", "--backend", "numpy", "--model", "tiny-llama", "--ray", "auto"]) == 1
    assert capsys.readouterr().err == ('error: --ray needs Ray, which is not installed here: '
                                       'pip install ".[cluster]"\n')


def test_nothing_imports_ray_without_ray():
    code = ("import sys\nfrom harness import cli, distribute, mutants, pool, validate\n"
            "from harness.commands import bench, validate as v\n"
            "cli.build_parser().parse_args(['validate-catalog', '--gpus', 'all'])\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr


def test_models_are_sized_from_their_file_or_the_catalog(tmp_path, monkeypatch):
    from harness import catalog

    cat = catalog.load()
    on_disk = catalog.approx_bytes(cat["tiny-llama"])
    monkeypatch.setenv("ANVIL_MODELS_DIR", str(tmp_path))  # no file there: the preset's tensors
    estimate = catalog.approx_bytes(cat["tiny-llama"])
    assert on_disk > 0 and abs(estimate - on_disk) < 0.1 * on_disk  # the tokenizer in the header not counted
    assert catalog.approx_bytes(cat["qwen3-8b"]) == pytest.approx(5.02e9, rel=0.02)  # its file: 5.02 GB
    assert catalog.approx_bytes(cat["gemma3-270m"]) == pytest.approx(242e6, rel=0.05)  # the stated download
    units = [pool.Unit(n, where_am_i, size=catalog.approx_bytes(cat[n])) for n in ("tiny-llama", "qwen3-8b",
                                                                                    "gemma3-270m", "qwen36-27b")]
    assert [units[i].name for i in pool.largest_first(units)] == ["qwen36-27b", "qwen3-8b", "gemma3-270m",
                                                                   "tiny-llama"]


# ---- one worker per GPU -------------------------------------------------------------------------

def test_a_worker_per_gpu_pinned_largest_first_results_in_the_order_given(tmp_path):
    started = tmp_path / "started"
    units = [pool.Unit(f"m{i}", where_am_i, (f"m{i}", str(started)), size=s) for i, s in enumerate((1, 5, 3, 9))]
    seen = []
    outs = pool.run_local(units, [3, 5], tmp_path / "logs", progress=lambda o, done, total: seen.append(
        (o.unit.name, done, total)))
    assert [o.unit.name for o in outs] == ["m0", "m1", "m2", "m3"] and not any(o.error for o in outs)
    for o in outs:  # pinned, CUDA's device order NVML's
        assert (o.result["visible"], o.result["order"], o.host) == (str(o.gpu), "PCI_BUS_ID", os.uname().nodename)
    assert {o.gpu for o in outs} == {3, 5}
    assert len({o.result["pid"] for o in outs}) == 2  # a worker per GPU, kept between its units
    assert set(started.read_text().split()[:2]) == {"m3", "m1"}  # the two largest first
    assert [d for _, d, _ in seen] == [1, 2, 3, 4] and {t for *_, t in seen} == {4}


def test_a_dying_worker_is_reported_for_its_unit_and_the_others_finish(tmp_path):
    units = [pool.Unit("a", where_am_i, ("a",), size=1), pool.Unit("crash", dies, (3,), size=9),
             pool.Unit("killed", dies, (-signal.SIGKILL,), size=8), pool.Unit("raises", raises, size=7),
             pool.Unit("b", where_am_i, ("b",), size=2), pool.Unit("c", where_am_i, ("c",), size=0)]
    outs = {o.unit.name: o for o in pool.run_local(units, [0, 1], tmp_path / "logs")}
    assert all(outs[n].error is None and outs[n].result["name"] == n for n in "abc")
    crash = outs["crash"].error
    assert crash.startswith(f"the worker on GPU {outs['crash'].gpu} died (exit status 3): loading the model... "
                            f"CUDA error: an illegal memory access was encountered (log: ")
    assert f"died (killed by SIGKILL): " in outs["killed"].error and outs["killed"].result is None
    # a unit that raised: its own last line; its worker lives on
    assert outs["raises"].error == f"on GPU {outs['raises'].gpu}: second line: the one that counts"
    assert (tmp_path / "logs" / "gpu0.log").exists() and (tmp_path / "logs" / "gpu1.log").exists()


def test_ctrl_c_stops_every_worker_and_their_children_and_exits_130(tmp_path):
    tags = tmp_path / "tags"
    tags.mkdir()
    script = (f"import sys; sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT)!r}]\n"
              "from pathlib import Path\n"
              "from engine.errors import run_command\n"
              "from harness import pool\n"
              "from test_multi_gpu import sleeper\n"
              "units = [pool.Unit(f'u{i}', sleeper, (sys.argv[1],)) for i in range(3)]\n"
              "sys.exit(run_command(lambda a: pool.run_local(units, [0, 1], Path(sys.argv[2])), None))\n")
    p = subprocess.Popen([sys.executable, "-c", script, str(tags), str(tmp_path / "logs")], stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while len(list(tags.glob("child-*"))) < 2 and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(tags.glob("child-*"))) == 2, f"the workers did not start: {p.poll()} {p.stderr.read()}"
    pids = [int(f.name.split("-")[1]) for f in tags.iterdir()]
    p.send_signal(signal.SIGINT)
    try:
        err = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    # multiprocessing's resource tracker (its own process) may warn after the command's last line,
    # about the semaphores of the workers the command killed
    ours = [x for x in err.strip().splitlines() if "resource_tracker" not in x and "leaked semaphore" not in x]
    assert p.returncode == 130 and ours[-1] == "interrupted", err
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "a worker or its benchmark child outlived Ctrl-C"
    assert len(list(tags.glob("worker-*"))) == 2  # the third unit never started


def test_two_workers_asking_for_one_model_generate_it_once(tmp_path, monkeypatch, model_path):
    """Two workers want tiny-llama, which the model cache does not have: one
    writes it under <file>.lock, the other waits, then finds it written."""
    import fcntl

    from harness import catalog, fetch

    real = model_path("smollm2-135m")  # the tokenizer tiny-llama borrows, from the real cache
    models = tmp_path / "models"
    (models / "smollm2-135m").mkdir(parents=True)
    (models / "smollm2-135m" / real.name).symlink_to(real)
    monkeypatch.setenv("ANVIL_MODELS_DIR", str(models))  # the workers take this environment with them
    fetch.write_stamp(models / "smollm2-135m" / real.name, catalog.entry("smollm2-135m").sha256)
    target = catalog.synth_path(catalog.entry("tiny-llama"))
    target.parent.mkdir(parents=True)
    logs = tmp_path / "logs"
    units = [pool.Unit(f"w{i}", model_unit, ("tiny-llama",)) for i in range(2)]
    got = {}
    with open(target.with_name(target.name + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # both workers start while the model is "being written"
        t = threading.Thread(target=lambda: got.update(outs=pool.run_local(units, [0, 1], logs)))
        t.start()
        deadline = time.monotonic() + 120
        text = lambda: "".join(f.read_text() for f in logs.glob("gpu*.log")) if logs.exists() else ""  # noqa: E731
        while text().count("waiting for another process writing tiny-llama.gguf") < 2 and t.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert text().count("waiting for another process writing tiny-llama.gguf") == 2, text()
        fcntl.flock(held, fcntl.LOCK_UN)
    t.join(300)
    outs = got["outs"]
    assert [o.error for o in outs] == [None, None] and {o.result for o in outs} == {str(target)}
    assert text().count("generating tiny-llama") == 1  # one wrote it; the other found it there
    assert fetch.sha256_file(target) == catalog.entry("tiny-llama").sha256
    assert not list(target.parent.glob(".*.partial"))


# ---- the commands ------------------------------------------------------------------------------

TWO = ["--model", "tiny-llama-f32", "--model", "tiny-qwen3-f32"]


def _same(a: dict, b: dict) -> bool:
    """Two validate entries agree on everything the gate judged (not on time or where they ran)."""
    drop = ("seconds", "gpu_index", "gpu", "host")
    return {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_validate_catalog_on_two_gpus_is_the_single_process_table_and_record(fake_gpus, tmp_path, monkeypatch,
                                                                             capsys):
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["validate-catalog", "--backend", "numpy", *TWO, "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert cli.main(["validate-catalog", "--backend", "numpy", *TWO, "--gpus", "all", "--save"]) == 0
    out, err = capsys.readouterr()
    assert "2 unit(s) on GPUs 0, 1, a worker each" in err and "[2/2] " in err
    rows = [ln for ln in out.splitlines() if ln.startswith("| tiny-")]  # the table, in plan order
    assert rows[0].startswith("| tiny-llama-f32 | cpu | 128/128 |") and rows[1].startswith("| tiny-qwen3-f32 | cpu |")
    (rec,) = results.load_all(tmp_path, kind="validate")
    assert [(e["model"], e["tier"]) for e in rec["results"]] == [(e["model"], e["tier"]) for e in alone]
    assert all(_same(a, b) for a, b in zip(rec["results"], alone))
    assert {e["gpu_index"] for e in rec["results"]} == {0, 1}  # a model per GPU
    assert all("gpu" not in e and e["host"] for e in rec["results"])  # the NumPy engine ran: no GPU to name


def test_validate_catalog_reports_a_dead_worker_for_its_model(fake_gpus, monkeypatch, capsys):
    from harness import cli

    monkeypatch.setattr(pool, "Unit", _crashing_unit(pool.Unit, "tiny-qwen3-f32"))  # its worker dies
    assert cli.main(["validate-catalog", "--backend", "numpy", *TWO, "--gpus", "0,1"]) == 1
    out = capsys.readouterr().out
    assert "| tiny-llama-f32 | cpu | 128/128 |" in out and " pass |" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("FAIL tiny-qwen3-f32"))
    assert "error: the worker on GPU " in line and "died (exit status 7): the worker ran out of memory" in line
    assert "| tiny-qwen3-f32 | cpu | 0/0 | 0/0 |" in out and "FAIL: error |" in out


def crash_7() -> None:
    print("the worker ran out of memory", file=sys.stderr, flush=True)
    os._exit(7)


def _crashing_unit(real, victim: str):
    def make(name, fn, args=(), size=0, fresh=False):
        return real(name, crash_7, (), size, fresh) if name == victim else real(name, fn, args, size, fresh)
    return make


def test_mutants_on_two_gpus_one_fresh_worker_each(fake_gpus, tmp_path, monkeypatch, capsys):
    from harness import cli, results

    monkeypatch.setattr(results, "DEFAULT_DIR", tmp_path)
    assert cli.main(["mutants", "--backend", "numpy", "--model", "tiny-llama-f32", "--mutant", "rms-eps",
                     "--mutant", "attn-scale", "--gpus", "all", "--save"]) == 0
    out, err = capsys.readouterr()
    assert "| rms-eps |" in out and "| attn-scale |" in out and "caught 2 of 2 mutants" in out
    assert "rms-eps: caught by tiny-llama-f32" in err
    (rec,) = results.load_all(tmp_path, kind="mutants")
    assert [r["mutant"] for r in rec["mutants"]] == ["rms-eps", "attn-scale"]  # in the order asked
    assert all(r["caught"] and r["gpu_index"] in (0, 1) and r["bug"] and r["host"] for r in rec["mutants"])
    assert rec["control_failed"] == [] and rec["not_judged"] == []


def test_bench_on_two_gpus_both_arms_of_a_model_on_one(fake_gpus, tmp_path, capsys):
    from harness import cli, results

    assert cli.main(["bench", "--model", "tiny-qwen3-f32", "tiny-llama-f32", "-p", "8", "-n", "4", "-r", "1",
                     "--gpus", "all", "--results-dir", str(tmp_path), "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["test"]) for r in rows] == [("tiny-qwen3-f32", "pp8"), ("tiny-qwen3-f32", "tg4"),
                                                         ("tiny-llama-f32", "pp8"), ("tiny-llama-f32", "tg4")]
    recs = results.load_all(tmp_path, kind="bench")
    assert sorted(r["model_name"] for r in recs) == ["tiny-llama-f32", "tiny-qwen3-f32"]
    assert {r["gpu_index"] for r in recs} == {0, 1} and len({r["sitting"] for r in recs}) == 1
    assert all(r["record"] for r in rows)


def test_bench_reports_a_dead_worker_for_its_model_and_keeps_stdout_data(fake_gpus, monkeypatch, capsys):
    from harness import cli

    monkeypatch.setattr(pool, "Unit", _crashing_unit(pool.Unit, "tiny-qwen3-f32"))
    assert cli.main(["bench", "--model", "tiny-qwen3-f32", "tiny-llama-f32", "-p", "8", "-n", "0", "-r", "1",
                     "--gpus", "all", "-o", "json"]) == 1
    out, err = capsys.readouterr()
    assert [(r["model"], r["test"]) for r in json.loads(out)] == [("tiny-llama-f32", "pp8")]
    assert re.search(r"^ERROR tiny-qwen3-f32 on GPU [01] of .*: the worker on GPU [01] died \(exit status 7\): "
                     r"the worker ran out of memory \(log: ", err, re.M)


# ---- Ray --------------------------------------------------------------------------------------

def test_validate_catalog_as_ray_tasks_on_a_local_instance(tmp_path):
    pytest.importorskip("ray", reason=f"Ray is not installed ({pool.RAY_EXTRA}): --ray cannot run here")
    env = {**os.environ, "RAY_ADDRESS": "", "ANVIL_PROJECT": str(ROOT), "PYTHONPATH": str(ROOT),
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    p = subprocess.run([sys.executable, "-m", "harness.cli", "validate-catalog", "--backend", "numpy",
                        "--model", "tiny-llama", "--model", "tiny-qwen2", "--ray", "auto", "--json"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    entries = json.loads(p.stdout)
    assert [(e["model"], e["tier"]) for e in entries] == [("tiny-llama", "cpu"), ("tiny-llama", "twin"),
                                                         ("tiny-llama", "f16kv"), ("tiny-qwen2", "cpu"),
                                                         ("tiny-qwen2", "twin")]
    assert all(e["passed"] and e["steps"] == 128 and e["host"] and e["gpu_index"] is None for e in entries)
    assert "2 unit(s) on Ray (auto)" in p.stderr
