"""Speed figures only from validated builds (harness/report/validated.py):
which validate record backs an Anvil bench record, from fabricated records
that pass, fail, or differ in build, sitting, model, GPU or host; and what
the scoreboard and the README's speed table make of it. CPU only."""

from __future__ import annotations

import datetime

import pytest

from harness import results
from harness.report import build_report, render_md
from harness.report.html import render_html, render_readme_table
from harness.report.validated import SITTING_S, backing
from test_report import bench, row

T0 = "2026-12-04T04:47:00Z"


def at(seconds: int) -> str:
    """T0 moved by ``seconds``."""
    t = datetime.datetime.fromisoformat(T0.replace("Z", "+00:00")) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(model="qwen3-8b", tier="gpu", passed=True):
    return {"model": model, "tier": tier, "backend": "cuda", "passed": passed, "steps": 32, "mode": "exact"}


def validation(date="2026-12-04T04:40:00Z", build="b1", *entries, gpu="NVIDIA H200", host=None, name="v"):
    rec = {"kind": "validate", "engine": "anvil", "build": build, "backend": "cuda", "gpu": gpu, "date": date,
           "results": list(entries) or [entry()], "_path": f"/store/validate-{name}.json"}
    if host:
        rec["host"] = host
    return rec


def anvil(date=T0, build="b1", model="qwen3-8b", **over):
    return bench("anvil", model, date, 27000.0, 475.0, build=build, **over)


def test_a_passing_validation_of_the_build_in_the_sitting_backs_the_figure():
    b = backing(anvil(), "qwen3-8b", [validation()])
    assert b.ok and b.record == "validate-v.json" and "7 min from the benchmark" in b.note
    # after the benchmark counts as well, within the sitting; the nearest record is named
    later = validation("2026-12-04T04:50:00Z", name="later")
    assert backing(anvil(), "qwen3-8b", [validation(), later]).record == "validate-later.json"
    assert backing(anvil(), "qwen3-8b", [validation(at(SITTING_S))]).ok
    assert not backing(anvil(), "qwen3-8b", [validation(at(SITTING_S + 1))]).ok
    assert not backing(anvil(), "qwen3-8b", [validation(at(-SITTING_S - 1))]).ok
    assert backing(anvil(), "qwen3-8b", [validation("2026-12-04T04:40:00Z", "b1", {**entry(), "model_sha256": "sha-qwen3-8b"})]).ok


@pytest.mark.parametrize("validations, why", [
    ([], "build b1 was never validated on qwen3-8b"),
    ([validation(build="b0")], "build b1 was never validated on qwen3-8b"),  # another build
    ([validation("2026-12-04T04:40:00Z", "b1", entry(model="llama3-8b"))], "build b1 was never validated on qwen3-8b"),
    ([validation(gpu="NVIDIA A100")], "build b1 was validated on qwen3-8b only on another GPU or host"),
    ([validation("2026-12-04T04:40:00Z", "b1", {**entry(), "model_sha256": "earlier"})],
     "build b1 was validated on qwen3-8b only on another file"),
    ([validation(host="other-host")], "build b1 was validated on qwen3-8b only on another GPU or host"),
    ([validation("2026-12-04T04:07:00Z")], "build b1 was validated on qwen3-8b only in another sitting (40 min away)"),
    ([validation("2026-12-03T04:47:00Z")], "build b1 was validated on qwen3-8b only in another sitting (24.0 h away)"),
    ([validation("2026-12-04T04:40:00Z", "b1", entry(passed=False), name="failed")],
     "qwen3-8b FAILED the gate against its gpu references in this sitting (validate-failed.json)"),
    # a pass beside a failure of the same build in the sitting: the failure stands
    ([validation(), validation("2026-12-04T04:45:00Z", "b1", entry(tier="cpu", passed=False), name="failed")],
     "qwen3-8b FAILED the gate against its cpu references in this sitting (validate-failed.json)"),
    # judged, and passed, but not against llama.cpp with CUDA
    ([validation("2026-12-04T04:40:00Z", "b1", entry(tier="cpu"), entry(tier="oracle"))],
     "qwen3-8b was not judged against its gpu references in this sitting"),
])
def test_no_validation_of_that_build_model_gpu_and_sitting_no_backing(validations, why):
    b = backing(anvil(host="vm"), "qwen3-8b", validations)
    assert (b.ok, b.record, b.note) == (False, None, f"not validated: {why}")


def test_the_same_host_where_both_name_one_and_a_cpu_run_is_never_backed():
    assert backing(anvil(host="vm"), "qwen3-8b", [validation(host="vm")]).ok
    assert backing(anvil(), "qwen3-8b", [validation(host="vm")]).ok  # older bench records name none
    b = backing(anvil(backend="numpy"), "qwen3-8b", [validation()])
    assert not b.ok and b.note == "not validated: a numpy run, the gate judges CUDA"
    numpy_gate = validation()
    numpy_gate["results"][0]["backend"] = "numpy"
    assert not backing(anvil(), "qwen3-8b", [numpy_gate]).ok


def save_sitting(d, date, build, tg, *, validate: bool | None, sitting):
    """One sitting: Anvil and llama.cpp benchmarked, and the build's gate on the model (passed, failed or not run)."""
    results.save(bench("anvil", "qwen3-8b", date, 27000.0, tg, build=build, sitting=sitting), "bench", d)
    results.save(bench("llama.cpp", "qwen3-8b", date, 9800.0, 260.0, build="llama-cpp-python", sitting=sitting),
                 "bench", d)
    if validate is not None:
        results.save({"engine": "anvil", "build": build, "backend": "cuda", "gpu": "NVIDIA H200", "date": date,
                      "results": [entry(passed=validate)]}, "validate", d)


def test_the_scoreboard_row_is_the_newest_validated_pair_and_says_what_backs_it(tmp_path):
    d = tmp_path / "r"
    save_sitting(d, "2026-12-03T09:07:00Z", "b1", 453.0, validate=True, sitting="s1")
    save_sitting(d, "2026-12-04T04:47:00Z", "b2", 475.0, validate=None, sitting="s2")  # newer, never validated
    rep = build_report(results.load_all(d))
    r = row(rep, "qwen3-8b", "tg128")
    assert r.validated and (r.anvil.build, r.anvil.tok_s) == ("b1", 453.0)
    assert r.anvil.validation.record.startswith("validate-20")
    a, lc, ratio = r.newer_unvalidated
    assert (a.build, ratio) == ("b2", pytest.approx(475 / 260))
    html = render_html(rep)
    assert r.anvil.validation.record in html and "newer: 1.83× (b2, 2026-12-04), not validated" in html
    assert f"validated by {r.anvil.validation.record}" in render_md(rep)
    table = render_readme_table(rep)
    assert "| qwen3-8b | tg128 | 453.0 ± 2.3 |" in table and f"`{r.anvil.validation.record}`" in table
    assert "- qwen3-8b tg128: 1.83×, build b2, 2026-12-04 (build b2 was never validated on qwen3-8b)" in table


def test_without_a_validated_pair_the_row_is_marked_and_left_out_of_the_readme(tmp_path):
    d = tmp_path / "r"
    save_sitting(d, "2026-12-04T04:47:00Z", "b2", 475.0, validate=False, sitting="s2")  # failed its gate
    rep = build_report(results.load_all(d))
    r = row(rep, "qwen3-8b", "tg128")
    assert r.ratio == pytest.approx(475 / 260) and not r.validated and r.newer_unvalidated is None
    assert "FAILED the gate against its gpu references" in r.anvil.validation.note
    assert 'class="badge bad" title="not validated: qwen3-8b FAILED' in render_html(rep)
    table = render_readme_table(rep)
    assert "| qwen3-8b |" not in table and "No validated GPU records yet." in table
    assert "- qwen3-8b tg128: 1.83×, build b2, 2026-12-04 (qwen3-8b FAILED the gate" in table


def test_llama_cpp_alone_needs_no_validation(tmp_path):
    d = tmp_path / "r"
    results.save(bench("llama.cpp", "qwen3-8b", T0, 9800.0, 260.0), "bench", d)
    rep = build_report(results.load_all(d))
    r = row(rep, "qwen3-8b", "tg128")
    assert r.anvil is None and r.llamacpp.validation is None and not r.validated
    assert "| qwen3-8b | tg128 | — | 260.0 ± 1.3 | — | — |" in render_md(rep)


def test_the_gpu_test_suite_runs_on_the_scoreboard(tmp_path):
    d = tmp_path / "r"
    base = {"engine": "anvil", "gpu": "NVIDIA H200", "driver": "580.159.04", "host": "vm", "failures": [],
            "command": "ANVIL_REQUIRE_GPU=1 python3 -m pytest -q -m gpu -n 8 tests", "duration_s": 301.2}
    results.save({**base, "build": "b1", "date": "2026-12-05T10:00:00Z", "passed": 250, "failed": 0, "errors": 0,
                  "skipped": 3}, "tests", d)
    results.save({**base, "build": "b2", "date": "2026-12-05T11:00:00Z", "passed": 249, "failed": 1, "errors": 0,
                  "skipped": 3}, "tests", d)
    rep = build_report(results.load_all(d))
    assert [(t.build, t.passed, t.problem) for t in rep.suite_runs] == [("b2", 249, "1 failed, 0 errors"),
                                                                        ("b1", 250, None)]
    html = render_html(rep)
    assert 'id="gpu-tests"' in html and "1 failed, 0 errors" in html and "ANVIL_REQUIRE_GPU=1 python3 -m pytest" in html
    assert "| 2026-12-05 10:00 | pass | 250 | 0 | 0 | 3 | 301 s | b1 | NVIDIA H200, driver 580.159.04, vm |" in \
        render_md(rep)


def test_a_validation_of_an_earlier_file_is_not_the_current_files():
    """A model's file made anew (the catalog pins a new sha256), or its references, is not judged
    by validations of the old ones: by the file a validation names, or, for records from before
    validations named it, by coming before the first record that names the current file or before
    the reference set was made."""
    def val(date, name, **e):
        return validation(date, "b1", {**entry(), **e}, name=name)

    variation = {"kind": "variation", "date": "2026-12-04T05:00:00Z", "_path": "/store/variation-x.json",
                 "results": [{"model": "qwen3-8b", "tier": "cpu", "variant": "f32-twin", "model_sha256": "new"}]}
    files = {"qwen3-8b": {"sha256": "new", "refs": {"gpu": "2026-12-04T04:00:00Z"}}}

    def status(*recs, files=files):
        (p,) = build_report([*recs, variation], files).parity
        return p.ok, p.status

    stale = (False, "STALE: judged an earlier file or references of this model (made anew since)")
    assert status(val("2026-12-04T04:40:00Z", "old")) == stale  # no sha, before the new file's first record
    assert status(val("2026-12-04T05:10:00Z", "after")) == (True, "exact")  # no sha, after it
    assert status(val("2026-12-04T05:10:00Z", "named-old", model_sha256="old")) == stale
    assert status(val("2026-12-04T04:40:00Z", "named", model_sha256="new")) == (True, "exact")
    remade = {"qwen3-8b": {"sha256": "new", "refs": {"gpu": "2026-12-04T05:20:00Z"}}}  # its gpu references
    assert status(val("2026-12-04T05:10:00Z", "after"), files=remade) == stale
    assert build_report([val("2026-12-04T04:40:00Z", "old"), variation]).parity[0].ok  # no catalog given
