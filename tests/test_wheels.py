"""Engine wheels from git revisions: `harness wheel`, `harness ab --commits`."""

from __future__ import annotations

import pytest

from engine.errors import AnvilError
from harness import cli, wheels


def test_a_commit_is_built_once_and_named_by_its_id(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANVIL_WHEELS_DIR", str(tmp_path / "wheels"))
    head = wheels.commit_of("HEAD")
    first = wheels.wheel_for("HEAD", progress=False)
    assert first.parent == tmp_path / "wheels" / head and first.name.startswith("anvil-")
    # beside it, what an A/B arm is named by: the commit and its subject
    assert wheels.commit_info(first) == {"commit": head, "subject": wheels.subject_of(head)} and wheels.subject_of(head)
    stamp = first.stat().st_mtime_ns
    assert cli.main(["wheel", head[:12]]) == 0  # the same commit by another name: the cached wheel
    assert capsys.readouterr().out.strip() == str(first) and first.stat().st_mtime_ns == stamp
    with pytest.raises(AnvilError, match=r"^'no-such-rev' is not a commit of .* \(git rev-parse\)$"):
        wheels.wheel_for("no-such-rev")
    # one commit on both arms: refused before any measurement, unless --allow-same
    assert cli.main(["ab", "--commits", "HEAD", head, "--model", "tiny-qwen3"]) != 0
    assert "both arms are the same build" in capsys.readouterr().err


def test_wheels_build_without_isolation_where_the_backend_is_installed(monkeypatch):
    import importlib.metadata as md

    from harness import wheels

    for installed, want in (("80.9.0", ["--no-build-isolation"]), ("77.0.1", ["--no-build-isolation"]),
                            ("65.5.0", []), (None, [])):
        def version(name, v=installed):
            if v is None:
                raise md.PackageNotFoundError(name)
            return v
        monkeypatch.setattr(md, "version", version)
        assert wheels.build_isolation_args() == want, installed
