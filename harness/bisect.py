"""``harness bisect GOOD BAD --test tg128``: the first commit that made a
test slower.

The commits after GOOD up to BAD on BAD's first-parent line
(``wheels.first_parent``: a merged branch is one step, its merge) are
searched by bisection. Each step builds (or takes from the cache) the
engine wheel of one commit and A/Bs it against GOOD's wheel, interleaved,
judged exactly as ``harness ab`` judges (the CI of B/A beyond the noise
band, harness/noise.py, and the round wins): "slower" puts the first slower
commit at or before that one; any other verdict, after it. BAD is measured
first, so a range with nothing slower in it ends there: 1 + ceil(log2(n))
A/Bs for n commits, and only those commits' wheels are built.

A commit whose engine build is GOOD's (a change outside ``engine/``) is not
slower, and is not measured.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import AnvilError

from . import ab, provenance, stats, wheels
from .table import markdown

SAME_BUILD = "same engine build as GOOD"  # a step's verdict without a measurement


def search(n: int, slower) -> int | None:
    """The first of indices 0..n-1 at which ``slower(i)`` holds, asked as
    few times as bisection needs, assuming that once it holds it stays (a
    regression is not undone later in the range); None when it does not
    hold at n-1 (BAD), which is asked first."""
    if n < 1 or not slower(n - 1):
        return None
    lo, hi = -1, n - 1  # lo: not slower (-1: GOOD itself); hi: slower
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if slower(mid):
            hi = mid
        else:
            lo = mid
    return hi


def lengths_of(test: str) -> tuple[int, int]:
    """(n_prompt, n_gen) of the one test a step runs: pp512 -> (512, 0), tg128 -> (0, 128)."""
    m = re.fullmatch(r"(pp|tg)(\d+)", test)
    if not m or int(m[2]) < 1:
        raise AnvilError(f"expected a llama-bench test name, ppN or tgN (e.g. tg128), got {test!r}")
    return (int(m[2]), 0) if m[1] == "pp" else (0, int(m[2]))


@dataclass
class Step:
    index: int  # of the commit, 0 the first after GOOD
    commit: str
    subject: str
    verdict: str  # stats.SLOWER, FASTER, SAME, or SAME_BUILD
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    band: dict | None = None
    record: dict | None = None  # the step's A/B record (its path, if saved)


def measure(good_wheel: Path, wheel: Path, cfg: ab.ABConfig, workdir: Path, test: str, *,
            results_dir=None, save: bool = False) -> dict:
    """One step's A/B of ``wheel`` against GOOD's: the analysis of ``test``
    (its verdict, B/A, CI and band) and the record, or SAME_BUILD."""
    runners = ab.prepare_arms(str(good_wheel), str(wheel), workdir, allow_same=True)
    builds = [r.describe().get("build") for r in runners.values()]
    if builds[0] and builds[0] == builds[1]:
        return {"verdict": SAME_BUILD}
    rec = ab.run_ab(str(good_wheel), str(wheel), cfg, workdir, runners=runners, results_dir=results_dir, save=save)
    t = rec["analysis"].get(test)
    if t is None:
        raise AnvilError(f"the A/B measured no {test} (tests: {', '.join(rec['analysis']) or 'none'})")
    return {"verdict": t["verdict"], "ratio": t["ratio"], "ci": (t["ci_low"], t["ci_high"]), "band": t["band"],
            "record": rec}


def run_bisect(good: str, bad: str, cfg: ab.ABConfig, workdir: Path, *, test: str, repo: Path | None = None,
               build=None, results_dir=None, save: bool = False) -> dict:
    """Bisect ``good``..``bad`` (git revisions of ``repo``, default the
    project) for the first commit whose ``test`` is slower than GOOD's.
    ``build(rev, repo)``: a revision's engine wheel (default
    wheels.wheel_for). Returns {"commits": [(sha, subject)], "steps":
    [Step], "first_slower": Step or None}."""
    build = build or (lambda rev, repo: wheels.wheel_for(rev, repo))
    commits = wheels.first_parent(good, bad, repo)
    if not commits:
        raise AnvilError(f"{bad} is {good}: no commit lies between them")
    good_wheel = build(good, repo)
    steps: list[Step] = []

    def slower(i: int) -> bool:
        sha, subject = commits[i]
        try:
            m = measure(good_wheel, build(sha, repo), cfg, workdir, test, results_dir=results_dir, save=save)
        except ab.Interrupted as e:
            raise ab.Interrupted(f"{e}; the bisect stopped at its step {len(steps) + 1}") from None
        except AnvilError as e:
            e.add_note(f"bisect step {len(steps) + 1}: commit {sha[:10]} {subject}")
            raise
        steps.append(Step(i, sha, subject, **m))
        step = steps[-1]
        said = f"{step.ratio:.4f} [{step.ci[0]:.4f}, {step.ci[1]:.4f}], " if step.ratio is not None else ""
        print(f"bisect step {len(steps)}: {sha[:10]} {subject}: {said}{step.verdict}", file=sys.stderr, flush=True)
        return step.verdict == stats.SLOWER

    k = search(len(commits), slower)
    return {"commits": commits, "steps": steps,
            "first_slower": next(s for s in steps if s.index == k) if k is not None else None}


def format_result(result: dict, good: str, bad: str, test: str) -> str:
    commits, steps, found = result["commits"], result["steps"], result["first_slower"]
    rec = next((s.record for s in steps if s.record), None)
    lines = [f"bisect {good}..{bad}: {len(commits)} first-parent commits, {test}, {len(steps)} A/Bs against {good}"]
    if rec:
        lines.append(f"measured: {provenance.phrase(rec.get('backend'), rec.get('device'))}")
    lines.append(markdown(
        ["step", "commit", "subject", "B/A [95% CI]", "noise band", "verdict", "record"],
        [[n, s.commit[:10], s.subject, f"{s.ratio:.4f} [{s.ci[0]:.4f}, {s.ci[1]:.4f}]" if s.ratio is not None else "",
          f"±{s.band['band']:.2%} ({s.band['source']})" if s.band else "", s.verdict,
          Path(s.record["path"]).name if s.record and s.record.get("path") else ""]
         for n, s in enumerate(steps, 1)]))
    if found:
        lines.append(f"first slower commit: {found.commit} {found.subject} ({found.index + 1} of {len(commits)} "
                     f"after {good})")
    else:
        lines.append(f"{bad} is not slower than {good} on {test} ({steps[0].verdict}): nothing to bisect")
    return "\n".join(lines)
