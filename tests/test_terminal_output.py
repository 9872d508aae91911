"""What a person reads: validate-catalog's details first and its table last,
near-tie flips summarised per model (each with --verbose), every field
labelled, and tables within 120 columns (drawn by rich in a terminal)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import table

MODEL = "tiny-llama"  # 2 near-tie flips against its cpu references, 8 against its f16kv ones


@pytest.fixture(scope="module")
def runs(model_path):
    model_path(MODEL)

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "harness.cli", "validate-catalog", "--model", MODEL, "--backend",
                            "numpy", *extra], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r
    return {"plain": run(), "verbose": run("--verbose")}


def test_validate_prints_its_table_last(runs):
    out = runs["plain"].stdout.strip().splitlines()
    assert [ln.split(" | ")[1] for ln in out[-3:]] == ["cpu", "twin", "f16kv"] and out[-1].startswith(f"| {MODEL} | ")
    assert out[-5] == "| model | set | prefix | agree | flips | flip share | Δlogit | KL | margin shift | verdict |"
    assert max(map(len, out)) <= table.WIDTH
    # each model's line, counted, with its time
    err = runs["plain"].stderr.splitlines()
    assert err[0].startswith(f"[1/3] {MODEL} (cpu references): pass (") and err[1].startswith("[2/3] ")


def test_near_ties_are_summarised_per_model_and_listed_with_verbose(runs):
    out = runs["plain"].stdout
    assert "Near-tie flips, where llama.cpp's top-2 margin and the engine's gap" in out
    assert "--verbose lists each" in out
    (summary,) = [ln for ln in out.splitlines() if ln.startswith(f"  {MODEL} (cpu references): ")]
    assert "2 in 2 of 4 prompts, bound 0.69; the closest to it, prompt " in summary
    assert not any(ln.startswith("near-tie ") for ln in out.splitlines())  # no line per flip
    listed = [ln for ln in runs["verbose"].stdout.splitlines() if ln.startswith("near-tie ")]
    assert len(listed) == 10
    for ln in listed:  # each with its set's bound
        assert ln.startswith(f"near-tie {MODEL} (cpu) prompt ") and ", bound 0.69" in ln or \
            ln.startswith(f"near-tie {MODEL} (f16kv) prompt ") and ", bound 0.78" in ln
        assert "llama.cpp token " in ln and "(top-2 margin " in ln and "engine token " in ln and "(gap " in ln


def test_terminal_tables_fit_and_keep_every_character():
    header = ["model", "set", "a long header that wraps", "verdict"]
    rows = [["tiny-qwen35moe-f32", "oracle", "7.63e-5 / 0.001", "FAIL: degenerate, drift, flips, kl, logit"],
            ["m", "[1.0, 2.0]", "[bold]not markup[/bold]", "pass"]]
    for width in (120, 60, 30):
        text = table.terminal(header, rows, width)
        assert max(map(len, text.splitlines())) <= width, text
        squeezed = "".join(text.split())
        for cell in [*header, *(c for row in rows for c in row)]:  # wrapped or folded, every character in order
            rest = iter(squeezed)
            assert all(ch in rest for ch in "".join(cell.split())), (cell, width)
    wide = table.terminal(header, rows, 200)
    assert "[bold]not markup[/bold]" in wide and "tiny-qwen35moe-f32" in wide  # one line each, nothing cut


def test_show_draws_for_a_terminal_and_writes_markdown_elsewhere(capsys):
    table.show(["a", "b"], [["1", "2"]], tty=False)
    assert capsys.readouterr().out == "| a | b |\n|---|---|\n| 1 | 2 |\n"
    table.show(["a", "b"], [["1", "2"]], tty=True)
    out = capsys.readouterr().out
    assert "|" not in out and "─" in out and "1" in out
