"""harness ab's verdict against the noise band (harness/noise.py): a steady
2% regression is "slower" (exit 1), an A/A is never flagged, the band
comes from the newest A/A record of the same GPU, backend and test, and
falls back, labelled, to the run's own spread."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness import ab, cli, noise, results, stats
from harness.commands import common
from harness.runners import RunResult

H200 = {"backend": "cuda", "gpu": "NVIDIA H200"}
NOISE = 0.003  # a run's tok/s scatters ±0.3% (sd) around its build's speed: an H200's decode


class NoisyRunner:
    """A build of a given speed whose every run is off by NOISE at random."""

    def __init__(self, label, speed, rng, sha, raw=H200):
        self.label, self.speed, self.rng, self.sha, self.raw = label, speed, rng, sha, dict(raw)

    def prepare(self):
        pass

    def describe(self):
        return {"kind": "fake", "label": self.label, "sha256": self.sha, "build": self.sha[:8]}

    def run(self, model, **kw):
        v = self.speed * (1 + self.rng.normal(0, NOISE))
        return RunResult(tests={"tg128": [v, v]}, tokens=[1, 2], raw=self.raw, wall_s=0.1, cmd=["fake"], returncode=0)


def _arms(monkeypatch, seed, slowdown, raw=H200):
    rng = np.random.default_rng(seed)
    arms = iter([NoisyRunner("A", 400.0, rng, "a" * 64, raw),
                 NoisyRunner("B", 400.0 * (1 - slowdown), rng, "b" * 64, raw)])
    monkeypatch.setattr(ab, "make_runner", lambda spec, workdir: next(arms))


def _ab(monkeypatch, tmp_path, seed, slowdown, store, **cfg):
    _arms(monkeypatch, seed, slowdown)
    config = ab.ABConfig(model=tmp_path / "m.gguf", rounds=8, identity={"model_name": "qwen3-8b"}, **cfg)
    return ab.run_ab("a.whl", "b.whl", config, tmp_path, results_dir=store, save=bool(cfg.get("aa")))


def test_the_verdict_rule():
    """The whole CI beyond the band, and the majority of rounds for that arm."""
    assert stats.band_verdict(0.975, 0.985, 0.01, "A") == stats.SLOWER
    assert stats.band_verdict(0.975, 0.991, 0.01, "A") == stats.SAME  # the CI reaches into the band
    assert stats.band_verdict(0.975, 0.985, 0.01, None) == stats.SAME  # the rounds do not agree
    assert stats.band_verdict(1.015, 1.02, 0.01, "B") == stats.FASTER
    assert stats.band_verdict(1.015, 1.02, 0.01, "A") == stats.SAME
    assert stats.band_verdict(0.975, 0.985, 0.01, "A", factor=1.05) == stats.SAME  # --factor: beyond it too
    assert stats.ratio_spread([(100.0, 101.0), (100.0, 99.0)]) == pytest.approx(np.std([1.01, 0.99], ddof=1))


@pytest.mark.parametrize("seed", range(10))
def test_a_steady_2pct_slowdown_is_slower_and_exits_1(monkeypatch, tmp_path, capsys, seed):
    """The regression the old rule (beyond 1.05x) let through, with no A/A
    record yet: the default band from the run's own spread, said so."""
    _arms(monkeypatch, seed, 0.02)
    monkeypatch.setattr(common, "model",
                        lambda name, check_only=False: None if check_only else (tmp_path / "m.gguf", {}))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path)
    assert cli.main(["ab", "a.whl", "b.whl", "--results-dir", str(tmp_path / "store")]) == 1
    out, err = capsys.readouterr()
    assert "| slower |" in out and "slower: tg128: exit status 1" in err
    assert "noise band of tg128: default: 2 sd of this run's per-round B/A (no A/A record" in out
    assert "measured: cuda on NVIDIA H200" in out and "A: A (build aaaaaaaa)  B: B (build bbbbbbbb)" in out


def test_an_aa_is_never_flagged(monkeypatch, tmp_path):
    """One build against itself, 150 times with the default band and 150
    with a band an earlier A/A measured: never "slower" or "faster"; a 2%
    regression is found under the same band every time."""
    store = tmp_path / "store"
    aa = _ab(monkeypatch, tmp_path, 1000, 0.0, store, aa=True, allow_same=True)
    band = aa["noise_band"]["tg128"]
    assert aa["aa"] and 0 < band < 0.01 and aa["path"]
    for seed in range(150):
        assert _ab(monkeypatch, tmp_path, seed, 0.0, tmp_path / "empty")["analysis"]["tg128"]["verdict"] == stats.SAME
        t = _ab(monkeypatch, tmp_path, seed, 0.0, store)["analysis"]["tg128"]
        assert t["verdict"] == stats.SAME and t["band"]["source"] == "aa", seed
    for seed in range(20):
        t = _ab(monkeypatch, tmp_path, seed, 0.02, store)["analysis"]["tg128"]
        assert t["verdict"] == stats.SLOWER and t["band"]["band"] == band, seed


def _aa_record(store, date, gpu, test, band, backend="cuda", model="qwen3-8b"):
    rec = {"date": date, "model": f"/m/{model}.gguf", "model_name": model, "aa": True, "complete": True,
           "backend": backend, "gpu": gpu, "device": gpu, "arms": {}, "rounds": [], "measured_rounds": 8,
           "noise_band": {test: band}}
    return results.save(rec, "ab", store).name


def test_band_lookup_picks_the_newest_aa_record_of_the_same_gpu_backend_and_test(tmp_path):
    store = tmp_path / "store"
    old = _aa_record(store, "2026-12-01T00:00:00Z", "NVIDIA H200", "tg128", 0.004)
    new = _aa_record(store, "2026-12-02T00:00:00Z", "NVIDIA H200", "tg128", 0.005)
    _aa_record(store, "2026-12-03T00:00:00Z", "NVIDIA H100 80GB HBM3", "tg128", 0.02)  # another GPU
    _aa_record(store, "2026-12-03T00:00:00Z", "NVIDIA H200", "pp512", 0.03)  # another test
    _aa_record(store, "2026-12-03T00:00:00Z", "NVIDIA H200", "tg128", 0.04, backend="numpy")  # another backend
    other = _aa_record(store, "2026-12-04T00:00:00Z", "NVIDIA H200", "tg128", 0.006, model="llama3-8b")
    # an A/B of two builds is no A/A, however alike they measured
    results.save({"date": "2026-12-05T00:00:00Z", "model": "m", "model_name": "qwen3-8b", "backend": "cuda",
                  "device": "NVIDIA H200", "arms": {}, "rounds": [], "measured_rounds": 8,
                  "noise_band": {"tg128": 0.5}}, "ab", store)
    find = lambda **kw: noise.find(store, **{"device": "NVIDIA H200", "backend": "cuda", "test": "tg128", **kw})
    assert (find(model="qwen3-8b")["band"], find(model="qwen3-8b")["record"]) == (0.005, new)  # same model first
    assert (find(model="gemma3-270m")["band"], find(model="gemma3-270m")["record"]) == (0.006, other)  # else newest
    assert find(test="pp512")["band"] == 0.03 and find(backend="numpy")["band"] == 0.04
    assert find(device="NVIDIA H100 80GB HBM3")["band"] == 0.02
    assert find(test="tg128 @ d4096") is None and find(device="NVIDIA A100") is None and find(device=None) is None
    assert old != new and "A/A record " + new in find(model="qwen3-8b")["said"]


def test_aa_command_saves_the_band_a_later_ab_is_judged_by(monkeypatch, tmp_path, capsys):
    """`harness ab --aa WHEEL` runs the build against itself and keeps the
    band; the next `harness ab` on that GPU names that record as its band."""
    monkeypatch.setattr(common, "model", lambda name, check_only=False:
                        None if check_only else (tmp_path / "m.gguf", {"model_name": "qwen3-8b"}))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path)
    store = str(tmp_path / "store")
    specs = []
    rng = np.random.default_rng(7)
    monkeypatch.setattr(ab, "make_runner", lambda spec, workdir: specs.append(spec) or
                        NoisyRunner("A", 400.0, rng, "a" * 64))
    assert cli.main(["ab", "--aa", "base.whl", "--results-dir", store]) == 0
    assert specs == ["base.whl", "base.whl"]
    out = capsys.readouterr().out
    (saved,) = results.load_all(store, kind="ab")
    assert saved["aa"] and set(saved["noise_band"]) == {"tg128"} and saved["device"] == "NVIDIA H200"
    assert f"A/A: the noise band this run measured: tg128 ±{saved['noise_band']['tg128']:.2%}" in out
    from harness.report import build_report

    assert [t.notes.split(";")[0] for t in build_report([saved]).ab] == ["A/A: measures the noise band"]
    _arms(monkeypatch, 8, 0.02)
    assert cli.main(["ab", "a.whl", "b.whl", "--results-dir", store]) == 1
    out = capsys.readouterr().out
    assert f"noise band of tg128: A/A record {saved['_path'].split('/')[-1]} (qwen3-8b, " in out
    assert "(aa) | 0:8 |" in out and "| slower |" in out
    for argv in (["ab", "--aa", "a.whl", "b.whl"], ["ab", "a.whl"]):  # one arm with --aa, two without
        assert cli.main(argv) != 0
    assert "--aa measures one build against itself" in capsys.readouterr().err


def test_numpy_runs_say_the_numpy_engine_and_the_cpu(monkeypatch, tmp_path):
    """On a CPU the device is this machine's CPU, the backend the NumPy engine, spelled out."""
    from harness import provenance

    _arms(monkeypatch, 3, 0.0, raw={"backend": "numpy", "gpu": None})
    rec = ab.run_ab("a.whl", "b.whl", ab.ABConfig(model=tmp_path / "m.gguf", rounds=4), tmp_path,
                    results_dir=tmp_path / "store")
    assert (rec["backend"], rec["gpu"], rec["device"]) == ("numpy", None, provenance.cpu_name())
    assert rec["builds"] == {"A": "aaaaaaaa", "B": "bbbbbbbb"}
    assert f"measured: numpy (the NumPy engine) on the CPU: {provenance.cpu_name()}" in ab.format_report(rec)
    saved = json.loads(next((tmp_path / "store").glob("ab-*.json")).read_text())
    assert (saved["backend"], saved["device"], saved["builds"]["B"]) == ("numpy", provenance.cpu_name(), "bbbbbbbb")
