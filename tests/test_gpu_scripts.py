"""The GPU host scripts' decisions, run on the CPU against a fake host: a
``python3`` that fakes pytest, the harness's GPU commands and pip (and runs
everything else, the harness's own record keeping included, for real) and a
fake ``nvidia-smi``. What is checked is what the scripts decide: which
models are benchmarked after which validations, which records are saved,
and the exit status."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO
from harness import catalog, gates, results

FAKE_PYTHON = textwrap.dedent('''\
    #!/usr/bin/env bash
    # the host's python3, faked where the real one would need a GPU, llama.cpp or the network
    echo "python3 $(printf '%q ' "$@")" >> "$FAKE_LOG"
    case "$*" in
      "-m pip "*|scripts/gpu/join_parts.py*|"-c import llama_cpp"*|*"harness.cli models"*|*"harness.cli bench"*|*"harness.cli roofline"*)
        exit 0 ;;
      *"harness.cli reference --variation"*)
        model=$(echo "$*" | sed -n 's/.*--model \\([^ ]*\\).*/\\1/p')
        case " $FAKE_FAIL " in *" variation-$model "*) echo "llama.cpp failed"; exit 1 ;; esac
        cp "$FAKE_VARIATION/$model.json" "reports/results/variation-29991231T000000Z-$model.json"  # what --save leaves
        exit 0 ;;
      *"harness.cli reference "*)
        tier=$(echo "$*" | sed -n 's/.*--tier \\([^ ]*\\).*/\\1/p')
        model=$(echo "$*" | sed -n 's/.*--model \\([^ ]*\\).*/\\1/p')
        mkdir -p "references/$tier" && echo "{}" > "references/$tier/$model.json"
        exit 0 ;;
      *"harness.cli validate-catalog"*)
        model=$(echo "$*" | sed -n 's/.*--model \\([^ ]*\\).*/\\1/p')
        echo "{}" > "reports/results/validate-fake-$model.json"  # what --save leaves, passed or not
        case " $FAKE_FAIL " in *" $model "*) echo "$model: FAIL"; exit 1 ;; esac
        exit 0 ;;
      "-m pytest"*"--co"*)
        exit 1 ;;  # no pytest-xdist here: one process
      "-m pytest"*)
        junit=$(echo "$*" | sed -n 's/.*--junitxml=\\([^ ]*\\).*/\\1/p')
        [ -n "$FAKE_JUNIT" ] && cp "$FAKE_JUNIT" "$junit"
        echo "$FAKE_PYTEST_OUT"
        exit "$FAKE_PYTEST_RC" ;;
    esac
    PYTHONPATH=$FAKE_REPO:$PYTHONPATH exec "$REAL_PYTHON" "$@"  # host-env.sh set PYTHONPATH to the host's
''')


def junit_xml(passed=0, failed=0, skipped=0) -> str:
    cases = ([f'<testcase classname="tests.test_k" name="test_p{i}" time="0.1"/>' for i in range(passed)]
             + [f'<testcase classname="tests.test_k" name="test_f{i}" time="0.1"><failure message="assert 0">'
                '</failure></testcase>' for i in range(failed)]
             + [f'<testcase classname="tests.test_k" name="test_s{i}" time="0"><skipped type="pytest.skip" '
                'message="no usable NVIDIA GPU: cuInit: CUDA_ERROR_NO_DEVICE"/></testcase>' for i in range(skipped)])
    return (f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="12.5">'
            f'{"".join(cases)}</testsuite></testsuites>')


@pytest.fixture
def host(tmp_path):
    """A checkout on a fake GPU host: the scripts and the catalog (the project
    root, where records are saved), fake python3 and nvidia-smi on PATH.
    ``host.run(script, *args, **env)`` returns (exit status, output, the python3 calls)."""
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts" / "gpu", root / "scripts" / "gpu")
    shutil.copy(REPO / "scripts" / "adopt_gates.py", root / "scripts" / "adopt_gates.py")
    shutil.copytree(REPO / "references" / "prompts", root / "references" / "prompts")
    shutil.copy(REPO / "references" / "catalog.toml", root / "references" / "catalog.toml")
    (root / "reports" / "results").mkdir(parents=True)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(FAKE_PYTHON)
    (bin_ / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'NVIDIA H200, 580.159.04, 700.00 W'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    log, out = tmp_path / "calls.log", tmp_path / "out"

    def run(script, *args, **env):
        log.write_text("")
        e = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "REAL_PYTHON": sys.executable,
             "FAKE_REPO": str(REPO), "FAKE_LOG": str(log), "OUT": str(out), "ANVIL_MODELS_DIR": str(tmp_path / "m"),
             "ANVIL_PROJECT": str(root), "FAKE_FAIL": "", "FAKE_JUNIT": "", "FAKE_VARIATION": str(tmp_path / "variation"), "FAKE_PYTEST_RC": "0",
             "FAKE_PYTEST_OUT": "", **env}
        e.pop("ANVIL_REQUIRE_GPU", None)
        p = subprocess.run(["bash", f"scripts/gpu/{script}", *args], cwd=root, env=e, capture_output=True,
                           text=True, timeout=300)
        return p.returncode, p.stdout + p.stderr, log.read_text().splitlines()

    return type("Host", (), {"run": staticmethod(run), "root": root, "tmp": tmp_path, "out": out})


def test_the_scripts_parse():
    for script in sorted((REPO / "scripts" / "gpu").glob("*.sh")):
        p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, f"{script.name}: {p.stderr}"


def test_check_tests_runs_the_whole_gpu_suite_and_saves_its_record(host):
    xml = host.tmp / "j.xml"
    xml.write_text(junit_xml(passed=40, skipped=2))
    rc, out, calls = host.run("check.sh", "tests", FAKE_JUNIT=str(xml))
    assert rc == 0, out
    (pytest_call,) = [c for c in calls if c.startswith("python3 -m pytest") and "--co" not in c]
    assert " -m gpu " in pytest_call and pytest_call.endswith(" tests ")  # every file, none picked by hand
    (rec,) = results.load_all(host.root / "reports" / "results", "tests")
    assert (rec["passed"], rec["failed"], rec["skipped"]) == (40, 0, 2)
    assert rec["command"].startswith("ANVIL_REQUIRE_GPU=1 python3 -m pytest -q -m gpu")
    assert (host.out / "results.tgz").is_file() and "40 passed, 0 failed" in out


@pytest.mark.parametrize("junit, pytest_rc, why", [
    (junit_xml(passed=39, failed=1), 1, "the gpu suite does not pass: 1 failed, 0 errors"),
    (junit_xml(skipped=42), 0, "the gpu suite does not pass: no test ran (42 skipped; no usable NVIDIA GPU"),
])
def test_check_tests_fails_on_a_failure_or_when_nothing_ran(host, junit, pytest_rc, why):
    xml = host.tmp / "j.xml"
    xml.write_text(junit)
    rc, out, _ = host.run("check.sh", "tests", FAKE_JUNIT=str(xml), FAKE_PYTEST_RC=str(pytest_rc))
    assert rc == 1 and why in out
    assert len(results.load_all(host.root / "reports" / "results", "tests")) == 1  # the evidence is kept either way


def test_check_tests_fails_without_a_report_and_saves_nothing(host):
    """A broken driver under ANVIL_REQUIRE_GPU=1 stops pytest before it writes a report."""
    rc, out, _ = host.run("check.sh", "tests", FAKE_PYTEST_RC="4",
                          FAKE_PYTEST_OUT="ERROR: ANVIL_REQUIRE_GPU=1 but no usable NVIDIA GPU: cuInit: CUDA_ERROR_X")
    assert rc == 1 and "pytest -m gpu: exit 4" in out and "no readable pytest report" in out
    assert "ANVIL_REQUIRE_GPU=1 but no usable NVIDIA GPU: cuInit: CUDA_ERROR_X" in out
    assert results.load_all(host.root / "reports" / "results") == []


def test_check_tests_with_a_selection_is_not_the_suite(host):
    xml = host.tmp / "j.xml"
    xml.write_text(junit_xml(passed=3))
    rc, out, calls = host.run("check.sh", "tests", "gemv and not bulk", FAKE_JUNIT=str(xml))
    assert rc == 0, out
    (pytest_call,) = [c for c in calls if c.startswith("python3 -m pytest") and "--co" not in c]
    assert r"-k gemv\ and\ not\ bulk tests" in pytest_call  # one argument
    assert results.load_all(host.root / "reports" / "results") == []


def harness_calls(calls, command):
    """The models of the ``harness.cli COMMAND`` calls, in order."""
    return [c.split("--model ")[1].split()[0] for c in calls if f"harness.cli {command} " in c]


def test_scoreboard_benchmarks_each_model_right_after_it_passed(host):
    rc, out, calls = host.run("scoreboard.sh", "qwen3-8b", "llama3-8b")
    assert rc == 0, out
    gated = [c for c in calls if "harness.cli validate-catalog" in c or "harness.cli bench" in c]
    assert [(c.split()[3], c.split("--model ")[1].split()[0]) for c in gated[-4:]] == [
        ("validate-catalog", "qwen3-8b"), ("bench", "qwen3-8b"), ("validate-catalog", "llama3-8b"),
        ("bench", "llama3-8b")]
    assert "tiny-llama" in harness_calls(calls, "validate-catalog")  # the cpu tier first, while llama.cpp builds
    (roof,) = [i for i, c in enumerate(calls) if "harness.cli roofline --save" in c]  # the GPU's rooflines, once,
    assert roof < calls.index(gated[0])  # before the sitting's first gate and benchmark
    assert all("--save" in c for c in calls if "harness.cli validate-catalog" in c)


@pytest.mark.parametrize("failing, benched", [("llama3-8b", ["qwen3-8b"]), ("tiny-qwen3", [])])
def test_scoreboard_stops_at_a_failed_validation(host, failing, benched):
    rc, out, calls = host.run("scoreboard.sh", "qwen3-8b", "llama3-8b", "gemma4-31b", FAKE_FAIL=failing)
    assert rc == 1 and f"{failing}: validation FAILED" in out
    assert harness_calls(calls, "bench") == benched  # nothing after the failure, nothing that did not pass
    validated = harness_calls(calls, "validate-catalog")
    assert validated[-1] == failing and "gemma4-31b" not in validated
    import tarfile

    with tarfile.open(host.out / "results.tgz") as t:  # the records so far come back, the failure's included
        assert f"reports/results/validate-fake-{failing}.json" in t.getnames()


def test_reference_set_adopts_the_gates_llama_cpps_spread_sets_and_validates_with_them(host):
    """reference_set.sh on two models, the second's llama.cpp run failing: the
    first's references made anew, its spread measured (a committed record,
    twice as wide, standing in for llama.cpp's), its gates written into the
    catalog by scripts/adopt_gates.py and printed; only it is validated; the
    references, the record and the catalog come back."""
    import json
    import tarfile

    (host.tmp / "variation").mkdir()
    rec = json.loads((results.DEFAULT_DIR / "variation-20261130T093110Z-f0aa1be7.json").read_text())
    for r in rec["results"]:
        r["max_margin_shift"], r["max_logit_diff"], r["max_kl"] = (2 * r[k] for k in
                                                                   ("max_margin_shift", "max_logit_diff", "max_kl"))
    rec["date"] = "2999-12-31T00:00:00Z"
    (host.tmp / "variation" / "llama3-8b.json").write_text(json.dumps(rec))
    rc, out, calls = host.run("reference_set.sh", MODELS="llama3-8b qwen3-8b", TIER="gpu",
                              FAKE_FAIL="variation-qwen3-8b")
    assert rc == 0, out
    assert "qwen3-8b: variation failed" in out and "validate qwen3-8b: not run" in out
    assert harness_calls(calls, "validate-catalog") == ["llama3-8b"]
    # the rule on the records as they stand on the host, the doubled spread among them
    cat = catalog.load()
    measured = gates.gpu_records(host.root / "reports" / "results", cat)
    assert measured[("llama3-8b", "gpu")][0].max_kl == 2 * 0.5624242259593778
    g = gates.propose_measured(cat["llama3-8b"], "gpu", measured[("llama3-8b", "gpu")],
                               gates.held_out_headroom(cat, measured))
    want = f"gate.gpu-cuda = {{ margin = {g.margin:g}, logit = {g.logit:g}, kl = {g.kl:g}, flips = {g.flips:g} }}"
    assert g.kl > 2 * 0.5624  # wider than the committed record's spread, as its record is
    assert (host.out / "gates.txt").read_text().startswith(f"llama3-8b: {want}  # llama.cpp CUDA flash-attn 4.52")
    catalog_text = (host.root / "references" / "catalog.toml").read_text()
    assert want in catalog_text and "variation-29991231T000000Z-llama3-8b.json" in catalog_text
    with tarfile.open(host.out / "results.tgz") as t:
        assert {"references/catalog.toml", "references/gpu/llama3-8b.json",
                "reports/results/variation-29991231T000000Z-llama3-8b.json"} <= set(t.getnames())


def test_reference_set_keeps_the_committed_references_with_keep(host):
    """KEEP=1: llama.cpp makes no reference anew; only its spread is measured,
    the gates written and the engine validated."""
    import json

    (host.tmp / "variation").mkdir()
    rec = json.loads((results.DEFAULT_DIR / "variation-20261130T093110Z-f0aa1be7.json").read_text())
    rec["date"] = "2999-12-31T00:00:00Z"
    (host.tmp / "variation" / "llama3-8b.json").write_text(json.dumps(rec))
    rc, out, calls = host.run("reference_set.sh", MODELS="llama3-8b", TIER="gpu", KEEP="1")
    assert rc == 0, out
    assert not [c for c in calls if "harness.cli reference " in c and "--variation" not in c]
    assert harness_calls(calls, "reference --variation") == ["llama3-8b"]
    assert harness_calls(calls, "validate-catalog") == ["llama3-8b"]


@pytest.mark.parametrize("tests_rc", [0, 1])
@pytest.mark.parametrize("switch,model,n_validated", [("int8", "tiny-qwen3moe", 6), ("wgmma", "tiny-qwen3", 8),
                                                      ("wgmma_moe", "tiny-qwen3moe", 9)])
def test_switch_trial_validates_with_the_switch_on_only_after_its_kernel_tests_pass(host, tests_rc, switch, model,
                                                                                  n_validated):
    """scripts/gpu/switch_trial.sh: the switched kernel's tests first; only when
    they pass, the benchmark rounds with the switch off and on and the models
    validated through switched.py (the switch on in that process), nothing
    saved under reports/, the logs brought back."""
    rc, out, calls = host.run("switch_trial.sh", switch, MODEL=model, ROUNDS="1", FAKE_PYTEST_RC=str(tests_rc))
    validations = [c for c in calls if "validate-catalog" in c]
    benches = [c for c in calls if "-m engine bench" in c]
    assert (host.out / f"{switch}-logs.tgz").exists()
    assert not any("--save" in c for c in calls)
    if tests_rc:
        assert rc == 1 and not validations and not benches, out
        return
    assert rc == 0, out
    assert len(validations) == n_validated and all(
        f"scripts/gpu/switched.py {switch} -m harness.cli validate-catalog --backend cuda" in c
        for c in validations), validations
    assert len(benches) == 4 and sum(f"switched.py {switch} -m engine bench" in c for c in benches) == 2, benches


def test_switch_trial_refuses_an_unknown_switch(host):
    rc, out, _ = host.run("switch_trial.sh", "fp8")
    assert rc == 2 and "usage: switch_trial.sh int8|wgmma|wgmma_moe" in out