"""harness ab: ABBA order, cold round dropped, identical builds refused,
token identity enforced, Ctrl-C keeps completed rounds, and an end-to-end
A/B of two real engine wheels (NumPy backend) on a tiny model."""

from __future__ import annotations

import json

import pytest

from engine.errors import AnvilError
from harness import ab, results
from harness.runners import RunResult


def test_abba_order():
    assert ab.abba_order(4) == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


class FakeRunner:
    """Scripted runs: tok/s per call, fixed tokens; optional Ctrl-C at call n."""

    def __init__(self, label, speed, tokens=(1, 2, 3), interrupt_at=None, sha="0" * 64, raw=None):
        self.label, self.speed, self.tokens, self.interrupt_at, self.sha = label, speed, list(tokens), interrupt_at, sha
        self.calls, self.raw = 0, raw or {}

    def prepare(self):
        pass

    def describe(self):
        return {"kind": "fake", "label": self.label, "sha256": self.sha}

    def run(self, model, **kw):
        self.calls += 1
        if self.interrupt_at == self.calls:
            raise KeyboardInterrupt
        v = self.speed(self.calls)
        return RunResult(tests={"pp8": [v, v], "tg4": [v / 10, v / 10]}, tokens=self.tokens, raw=self.raw, wall_s=0.1,
                         cmd=["fake"], returncode=0)


def _fake(monkeypatch, a, b):
    runners = iter([a, b])
    monkeypatch.setattr(ab, "make_runner", lambda spec, workdir: next(runners))


def _cfg(tmp_path, **kw):
    return ab.ABConfig(model=tmp_path / "m.gguf", rounds=6, **kw)


def test_cold_round_dropped_and_verdict(monkeypatch, tmp_path):
    # A's first (cold) run is absurdly slow: it must not count
    a = FakeRunner("A", lambda n: 10.0 if n == 1 else 100.0 + n % 2, sha="a" * 64)
    b = FakeRunner("B", lambda n: 120.0 + n % 3, sha="b" * 64)
    _fake(monkeypatch, a, b)
    rec = ab.run_ab("a.whl", "b.whl", _cfg(tmp_path), tmp_path, results_dir=tmp_path / "res")
    assert a.calls == b.calls == 7  # 6 rounds + the cold one
    assert [r["order"] for r in rec["rounds"][:4]] == ["AB", "BA", "AB", "BA"]
    t = rec["analysis"]["pp8"]
    assert t["A"]["n"] == 6 and min(t["A"]["median"], t["A"]["p90"]) > 99
    # the 10 t/s run is the cold round's, and only the other rounds are analysed (n above)
    cold = [r for r in rec["rounds"] if r["cold"]]
    assert len(cold) == 1 and max(cold[0]["runs"]["A"]["tests"]["pp8"]) < 11
    assert t["verdict"] == "faster" and t["wins"]["B"] == 6
    saved = json.loads((tmp_path / "res").glob("ab-*.json").__next__().read_text())
    assert saved["kind"] == "ab" and saved["complete"] and saved["tokens_identical"]
    assert ab.slower_tests(rec) == []
    report = ab.format_report(rec)  # the rule, stated, and the band that judged each test
    assert "the whole 95% CI of B/A lies beyond the test's noise band" in report
    assert "noise band of pp8, tg4: default: 2 sd of this run's per-round B/A" in report


@pytest.mark.parametrize("allow", [False, True])
def test_a_slower_candidate_fails_the_command(monkeypatch, tmp_path, capsys, allow):
    """harness ab can gate CI: exit 1 when a test's verdict is "slower"
    (--allow-slower: 0), naming the tests."""
    from harness import cli
    from harness.commands import common

    _fake(monkeypatch, FakeRunner("A", lambda n: 120.0 + n % 3, sha="a" * 64),
          FakeRunner("B", lambda n: 100.0 + n % 2, sha="b" * 64))
    monkeypatch.setattr(common, "model", lambda name, check_only=False: None if check_only else (tmp_path / "m.gguf", {}))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path)
    argv = ["ab", "a.whl", "b.whl", "--rounds", "6", "--results-dir", str(tmp_path / "res")]
    assert cli.main(argv + (["--allow-slower"] if allow else [])) == (0 if allow else 1)
    out, err = capsys.readouterr()
    assert out.count("| slower |") == 2
    assert ("slower: pp8, tg4: exit status 1" in err) != allow


def test_identical_builds_refused(monkeypatch, tmp_path):
    _fake(monkeypatch, FakeRunner("A", lambda n: 1.0), FakeRunner("B", lambda n: 1.0))
    with pytest.raises(AnvilError, match="same build"):
        ab.run_ab("a.whl", "a.whl", _cfg(tmp_path), tmp_path, results_dir=tmp_path)


def test_token_difference_fails_loudly(monkeypatch, tmp_path):
    _fake(monkeypatch, FakeRunner("A", lambda n: 1.0, tokens=[5, 6, 7], sha="a" * 64),
          FakeRunner("B", lambda n: 1.0, tokens=[5, 9, 7], sha="b" * 64))
    with pytest.raises(AnvilError, match="different greedy tokens from step 1"):
        ab.run_ab("a.whl", "b.whl", _cfg(tmp_path), tmp_path, results_dir=tmp_path / "res")
    rec = results.load_all(tmp_path / "res", kind="ab")[0]
    assert rec["tokens_identical"] is False and rec["token_diff"]["first_step"] == 1


def _tops(tokens, runner_up, gap):
    """Per step: the token first, ``runner_up`` ``gap`` below it at the flip's step (1), far below elsewhere."""
    return [{"ids": [t, runner_up[i]], "logits": [10.0, 10.0 - (gap if i == 1 else 5.0)]} for i, t in enumerate(tokens)]


@pytest.mark.parametrize("gap_a,gap_b,backend,name,judged,bound,source", [
    (0.05, 0.02, "cuda", "tiny-qwen3", True, 1.1, "the A/B budget"),  # both: the other's token within the budget
    (0.05, None, "cuda", "tiny-qwen3", True, 1.1, "the A/B budget"),  # B kept no top logits: A's alone judge
    (0.05, 1.5, "cuda", "tiny-qwen3", False, 1.1, None),  # within the parity gate's 1.4, beyond the A/B's 1.1
    (0.05, 0.02, "cuda", "m", True, 1.1, "the A/B budget"),  # a .gguf path: no catalog gate, the budget still
    (0.05, 0.5, "cuda", "tiny-qwen2-f32", False, 0.002, None),  # the gate's margin where tighter (fp32: 0.002)
    (0.0015, 0.001, "cuda", "tiny-qwen2-f32", True, 0.002, "gate.cpu-cuda"),
    (None, None, "cuda", "tiny-qwen3", False, 1.1, None),  # old builds: no top logits at all
])
def test_token_difference_judged_by_the_ab_budget(monkeypatch, tmp_path, gap_a, gap_b, backend, name, judged, bound,
                                                  source):
    """Where the arms' tokens first part, the flip passes when it is between
    tokens both builds nearly tie: within the A/B's own budget (AB_NEAR_TIE,
    not the parity gate's margin: tiny-qwen3 with CUDA against its cpu
    references has 2.6), or the model's gate margin where that is tighter,
    in every arm that kept that step's top logits; otherwise the A/B fails."""
    ta, tb = [5, 6, 7], [5, 9, 7]
    raw = lambda toks, other, gap: {"backend": backend, **({} if gap is None else {"token_tops": _tops(toks, other, gap)})}
    _fake(monkeypatch, FakeRunner("A", lambda n: 1.0, tokens=ta, sha="a" * 64, raw=raw(ta, tb, gap_a)),
          FakeRunner("B", lambda n: 1.0, tokens=tb, sha="b" * 64, raw=raw(tb, ta, gap_b)))
    cfg = _cfg(tmp_path, identity={"model_name": name})
    if not judged:
        with pytest.raises(AnvilError, match=f"different greedy tokens from step 1.*not a near-tie between builds.*"
                                             f"each must be within {bound:g}"):
            ab.run_ab("a.whl", "b.whl", cfg, tmp_path, results_dir=tmp_path / "res")
        return
    rec = ab.run_ab("a.whl", "b.whl", cfg, tmp_path, results_dir=tmp_path / "res")
    j = rec["token_diff"]["judged"]
    assert rec["tokens_identical"] is False and j["near_tie"] and j["step"] == 1
    assert (j["bound"], j["bound_from"]) == (bound, source) and j["margins"]["A"] == pytest.approx(gap_a)
    assert f"a flip between near-tied tokens, margins A {gap_a:.3g}" in ab.format_report(rec)


def test_the_ab_budget_is_the_one_its_records_support():
    """AB_NEAR_TIE is re-derived from the committed A/B records it cites: the
    arms' gaps at the flips between two builds A/B'd without
    --allow-token-diff, saved before the budget judged any; it is well under
    the parity gate's margin on the model those flips were seen on."""
    from harness import catalog

    recs = [r for r in results.load_all(kind="ab")
            if r.get("saved_at", "") < ab.AB_MEASURED_BEFORE and not r["config"].get("allow_token_diff")]
    gaps = [m for r in recs for m in ((r.get("token_diff") or {}).get("judged") or {}).get("margins", {}).values()
            if m is not None]
    assert len(gaps) == 26 and ab.AB_NEAR_TIE == ab.ab_budget(gaps) == 1.1
    assert ab.AB_NEAR_TIE < catalog.entry("qwen3-8b").gate("cuda").margin / 3


def test_judge_flip_needs_the_run_path():
    """The warm-up's top logits count only where its tokens up to the flip are
    the run's (else they describe another path)."""
    tops = _tops([5, 6, 7], [5, 9, 7], 0.01)
    assert ab.judge_flip([5, 6, 7], [5, 9, 7], tops, None, 1.0)["near_tie"]
    assert not ab.judge_flip([4, 6, 7], [4, 9, 7], tops, None, 1.0)["near_tie"]  # step 0 is not the run's
    assert not ab.judge_flip([5, 6], [5, 6, 7], tops, tops, 1.0)["near_tie"]     # one arm ran out of tokens


def test_ctrl_c_keeps_completed_rounds(monkeypatch, tmp_path):
    _fake(monkeypatch, FakeRunner("A", lambda n: 1.0, sha="a" * 64, interrupt_at=4),
          FakeRunner("B", lambda n: 1.0, sha="b" * 64))
    with pytest.raises(KeyboardInterrupt):
        ab.run_ab("a.whl", "b.whl", _cfg(tmp_path), tmp_path, results_dir=tmp_path / "res")
    rec = results.load_all(tmp_path / "res", kind="ab")[0]
    assert len(rec["rounds"]) == 3 and not rec["complete"] and "KeyboardInterrupt" in rec["interrupted"]


def _numerics_change(src):
    """A candidate whose numerics differ: RMSNorm epsilon x1e6."""
    p = src / "engine" / "backends" / "numpy" / "ops.py"
    p.write_text(p.read_text().replace("1.0 / np.sqrt(ms + eps)", "1.0 / np.sqrt(ms + eps * 1e6)"))


def _comment_change(src):
    p = src / "engine" / "generate.py"
    p.write_text(p.read_text() + "\n# candidate build\n")


def test_end_to_end_two_real_wheels(build_engine_wheel, model_path, tmp_path):
    base = build_engine_wheel("plain")
    cand = build_engine_wheel("comment", _comment_change)
    cfg = ab.ABConfig(model=model_path("tiny-qwen3"), n_prompt=8, n_gen=4, reps=2, rounds=2)
    rec = ab.run_ab(str(base), str(cand), cfg, tmp_path / "work", results_dir=tmp_path / "res")
    assert rec["complete"] and rec["tokens_identical"] is True
    assert rec["arms"]["A"]["sha256"] != rec["arms"]["B"]["sha256"]
    assert set(rec["analysis"]) == {"pp8", "tg4"}
    assert "| pp8 |" in ab.format_report(rec)

    bad = build_engine_wheel("numerics", _numerics_change)
    with pytest.raises(AnvilError, match="different greedy tokens"):
        ab.run_ab(str(base), str(bad), ab.ABConfig(model=cfg.model, n_prompt=8, n_gen=4, reps=1, rounds=1),
                  tmp_path / "work", results_dir=tmp_path / "res")


def test_bench_record_samples_each_test_in_its_own_process(tmp_path):
    class Runner(FakeRunner):
        def run(self, model, n_prompt, n_gen, reps):
            self.calls += 1
            tests = ([{"test": f"pp{n_prompt}", "samples_tok_s": [9.0] * reps, "tok_s_mean": 9.0, "tok_s_sd": 0.0}]
                     if n_prompt else
                     [{"test": f"tg{n_gen}", "samples_tok_s": [2.0] * reps, "tok_s_mean": 2.0, "tok_s_sd": 0.0}])
            return RunResult(tests={t["test"]: t["samples_tok_s"] for t in tests}, tokens=[1, 2] if n_gen else None,
                             raw={"engine": "anvil", "results": tests, "tokens": [1, 2] if n_gen else []},
                             wall_s=0.1, cmd=["fake", str(n_prompt), str(n_gen)], returncode=0)

    r = Runner("A", None)
    rec = ab.bench_record(r, tmp_path / "m.gguf", n_prompt=8, n_gen=4, reps=1)
    assert r.calls == 2 and [x["test"] for x in rec["results"]] == ["pp8", "tg4"]
    assert all("nvml" in x for x in rec["results"]) and rec["tokens"] == [1, 2]
    assert rec["settings"]["n_prompt"] == 8 and rec["settings"]["n_gen"] == 4
    # the prefill test can be repeated more often (a window NVML can read)
    rec = ab.bench_record(r, tmp_path / "m.gguf", n_prompt=8, n_gen=4, reps=2, pp_reps=7)
    assert [len(x["samples_tok_s"]) for x in rec["results"]] == [7, 2] and rec["settings"]["pp_reps"] == 7


@pytest.mark.parametrize("save", [False, True])
def test_records_enter_the_store_only_when_asked(monkeypatch, tmp_path, capsys, save):
    """Trying `harness ab` or `harness bench` leaves the committed store alone;
    --save writes there and prints each path."""
    from harness import cli, runners
    from harness.commands import common

    store = tmp_path / "store"
    monkeypatch.setattr(results, "DEFAULT_DIR", store)
    monkeypatch.setattr(common, "model", lambda name, check_only=False: None if check_only else (tmp_path / "m.gguf", {}))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path)
    flag = ["--save"] if save else []
    _fake(monkeypatch, FakeRunner("A", lambda n: 100.0, sha="a" * 64), FakeRunner("B", lambda n: 100.0, sha="b" * 64))
    assert cli.main(["ab", "a.whl", "b.whl", "--rounds", "4", *flag]) == 0
    bench = iter([FakeRunner("C", lambda n: 100.0, sha="c" * 64), FakeRunner("D", lambda n: 90.0, sha="d" * 64)])
    monkeypatch.setattr(runners, "make_runner", lambda spec, workdir: next(bench))
    assert cli.main(["bench", "--model", "m", "-p", "8", "-n", "4", "-r", "2", "--llamacpp", "llama-bench:x",
                     *flag]) == 0
    err = capsys.readouterr().err
    saved = sorted(p.name.split("-")[0] for p in store.glob("*.json")) if store.exists() else []
    assert saved == (["ab", "bench", "bench"] if save else [])
    assert err.count("saved ") == (3 if save else 0) and (err.count("not saved: --save") == (0 if save else 2))
    if save:  # one call, one sitting: the scoreboard's ratios pair only such records (results.same_sitting)
        a, b = (json.loads(p.read_text()) for p in sorted(store.glob("bench-*.json")))
        assert a["sitting"] and a["sitting"] == b["sitting"] and results.same_sitting(a, b)


def test_bench_depth_sweep_and_output_formats(model_path, capsys):
    """`harness bench -d 0,16 -o json|csv`: llama-bench's depth (the tests
    after that many cached tokens, named "pp8 @ d16") and its output
    formats, through the real engine in its own process (NumPy, tiny model)."""
    import csv
    import io
    import json

    from harness import cli

    path = str(model_path("tiny-qwen3"))
    assert cli.main(["bench", "--model", path, "-p", "8", "-n", "4", "-r", "2", "-d", "0,16", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["test"], r["n_depth"], r["engine"]) for r in rows] == [
        ("pp8", 0, "anvil"), ("tg4", 0, "anvil"), ("pp8 @ d16", 16, "anvil"), ("tg4 @ d16", 16, "anvil")]
    assert all(r["tok_s_mean"] > 0 and r["record"] is None and r["vs_llamacpp"] is None for r in rows)
    assert cli.main(["bench", "--model", path, "-p", "0", "-n", "4", "-r", "2", "-o", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["test"] for r in table] == ["tg4"] and list(table[0]) == list(ab.BENCH_FIELDS)
    with pytest.raises(SystemExit):
        cli.main(["bench", "--model", path, "-d", "0,-4"])
    assert "expected token counts >= 0 separated by commas" in capsys.readouterr().err
