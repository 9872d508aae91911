"""harness.results: atomic append-only store, schema checks, spec hashes, the frame."""

from __future__ import annotations

import copy
import json
import os
import stat
import time
import warnings

import numpy as np
import pytest

from engine.errors import AnvilError
from harness import results, stats


def bench_record(**over):
    rec = {
        "engine": "anvil", "build": "d4df51d7f8fbf091",
        "model": "/tmp/models/synth/qwen3-8b.gguf", "backend": "cuda",
        "settings": {"n_prompt": 512, "n_gen": 128, "reps": 5, "warmup": 1, "seed": 0,
                     "n_ctx": 4096, "kv": "f16", "graphs": True},
        "date": "2026-11-29T15:41:33Z", "gpu": "NVIDIA H200", "driver": "580.159.04",
        "results": [
            {"test": "pp512", "samples_tok_s": [17827.9, 17902.3, 17839.7, 16620.0, 17897.3],
             "tok_s_mean": 17617.4, "tok_s_sd": 558.6},
            {"test": "tg128", "samples_tok_s": [237.3, 237.4, 236.5, 237.3, 236.4],
             "tok_s_mean": 237.0, "tok_s_sd": 0.49, "gb_s": 1106.9,
             "nvml": {"sm_mhz_median": 1980.0, "sm_bimodal": False, "throttle_reasons": []}},
        ],
    }
    rec.update(over)
    return rec


@pytest.fixture
def pinned_clock(monkeypatch):
    monkeypatch.setattr(results, "_now", lambda: time.gmtime(1_800_000_000))


def files(d):
    return sorted(p.name for p in d.iterdir())


def test_default_dir_is_the_repos():
    assert results.DEFAULT_DIR.parts[-2:] == ("reports", "results")
    assert (results.DEFAULT_DIR.parent.parent / "harness" / "results.py").is_file()


def test_round_trip(tmp_path, pinned_clock):
    rec = bench_record(peak=np.int64(6101521356), samples=np.array([1.5, 2.5]),
                       cmp=stats.compare([1.0, 1.1], [1.2, 1.3]))
    original = copy.deepcopy(rec)
    p = results.save(rec, "bench", tmp_path)
    assert rec.keys() == original.keys()  # the caller's dict is not modified
    assert p.parent == tmp_path and p.name.startswith("bench-20270115T080000Z-")
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    [back] = results.load_all(tmp_path)
    assert back["schema_version"] == results.SCHEMA_VERSION and back["kind"] == "bench"
    assert back["saved_at"] == "2027-01-15T08:00:00Z" and back["_path"] == str(p)
    assert back["results"] == rec["results"] and back["peak"] == 6101521356
    assert back["samples"] == [1.5, 2.5] and back["cmp"]["verdict"] == stats.SAME
    # a loaded record saves again without dragging its _path along
    p2 = results.save(back, "bench", tmp_path)
    assert "_path" not in json.loads(p2.read_text())


def test_kind_filter_and_order(tmp_path, monkeypatch):
    for i, kind in enumerate(["validate", "bench", "ab", "bench"]):
        monkeypatch.setattr(results, "_now", lambda i=i: time.gmtime(1_800_000_000 + i))
        results.save({"i": i, **({"measured_rounds": 0} if kind == "ab" else {})}, kind, tmp_path)
    assert [r["i"] for r in results.load_all(tmp_path)] == [0, 1, 2, 3]  # oldest first
    assert [r["i"] for r in results.load_all(tmp_path, kind="bench")] == [1, 3]
    assert results.load_all(tmp_path / "missing") == []


def test_bad_kind_and_conflicting_version(tmp_path):
    with pytest.raises(ValueError):
        results.save({}, "benchmark", tmp_path)
    with pytest.raises(ValueError):
        results.save({"schema_version": 99}, "bench", tmp_path)
    with pytest.raises(ValueError):
        results.save({"kind": "ab"}, "bench", tmp_path)
    assert files(tmp_path) == []


def test_never_overwrites(tmp_path, pinned_clock):
    rec = bench_record()
    p1 = results.save(rec, "bench", tmp_path)
    before = p1.read_bytes()
    p2 = results.save(rec, "bench", tmp_path)  # same content, same second: same name wanted
    p3 = results.save(rec, "bench", tmp_path)
    assert len({p1, p2, p3}) == 3 and p1.read_bytes() == before
    assert len(results.load_all(tmp_path)) == 3


def test_never_overwrites_without_hard_links(tmp_path, pinned_clock, monkeypatch):
    def no_link(src, dst):
        raise PermissionError("no hard links here")

    monkeypatch.setattr(os, "link", no_link)
    p1 = results.save({"x": 1}, "bench", tmp_path)
    p2 = results.save({"x": 1}, "bench", tmp_path)
    assert p1 != p2 and files(tmp_path) == sorted([p1.name, p2.name])


@pytest.mark.parametrize("where", [("fsync",), ("chmod",), ("link", "replace")])
def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch, where):
    # fsync fails after the bytes were written to the temp file: a real mid-write failure
    def boom(*a):
        raise OSError("disk full")

    for name in where:
        monkeypatch.setattr(os, name, boom)
    with pytest.raises(OSError, match="disk full"):
        results.save(bench_record(), "bench", tmp_path)
    assert files(tmp_path) == []  # no temp file, no partial record


def test_unserialisable_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        results.save({"x": object()}, "bench", tmp_path)
    assert files(tmp_path) == []


def test_bad_files_skipped_or_strict(tmp_path):
    good = results.save(bench_record(), "bench", tmp_path)
    (tmp_path / "bench-20270101T000000Z-aaaaaaaa.json").write_text(
        json.dumps({"schema_version": 3, "kind": "bench", "date": "2027-01-01T00:00:00Z"}))
    (tmp_path / "bench-20270101T000001Z-bbbbbbbb.json").write_text("{truncated")
    (tmp_path / "notes.txt").write_text("ignored: not .json")
    with pytest.warns(results.ResultsWarning) as caught:
        recs = results.load_all(tmp_path)
    assert [r["_path"] for r in recs] == [str(good)]
    msgs = " ".join(str(w.message) for w in caught)
    assert "schema_version 3: written by a newer Anvil" in msgs and "unreadable" in msgs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AnvilError, match="aaaaaaaa.json: schema_version 3"):
            results.load_all(tmp_path, strict=True)


def test_old_records_are_upgraded_on_load_never_rewritten(tmp_path):
    """Schema 1 records (the committed store holds dozens) load in the current shape."""
    v1 = {"schema_version": 1, "kind": "ab", "saved_at": "2026-11-29T17:02:40Z", "arms": {}, "analysis": {},
          "rounds": [{"round": 0, "cold": True}, {"round": 1, "cold": False}, {"round": 2, "cold": False}]}
    p = tmp_path / "ab-20261129T170240Z-00000000.json"
    p.write_text(json.dumps(v1))
    [rec] = results.load_all(tmp_path)
    assert rec["schema_version"] == results.SCHEMA_VERSION and rec["date"] == "2026-11-29T17:02:40Z"
    assert rec["measured_rounds"] == 2
    assert json.loads(p.read_text()) == v1  # evidence is never edited
    bench_v1 = {"schema_version": 1, "kind": "bench", "date": "2026-11-01T10:00:00Z", "results": []}
    assert results.upgrade(bench_v1)["date"] == "2026-11-01T10:00:00Z"
    # an older engine's bench output is saved in the current schema
    saved = json.loads(results.save({**bench_v1, "kind": "bench"}, "bench", tmp_path / "s").read_text())
    assert saved["schema_version"] == results.SCHEMA_VERSION
    # what no upgrade can repair is refused on save
    with pytest.raises(ValueError, match="would not load: field 'measured_rounds' is missing"):
        results.save({"rounds": []}, "ab", tmp_path / "s")


def test_the_committed_store_loads_whole():
    skipped = []
    recs = results.load_all(skipped=skipped)
    assert recs and not skipped
    assert all(r["schema_version"] == results.SCHEMA_VERSION and r.get("date") for r in recs)


def test_engine_bench_records_speak_the_store_schema():
    import engine.bench

    assert engine.bench.SCHEMA_VERSION == results.SCHEMA_VERSION


def test_spec_hash():
    a = bench_record()
    h = results.spec_hash(a, "tg128")
    assert h == results.spec_hash(copy.deepcopy(a), "tg128") and len(h) == 16
    assert results.spec(a, "pp512") == {"test": "pp512", "n_prompt": 512, "n_gen": 0, "n_depth": 0,
                                        "model": "qwen3-8b.gguf", "backend": "cuda", "kv": "f16"}
    assert results.spec(a, "pp512+tg128")["n_gen"] == 128
    # how the engine works, run length and where the file sits do not change the spec
    b = bench_record(build="other", model="/elsewhere/qwen3-8b.gguf", date="2027-01-01T00:00:00Z")
    b["settings"].update(graphs=False, reps=10, seed=3, n_ctx=8192, flash_attn=1)
    assert results.spec_hash(b, "tg128") == h and results.comparable(a, b)
    # the work does
    for change in ({"model": "/tmp/llama3-8b.gguf"}, {"backend": "numpy"},
                   {"model_sha256": "ab" * 32}):
        assert results.spec_hash(bench_record(**change), "tg128") != h
    kv32 = bench_record()
    kv32["settings"]["kv"] = "f32"
    deep = bench_record()
    deep["settings"]["n_depth"] = 4096
    for other in (kv32, deep):
        assert results.spec_hash(other, "tg128") != h and not results.comparable(a, other)
    assert results.spec_hash(a, "pp512") != results.spec_hash(a, "pp1024")


def test_comparable():
    a = bench_record()
    assert results.comparable(a, bench_record(backend="CUDA"))  # llama.cpp spells it so
    assert not results.comparable(a, bench_record(gpu="NVIDIA A100-SXM4-80GB"))
    tg_only = bench_record(results=[a["results"][1]])
    assert results.comparable(a, tg_only) and results.comparable(a, tg_only, "tg128")
    assert not results.comparable(a, tg_only, "pp512")
    assert not results.comparable(a, bench_record(results=[{"test": "tg256"}]))


def test_bad_records_are_skipped_named_and_counted(tmp_path, capsys):
    """Records with the right schema version but wrong field types, dates that
    are not dates, truncated JSON and a FIFO: each skipped with one line
    naming the file and the field; the scoreboard renders the rest and lists
    what it skipped."""
    import json as _json

    from harness import cli

    good = {"engine": "anvil", "gpu": "NVIDIA H200", "date": "2026-11-30T09:00:00Z", "build": "b" * 16,
            "model": "m.gguf", "settings": {"n_prompt": 8, "n_gen": 0},
            "results": [{"test": "pp8", "samples_tok_s": [1.0, 2.0], "tok_s_mean": 1.5}]}
    results.save(good, "bench", tmp_path)
    bad = {"gpu-a-dict": {**good, "gpu": {"name": "H200"}}, "results-a-dict": {**good, "results": {"pp8": 1}},
           "test-an-int": {**good, "results": [{"test": 8}]}, "not-a-date": {**good, "date": "not a date"}}
    for name, rec in bad.items():
        (tmp_path / f"bench-{name}.json").write_text(_json.dumps({**rec, "schema_version": 1, "kind": "bench"}))
    (tmp_path / "bench-truncated.json").write_text('{"schema_version": 1, "kind": "bench", "resu')
    os.mkfifo(tmp_path / "bench-fifo.json")
    assert cli.main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "site" / "index.html")]) == 0
    err = capsys.readouterr().err
    for fragment in ("bench-gpu-a-dict.json: field 'gpu' is dict", "bench-results-a-dict.json: field 'results'",
                     "bench-test-an-int.json: field 'results[0].test' is int", "bench-not-a-date.json: field 'date'",
                     "bench-truncated.json: unreadable", "bench-fifo.json: not a regular file"):
        assert fragment in err, (fragment, err)
    assert "Traceback" not in err and "Warning" not in err
    page = (tmp_path / "site" / "index.html").read_text()
    assert "6 file(s) in the results store were skipped" in page and "from 1 result" in page


def test_records_are_written_compact_and_nvml_traces_rounded(tmp_path, pinned_clock):
    """A sitting's records are what the repository grows by: no
    indentation, trace times to the millisecond and power to 0.1 W; every
    other value as measured (summaries too: a rounded fraction could cross
    a diagnosis threshold)."""
    rec = bench_record()
    trace = {"t": [4.212000021652784e-06, 0.2019125660000327, 0.4019806490000519], "sm_mhz": [1980, 1980, None],
             "mem_mhz": [3201] * 3, "power_w": [291.729, 254.816, None], "gpu_util": [45, 45, 0],
             "mem_util": [5, 5, 0], "temp_c": [42, 42, 41], "reasons": [0, 0, 0]}
    rec["results"][1].update(nvml_trace=trace, nvml={"n_samples": 3, "power_frac_of_limit": 0.4424342857142857})
    rec["rounds"] = [{"runs": {"A": {"nvml_trace": trace}}}]  # an A/B record's traces, found wherever they sit
    p = results.save(rec, "bench", tmp_path)
    text = p.read_text()
    assert text.count("\n") == 1 and ", " not in text and ": " not in text  # one line, no padding
    back = json.loads(text)
    want = dict(trace, t=[0.0, 0.202, 0.402], power_w=[291.7, 254.8, None])
    assert back["results"][1]["nvml_trace"] == want and back["rounds"][0]["runs"]["A"]["nvml_trace"] == want
    assert back["results"][1]["nvml"]["power_frac_of_limit"] == 0.4424342857142857
    assert back["results"][1]["samples_tok_s"] == rec["results"][1]["samples_tok_s"]
    assert trace["t"][0] == 4.212000021652784e-06  # the caller's record is not modified


def test_records_written_indented_before_still_load(tmp_path):
    rec = {"schema_version": 2, "kind": "bench", "date": "2026-11-30T09:00:00Z", "saved_at": "2026-11-30T09:00:00Z",
           **bench_record()}
    (tmp_path / "bench-20261130T090000Z-00000000.json").write_text(json.dumps(rec, indent=1) + "\n")
    (back,) = results.load_all(tmp_path)
    assert back["results"] == rec["results"]
