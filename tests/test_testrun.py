"""harness.testrun: a pytest run (its JUnit report) as a ``tests`` record,
and when such a run does not stand: a failure, an error, or nothing run.
The reports come from real pytest runs of a small suite. CPU only."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from engine.errors import AnvilError
from harness import results, testrun

SUITE = textwrap.dedent('''
    import pytest

    def test_passes():
        pass

    def test_fails():
        assert 1 + 1 == 3, "arithmetic"

    @pytest.mark.skip(reason="no usable NVIDIA GPU: cuInit: CUDA_ERROR_NO_DEVICE")
    def test_skipped_one():
        pass

    @pytest.mark.skip(reason="no usable NVIDIA GPU: cuInit: CUDA_ERROR_NO_DEVICE")
    def test_skipped_two():
        pass

    @pytest.fixture
    def broken():
        raise RuntimeError("setup broke")

    def test_errors(broken):
        pass

    @pytest.mark.xfail(reason="known")
    def test_expected_failure():
        assert False
''')


def junit(tmp_path, source: str, name: str = "test_suite.py"):
    """Run pytest on ``source`` alone (none of this repository's configuration) and return its report."""
    (tmp_path / name).write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    f"--junitxml={out}", name], cwd=tmp_path, capture_output=True, timeout=120)
    return out


def test_counts_each_outcome_once(tmp_path):
    c = testrun.count(junit(tmp_path, SUITE))
    assert (c["passed"], c["failed"], c["errors"], c["skipped"]) == (1, 1, 1, 3)  # the xfail is a skip
    assert [f["test"] for f in c["failures"]] == ["test_suite::test_fails", "test_suite::test_errors"]
    assert "arithmetic" in c["failures"][0]["message"] and "setup broke" in c["failures"][1]["message"]
    assert c["skip_reasons"] == {"no usable NVIDIA GPU: cuInit: CUDA_ERROR_NO_DEVICE": 2, "known": 1}
    assert c["duration_s"] > 0
    assert testrun.verdict(c) == "1 failed, 1 errors"


def test_a_file_that_does_not_collect_is_an_error(tmp_path):
    c = testrun.count(junit(tmp_path, "import no_such_module_here\n\ndef test_x():\n    pass\n"))
    assert (c["passed"], c["errors"]) == (0, 1) and "collection" in c["failures"][0]["message"]
    assert testrun.verdict(c) == "0 failed, 1 errors"


def test_a_run_that_skipped_every_test_does_not_stand(tmp_path):
    only_skips = "import pytest\n\n@pytest.mark.skip(reason='no usable NVIDIA GPU: driver gone')\ndef test_a():\n" \
                 "    pass\n"
    c = testrun.count(junit(tmp_path, only_skips))
    assert testrun.verdict(c) == "no test ran (1 skipped; no usable NVIDIA GPU: driver gone)"
    c = testrun.count(junit(tmp_path, "def helper():\n    pass\n"))  # nothing collected
    assert testrun.verdict(c) == "no test ran (0 skipped; none collected)"
    ok = testrun.count(junit(tmp_path, "def test_a():\n    pass\n"))
    assert testrun.verdict(ok) is None


def test_no_report_is_an_error_naming_it(tmp_path):
    with pytest.raises(AnvilError, match=r"junit\.xml: no readable pytest report"):
        testrun.count(tmp_path / "junit.xml")
    (tmp_path / "junit.xml").write_text("<testsuites><testsuite")
    with pytest.raises(AnvilError, match="ParseError"):
        testrun.count(tmp_path / "junit.xml")


def test_the_record_saves_loads_and_sets_the_exit_status(tmp_path, capsys):
    report = junit(tmp_path, SUITE)
    store = tmp_path / "results"
    cmd = "python3 -m pytest -q -m gpu tests"
    rc = testrun.main([str(report), "--command", cmd, "--started", "2026-12-05T10:00:00Z", "--save",
                       "--results-dir", str(store)])
    assert rc == 1 and "the gpu suite does not pass: 1 failed, 1 errors" in capsys.readouterr().err
    (rec,) = results.load_all(store, "tests")
    assert (rec["passed"], rec["failed"], rec["errors"], rec["skipped"], rec["command"]) == (1, 1, 1, 3, cmd)
    assert rec["date"] == "2026-12-05T10:00:00Z" and rec["marker"] == "gpu"
    from engine.bench import build_hash

    assert rec["build"] == build_hash() and rec["engine"] == "anvil"
    ok = junit(tmp_path, "def test_a():\n    pass\n", "test_ok.py")
    assert testrun.main([str(ok), "--command", cmd]) == 0
    assert "1 passed, 0 failed, 0 errors, 0 skipped" in capsys.readouterr().out
    assert testrun.main([str(tmp_path / "missing.xml"), "--command", cmd]) == 1
    assert "no readable pytest report" in capsys.readouterr().err


def test_a_tests_record_of_the_wrong_shape_is_refused(tmp_path):
    good = {"command": "pytest", "passed": 3, "failed": 0, "errors": 0, "skipped": 1, "date": "2026-12-05T10:00:00Z",
            "failures": []}
    results.save(good, "tests", tmp_path)
    with pytest.raises(ValueError, match="field 'passed' is missing"):
        results.save({k: v for k, v in good.items() if k != "passed"}, "tests", tmp_path)
    with pytest.raises(ValueError, match=r"field 'failed' is str"):
        results.save({**good, "failed": "2"}, "tests", tmp_path)
    with pytest.raises(ValueError, match=r"field 'failures\[0\]' is str"):
        results.save({**good, "failures": ["tests/test_x.py::test_y"]}, "tests", tmp_path)
