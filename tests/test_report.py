"""harness report: the scoreboard from fake records of every kind (bench, ab,
validate, roofline) and from the committed real ones; the NVML diagnosis
rules at and around each threshold. CPU only, a few seconds."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.errors import AnvilError
from harness import ab, nvml, results
from harness.compare import CaseResult, Flip
from harness.report import build_report, main_report, render_md, write_html
from harness.report import diagnose as dx
from harness.report import figures
from harness.report.html import FIGURE_RE, render_html
from harness.catalog import Gate
from harness.roofline import Roofline
from harness.validate import Failure, ModelResult

H200 = "NVIDIA H200"
WEIGHT_BYTES = 4_670_533_632   # qwen3-8b's matrices
N_PARAMS = 8_190_735_360
ROOF = Roofline(H200, 4300.0, 790.0)  # what the fixture's roofline record says


def roofline_record(gpu=H200, copy=4300.0, gemm=790.0, date="2026-11-01T08:00:00Z") -> dict:
    return {"gpu": gpu, "copy_gb_s": copy, "bf16_tflops": gemm, "date": date, "driver": "580.159.04",
            "copy": {"samples_gb_s": [copy] * 3}, "gemm": {"samples_tflops": [gemm] * 3}}


def svg_ok(markup: str) -> bool:
    return markup.startswith("<svg") and markup.rstrip().endswith("</svg>") and "<?xml" not in markup


def bench(engine, model, date, pp, tg, *, build="b0", kv="f16", gpu=H200, **over):
    rec = {"engine": engine, "build": build, "model": f"/models/{model}.gguf", "model_name": model,
           "model_sha256": f"sha-{model}", "backend": "cuda", "settings": {"n_prompt": 512, "n_gen": 128, "reps": 5,
                                                                            "kv": kv},
           "date": date, "gpu": gpu, "driver": "580.159.04", "power_limit_w": 700.0, "sm_clock_max_mhz": 1980,
           "results": [{"test": "pp512", "samples_tok_s": [pp] * 5, "tok_s_mean": pp, "tok_s_sd": pp / 100},
                       {"test": "tg128", "samples_tok_s": [tg] * 5, "tok_s_mean": tg, "tok_s_sd": tg / 200}]}
    rec.update({"weight_bytes_per_token": WEIGHT_BYTES} if engine == "anvil" else {"n_params": N_PARAMS})
    rec.update(over)
    return rec


def synthetic_trace(kind: str, n: int = 80) -> dict:
    """NVML traces of the four classes, shaped like harness.nvml.Sampler.trace."""
    t = [i * 0.025 for i in range(n)]
    if kind == "host-sync":      # idles between host round-trips: clock dips to idle, little power
        sm = [345 if i % 3 == 0 else 1980 for i in range(n)]
        pw, util = [140.0 + (i % 3) * 20 for i in range(n)], [55] * n
    elif kind == "launch":       # gaps between kernels: boost held, power low, idle part of the time
        sm, pw, util = [1980] * n, [315.0] * n, [57] * n
    elif kind == "kernel":       # graph replay of small kernels: boost held, never idle, below the roofline
        sm, pw, util = [1980] * n, [460.0] * n, [99] * n
    elif kind == "compute":      # tensor-core GEMMs: boost, near the power limit
        sm, pw, util = [1980] * n, [640.0] * n, [100] * n
    else:                        # memory: boost, high power
        sm, pw, util = [1980] * n, [520.0] * n, [100] * n
    return {"t": t, "sm_mhz": sm, "mem_mhz": [3201] * n, "power_w": pw, "gpu_util": util, "mem_util": [40] * n,
            "temp_c": [50] * n, "reasons": [0] * n}


STATIC = {"power_limit_w": 700.0, "sm_clock_max_mhz": 1980}


def summary(kind: str) -> dict:
    return nvml.summarize(synthetic_trace(kind), STATIC)


def validate_record(date: str, *, drift: bool = False) -> dict:
    near = Flip(step=3, ref_token=11, engine_token=12, ref_margin=0.004, engine_margin=0.003, ref_in_engine_top2=True)
    gate = Gate(margin=0.05, logit=0.5, kl=0.01)
    exact = ModelResult("alpha-8b", "gpu", "cuda", gate, cases=[CaseResult("p0", 32, 32, "exact", 32)])
    forced = ModelResult("beta-3b", "gpu", "cuda", gate, cases=[CaseResult("p0", 32, 3, "teacher-forced", 31, [near]),
                                                                CaseResult("p1", 32, 32, "exact", 32)])
    if drift:
        forced.failures = [Failure(0, 3, "drift", "llama.cpp 11 vs engine 12")]
    return {"models": [exact.to_json(), forced.to_json()], "build": "a1b2c3d4e5f6a7b8", "gpu": H200,
            "driver": "580.159.04", "date": date}


class _FakeRunner:
    def __init__(self, label, tg, sha):
        self.label, self.tg, self.sha = label, tg, sha

    def prepare(self):
        pass

    def describe(self):
        return {"kind": "fake", "label": self.label, "sha256": self.sha}

    def run(self, model, **kw):
        from harness.runners import RunResult

        import time

        v = self.tg + random.random()
        now = time.time()  # the engine stamps its measured repetitions: here the whole fake trace
        raw = {"results": [{"test": t, "window_unix": [now - 1.95, now]} for t in ("pp512", "tg128")]}
        return RunResult(tests={"pp512": [9000.0 + v, 9001.0 + v], "tg128": [v, v + 0.1]}, tokens=[1, 2, 3], raw=raw,
                         wall_s=1.0, cmd=["fake"], returncode=0)


class _FakeSampler:
    available, reason, static = True, "", dict(STATIC)
    kinds = iter([])

    def __enter__(self):
        import time

        self.trace = synthetic_trace(next(_FakeSampler.kinds, "launch"))
        self.t0_unix = time.time() - self.trace["t"][-1]  # the run ends as the trace does
        return self

    def __exit__(self, *exc):
        return False


def ab_record(monkeypatch, tmp_path, store):
    """A real harness.ab record (ABBA rounds, stats, thinned NVML traces) from fake runners."""
    random.seed(0)
    arms = iter([_FakeRunner("base.whl", 240.0, "a" * 64), _FakeRunner("cand.whl", 262.0, "b" * 64)])
    monkeypatch.setattr(ab, "make_runner", lambda spec, workdir: next(arms))
    monkeypatch.setattr(ab.nvml, "Sampler", _FakeSampler)
    monkeypatch.setattr(ab.nvml, "gpu_busy_by_other_processes", lambda: [])
    # arm A's runs look host-sync starved, B's launch-latency bound (runs go A B | B A | ...)
    kinds = ["host-sync" if arm == "A" else "launch" for pair in ab.abba_order(5) for arm in pair]
    monkeypatch.setattr(_FakeSampler, "kinds", iter(kinds))
    cfg = ab.ABConfig(model=tmp_path / "alpha-8b.gguf", rounds=4)
    return ab.run_ab("a.whl", "b.whl", cfg, tmp_path, results_dir=store)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """Two models x two dates x two engines, a validate record per date and one A/B."""
    d = tmp_path / "results"
    for date, (a_pp, a_tg, l_pp, l_tg), build in (("2026-11-01T10:00:00Z", (15000.0, 200.0, 9000.0, 250.0), "old0"),
                                                  ("2026-11-20T10:00:00Z", (18000.0, 240.0, 9500.0, 260.0), "new1")):
        for model, scale in (("alpha-8b", 1.0), ("beta-3b", 2.0)):
            a = bench("anvil", model, date, a_pp * scale, a_tg * scale, build=build)
            lc = bench("llama.cpp", model, date, l_pp * scale, l_tg * scale, build="llama-cpp-python 0.3.36")
            if build == "new1" and model == "alpha-8b":  # a trace of its own for the decode test
                a["results"][1]["nvml_trace"] = synthetic_trace("launch")
                a["results"][1]["nvml_window"] = {"source": "engine timestamps", "start_s": 0.0, "end_s": 1.975}
            if build == "new1" and model == "beta-3b":   # harness bench style: one summary for the whole run
                a["nvml"] = summary("host-sync")
                lc["nvml"] = {"available": False, "reason": "NVML unavailable: no driver"}
            results.save(a, "bench", d)
            results.save(lc, "bench", d)
    results.save(validate_record("2026-11-01T09:00:00Z", drift=True), "validate", d)
    results.save(validate_record("2026-11-20T09:00:00Z"), "validate", d)
    results.save(roofline_record(), "roofline", d)
    ab_record(monkeypatch, tmp_path, d)
    return d


def row(rep, model, test):
    (r,) = [r for r in rep.rows if (r.model, r.test) == (model, test)]
    return r


def test_the_ratio_is_of_medians_a_cold_first_repetition_moves_nothing(tmp_path):
    """llama-bench's first timed prefill repetition runs ~20% slow after its
    warm-up: the scoreboard and ``bench`` take the median of the repetitions
    (a mean of 3 would flatter Anvil's ratio by ~7%)."""
    d = tmp_path / "results"
    date = "2026-11-20T10:00:00Z"
    lc = bench("llama.cpp", "alpha-8b", date, 8300.0, 250.0)
    lc["results"][0].update(samples_tok_s=[6500.0, 8300.0, 8400.0], tok_s_mean=7733.3)
    a = bench("anvil", "alpha-8b", date, 10000.0, 240.0)
    a["results"][0].update(samples_tok_s=[9000.0, 10000.0, 10100.0, 10200.0], tok_s_mean=9825.0)
    results.save(a, "bench", d)
    results.save(lc, "bench", d)
    r = row(build_report(results.load_all(d)), "alpha-8b", "pp512")
    assert (r.anvil.tok_s, r.llamacpp.tok_s) == (10050.0, 8300.0)  # an even count: the mean of the middle two
    assert r.ratio == pytest.approx(10050 / 8300)
    pp = next(x for x in ab.bench_rows([("alpha-8b", [a, lc])]) if x["engine"] == "anvil" and x["test"] == "pp512")
    assert pp["vs_llamacpp"] == pytest.approx(10050 / 8300)
    assert results.throughput({"tok_s_mean": 5.0}) == 5.0  # a record without samples: its mean


def test_scoreboard_numbers_ratios_and_rooflines(store):
    rep = build_report(results.load_all(store))
    assert [m.name for m in rep.models] == ["alpha-8b", "beta-3b"]
    r = row(rep, "alpha-8b", "tg128")
    assert (r.anvil.tok_s, r.llamacpp.tok_s) == (240.0, 260.0)   # the latest of each engine
    assert r.ratio == pytest.approx(240 / 260)
    assert r.anvil.rate.gb_s == pytest.approx(WEIGHT_BYTES * 240 / 1e9)
    assert r.anvil.rate.roofline == pytest.approx(WEIGHT_BYTES * 240 / 1e9 / 4300.0)  # the roofline record's
    assert (r.anvil.rate.ceiling.gpu, r.anvil.rate.ceiling.bf16_tflops) == (H200, 790.0)
    assert r.anvil.rate.ceiling.file.startswith("roofline-")
    # llama.cpp's decode GB/s: the same file's weight bytes, taken from the Anvil record
    assert r.llamacpp.rate.gb_s == pytest.approx(WEIGHT_BYTES * 260 / 1e9)
    p = row(rep, "beta-3b", "pp512")
    assert p.ratio == pytest.approx(36000 / 19000)
    # prefill: 2 x n_params FLOPs per token, n_params from the llama.cpp record of the same file
    assert p.anvil.rate.tflop_s == pytest.approx(2 * N_PARAMS * 36000 / 1e12)
    html = render_html(rep)
    for sid in ("summary", "scoreboard", "model-alpha-8b", "model-beta-3b", "figures", "history", "parity", "ab",
                "diagnosis", "provenance"):
        assert f'id="{sid}"' in html
    assert "0.92×" in html and "1.89×" in html
    assert "build new1" in html or "new1" in html
    # provenance on the numbers: the tooltip names GPU, driver, date, build and record file
    assert re.search(r'title="anvil on NVIDIA H200, driver 580\.159\.04, 2026-11-20T10:00:00Z, build new1; '
                     r'kv=f16, reps=5; 5 samples; bench-[^"]+\.json">240\.0 ± 1\.2<', html)


def test_bench_nvml_diagnosis_and_trace_figures(store, tmp_path):
    rep = build_report(results.load_all(store))
    a = row(rep, "alpha-8b", "tg128").anvil
    assert a.diagnosis.label == dx.LAUNCH and a.diagnosis.sentence.startswith("decode reads 1121 GB/s = 26%")
    assert a.figure and a.figure.endswith("-tg128")
    assert row(rep, "alpha-8b", "pp512").anvil.diagnosis.label == dx.UNKNOWN  # the trace was tg128's only
    b = row(rep, "beta-3b", "tg128")
    # a summary of the whole process (model load included) is not diagnosed
    assert b.anvil.diagnosis.label == dx.WHOLE_RUN and "covers the whole run" in b.anvil.diagnosis.sentence
    assert b.anvil.figure is None  # a summary without its trace: nothing to plot
    assert b.llamacpp.diagnosis.label == dx.UNKNOWN and "no driver" in b.llamacpp.diagnosis.sentence
    assert "covers the whole run" not in b.llamacpp.diagnosis.sentence
    (fig,) = [f for f in rep.figures if f.name == a.figure]
    assert svg_ok(figures.render(fig)) and "tg128" in fig.title
    assert f'<figure class="fig" data-fig="{a.figure}"><svg' in render_html(rep)


def test_history_first_to_latest(store):
    rep = build_report(results.load_all(store))
    (h,) = [h for h in rep.history if (h.model, h.test, h.engine) == ("alpha-8b", "pp512", "anvil")]
    assert (h.first.tok_s, h.latest.tok_s, h.n_records) == (15000.0, 18000.0, 2)
    assert (h.first.build, h.latest.build) == ("old0", "new1")
    assert h.gain == pytest.approx(1.2)
    html = render_html(rep)
    assert "published (first record)" in html and "1.20×" in html
    (bars,) = [f for f in rep.figures if f.kind == "bars"]
    assert bars.name == "ratios" and bars.data[:2] == (("alpha-8b pp512", pytest.approx(18000 / 9500), False),
                                                       ("alpha-8b tg128", pytest.approx(240 / 260), False))
    assert svg_ok(figures.render(bars))


def test_incomparable_records_are_never_compared(tmp_path):
    d = tmp_path / "r"
    results.save(bench("anvil", "alpha-8b", "2026-11-01T00:05:00Z", 18000.0, 240.0), "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:00:00Z", 9000.0, 250.0), "bench", d)
    # newer and in the same sitting, but another KV type (spec) and another GPU: never paired with the anvil record
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:06:00Z", 1.0, 1.0, kv="f32"), "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:07:00Z", 2.0, 2.0, gpu="NVIDIA A100"), "bench", d)
    results.save(bench("anvil", "gamma-1b", "2026-11-04T00:00:00Z", 500.0, 50.0, model_sha256="sha-other"), "bench", d)
    results.save(bench("llama.cpp", "gamma-1b", "2026-11-04T00:00:10Z", 400.0, 40.0, model_sha256="sha-third"),
                 "bench", d)  # the same name, another file
    rep = build_report(results.load_all(d))
    tg = [r for r in rep.rows if (r.model, r.test) == ("alpha-8b", "tg128")]
    assert [r.gpu for r in tg] == ["NVIDIA A100", H200]  # one row per model, test and GPU
    (a100, paired) = tg
    assert paired.llamacpp.tok_s == 250.0 and paired.ratio == pytest.approx(240 / 250)  # not the newer f32 one
    assert paired.spec == results.spec_hash(bench("anvil", "alpha-8b", "", 1, 1), "tg128")
    assert (a100.anvil, a100.llamacpp.tok_s, a100.ratio) == (None, 2.0, None)
    (gamma,) = [r for r in rep.rows if (r.model, r.test) == ("gamma-1b", "tg128")]
    # the same name, another file: no ratio, and llama.cpp's number of the other file not shown beside Anvil's
    assert (gamma.anvil.tok_s, gamma.llamacpp, gamma.ratio) == (50.0, None, None)
    assert "no comparable pair" in render_html(rep)


def test_ratios_only_within_one_sitting(tmp_path):
    """A ratio pairs records of one ``harness bench`` call (its sitting id),
    or, before the id, records saved within results.SITTING_S: a later
    Anvil-only run does not borrow an old llama.cpp number. The row keeps the
    newest such pair; the later run is in the history."""
    d = tmp_path / "r"
    results.save(bench("anvil", "alpha-8b", "2026-11-01T00:00:10Z", 18000.0, 240.0), "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:00:20Z", 9000.0, 250.0), "bench", d)
    results.save(bench("anvil", "alpha-8b", "2026-11-05T00:00:00Z", 30000.0, 300.0), "bench", d)
    rep = build_report(results.load_all(d))
    r = row(rep, "alpha-8b", "tg128")
    assert (r.anvil.tok_s, r.llamacpp.tok_s, r.ratio) == (240.0, 250.0, pytest.approx(240 / 250))
    (h,) = [h for h in rep.history if (h.model, h.test, h.engine) == ("alpha-8b", "tg128", "anvil")]
    # one selection: the history's "today" is the row's number; the later run is a point, counted as newer
    assert h.latest is r.anvil and h.newer == 1 and [m.tok_s for m in h.points] == [240.0, 300.0]
    # ids decide where they exist: minutes apart but two calls is two sittings, one call is one
    e = tmp_path / "s"
    results.save(bench("anvil", "alpha-8b", "2026-11-01T00:00:10Z", 18000.0, 240.0, sitting="one"), "bench", e)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:00:20Z", 9000.0, 250.0, sitting="two"), "bench", e)
    assert row(build_report(results.load_all(e)), "alpha-8b", "tg128").ratio is None
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:30:00Z", 9000.0, 260.0, sitting="one"), "bench", e)
    assert row(build_report(results.load_all(e)), "alpha-8b", "tg128").ratio == pytest.approx(240 / 260)
    # an id beside none is two sittings however close; a date without a time zone pairs with nothing
    d0 = "2026-11-01T00:00:00Z"
    assert not results.same_sitting({"sitting": "one", "date": d0}, {"date": d0})
    assert not results.same_sitting({"date": d0}, {"date": "2026-11-01T00:00:00"})
    assert results.same_sitting({"date": d0}, {"date": "2026-11-01T00:14:59Z"})
    assert not results.same_sitting({"date": d0}, {"date": "2026-11-01T00:15:01Z"})


def test_run_to_run_spread_of_a_build_over_its_sittings(tmp_path):
    """Anvil's row says how far one build's results moved between separate
    ``harness bench`` calls: (max - min) / median over one value a sitting
    (the newest of each); another build's and llama.cpp's runs do not count,
    and one sitting shows none."""
    d = tmp_path / "r"
    results.save(bench("anvil", "alpha-8b", "2026-11-01T00:00:10Z", 18000.0, 240.0, sitting="a"), "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T00:00:20Z", 9000.0, 250.0, sitting="a"), "bench", d)
    rep = build_report(results.load_all(d))
    assert row(rep, "alpha-8b", "pp512").anvil_spread is None and "run to run" in render_md(rep)
    results.save(bench("anvil", "alpha-8b", "2026-11-01T01:00:00Z", 19000.0, 240.0, sitting="b"), "bench", d)
    results.save(bench("anvil", "alpha-8b", "2026-11-01T02:00:00Z", 17000.0, 240.0, sitting="c"), "bench", d)
    results.save(bench("anvil", "alpha-8b", "2026-11-01T02:00:30Z", 18500.0, 240.0, sitting="c"), "bench", d)  # c's newest
    results.save(bench("anvil", "alpha-8b", "2026-11-01T03:00:00Z", 30000.0, 300.0, sitting="d", build="b1"), "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-01T03:00:10Z", 5000.0, 250.0, sitting="d"), "bench", d)
    rep = build_report(results.load_all(d))
    r = row(rep, "alpha-8b", "pp512")
    assert r.anvil.build == "b1" and r.anvil_spread is None  # the newest pair's build ran once
    results.save(bench("anvil", "alpha-8b", "2026-11-01T04:00:00Z", 30600.0, 300.0, sitting="e", build="b1"), "bench", d)
    rep = build_report(results.load_all(d))
    assert row(rep, "alpha-8b", "pp512").anvil_spread == (pytest.approx(600 / 30300), 2)
    assert "spread 2.0% over 2 sittings" in render_html(rep)
    # build b0 alone: its three sittings 18000, 19000, 18500 (c's newest)
    old = build_report([r for r in results.load_all(d) if r.get("sitting") in ("a", "b", "c")])
    assert row(old, "alpha-8b", "pp512").anvil_spread == (pytest.approx(1000 / 18500), 3)


def test_parity_latest_validate_per_model(store):
    rep = build_report(results.load_all(store))
    by = {p.model: p for p in rep.parity}
    assert by["alpha-8b"].status == "exact" and by["alpha-8b"].ok and by["alpha-8b"].matched == "32/32"
    # the later record (no drift) replaces the earlier drifting one
    assert by["beta-3b"].status == "teacher-forced: 1 near-tie flip" and by["beta-3b"].ok
    # free-run prefix and teacher-forced agreement are separate columns
    assert by["beta-3b"].matched == "35/64" and by["beta-3b"].agreement == "63/64"
    old = build_report([r for r in results.load_all(store) if r.get("date", "") < "2026-11-02"])
    assert {p.model: p.ok for p in old.parity} == {"alpha-8b": True, "beta-3b": False}
    assert "FAIL: drift" in render_html(old)
    assert "teacher-forced agreement" in render_html(rep) and "free-run prefix" in render_md(rep)
    assert "parity (cuda, gpu refs): exact" in render_html(rep)


def test_parity_shows_llama_cpps_own_spread(store):
    """A variation record (llama.cpp against its own references under other
    settings) sits beside the engine's margin shift for the same model and tier."""
    v = ModelResult("beta-3b", "gpu", "llama.cpp flash-attn", Gate(float("inf")),
                    cases=[CaseResult("p0", 32, 3, "teacher-forced", margin_shifts=[0.1, -0.6])])
    u = ModelResult("beta-3b", "gpu", "llama.cpp ubatch-1", Gate(float("inf")),
                    cases=[CaseResult("p0", 32, 32, "exact", margin_shifts=[0.2])])
    results.save({"engine": "llama.cpp", "date": "2026-11-21T09:00:00Z", "tiers": ["gpu"],
                  "results": [{**v.to_json(), "variant": "flash-attn"}, {**u.to_json(), "variant": "ubatch-1"}]},
                 "variation", store)
    rep = build_report(results.load_all(store))
    by = {p.model: p for p in rep.parity}
    assert by["beta-3b"].llama_spread == "flash-attn 0.6, ubatch-1 0.2" and by["alpha-8b"].llama_spread is None
    assert by["beta-3b"].margin_shift == 0.0  # the engine record's own (its cases carry no shifts)
    assert "flash-attn 0.6, ubatch-1 0.2" in render_html(rep) and "flash-attn 0.6" in render_md(rep)


def test_ab_verdicts_statistics_and_traces(store, tmp_path):
    recs = results.load_all(store)
    rep = build_report(recs)
    (src,) = [r for r in recs if r["kind"] == "ab"]
    t = {x.test: x for x in rep.ab}["tg128"]
    a = src["analysis"]["tg128"]
    assert (t.ratio, t.ci, t.p_value, t.verdict) == (a["ratio"], (a["ci_low"], a["ci_high"]), a["p_value"],
                                                     a["verdict"])
    assert t.verdict == "faster" and t.wins == "4:0" and t.model == "alpha-8b"
    assert t.arm_a.startswith("base.whl (aaaa") and "greedy tokens identical" in t.notes
    # every run of the A/B is diagnosed from its own trace; the cold round is listed but not counted
    ab_runs = [x for x in rep.runs if x.source == "ab"]
    assert len(ab_runs) == 10 and not any(x.figure for x in ab_runs)  # their traces stay in the record
    assert sum("cold" in x.who for x in ab_runs) == 2
    assert {x.diagnosis.label for x in ab_runs} == {dx.HOST_SYNC, dx.LAUNCH}
    assert (t.diag_a, t.diag_b) == ("host-sync starved (4/4 runs)", "launch-latency bound (4/4 runs)")
    # the model's history marks the A/B in its lane, by date and verdict
    (hist,) = [f for f in rep.figures if f.name == "history-alpha-8b"]
    assert (src["date"], "faster", f"tg128 {a['ratio']:.3f}×") in dict(hist.data)["ab"]


def test_ab_arms_are_named_by_commit_and_subject_where_the_record_has_them(monkeypatch, tmp_path):
    """``harness ab --commits`` records each arm's commit and subject; the
    page names arms by them. Older records: the wheel's directory (a branch
    or commit someone built it in) and the wheel's label, never a hash alone."""
    from harness.report import _arm_label

    random.seed(0)
    arms = iter([_FakeRunner("base.whl", 240.0, "a" * 64), _FakeRunner("cand.whl", 262.0, "b" * 64)])
    monkeypatch.setattr(ab, "make_runner", lambda spec, workdir: next(arms))
    monkeypatch.setattr(ab.nvml, "Sampler", _FakeSampler)
    monkeypatch.setattr(ab.nvml, "gpu_busy_by_other_processes", lambda: [])
    info = {"A": {"commit": "1" * 40, "subject": "Decode: the old way"},
            "B": {"commit": "2" * 40, "subject": "Decode: one launch fewer"}}
    cfg = ab.ABConfig(model=tmp_path / "alpha-8b.gguf", rounds=4)
    ab.run_ab("a.whl", "b.whl", cfg, tmp_path, results_dir=tmp_path / "r", arm_info=info)
    rep = build_report(results.load_all(tmp_path / "r"))
    t = rep.ab[0]
    assert (t.arm_a, t.arm_b) == ("11111111 Decode: the old way (build aaaaaaaa)",
                                  "22222222 Decode: one launch fewer (build bbbbbbbb)")
    assert "22222222 Decode: one launch fewer" in render_html(rep)
    wheel = {"label": "anvil-0.1.0@45045aa078cf", "sha256": "45045aa078cf" + "0" * 52, "build": "40f86355fa1b69a6"}
    assert _arm_label({**wheel, "wheel": "/w/wheels/tail/anvil-0.1.0-py3-none-any.whl"}) == \
        "tail: anvil-0.1.0@45045aa078cf"
    assert _arm_label({**wheel, "wheel": f"/c/anvil/wheels/{'9' * 40}/anvil-0.1.0-py3-none-any.whl"}) == \
        "99999999: anvil-0.1.0@45045aa078cf"
    assert _arm_label({**wheel, "wheel": "/w/wheels/anvil-0.1.0-py3-none-any.whl"}) == "anvil-0.1.0@45045aa078cf"
    # what harness ab --commits records of a revision
    import subprocess

    from harness import wheels

    head = wheels.commit_of("HEAD")
    head = {"commit": head, "subject": wheels.subject_of(head)}
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    assert head == {"commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s")}


def test_deterministic_self_contained_html(store, tmp_path):
    """Same records, any order: the same bytes, one file, every figure inline
    SVG with ids of its own, nothing else loaded."""
    recs = results.load_all(store)
    shuffled = list(recs)
    random.Random(1).shuffle(shuffled)
    assert build_report(recs) == build_report(shuffled)
    one = write_html(build_report(recs), tmp_path / "one")
    two = write_html(build_report(shuffled), tmp_path / "two")
    assert one.read_bytes() == two.read_bytes()
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["index.html"]  # no figures beside it, no temp file
    html = one.read_text()
    figs = FIGURE_RE.findall(html)
    assert len(figs) == len(build_report(recs).figures) >= 3 and "<img" not in html and ' src="' not in html
    ids = re.findall(r' id="([^"]+)"', html)
    assert len(ids) == len(set(ids))  # two inline SVGs never share an id


def test_markdown(store):
    md = render_md(build_report(results.load_all(store)))
    for head in ("## Summary", "## Scoreboard", "## History: published → today", "## Parity with llama.cpp", "## A/B comparisons",
                 "## Diagnosis", "## Sources"):
        assert head in md
    assert "| alpha-8b | tg128 | 240.0 ± 1.2 | 260.0 ± 1.3 | 0.92× |" in md
    # the summary: a row per model, pp512 and tg128 (the store has no pp4096 or depth test), ✗ not validated
    # (the store's validate records judged another build), the share of the H200's roofline record
    # (a section per kind of GPU, the GPU its heading)
    assert ("### NVIDIA H200\n\n| model |" in md and "| alpha-8b | 18000 | 9500 | 1.89× ✗ | 37% | 240.0 | 260.0 | "
            "0.92× ✗ | 26% |" + " — |" * 8) in md
    assert "Rooflines: 4300 GB/s copy, 790 TFLOP/s bf16 on NVIDIA H200 (2026-11-01, roofline-" in md
    assert "| beta-3b | gpu | cuda | teacher-forced: 1 near-tie flip | 35/64 |" in md
    assert "<" not in md.split("## Scoreboard")[1].split("## Sources")[0].replace("<br>", "")


def test_main_report_cli_entry(store, tmp_path, capsys):
    out = tmp_path / "site" / "index.html"
    assert main_report(SimpleNamespace(format="html", out=str(out), results_dir=str(store))) == 0
    assert out.is_file() and not (out.parent / "figures").exists() and "<svg" in out.read_text()
    err = capsys.readouterr().err  # progress: a line per step and per figure, each with the time so far
    assert re.search(r"^\[ *\d+\.\d s\] read \d+ record\(s\)", err, re.M) and "figure 1/" in err
    assert re.search(r"wrote .*index\.html \(\d+ kB, \d+ inline figure\(s\)\)", err)
    assert main_report(SimpleNamespace(format="md", out=None, results_dir=str(store))) == 0
    assert capsys.readouterr().out.startswith("# Anvil scoreboard")
    assert main_report(SimpleNamespace(format="md", out=str(tmp_path / "s.md"), results_dir=str(store))) == 0
    assert (tmp_path / "s.md").read_text().startswith("# Anvil scoreboard")


def test_main_report_user_errors(tmp_path):
    with pytest.raises(AnvilError, match="no such results directory"):
        main_report(SimpleNamespace(format="html", out=str(tmp_path / "i.html"), results_dir=str(tmp_path / "nope")))
    with pytest.raises(AnvilError, match="unknown report format 'pdf'"):
        main_report(SimpleNamespace(format="pdf", out=None, results_dir=str(tmp_path)))


def test_empty_store(tmp_path):
    rep = build_report([])
    html = render_html(rep)
    assert "No bench records yet" in html and "No A/B records yet" in html and "No validate records yet" in html
    assert "no roofline measured" in html
    assert write_html(rep, tmp_path).is_file()


def test_real_committed_records():
    """Whatever the repository's store holds renders, and every pair shown is comparable."""
    recs = results.load_all()
    rep = build_report(recs)
    html = render_html(rep)
    assert {s[0] for s in rep.sources} == {Path(r["_path"]).name for r in recs}
    by_file = {Path(r["_path"]).name: r for r in recs}
    for r in rep.rows:
        if r.ratio is not None:  # a pair of one sitting, same spec, same GPU
            a, lc = by_file[r.anvil.file], by_file[r.llamacpp.file]
            assert r.ratio == pytest.approx(r.anvil.tok_s / r.llamacpp.tok_s)
            assert results.same_sitting(a, lc) and results.comparable(a, lc, r.test), (r.anvil.file, r.llamacpp.file)
        for m in (r.anvil, r.llamacpp):
            if m is not None:
                assert m.file in html and (m.gpu or "unknown GPU") in m.provenance
    assert render_md(rep).startswith("# Anvil scoreboard")


# ---- diagnosis rules -----------------------------------------------------------

def test_diagnosis_each_class_from_traces():
    gbs = lambda frac: frac * ROOF.copy_gb_s  # noqa: E731
    assert dx.diagnose("tg128", summary("memory"), gb_s=gbs(0.80), roofline=ROOF).label == dx.MEMORY
    # without a roofline measured on the GPU, nothing is memory bound: the bandwidth has nothing to be read against
    d = dx.diagnose("tg128", summary("memory"), gb_s=gbs(0.80))
    assert d.label != dx.MEMORY and d.sentence.startswith("decode reads 3440 GB/s (no roofline measured on this GPU)")
    assert dx.diagnose("tg128", summary("host-sync"), gb_s=gbs(0.10)).label == dx.HOST_SYNC
    assert dx.diagnose("tg128", summary("launch"), gb_s=gbs(0.26)).label == dx.LAUNCH
    assert dx.diagnose("tg128", summary("kernel"), gb_s=gbs(0.29)).label == dx.KERNEL
    assert dx.diagnose("pp512", summary("compute"), tflop_s=300.0).label == dx.COMPUTE
    assert dx.diagnose("tg128", summary("compute"), gb_s=gbs(0.5)).label == dx.KERNEL  # decode is never compute bound


def test_diagnosis_sentence_carries_the_numbers():
    s = {"n_samples": 100, "sm_mhz_median": 1980.0, "sm_frac_of_max": 1.0, "sm_bimodal": False,
         "power_frac_of_limit": 0.44, "gpu_util_mean": 55.0, "throttle_reasons": []}
    d = dx.diagnose("tg128", s, gb_s=1206.0, roofline=ROOF)
    assert d.sentence == ("decode reads 1206 GB/s = 28% of the 4300 GB/s roofline with the SM clock at 1980 MHz "
                          "(pinned) and 44% power, 55% utilisation: launch-latency bound")
    k = dx.diagnose("tg128", dict(s, power_frac_of_limit=0.66, gpu_util_mean=99.0), gb_s=1258.0)
    assert k.sentence.endswith("(pinned) and 66% power, 99% utilisation: kernel-latency bound")
    h = dx.diagnose("tg128", summary("host-sync"), gb_s=430.0)
    assert "bimodal (median 1980 MHz, 34% of samples low)" in h.sentence and "23% power" in h.sentence
    assert dx.diagnose("pp512", summary("compute"), tflop_s=292.0, roofline=ROOF).sentence.startswith(
        "prefill computes ~292 TFLOP/s = 37% of the 790 TFLOP/s bf16 peak with the SM clock at 1980 MHz (pinned)")


def _s(clk=1.0, pwr=0.4, util=60.0, bimodal=False, n=50, **extra):
    return {"n_samples": n, "sm_mhz_median": 1980.0 * clk, "sm_frac_of_max": clk, "sm_bimodal": bimodal,
            "power_frac_of_limit": pwr, "gpu_util_mean": util, **extra}


@pytest.mark.parametrize("test, s, kw, label", [
    ("tg128", _s(), {"gb_s": 0.70 * ROOF.copy_gb_s}, dx.MEMORY),                     # at the threshold
    ("tg128", _s(), {"gb_s": 0.699 * ROOF.copy_gb_s}, dx.LAUNCH),                    # just below
    ("pp512", _s(), {"tflop_s": 700.0}, dx.LAUNCH),                                 # bandwidth rule is decode only
    ("tg128", _s(clk=0.849), {}, dx.HOST_SYNC),
    ("tg128", _s(clk=0.85), {}, dx.UNCLASSIFIED),                                   # neither low nor pinned
    ("tg128", _s(clk=0.95), {}, dx.LAUNCH),
    ("tg128", _s(clk=0.949), {}, dx.UNCLASSIFIED),
    ("tg128", _s(clk=0.6, pwr=0.55), {}, dx.UNCLASSIFIED),                          # power not low: not starved
    ("tg128", _s(clk=1.0, pwr=0.55), {}, dx.UNCLASSIFIED),                          # idle gaps need low power
    ("tg128", _s(clk=1.0, pwr=0.549), {}, dx.LAUNCH),
    ("tg128", _s(util=89.9), {}, dx.LAUNCH),
    ("tg128", _s(util=90.0), {}, dx.KERNEL),                                        # never idle
    ("tg128", _s(util=90.0, pwr=0.66), {}, dx.KERNEL),                              # power does not matter there
    ("tg128", _s(util=99.0, clk=0.949), {}, dx.UNCLASSIFIED),                       # ... the clock does
    ("tg128", _s(bimodal=True), {}, dx.HOST_SYNC),                                  # bimodal beats a pinned median
    ("pp512", _s(pwr=0.70, util=90.0), {}, dx.COMPUTE),
    ("pp512", _s(pwr=0.699, util=90.0), {}, dx.KERNEL),
    ("pp512", _s(pwr=0.9, util=89.9), {}, dx.UNCLASSIFIED),
    ("tg128", _s(n=2), {}, dx.TOO_SHORT),
    ("tg128", _s(n=3), {}, dx.LAUNCH),
    ("tg128", _s(duration_s=0.999), {}, dx.SHORT_WINDOW),                           # NVML averages over ~1 s
    ("tg128", _s(duration_s=1.0), {}, dx.LAUNCH),
    ("pp512", _s(pwr=0.9, util=99.0, duration_s=0.2), {}, dx.SHORT_WINDOW),
    ("tg128", _s(), {"windowed": False}, dx.WHOLE_RUN),                             # load included: no verdict
])
def test_diagnosis_boundaries(test, s, kw, label):
    assert dx.diagnose(test, s, roofline=ROOF, **kw).label == label


def test_diagnosis_missing_data():
    assert dx.diagnose("tg128", None, gb_s=1121.0).label == dx.UNKNOWN
    d = dx.diagnose("tg128", {"available": False, "reason": "NVML unavailable: no driver"})
    assert d.label == dx.UNKNOWN and "NVML unavailable: no driver" in d.sentence
    assert dx.diagnose("tg128", {"n_samples": 0}).label == dx.UNKNOWN
    # no power in the summary: only the limit can make the fraction; without it, no power rule fires
    s = {"n_samples": 40, "sm_mhz_median": 1980.0, "sm_mhz_max": 1980.0, "power_w_mean": 300.0}
    assert dx.diagnose("tg128", s).label == dx.UNCLASSIFIED
    assert "power not recorded" in dx.diagnose("tg128", {k: v for k, v in s.items() if k != "power_w_mean"}).sentence
    assert dx.diagnose("tg128", s, power_limit_w=700.0, sm_clock_max_mhz=1980).label == dx.LAUNCH
    # no decode rate: says so and still classifies from the trace
    assert dx.diagnose("tg128", summary("launch")).sentence.startswith("decode (no achieved-rate estimate) with")


def test_rate_sources():
    assert dx.rate("tg128", 240.0, gb_s=1121.0).note == "recorded"
    r = dx.rate("tg128", 259.0, weight_bytes=WEIGHT_BYTES)
    assert r.gb_s == pytest.approx(1209.7, abs=0.1) and r.text == "1210 GB/s"
    assert dx.rate("tg128", 259.0, file_bytes=5e9).text.startswith("~")
    est = dx.rate("pp512", 17804.0, weight_bytes=WEIGHT_BYTES)
    assert est.tflop_s == pytest.approx(2 * WEIGHT_BYTES * 8 / dx.Q4_K_M_BITS_PER_WEIGHT * 17804 / 1e12)
    assert "estimated" in est.note
    assert dx.rate("tg128", 1.0).roofline is None and dx.rate("pp512", 1.0).text == ""
    # Mixture of experts (the qwen3moe-30b-a3b record): 30.5 B weights, 3.04 B multiplied per token
    moe = dict(weight_bytes=1.92e9, file_bytes=18.56e9, n_params=30.53e9)
    assert dx.rate("pp512", 6352.0, **moe).text == ""  # n_params would claim ~10x the FLOPs
    r = dx.rate("pp512", 6352.0, params_per_token=3.04e9, **moe)
    assert r.tflop_s == pytest.approx(2 * 3.04e9 * 6352 / 1e12) and r.note == "2 x params_per_token FLOPs per token"


def test_mutants_section_shows_one_sitting_never_a_merge(tmp_path):
    from harness.mutants import for_backend

    suite = [m.name for m in for_backend("cuda")]
    caught = {"caught": True, "model": "tiny-llama", "references": "twin", "checks": ["kl", "logit"],
              "tried": ["tiny-llama (twin)"], "seconds": 3.0}
    whole = [{"mutant": n, "bug": f"bug {n}", **caught} for n in suite]
    whole[1] = {"mutant": suite[1], "bug": "erf GELU", "caught": False, "seconds": 5.0,
                "tried": ["tiny-gemma3 (twin)", "gemma3-270m (twin)"]}
    prov = {"engine": "anvil", "backend": "cuda", "gpu": H200, "driver": "580.159.04", "tiers": ["cpu", "gpu"]}
    control = [{"model": "tiny-gemma4moe", "references": "oracle", "first": "FAIL tiny-gemma4moe: ops"}]
    results.save({**prov, "date": "2026-12-05T09:00:00Z", "build": "a1b2c3d4e5f6a7b8", "caught": len(suite) - 1,
                  "suite": suite, "not_run": [], "partial": False, "mutants": whole, "control_failed": control},
                 "mutants", tmp_path)
    # a later run of one mutant (--mutant) on another build: listed as history, not merged into the table
    results.save({**prov, "date": "2026-12-05T10:00:00Z", "build": "b1b2c3d4e5f6a7b8", "caught": 1,
                  "suite": suite, "not_run": suite[:1] + suite[2:], "partial": True,
                  "mutants": [dict(whole[1], caught=True, model="gemma3-270m", references="twin", checks=["kl"])]},
                 "mutants", tmp_path)
    rep = build_report(results.load_all(tmp_path))
    (m,) = rep.mutants
    assert (m.backend, m.caught, m.total, m.build, m.partial, m.not_run) == (
        "cuda", len(suite) - 1, len(suite), "a1b2c3d4", False, ())
    assert m.rows[0][2:] == ("tiny-llama (twin)", "kl, logit", "tiny-llama (twin)")
    assert m.rows[1][2:] == ("NOT CAUGHT", "", "tiny-gemma3 (twin), gemma3-270m (twin)")
    assert [h[1:4] for h in m.history] == [("b1b2c3d4", "caught 1 of 1", f"{len(suite) - 1} not run")]
    # a pair the build itself failed, where no mutant was tried, is said beside the result
    assert m.control_failed == (("tiny-gemma4moe (oracle)", "FAIL tiny-gemma4moe: ops"),)
    html, md = render_html(rep), render_md(rep)
    assert f"caught {len(suite) - 1} of {len(suite)}</span>\nat build a1b2c3d4, 2026-12-05" in html
    assert f"cuda engine: caught {len(suite) - 1} of {len(suite)} at build a1b2c3d4, 2026-12-05 (" in md
    assert "1 pair(s) not tried" in html and "tiny-gemma4moe (oracle) (FAIL tiny-gemma4moe: ops)" in html
    assert "Not tried where the build itself failed: tiny-gemma4moe (oracle) (FAIL tiny-gemma4moe: ops)." in md
    # with no record of the whole suite (records from before one was kept say nothing), the latest one,
    # partial, with the suite's mutants it has no result for named; a failed child reads NOT JUDGED
    old = tmp_path / "old"
    failed = {"caught": False, "tried": [], "error": "the mutant's process killed by signal 15", "seconds": 1.0}
    results.save({**prov, "date": "2026-11-30T09:00:00Z", "build": "c1b2c3d4e5f6a7b8", "caught": 1,
                  "mutants": whole[:2]}, "mutants", old)
    results.save({**prov, "date": "2026-11-30T11:00:00Z", "build": "d1b2c3d4e5f6a7b8", "caught": 0,
                  "mutants": [{"mutant": suite[2], "bug": "b", **failed}]}, "mutants", old)
    (m,) = build_report(results.load_all(old)).mutants
    assert (m.build, m.caught, m.total, m.partial) == ("d1b2c3d4", 0, 1, True)
    assert m.rows[0][2] == "NOT JUDGED" and "signal 15" in m.rows[0][3]
    assert set(m.not_run) == set(suite) - {suite[2]}  # never filled in from the older record
    assert [h[1:4] for h in m.history] == [("c1b2c3d4", "caught 1 of 2", "not recorded")]
    assert "Not in this record: " in render_md(build_report(results.load_all(old)))
    assert "partial: " in render_html(build_report(results.load_all(old)))


def test_a_sitting_record_says_what_it_did_not_run():
    from harness import mutants

    suite = [m.name for m in mutants.for_backend("numpy")]
    rows = [{"mutant": n, "caught": True} for n in suite]
    rec = mutants.sitting("numpy", ["cpu"], None, rows, "abcd")
    assert (rec["build"], rec["caught"], rec["not_run"], rec["not_judged"], rec["partial"]) == (
        "abcd", len(suite), [], [], False)
    rows[0] = {"mutant": suite[0], "caught": False, "error": "no catalog model has this feature"}
    rec = mutants.sitting("numpy", ["cpu"], ["tiny-llama"], rows[:-1], "abcd")
    assert (rec["not_run"], rec["not_judged"], rec["partial"], rec["models"]) == (
        suite[-1:], suite[:1], True, ["tiny-llama"])
    assert results.check_record({"schema_version": results.SCHEMA_VERSION, "kind": "mutants", **rec}) is None


def test_the_committed_scoreboard_is_what_harness_report_renders():
    """reports/index.html is exactly what `harness report` renders from the
    committed records: a new record, or a change to the report, is committed
    together with the page it makes (run `harness report`), so the
    scoreboard never shows a stale state. The page's text and which figures
    it holds are compared; the figures' SVG is not drawn again here (it
    depends on matplotlib's version, and test_deterministic_self_contained_html
    checks it). The page is all there is: no figure files beside it."""
    from harness import results
    from harness.report import DEFAULT_OUT, build_report, catalog_files, html

    rep = dataclasses.replace(build_report(results.load_all(), catalog_files()), records_href="results")  # the store beside the page
    fresh = html.render_html(rep, draw=lambda f: f"<svg><!-- {f.name} --></svg>")
    committed = html.FIGURE_RE.sub(lambda m: f"{m[1]}<svg><!-- {m[2]} --></svg>{m[3]}", DEFAULT_OUT.read_text())
    assert fresh == committed, "reports/index.html is stale: run `harness report` and commit reports/"
    assert not (DEFAULT_OUT.parent / "figures").exists() or not any((DEFAULT_OUT.parent / "figures").glob("*.png")), \
        "figures are inline now: reports/figures/*.png is left over"


def test_energy_per_token_is_the_measured_windows_power_over_throughput():
    """J/token = mean board power over the measured window ÷ tokens/s: only
    with a window (a whole-run mean holds loading and idle power)."""
    rec = bench("anvil", "alpha-8b", "2026-11-02T00:00:00Z", 18000.0, 250.0)
    s = summary("memory")  # 520 W throughout
    rec["results"][1].update(nvml=s, nvml_window={"start_s": 0.0, "end_s": 1.9, "source": "engine timestamps"})
    rec["results"][0].update(nvml=s)  # no window: not judged
    from harness import report

    pp, tg = [m for _, m in report._bench_measures(rec, {}, {})]
    assert pp.j_per_token is None and tg.j_per_token == pytest.approx(520.0 / 250.0)
    from harness.report.html import fmt_energy

    assert fmt_energy(tg) == "2.08 J" and fmt_energy(pp) == "—"
    import dataclasses

    assert fmt_energy(dataclasses.replace(tg, j_per_token=0.0183)) == "18.3 mJ"


def test_a_files_facts_come_from_whichever_record_states_them_first():
    """Facts are keyed by the file (sha256 and file name): a llama.cpp record
    gets the weight bytes an Anvil record of the same file measured, and
    llama-bench's own n_params / size where Anvil's record has none."""
    from harness.report import _facts, _rate

    anvil = {"date": "2026-01-01T00:00:00Z", "model_sha256": "s1", "model": "/m/a.gguf",
             "weight_bytes_per_token": 4e9, "params_per_token": 7e9, "model_bytes": 5e9}
    later = {**anvil, "date": "2026-01-02T00:00:00Z", "weight_bytes_per_token": 9e9}  # the earlier record wins
    lcpp = {"date": "2026-01-01T00:00:01Z", "model_sha256": "s1", "model": "/other/dir/a.gguf",
            "llama_bench": [{"model_n_params": 8e9, "model_size": 6e9}]}
    other = {"date": "2026-01-01T00:00:02Z", "model": "/m/b.gguf", "llama_bench": [{"model_size": 3e9}]}
    junk = {"date": "2026-01-01T00:00:03Z", "model": "", "llama_bench": "not a list", "model_bytes": 1.0}
    facts = _facts([later, lcpp, other, junk, anvil])
    want = {"n_params": 8e9, "params_per_token": 7e9, "weight_bytes": 4e9, "file_bytes": 5e9}
    assert facts == {"s1": want, "a.gguf": want, "b.gguf": {"file_bytes": 3e9}}
    # the llama.cpp record's tg rate from the Anvil record's weight bytes; by file name alone too
    assert _rate(lcpp, "tg128", 100.0, facts).gb_s == pytest.approx(400.0)
    assert _rate({"model": "x/a.gguf"}, "tg128", 100.0, facts).gb_s == pytest.approx(400.0)
    assert _rate({"model": "x/b.gguf"}, "tg128", 100.0, facts).text == "~300 GB/s"
    assert _rate(lcpp, "pp512", 1000.0, facts).tflop_s == pytest.approx(2 * 7e9 * 1000 / 1e12)
    assert _rate({"model": "x/c.gguf"}, "tg128", 100.0, facts).gb_s is None
    assert _rate({"model_sha256": "s1", "model": "x/renamed.gguf"}, "tg128", 100.0, facts).gb_s == pytest.approx(400.0)
    assert _rate(lcpp, "tg128", 100.0, facts, gb_s=123.0).gb_s == 123.0  # a recorded rate wins
    assert _facts([{"model": "/m/e.gguf", "llama_bench": [], "model_bytes": 2e9}]) == {"e.gguf": {"file_bytes": 2e9}}


def test_parity_rows_from_entries_without_a_verdict_and_llama_cpps_spread_per_variant():
    """An entry with no "passed" is judged by its drift; near-tie flips are the
    flips that were not drift; llama.cpp's spread lists only variants that
    measured a margin shift."""
    from harness.report import _parity

    def rec(date, *entries):
        return {"kind": "validate", "date": date, "results": list(entries)}

    e = dict(tier="cpu", backend="numpy", steps=10, matched=10)
    rows = _parity([rec("2026-01-01", dict(e, model="drifts", drift=[{"step": 1}], flips=3),
                        dict(e, model="flips", flips=3), dict(e, model="one", flips=1),
                        dict(e, model="none", flips=None), dict(e, model="fails", passed=False, flips=0,
                                                                failures=[{"check": "logit"}, {"check": "kl"}]))],
                   [rec("2026-01-01", dict(model="flips", tier="cpu", variant="ubatch-1", max_margin_shift=0.5),
                        dict(model="flips", tier="cpu", variant="flash-attn", max_margin_shift=None),
                        dict(model="flips", tier="cpu", max_margin_shift=0.9))])
    by = {r.model: r for r in rows}
    assert (by["drifts"].ok, by["drifts"].status) == (False, "DRIFT: 1 flip(s) beyond the near-tie threshold")
    assert (by["flips"].ok, by["flips"].status) == (True, "teacher-forced: 3 near-tie flips")
    assert by["one"].status == "teacher-forced: 1 near-tie flip"
    assert by["none"].status == "teacher-forced: 0 near-tie flips"
    assert (by["fails"].ok, by["fails"].status) == (False, "FAIL: kl, logit")
    assert by["flips"].llama_spread == "ubatch-1 0.5" and by["one"].llama_spread is None


def test_parity_rows_carry_every_field_one_row_per_tier_and_backend():
    """Each (model, tier, backend) keeps its own latest row; fields missing from
    an entry come from its record (GPU, driver, tier, backend), then '?'."""
    from harness.report import Parity, _parity

    gpu = {"kind": "validate", "date": "2026-01-02", "_path": "/s/validate-2.json", "build": "b2",
           "gpu": "NVIDIA H200", "driver": "580.1", "backend": "cuda", "tier": "gpu",
           "results": [{"model": "m", "mode": "teacher-forced", "passed": True, "flips": 2, "matched": 7,
                        "steps": 64, "max_logit_diff": 0.3, "near_tie": 0.9, "max_margin_shift": 0.4,
                        "agreement": 60, "max_kl": 0.01}]}
    cpu = {"kind": "validate", "date": "2026-01-01", "build": "b1", "version": "0.1",
           "results": [{"model": "m", "tier": "gpu", "backend": "numpy", "mode": "exact", "passed": True},
                       {"model": "m", "tier": "cpu", "backend": "cuda", "passed": False}]}
    rows = _parity([gpu, cpu])
    assert rows == [
        Parity("m", "cpu", "cuda", "DRIFT: 0 flip(s) beyond the near-tie threshold", False, "?/?", None, None,
               "GPU not recorded, 2026-01-01, build b1 / 0.1; (unsaved record)", None, None, "—", None, "",
               "2026-01-01"),
        Parity("m", "gpu", "cuda", "teacher-forced: 2 near-tie flips", True, "7/64", 0.3, 0.9,
               "NVIDIA H200, driver 580.1, 2026-01-02, build b2; validate-2.json", 0.4, None, "60/64", 0.01,
               "validate-2.json", "2026-01-02"),
        Parity("m", "gpu", "numpy", "exact", True, "?/?", None, None,
               "CPU run, 2026-01-01, build b1 / 0.1; (unsaved record)", None, None, "—", None, "", "2026-01-01")]


def test_history_figure_plots_every_record_on_a_time_axis_and_marks_the_ab_results(store, tmp_path):
    d = tmp_path / "more"
    d.mkdir()
    for p in store.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    results.save(bench("anvil", "alpha-8b", "2026-11-25T10:00:00Z", 18500.0, 250.0, build="new2"), "bench", d)
    rep = build_report(results.load_all(d))
    (sec,) = [m for m in rep.models if m.name == "alpha-8b"]
    (fig,) = [f for f in sec.figures if f.name == "history-alpha-8b"]
    data = dict(fig.data)
    assert data["x"] == "date"
    (pp, tg) = data["panels"]
    assert pp[0] == "prefill t/s" and tg[0] == "decode t/s"
    series = dict(tg[1])
    assert series["Anvil tg128"] == (("2026-11-01T10:00:00Z", 200.0), ("2026-11-20T10:00:00Z", 240.0),
                                     ("2026-11-25T10:00:00Z", 250.0))
    assert series["llama.cpp tg128"] == (("2026-11-01T10:00:00Z", 250.0), ("2026-11-20T10:00:00Z", 260.0))
    # the A/B lane: every A/B test of the model, by date, verdict and ratio
    (ab_test,) = [t for t in rep.ab if t.model == "alpha-8b" and t.test == "tg128"]
    assert (ab_test.date, ab_test.verdict, f"tg128 {ab_test.ratio:.3f}×") in data["ab"]
    svg = figures.render(fig)
    assert svg_ok(svg) and "A/B: faster" in svg and "date measured (UTC)" in svg
    assert f'data-fig="{fig.name}"' in render_html(rep)
    # one date only: no line to draw
    one = tmp_path / "one"
    results.save(bench("anvil", "gamma-1b", "2026-11-01T10:00:00Z", 1.0, 2.0), "bench", one)
    (sec1,) = build_report(results.load_all(one)).models
    assert sec1.figures == ()


def test_ab_markers_take_lanes_so_none_overlap():
    from harness.report.figures import _lanes

    # markers closer than the gap go to the next free lane; a lane is reused once the gap has passed
    assert _lanes([0.0, 0.1, 0.2, 1.5, 1.55, 3.0], gap=1.0) == [0, 1, 2, 0, 1, 0]


def test_depth_figure_is_one_build_of_one_sitting(tmp_path):
    """A depth curve joins the depths one build measured in one sitting:
    a newer record of another build at one depth is never drawn into it."""
    d = tmp_path / "results"
    for engine, tg0, tg4, tg16 in (("anvil", 300.0, 280.0, 240.0), ("llama.cpp", 260.0, 250.0, 200.0)):
        rec = bench(engine, "alpha-8b", "2026-11-20T10:00:00Z", 15000.0, tg0, sitting="s1")
        rec["results"] += [{"test": f"tg128 @ d{dd}", "samples_tok_s": [v] * 5, "tok_s_mean": v, "tok_s_sd": 1.0}
                           for dd, v in ((4096, tg4), (16384, tg16))]
        results.save(rec, "bench", d)
    # a day later, another build, depth 0 only, with llama.cpp beside it
    results.save(bench("anvil", "alpha-8b", "2026-11-21T10:00:00Z", 16000.0, 330.0, build="b1", sitting="s2"),
                 "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-21T10:00:05Z", 9000.0, 261.0, sitting="s2"), "bench", d)
    rep = build_report(results.load_all(d))
    assert row(rep, "alpha-8b", "tg128").anvil.tok_s == 330.0  # the scoreboard's depth-0 row is the newer build
    (sec,) = rep.models
    (fig,) = [f for f in sec.figures if f.name == "depth-alpha-8b"]
    data = dict(fig.data)
    assert data["x"] == "depth"
    ((title, series, marks),) = data["panels"]  # pp512 has no depth test: no prefill curve
    assert title == "decode t/s" and marks == ()
    assert dict(series) == {"Anvil tg128 · build b0, 2026-11-20": ((0, 300.0), (4096, 280.0), (16384, 240.0)),
                            "llama.cpp tg128 · build b0, 2026-11-20": ((0, 260.0), (4096, 250.0), (16384, 200.0))}
    assert svg_ok(figures.render(fig))


def test_peak_memory_and_the_cuda_stack_on_the_scoreboard(tmp_path):
    d = tmp_path / "results"
    a = bench("anvil", "alpha-8b", "2026-11-20T10:00:00Z", 15000.0, 300.0, peak_device_bytes=19_311_656_620,
              cuda_driver="13.0", nvrtc="12.9", cublas="12.9.1")
    results.save(a, "bench", d)
    results.save(bench("llama.cpp", "alpha-8b", "2026-11-20T10:00:00Z", 9000.0, 250.0), "bench", d)
    rep = build_report(results.load_all(d))
    r = row(rep, "alpha-8b", "tg128")
    assert r.anvil.peak_bytes == 19_311_656_620 and r.llamacpp.peak_bytes is None
    assert r.anvil.stack == "CUDA driver API 13.0, NVRTC 12.9, cuBLAS 12.9.1" and r.llamacpp.stack == ""
    assert "CUDA driver API 13.0, NVRTC 12.9" in r.anvil.provenance
    html = render_html(rep)
    assert "19.3 GB" in html and "peak device memory" in html and "cuBLAS 12.9.1" in html
    assert "19.3 GB" in render_md(rep)


def test_engine_bench_records_the_cuda_stack_it_can_load():
    from engine.bench import cuda_versions

    v = cuda_versions()
    assert set(v) == {"cuda_driver", "nvrtc", "cublas"}
    assert v["nvrtc"] and re.fullmatch(r"\d+\.\d+", v["nvrtc"])  # NVRTC loads without a GPU (the kernel tests need it)
    assert all(x is None or re.fullmatch(r"\d+\.\d+(\.\d+)?", x) for x in v.values())


def test_the_scoreboard_links_each_number_to_its_record():
    """Every provenance link of the committed page opens a committed record,
    and every scoreboard row links its records."""
    import re as _re

    from harness.report import DEFAULT_OUT

    page = DEFAULT_OUT.read_text()
    links = _re.findall(r'href="(results/[^"]+\.json)"', page)
    assert links and all((DEFAULT_OUT.parent / link).is_file() for link in links)
    rows = page.count("<tr><td title=\"spec ")  # a scoreboard row
    assert rows and len(links) >= rows


def test_the_readme_speed_table_is_what_the_records_say():
    """The README's speed numbers are generated from the committed records
    (`harness report --readme`), so they cannot disagree with the
    scoreboard; a stale table fails here."""
    from harness import project, report, results
    from harness.report import html

    rep = report.build_report(results.load_all())
    readme = (project.ROOT / "README.md").read_text()
    assert html.update_readme(readme, html.render_readme_table(rep)) == readme, \
        "README.md's speed table is stale: run `harness report --readme`"
    table = html.render_readme_table(rep)
    assert "| qwen3-8b | tg128 |" in table and table.count("| qwen3-8b | tg128 |") == 1  # the newest pair only
    row = next(r for r in rep.rows if (r.model, r.test) == ("qwen3-8b", "tg128") and r.ratio is not None
               and r.anvil.file in table)
    (line,) = [ln for ln in table.splitlines() if row.anvil.file in ln and "| tg128 |" in ln]
    assert f"| {row.anvil.n} / {row.llamacpp.n} |" in line  # the repetitions each side ran
    with pytest.raises(ValueError, match="no speed-table block"):
        html.update_readme("# a README without the block\n", table)


def test_short_build_names_for_the_provenance_cell():
    """The narrow provenance cell names each build in a few words; the whole
    string stays in its tooltip."""
    from harness.report.html import fmt_short_build

    assert fmt_short_build("06212ade61dee98f") == "06212ade"
    assert fmt_short_build("version: 0.5.0-dev (build 0, commit unknown) · llama.cpp vendored in "
                           "llama_cpp_python-0.3.36 (sdist sha256 fb24142482634983)") == "(llama-cpp-python 0.3.36)"
    assert fmt_short_build("version: 0.5.0-dev (build 12, commit abcdef1234)") == "0.5.0-dev abcdef12"
    assert fmt_short_build("version: 0.5.0-dev (build 0, commit unknown)") == "0.5.0-dev"
    assert fmt_short_build("b1 / 0.1") == "b1 / 0.1"


# ---- the summary, the one selection, change-points, rooflines ---------------------

def save_pair(d, date, build, model_sha, tests, *, validated, sitting, scale=1.0):
    """One sitting: Anvil and llama.cpp on ``tests`` ({test: (anvil, llama.cpp) tok/s}), and the build's gate."""
    for engine, i, b in (("anvil", 0, build), ("llama.cpp", 1, "llama-cpp-python 0.3.36")):
        rec = bench(engine, "alpha-8b", date, 1.0, 1.0, build=b, model_sha256=model_sha, sitting=sitting)
        rec["results"] = [{"test": t, "samples_tok_s": [v[i] * scale] * 5, "tok_s_mean": v[i] * scale,
                           "tok_s_sd": 1.0} for t, v in tests.items()]
        results.save(rec, "bench", d)
    if validated:
        results.save({"engine": "anvil", "build": build, "backend": "cuda", "gpu": H200, "date": date,
                      "results": [{"model": "alpha-8b", "tier": "gpu", "backend": "cuda", "passed": True,
                                   "steps": 32, "mode": "exact"}]}, "validate", d)


FOUR = {"pp512": (18000.0, 9500.0), "tg128": (470.0, 260.0), "pp4096": (30000.0, 9600.0),
        "tg128 @ d4096": (380.0, 240.0)}


def test_the_summary_is_one_row_per_model_of_the_rows_own_numbers(tmp_path):
    d = tmp_path / "r"
    save_pair(d, "2026-12-01T10:00:00Z", "b1", "sha-a", FOUR, validated=True, sitting="s1")
    results.save(roofline_record(), "roofline", d)
    rep = build_report(results.load_all(d))
    (s,) = rep.summary
    assert (s.model, s.gpu) == ("alpha-8b", H200)
    assert [c.test for c in s.cells] == ["pp512", "tg128", "pp4096", "tg128 @ d4096"]
    assert all(c is row(rep, "alpha-8b", c.test) and c.validated for c in s.cells)  # the scoreboard's own rows
    tg = s.cells[1]
    assert tg.ratio == pytest.approx(470 / 260) and tg.anvil.rate.roofline == pytest.approx(WEIGHT_BYTES * 470 / 1e9
                                                                                            / 4300)
    html = render_html(rep)
    assert html.index('id="summary"') < html.index('id="scoreboard"')  # first on the page
    summary = html[html.index('id="summary"'):html.index('id="scoreboard"')]
    assert summary.count('<span class="ok-mark"') == 1 + 4  # the legend's, and one per test
    assert ">1.81× <span class=\"ok-mark\"" in summary and ">51%</td>" in summary  # 2196 of 4300 GB/s


def test_one_row_per_model_and_test_after_the_model_file_changed(tmp_path):
    """A regenerated model file is another spec: the row (and the summary)
    takes the newest validated sitting, whichever file it ran; the older
    file's records are not a second row, nor the history's first record."""
    d = tmp_path / "r"
    save_pair(d, "2026-11-29T10:00:00Z", "b0", "sha-old", FOUR, validated=True, sitting="s0", scale=0.5)
    save_pair(d, "2026-12-01T10:00:00Z", "b1", "sha-new", FOUR, validated=True, sitting="s1")
    save_pair(d, "2026-12-02T10:00:00Z", "b2", "sha-new", FOUR, validated=True, sitting="s2", scale=1.1)
    save_pair(d, "2026-12-03T10:00:00Z", "b3", "sha-new", FOUR, validated=False, sitting="s3", scale=1.2)
    rep = build_report(results.load_all(d))
    tg = [r for r in rep.rows if (r.model, r.test) == ("alpha-8b", "tg128")]
    assert len(tg) == 1 and (tg[0].anvil.build, tg[0].anvil.tok_s) == ("b2", pytest.approx(517.0))
    assert tg[0].newer_unvalidated[0].build == "b3"
    (h,) = [h for h in rep.history if (h.model, h.test, h.engine) == ("alpha-8b", "tg128", "anvil")]
    assert h.latest is tg[0].anvil and h.first.build == "b1" and h.n_records == 3 and h.newer == 1
    assert [c.before + ">" + c.after for c in h.changes] == ["b1>b2", "b2>b3"]
    board = render_md(rep).split("## Scoreboard")[1].split("## History")[0]
    assert board.count("| alpha-8b | tg128 |") == 1


def test_change_point_labels():
    from harness.report import changes

    base = [100.0, 101.0, 99.0, 100.5, 100.2]
    assert changes.label(base, [x * 0.9 for x in base]) == (changes.REGRESSION, pytest.approx(0.0079, abs=1e-4))
    assert changes.label(base, [x * 1.1 for x in base])[0] == changes.IMPROVEMENT
    assert changes.label(base, [x * 1.01 for x in base])[0] == changes.NO_CHANGE
    assert changes.label(base, [x * 0.97 for x in base])[0] == changes.SUSPICIOUS  # real, but within the factor
    assert changes.label(base, [90.0, 91.0, 120.0, 89.0, 115.0])[0] == changes.SUSPICIOUS  # beyond, not significant
    assert changes.label(base[:3], [x * 0.5 for x in base])[0] == changes.INSUFFICIENT  # 3 repetitions: no p < 0.05
    pts = [SimpleNamespace(build=b, date=f"2026-12-0{i}", samples=tuple(x * f for x in base))
           for i, (b, f) in enumerate((("b1", 1.0), ("b1", 1.0), ("b2", 0.9), ("b3", 0.9)), start=1)]
    got = changes.change_points(pts)
    assert [(c.before, c.after, c.date, c.label, c.n) for c in got] == [
        ("b1", "b2", "2026-12-03", changes.REGRESSION, (10, 5)), ("b2", "b3", "2026-12-04", changes.NO_CHANGE, (5, 5))]
    assert got[0].text.startswith("regression: 0.900× (10 vs 5 repetitions, p ")


def test_a_gpu_without_a_roofline_record_has_none_on_the_page(tmp_path):
    """The roofline is the newest record of the bench record's own GPU: an
    A100's does not make an H200's number a share of anything."""
    d = tmp_path / "r"
    save_pair(d, "2026-12-01T10:00:00Z", "b1", "sha-a", FOUR, validated=True, sitting="s1")
    results.save(roofline_record(gpu="NVIDIA A100", copy=1500.0, gemm=300.0), "roofline", d)
    rep = build_report(results.load_all(d))
    tg = row(rep, "alpha-8b", "tg128")
    assert tg.anvil.rate.gb_s and tg.anvil.rate.roofline is None and tg.anvil.rate.ceiling is None
    assert "no roofline measured" in tg.anvil.diagnosis.sentence
    html = render_html(rep)
    assert ">no roofline</td>" in html and "1500 GB/s copy, 300 TFLOP/s bf16 on NVIDIA A100" in html
    # a newer record of the H200 is what its numbers are read against
    results.save(roofline_record(copy=4000.0, date="2026-11-01T08:00:00Z"), "roofline", d)
    results.save(roofline_record(copy=4400.0, date="2026-11-02T08:00:00Z"), "roofline", d)
    tg = row(build_report(results.load_all(d)), "alpha-8b", "tg128")
    assert tg.anvil.rate.ceiling.copy_gb_s == 4400.0


# ---- records from many GPUs and hosts on one scoreboard ---------------------------------

def test_two_stores_on_one_scoreboard_a_record_in_both_once(tmp_path, capsys):
    """`harness report --results-dir A --results-dir B`: the stores of two
    hosts merged, a record copied into both (same name, or same content
    under another name) shown once; the page then links no store."""
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    save_pair(a, "2026-12-01T10:00:00Z", "b1", "sha-a", FOUR, validated=True, sitting="s1")
    shared = results.save(roofline_record(), "roofline", a)
    b.mkdir()
    shutil.copy(shared, b / shared.name)  # the same file in both stores
    shutil.copy(shared, b / shared.name.replace("roofline-", "roofline-copy-"))  # ...and under another name
    save_pair(b, "2026-12-02T10:00:00Z", "b2", "sha-a", FOUR, validated=True, sitting="s2",
              scale=1.1)
    out = tmp_path / "page" / "index.html"
    args = SimpleNamespace(format="html", out=str(out), results_dir=[str(a), str(b)])
    assert main_report(args) == 0
    assert re.search(rf"read 7 record\(s\) from {a}, {b}", capsys.readouterr().err)  # 3 + 3 bench/validate, 1 roofline
    page = out.read_text()
    assert "from 7 result\nrecords" in page and 'href="results/' not in page and "<a href=\"../" not in page
    records = results.load_all(a) + results.load_all(b)
    from harness.report import merge_stores

    merged = merge_stores([results.load_all(a), results.load_all(b)])
    assert len(records) == 9 and len(merged) == 7 and [r["date"] for r in merged] == sorted(r["date"] for r in merged)
    assert row(build_report(merged), "alpha-8b", "tg128").anvil.build == "b2"  # the newest sitting of both stores
    with pytest.raises(AnvilError, match="no such results directory"):
        main_report(SimpleNamespace(format="md", out=None, results_dir=[str(a), str(tmp_path / "nope")]))


def test_a_section_per_kind_of_gpu_and_ratios_only_within_one(tmp_path):
    """Records of an H200 and an A100 (one store, or merged): the summary
    has a section per GPU named in its heading, a model's scoreboard a table
    per GPU; a ratio is only ever of one GPU's two engines."""
    d = tmp_path / "r"
    save_pair(d, "2026-12-01T10:00:00Z", "b1", "sha-a", FOUR, validated=True, sitting="s1")
    a100 = "NVIDIA A100-SXM4-80GB"
    for engine, tg in (("anvil", 200.0), ("llama.cpp", 160.0)):
        results.save(bench(engine, "alpha-8b", "2026-12-01T11:00:00Z", 9000.0, tg, build="b1" if engine == "anvil"
                           else "llama-cpp-python 0.3.36", gpu=a100, model_sha256="sha-a", sitting="s9"), "bench", d)
    results.save(bench("anvil", "beta-3b", "2026-12-01T11:05:00Z", 9000.0, 150.0, gpu=a100, sitting="s9"), "bench", d)
    rep = build_report(results.load_all(d))
    assert [(g, [s.model for s in rows]) for g, rows in rep.summary_by_gpu] == [
        (a100, ["alpha-8b", "beta-3b"]), (H200, ["alpha-8b"])]
    tg = {r.gpu: r for r in rep.rows if (r.model, r.test) == ("alpha-8b", "tg128")}
    assert tg[a100].ratio == pytest.approx(200 / 160) and tg[H200].ratio == pytest.approx(470 / 260)
    assert tg[a100].llamacpp.gpu == a100 and tg[H200].llamacpp.gpu == H200
    (alpha,) = [m for m in rep.models if m.name == "alpha-8b"]
    assert [g for g, _ in alpha.rows_by_gpu] == [a100, H200]
    html = render_html(rep, draw=lambda f: "<svg></svg>")
    summary = html[html.index('id="summary"'):html.index('id="scoreboard"')]
    assert '<h3 id="summary-nvidia-a100-sxm4-80gb">NVIDIA A100-SXM4-80GB</h3>' in summary
    assert summary.index(a100) < summary.index('<h3 id="summary-nvidia-h200">NVIDIA H200</h3>')
    board = html[html.index('id="model-alpha-8b"'):html.index('id="model-beta-3b"')]
    assert board.count('<table class="scores">') == 2 and f"<h4>{a100}</h4>" in board and f"<h4>{H200}</h4>" in board
    beta = html[html.index('id="model-beta-3b"'):html.index('id="figures"')]
    assert beta.count('<table class="scores">') == 1 and "<h4>" not in beta  # one GPU: no sub-heading
    md = render_md(rep).split("## Scoreboard")[0]
    assert md.index(f"### {a100}") < md.index("| beta-3b |") < md.index(f"### {H200}")


def test_a_validation_run_on_one_gpu_of_several_backs_only_that_gpus_figures(tmp_path):
    """harness validate-catalog --gpus/--ray: each entry names its own GPU and
    host; a speed figure is backed by an entry of its own GPU and host."""
    from harness.report.validated import backing

    b = bench("anvil", "alpha-8b", "2026-12-01T10:10:00Z", 1.0, 1.0, build="b1", host="node-2")
    entry = {"model": "alpha-8b", "tier": "gpu", "backend": "cuda", "passed": True, "steps": 32, "mode": "exact"}
    v = {"engine": "anvil", "build": "b1", "backend": "cuda", "gpu": H200, "host": "node-1",
         "date": "2026-12-01T10:00:00Z", "_path": "/r/validate-x.json",
         "results": [{**entry, "gpu_index": 3, "gpu": H200, "host": "node-2"}]}
    assert backing(b, "alpha-8b", [v]).ok  # the record's host is the driver's; the entry's is where it ran
    v["results"][0]["host"] = "node-3"
    assert backing(b, "alpha-8b", [v]).note.endswith("only on another GPU or host")
    v["results"][0].update(host="node-2", gpu="NVIDIA A100")
    assert not backing(b, "alpha-8b", [v]).ok
    v["results"][0].pop("gpu"), v["results"][0].pop("host")  # a single-process record: its own GPU and host
    v["host"] = "node-2"
    assert backing(b, "alpha-8b", [v]).ok
