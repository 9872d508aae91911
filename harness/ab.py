"""``harness ab`` and ``harness bench``: interleaved, honest benchmarking.

A boosting GPU lies, so an A/B comparison here:
- runs each arm in a fresh process per run (a warm-up inside each process),
- interleaves the arms ABBA across rounds (A B | B A | A B ...), so drift in
  clocks or temperature hits both arms alike,
- runs one extra cold round first and drops it,
- skips (and reports) a round when another process is using the GPU,
- samples NVML (SM clock, power, utilisation, throttle reasons) during every
  run and keeps each run's summary,
- checks that the engine arms generated the same greedy tokens, or that
  where they part the flip is between tokens both builds nearly tie, by
  the A/B's own budget from build-to-build records (AB_NEAR_TIE, or the
  model's parity gate margin where that is tighter: near_tie_bound),
- reports per test the median and p90 of each arm, the per-round win count,
  the ratio of medians with a bootstrap CI and a Mann-Whitney U p-value,
  and the verdict: "slower" / "faster" when the whole CI lies beyond the
  test's noise band on this device (harness.noise: measured by an A/A run,
  ``cfg.aa``, else a default from the run's own spread) and the same arm won
  most rounds (harness.stats.band_verdict),
- says what was measured: the backend, the device and each arm's build,
  in the record and above the table (harness.provenance),
- saves the record at the end, or when interrupted (Ctrl-C keeps the rounds
  already measured and says so; the benchmark child is killed with its
  whole process group).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import AnvilError

from . import gates, noise, nvml, provenance, results, stats
from .runners import RunResult, make_runner
from .table import markdown


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during an A/B; the message says what was saved."""


def abba_order(n_rounds: int) -> list[tuple[str, str]]:
    """Arm order per round: AB, BA, AB, BA, ... (pairs of rounds form ABBA)."""
    return [("A", "B") if r % 2 == 0 else ("B", "A") for r in range(n_rounds)]


@dataclass
class ArmRuns:
    label: str
    describe: dict
    values: dict[str, list[float]] = field(default_factory=dict)  # test -> one value per kept round
    nvml: list[dict] = field(default_factory=list)  # per run summary
    tokens: list[int] | None = None
    tops: list[dict] | None = None  # the first run's per-step top logits (engine bench "token_tops")
    backend: str | None = None
    gpu: str | None = None  # the GPU the first run reported (NVML's name), None without one


@dataclass
class ABConfig:
    model: Path
    n_prompt: int = 512
    n_gen: int = 128
    depth: int = 0
    reps: int = 3
    rounds: int = 8
    factor: float | None = None  # a change must also be beyond this ratio (None: the noise band alone)
    aa: bool = False  # an A/A run: one build against itself, measuring the noise band
    allow_same: bool = False
    allow_token_diff: bool = False
    timeout_s: int = 1200
    max_skips: int = 8
    identity: dict = field(default_factory=dict)  # model_name / model_sha256 for the record


TRACE_POINTS = 400  # per run in the record: enough to plot, small enough to commit


def _thin(trace: dict) -> dict:
    n = len(trace.get("t", []))
    step = max(1, -(-n // TRACE_POINTS))
    return {k: v[::step] for k, v in trace.items()}


ESTIMATE_SLACK_S = 2.0  # llama-bench: time between its last repetition and its exit, at most


def _test_tokens(test: str) -> int:
    return int("".join(ch for ch in test if ch.isdigit()) or 0)


def measured(sampler: nvml.Sampler, tests: list[dict], exit_unix: float) -> tuple[dict, dict]:
    """The NVML samples taken while ``tests`` (result records of one run)
    were measured, and how that window was found. The engine stamps each
    test's repetitions (``window_unix``); llama-bench does not, so its window
    is estimated: the last sum-of-repetition-times (plus one warm-up) before
    the process exited, widened by ESTIMATE_SLACK_S for its teardown, then
    trimmed to the samples with the GPU busy."""
    trace, t0 = sampler.trace, sampler.t0_unix
    spans = [r.get("window_unix") for r in tests]
    stamped = bool(spans) and all(spans)
    if stamped:
        start, end = min(w[0] for w in spans), max(w[1] for w in spans)
        info = {"source": "engine timestamps"}
        sub = nvml.window(trace, start - t0, end - t0)
    else:
        busy_s = 0.0
        for r in tests:
            v = [x for x in r.get("samples_tok_s", []) if x > 0]
            busy_s += sum(_test_tokens(r.get("test", "")) / x for x in v) * (len(v) + 1) / max(len(v), 1)
        start, end = exit_unix - busy_s - ESTIMATE_SLACK_S, exit_unix
        info = {"source": "estimated from the repetition times (no timestamps from this runner)"}
        sub = nvml.window(trace, start - t0, end - t0)
        util = sub.get("gpu_util", [])
        keep = [i for i, u in enumerate(util) if u]
        if len(keep) >= nvml.MIN_WINDOW_SAMPLES:
            sub = {k: v[keep[0]:keep[-1] + 1] for k, v in sub.items()}
    info.update(start_s=round(start - t0, 3), end_s=round(end - t0, 3))
    summary = nvml.summarize(sub, sampler.static)
    # how long the measured repetitions ran (the estimate: their own times)
    summary["window_s"] = round(end - start if stamped else busy_s, 3)
    return summary, info


def run_value(result: RunResult, test: str) -> float:
    """One number per run and test: the median of its repetitions."""
    return stats.median(result.tests[test])


def prepare_arms(base_spec: str, cand_spec: str, workdir: Path, *, allow_same: bool = False) -> dict:
    """The two arms, installed and probed ({"A": runner, "B": runner}); two
    copies of one build are refused unless ``allow_same``."""
    runners = {"A": make_runner(base_spec, workdir), "B": make_runner(cand_spec, workdir)}  # checks the wheels
    for r in runners.values():
        r.prepare()
    if not allow_same:
        refuse_same_build({k: r.describe() for k, r in runners.items()})
    return runners


def refuse_same_build(desc: dict) -> None:
    """AnvilError if the arms ``desc`` describes are one build (one wheel file
    or one engine build hash)."""
    for key, what in (("sha256", "file"), ("build", "engine build")):
        ida, idb = desc["A"].get(key), desc["B"].get(key)
        if ida is not None and ida == idb:
            raise AnvilError(f"both arms are the same build ({what} {ida[:16]}: the same engine sources); "
                             f"pass --allow-same to measure a build against itself (--aa: to measure the noise)")


def run_ab(base_spec: str, cand_spec: str, cfg: ABConfig, workdir: Path, *, progress=None,
           results_dir: Path | None = None, save: bool = True, runners: dict | None = None,
           arm_info: dict | None = None) -> dict:
    """The interleaved A/B of two builds on ``cfg.model``, saved as one
    record (``runners``: the arms from ``prepare_arms``, if already made;
    ``arm_info``: more to record of each arm, e.g. {"A": {"commit", "subject"}}
    for arms built from git revisions)."""
    runners = runners or prepare_arms(base_spec, cand_spec, workdir, allow_same=cfg.allow_same)
    desc = {k: {**r.describe(), **(arm_info or {}).get(k, {})} for k, r in runners.items()}
    arms = {k: ArmRuns(k, desc[k]) for k in runners}
    record = {"kind": "ab", "model": str(cfg.model), **cfg.identity,
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in cfg.__dict__.items()},
              "arms": desc, "rounds": [], "skipped_rounds": [], "complete": False}
    order = abba_order(cfg.rounds + 1)  # round 0 is the cold round, dropped
    try:
        r_i, skips = 0, 0
        while r_i < len(order):
            busy = nvml.gpu_busy_by_other_processes()
            if busy:
                record["skipped_rounds"].append({"round": r_i, "reason": f"GPU in use by pids {busy}",
                                                 "time": time.time()})
                skips += 1
                if skips > cfg.max_skips:
                    raise AnvilError(f"GPU busy with other processes for {skips} rounds ({busy}); giving up")
                time.sleep(5)
                continue
            round_rec = {"round": r_i, "order": "".join(order[r_i]), "cold": r_i == 0, "runs": {}}
            for arm in order[r_i]:
                with nvml.Sampler() as sampler:
                    res = runners[arm].run(cfg.model, n_prompt=cfg.n_prompt, n_gen=cfg.n_gen, reps=cfg.reps,
                                           timeout_s=cfg.timeout_s, **({"depth": cfg.depth} if cfg.depth else {}))
                    exit_unix = time.time()
                if sampler.available:
                    summary, window = measured(sampler, res.raw.get("results", []), exit_unix)
                else:
                    summary, window = {"available": False, "reason": sampler.reason}, None
                round_rec["runs"][arm] = {"tests": res.tests, "wall_s": res.wall_s, "nvml": summary,
                                          "nvml_window": window,
                                          "nvml_trace": _thin(sampler.trace) if sampler.available else None}
                if arms[arm].tokens is None:
                    arms[arm].tokens = res.tokens
                    arms[arm].tops, arms[arm].backend = res.raw.get("token_tops"), res.raw.get("backend")
                    arms[arm].gpu = res.raw.get("gpu")
                if r_i > 0:
                    for test in res.tests:
                        arms[arm].values.setdefault(test, []).append(run_value(res, test))
                    arms[arm].nvml.append(summary)
                if progress:
                    progress(r_i, arm, res)
            record["rounds"].append(round_rec)
            if r_i == 0:  # a build too old to describe itself has now, in its first bench record
                record["arms"] = {k: {**r.describe(), **(arm_info or {}).get(k, {})} for k, r in runners.items()}
                if not cfg.allow_same:
                    refuse_same_build(record["arms"])
            r_i += 1
        record["complete"] = True
    except BaseException as e:  # Ctrl-C or a failed run: keep the rounds already measured
        record["interrupted"] = f"{type(e).__name__}: {e}"
        n_measured = max(0, len(record["rounds"]) - 1)  # the cold round is never a result
        path = _save(record, arms, cfg, results_dir, save) if n_measured else None
        rounds = f"{n_measured} measured round{'s' * (n_measured != 1)}"
        said = (f"{rounds} saved in {path}" if path else f"{rounds}, not saved (no --save)" if n_measured else
                "no round was measured, nothing saved")
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(said) from None
        e.add_note(said)  # printed after the error's own line
        raise
    try:
        _check_tokens(record, arms, cfg)
    finally:
        path = _save(record, arms, cfg, results_dir, save)
        record["path"] = str(path) if path else None
    return record


# Two builds of the engine on one GPU part only by summation order and
# rounding, far less than the engine and llama.cpp do (the parity gate's
# qwen3-8b margin is 4 logits): a flip between them is a near-tie when each
# arm puts the other's token within AB_NEAR_TIE logits of its own. 1.25 x
# (gates.HEADROOM) the largest such gap at a flip between two builds A/B'd
# without --allow-token-diff in the records saved before AB_MEASURED_BEFORE
# (13 flips, qwen3-8b and qwen35-9b; the largest 0.848, qwen3-8b step 123,
# ab-20261202T141915Z-30257dd4.json). Those records keep no per-step logits
# of runs whose tokens matched, so the gaps at their flips are the measure.
AB_NEAR_TIE = 1.1
AB_MEASURED_BEFORE = "2026-12-04"  # later records are judged by AB_NEAR_TIE, so they cannot measure it


def ab_budget(gaps) -> float:
    """AB_NEAR_TIE from the arms' gaps at build-to-build flips (gates' rule)."""
    return gates.round2(gates.HEADROOM * max(gaps))


def judge_flip(ta: list[int], tb: list[int], tops_a, tops_b, bound: float) -> dict:
    """Where two arms' greedy tokens first part, both decoded the same
    context; the builds still agree if the tokens there are near-tied: each
    arm that kept that step's top logits (engine bench "token_tops", from
    its warm-up, whose tokens to there must be the run's) puts the other
    arm's token within ``bound`` of its own. An arm whose top logits miss
    the other token, or a step past one arm's tokens: not a near-tie."""
    first = next((i for i, (a, b) in enumerate(zip(ta, tb)) if a != b), min(len(ta), len(tb)))
    out = {"step": first, "bound": bound, "margins": {}, "near_tie": False}
    if first >= min(len(ta), len(tb)):
        return out
    for arm, own, other, tops in (("A", ta, tb, tops_a), ("B", tb, ta, tops_b)):
        if not tops or len(tops) <= first or any(tops[i]["ids"][0] != own[i] for i in range(first + 1)):
            continue  # no top logits, or the warm-up decoded another path
        ids, logits = tops[first]["ids"], tops[first]["logits"]
        out["margins"][arm] = logits[0] - logits[ids.index(other[first])] if other[first] in ids else None
    m = list(out["margins"].values())
    out["near_tie"] = bool(m) and all(x is not None and x <= bound for x in m)
    return out


def near_tie_bound(cfg: ABConfig, backend: str | None) -> tuple[float, str]:
    """(bound, where it comes from): AB_NEAR_TIE, or the model's catalog gate
    margin for ``backend`` against its tier's references where that is
    tighter (an F32 model's is 0.002: a flip the gate would call drift
    against llama.cpp is no near-tie between two builds)."""
    from . import catalog

    name = cfg.identity.get("model_name")
    try:
        entry = catalog.entry(name) if name and backend else None
    except AnvilError:  # a .gguf path: no catalog entry, no gate
        entry = None
    gate = entry.gate(backend) if entry else None
    if gate and gate.margin < AB_NEAR_TIE:
        return gate.margin, f"gate.{entry.gate_key(backend, entry.tier)}"
    return AB_NEAR_TIE, "the A/B budget"


def _check_tokens(record: dict, arms: dict, cfg: ABConfig) -> None:
    ta, tb = arms["A"].tokens, arms["B"].tokens
    record["tokens_identical"] = None if ta is None or tb is None else ta == tb
    if record["tokens_identical"] is False:
        bound, source = near_tie_bound(cfg, arms["A"].backend or arms["B"].backend)
        judged = judge_flip(ta, tb, arms["A"].tops, arms["B"].tops, bound)
        first = judged["step"]  # where they part (or where the shorter ends)
        record["token_diff"] = {"first_step": first, "A": ta[first:first + 8], "B": tb[first:first + 8],
                                "judged": {**judged, "bound_from": source}}
        if not judged["near_tie"] and not cfg.allow_token_diff:
            said = ", ".join(f"{a} {'beyond its top logits' if m is None else f'{m:.3g}'}"
                             for a, m in judged["margins"].items()) or "no top logits to judge"
            raise AnvilError(f"the arms generated different greedy tokens from step {first} "
                             f"(A {ta[first:first + 8]} vs B {tb[first:first + 8]}), not a near-tie between builds "
                             f"(margins {said}; each must be within {bound:g}, {source}): the candidate changed the "
                             f"numerics; pass --allow-token-diff to compare speed anyway")


def _analyse(arms: dict, cfg: ABConfig, record: dict | None = None, store=None) -> dict:
    """Per test: each arm's median and p90, the round wins, B/A with its CI
    and p (harness.stats), the noise band that judges it (harness.noise: an
    A/A record in ``store`` on the device ``record`` names, else the default)
    and the verdict."""
    record = record or {}
    out = {}
    for test in sorted(set(arms["A"].values) & set(arms["B"].values)):
        a, b = arms["A"].values[test], arms["B"].values[test]
        if len(a) < 2 or len(b) < 2:
            continue
        c = stats.compare(a, b)  # its asv verdict is not this A/B's: the band's is
        wins = stats.round_wins(list(zip(a, b)))
        band = noise.band_for(store, record, test, a, b)
        out[test] = {"A": {"median": stats.median(a), "p90": stats.p90(a), "n": len(a)},
                     "B": {"median": stats.median(b), "p90": stats.p90(b), "n": len(b)},
                     "wins": wins, **{k: v for k, v in c.to_dict().items() if k not in ("verdict", "factor", "alpha")},
                     "band": band, "factor": cfg.factor,
                     "verdict": stats.band_verdict(c.ci_low, c.ci_high, band["band"], wins["majority"], cfg.factor)}
    return out


def _what_was_measured(record: dict, arms: dict) -> None:
    """The record's header: backend, device (harness.provenance) and each arm's build."""
    backends = sorted({a.backend.lower() for a in arms.values() if a.backend})
    record["backend"] = "/".join(backends) or None
    record["gpu"] = arms["A"].gpu or arms["B"].gpu
    record["device"] = provenance.device_name(record["backend"], record["gpu"])
    record["builds"] = {k: d.get("build") for k, d in record["arms"].items()}


def _save(record: dict, arms: dict, cfg: ABConfig, results_dir, save: bool = True) -> Path | None:
    """Complete the record's analysis; with ``save``, write it (once: the store is append-only)."""
    _what_was_measured(record, arms)
    record["analysis"] = _analyse(arms, cfg, record, results_dir)
    if cfg.aa:  # the bands later A/Bs on this device are judged by
        record["aa"] = True
        record["noise_band"] = {t: noise.aa_band(x["ci_low"], x["ci_high"]) for t, x in record["analysis"].items()}
    record["measured_rounds"] = sum(1 for r in record["rounds"] if not r["cold"])
    record["nvml_summary"] = {k: v.nvml for k, v in arms.items()}
    return results.save({k: v for k, v in record.items() if k != "path"}, "ab", results_dir) if save else None


def slower_tests(record: dict) -> list[str]:
    """The tests whose verdict is "slower": what makes ``harness ab`` exit 1."""
    return [test for test, t in record.get("analysis", {}).items() if t["verdict"] == stats.SLOWER]


def arm_line(record: dict) -> str:
    """Which builds were measured: each arm's label (a commit and its subject where known) and build hash."""
    return "  ".join(f"{k}: {d.get('label')} (build {d.get('build') or 'not reported'})"
                     for k, d in record["arms"].items())


def format_report(record: dict) -> str:
    analysis = record.get("analysis", {})
    lines = [f"model: {record['model']}",
             f"measured: {provenance.phrase(record.get('backend'), record.get('device'))}",
             arm_line(record),
             markdown(["test", "A median", "A p90", "B median", "B p90", "B/A [95% CI]", "noise band", "wins B:A", "p",
                       "verdict"],
                      [[test, f"{t['A']['median']:.2f}", f"{t['A']['p90']:.2f}", f"{t['B']['median']:.2f}",
                        f"{t['B']['p90']:.2f}", f"{t['ratio']:.3f} [{t['ci_low']:.3f}, {t['ci_high']:.3f}]",
                        f"±{t['band']['band']:.2%} ({t['band']['source']})", f"{t['wins']['B']}:{t['wins']['A']}",
                        f"{t['p_value']:.3g}", t["verdict"]] for test, t in analysis.items()])]
    if analysis:
        factor = next(iter(analysis.values())).get("factor")
        beyond = f", and beyond {factor:g}x (1/{factor:g})" if factor else ""
        lines.append(f"verdict: \"faster\" / \"slower\" only when the whole 95% CI of B/A lies beyond the test's noise "
                     f"band (above 1 + band / below 1 - band{beyond}) AND that arm won the majority of the kept "
                     f"rounds; else \"no significant change\". One value per round and arm: the median of that "
                     f"run's repetitions, as the progress lines show; p: Mann-Whitney U, for reference.")
        said: dict[str, list[str]] = {}  # where each band came from, the tests it judged
        for test, t in analysis.items():
            said.setdefault(t["band"]["said"], []).append(test)
        lines += [f"noise band of {', '.join(tests)}: {source}" for source, tests in said.items()]
    if record.get("noise_band"):
        lines.append("A/A: the noise band this run measured: " +
                     ", ".join(f"{t} ±{b:.2%}" for t, b in record["noise_band"].items()) +
                     " (the farthest its B/A CI reached from 1; later A/Bs on this device take it from the store)")
    if record.get("skipped_rounds"):
        lines.append(f"skipped rounds: {len(record['skipped_rounds'])} (GPU busy)")
    if record.get("tokens_identical") is not None:
        j = (record.get("token_diff") or {}).get("judged")
        said = ""
        if j and j["near_tie"]:
            ms = " / ".join(f"{a} {m:.3g}" for a, m in j["margins"].items())
            said = (f" (from step {j['step']}: a flip between near-tied tokens, margins {ms} within "
                    f"{j['bound']:g}, {j['bound_from']})")
        lines.append(f"greedy tokens identical: {record['tokens_identical']}{said}")
    return "\n".join(lines)


def bench_record(runner, model: Path, *, n_prompt: int, n_gen: int, reps: int, pp_reps: int | None = None,
                 depth: int = 0) -> dict:
    """One bench record for ``runner`` on ``model``: each test in its own
    process under its own NVML sampler, so every test gets its own trace
    and diagnosis (prefill and decode are bound by different things); at
    ``depth``, each after that many context tokens (llama-bench's ``-d``).
    ``pp_reps`` repeats the prefill test more often than ``reps``: five
    512-token prefills last ~0.15 s, too short for NVML's ~1 s averaging."""
    if not (n_prompt or n_gen):
        raise AnvilError("nothing to measure: -p/--n-prompt and -n/--n-gen are both 0")
    rec, tests = None, []
    for p, n, test_reps in ((n_prompt, 0, pp_reps or reps), (0, n_gen, reps)):
        if not (p or n):
            continue
        with nvml.Sampler() as sampler:
            res = runner.run(model, n_prompt=p, n_gen=n, reps=test_reps, **({"depth": depth} if depth else {}))
            exit_unix = time.time()
        raw = dict(res.raw)
        raw.pop("token_tops", None)  # judges an A/B's token difference; a bench record has no second arm
        for r in raw.get("results", []):
            if sampler.available:
                r["nvml"], r["nvml_window"] = measured(sampler, [r], exit_unix)
                r["nvml"]["whole_run"] = sampler.summary()  # load and warm-up included
            else:
                r["nvml"], r["nvml_window"] = {"available": False, "reason": sampler.reason}, None
            r["nvml_trace"] = _thin(sampler.trace) if sampler.available else None
        if rec is None:
            rec = raw
            if sampler.available:
                rec.update({k: v for k, v in sampler.static.items() if v is not None})
        else:
            rec["results"] = rec.get("results", []) + raw.get("results", [])
            if raw.get("tokens"):
                rec["tokens"] = raw["tokens"]
        tests.append(res.cmd)
    rec.update(model=str(model), runner=runner.describe(), commands=tests,
               device=provenance.device_name(rec.get("backend"), rec.get("gpu")))
    rec.setdefault("settings", {}).update(n_prompt=n_prompt, n_gen=n_gen, n_depth=depth, reps=reps,
                                          **({"pp_reps": pp_reps} if pp_reps else {}))
    return rec


BENCH_FIELDS = ("model", "engine", "build", "backend", "device", "test", "n_prompt", "n_gen", "n_depth", "tok_s_median",
                "tok_s_mean", "tok_s_sd", "gb_s", "vs_llamacpp", "record")


def bench_rows(rows) -> list[dict]:
    """One row per (model, engine, test), llama-bench's columns plus the
    ratio of the medians to the llama.cpp arm when there is one (rows:
    [(model, [engine rec, llama.cpp rec?])]; results.throughput says why the
    median); ``record``: where the record was saved, if it was."""
    out = []
    for model, recs in rows:
        base = {r["test"]: results.throughput(r) for r in recs[1]["results"]} if len(recs) > 1 else {}
        for rec in recs:
            s = rec.get("settings", {})
            for r in rec["results"]:
                ratio = results.throughput(r) / base[r["test"]] if rec is recs[0] and base.get(r["test"]) else None
                pp = r["test"].startswith("pp")
                out.append({"model": model, "engine": rec.get("engine", "?"), "build": rec.get("build"),
                            "backend": rec.get("backend"), "device": rec.get("device"),
                            "test": r["test"], "n_prompt": s.get("n_prompt", 0) if pp else 0,
                            "n_gen": 0 if pp else s.get("n_gen", 0), "n_depth": s.get("n_depth", 0),
                            "tok_s_median": results.throughput(r), "tok_s_mean": r["tok_s_mean"],
                            "tok_s_sd": r["tok_s_sd"], "gb_s": r.get("gb_s"),
                            "vs_llamacpp": ratio, "record": rec.get("path")})
    return out


def format_bench(rows, fmt: str = "md") -> str:
    """The rows of ``bench_rows`` as llama-bench's ``-o`` formats: md (each
    engine's build, backend and device above a table of t/s as median ± sd,
    GB/s, the ratio to llama.cpp), json (a list), jsonl, csv."""
    table = bench_rows(rows)
    if fmt == "json":
        return json.dumps(table, indent=1)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in table)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, BENCH_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows({k: "" if v is None else v for k, v in r.items()} for r in table)
        return buf.getvalue().rstrip("\n")
    # what was measured, above the table: each engine's build, backend and device
    said = dict.fromkeys(f"measured: {r['engine']} build {r['build'] or 'not reported'}, "
                         f"{provenance.phrase(r['backend'], r['device'])}" for r in table)
    return "\n".join([*said, markdown(
        ["model", "engine", "test", "t/s", "GB/s", "vs llama.cpp"],
        [[r["model"], r["engine"], r["test"], f"{r['tok_s_median']:.2f} ± {r['tok_s_sd']:.2f}",
          f"{r['gb_s']:.0f}" if r["gb_s"] else "",
          f"{r['vs_llamacpp']:.2f}x" if r["vs_llamacpp"] is not None else ""] for r in table])])
