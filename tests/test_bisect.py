"""harness bisect: in a scratch git repository whose commit k slows tg128
by 2% (runs scattering ±0.3%), the first slower commit is named, by hash
and subject, in 1 + ceil(log2(n)) A/Bs, each judged by harness ab's rule
and each commit's wheel built at most once."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.errors import AnvilError
from harness import ab, bisect, cli, project, stats, wheels
from harness.commands import common
from harness.runners import RunResult

N_COMMITS = 10


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, subject: str) -> str:
    (repo / "log.txt").write_text((repo / "log.txt").read_text() + subject + "\n" if (repo / "log.txt").exists()
                                  else subject + "\n")
    _git(repo, "add", "log.txt")
    _git(repo, "commit", "-q", "-m", subject)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """GOOD, then N_COMMITS commits on main: (repo, good sha, [(sha, subject)] oldest first)."""
    r = tmp_path_factory.mktemp("scratch")
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    good = _commit(r, "the good build")
    commits = [(_commit(r, f"change {i}"), f"change {i}") for i in range(1, N_COMMITS + 1)]
    return r, good, commits


class Builds:
    """A fake wheel builder (a path per commit, nothing built) and the runs
    of those wheels: a commit from ``slow_from`` on is 2% slower."""

    def __init__(self, repo, good, commits, slow_from: int | None, seed: int = 0, same_build=()):
        self.repo, self.order = repo, {good: 0, **{sha: i for i, (sha, _) in enumerate(commits, 1)}}
        self.slow_from, self.rng, self.same_build, self.built = slow_from, np.random.default_rng(seed), same_build, []

    def build(self, rev, repo=None):
        sha = wheels.commit_of(rev, repo or self.repo)
        self.built.append(sha)
        return self.repo / "wheels" / sha / "anvil-0.1.0-py3-none-any.whl"

    def runner(self, spec, workdir):
        sha = Path(spec).parent.name
        i = self.order[sha]
        slower = self.slow_from is not None and i >= self.slow_from
        builds = self

        class Runner:
            label = sha[:10]

            def prepare(self):
                pass

            def describe(self):
                return {"kind": "fake", "label": sha[:10], "sha256": sha,
                        "build": "b0" if i in builds.same_build else f"b{i}"}

            def run(self, model, **kw):
                v = 400.0 * (0.98 if slower else 1.0) * (1 + builds.rng.normal(0, 0.003))
                return RunResult(tests={"tg128": [v, v]}, tokens=[1, 2], raw={"backend": "cuda", "gpu": "NVIDIA H200"},
                                 wall_s=0.1, cmd=["fake"], returncode=0)

        return Runner()


def _bisect(monkeypatch, tmp_path, repo, slow_from, seed=0, **kw):
    r, good, commits = repo
    b = Builds(r, good, commits, slow_from, seed, **kw)
    monkeypatch.setattr(ab, "make_runner", b.runner)
    cfg = ab.ABConfig(model=tmp_path / "m.gguf", n_prompt=0, n_gen=128, rounds=8, allow_same=True)
    return b, bisect.run_bisect(good, commits[-1][0], cfg, tmp_path, test="tg128", repo=r, build=b.build,
                                results_dir=tmp_path / "store")


@pytest.mark.parametrize("k", range(1, N_COMMITS + 1))
def test_bisect_finds_the_commit_that_made_tg128_2pct_slower(monkeypatch, tmp_path, repo, k):
    b, result = _bisect(monkeypatch, tmp_path, repo, slow_from=k, seed=k)
    commits = repo[2]
    found = result["first_slower"]
    assert (found.commit, found.subject) == commits[k - 1], [(s.subject, s.verdict, s.ratio) for s in result["steps"]]
    assert len(result["steps"]) <= 1 + math.ceil(math.log2(N_COMMITS))  # BAD first, then bisection
    assert result["steps"][0].commit == commits[-1][0] and result["steps"][0].verdict == stats.SLOWER
    assert len(b.built) == len(set(b.built)) == len(result["steps"]) + 1  # GOOD's and each step's, once
    text = bisect.format_result(result, "GOOD", "BAD", "tg128")
    assert f"first slower commit: {found.commit} change {k} ({k} of {N_COMMITS} after GOOD)" in text
    assert "measured: cuda on NVIDIA H200" in text


def test_nothing_slower_ends_after_measuring_bad(monkeypatch, tmp_path, repo):
    b, result = _bisect(monkeypatch, tmp_path, repo, slow_from=None)
    assert result["first_slower"] is None and len(result["steps"]) == 1
    assert "is not slower than GOOD on tg128 (no significant change): nothing to bisect" in \
        bisect.format_result(result, "GOOD", "BAD", "tg128")


def test_a_commit_of_goods_engine_build_is_not_measured(monkeypatch, tmp_path, repo):
    """A change outside engine/ builds GOOD's engine again: not slower, no A/B run."""
    b, result = _bisect(monkeypatch, tmp_path, repo, slow_from=8, same_build={5})
    assert result["first_slower"].subject == "change 8"
    same = [s for s in result["steps"] if s.verdict == bisect.SAME_BUILD]
    assert [s.subject for s in same] == ["change 5"] and same[0].record is None


def test_search_asks_one_plus_log2_n_questions():
    for n in (1, 2, 3, 8, 9, 16, 100):
        for k in range(n):
            asked = []
            assert bisect.search(n, lambda i: asked.append(i) or i >= k) == k
            assert len(asked) <= 1 + math.ceil(math.log2(n)) and asked[0] == n - 1
        assert bisect.search(n, lambda i: False) is None


def test_first_parent_takes_a_merged_branch_as_one_commit(tmp_path):
    r = tmp_path / "r"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    good = _commit(r, "good")
    _git(r, "checkout", "-q", "-b", "side")
    _commit(r, "side 1")
    _commit(r, "side 2")
    _git(r, "checkout", "-q", "main")
    _git(r, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    last = _commit(r, "after the merge")
    assert [s for _, s in wheels.first_parent(good, "HEAD", r)] == ["merge side", "after the merge"]
    assert wheels.first_parent(good, "HEAD", r)[-1][0] == last
    with pytest.raises(AnvilError, match="is not an ancestor of"):
        wheels.first_parent("HEAD", good, r)


def test_bisect_command(monkeypatch, tmp_path, repo, capsys):
    """`harness bisect GOOD BAD --model M --test tg128`: the commit named, exit 0."""
    r, good, commits = repo
    b = Builds(r, good, commits, slow_from=4, seed=3)
    monkeypatch.setattr(project, "ROOT", r)
    monkeypatch.setattr(wheels, "wheel_for", lambda rev, repo=None: b.build(rev, repo))
    monkeypatch.setattr(ab, "make_runner", b.runner)
    monkeypatch.setattr(common, "model", lambda name, check_only=False: None if check_only else (tmp_path / "m.gguf", {}))
    monkeypatch.setattr(common, "workdir", lambda: tmp_path)
    assert cli.main(["bisect", good[:8], "main", "--model", "m", "--test", "tg128",
                     "--results-dir", str(tmp_path / "store")]) == 0
    out, err = capsys.readouterr()
    assert f"first slower commit: {commits[3][0]} change 4 (4 of {N_COMMITS} after {good[:8]})" in out
    assert "bisect step 1:" in err and len(list((tmp_path / "store").glob("ab-*.json"))) >= 3  # each step's record
    with pytest.raises(SystemExit):
        cli.main(["bisect", good, "main", "--test", "tg-fast"])
    assert "expected a llama-bench test name" in capsys.readouterr().err
