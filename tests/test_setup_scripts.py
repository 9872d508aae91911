"""The set-up scripts: Chromium (a system package) is installed only when
someone says yes, never asked for without a terminal (CI); the
llama-cpp-python build says how far it is; the README says how to put
``harness`` on PATH, and CI runs the README's test command."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "env", "id", "head", "seq", "sleep", "grep", "tail", "sed", "ls", "mkdir", "touch", "cat", "kill",
         "dirname")


@pytest.fixture
def fake_path(tmp_path):
    """A PATH of the few tools the scripts use and fakes that record their
    calls into ``calls`` (no chromium on it): ``add(name, script)``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in TOOLS:
        if shutil.which(tool):
            (bin_ / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls"

    def add(name, body="exit 0"):
        (bin_ / name).write_text(f"#!{shutil.which('bash')}\necho \"{name} $*\" >> {calls}\n{body}\n")
        (bin_ / name).chmod(0o755)
    add("id", 'echo 0')  # root: no sudo needed
    add("apt-get")
    add.calls = calls
    add.env = {"PATH": str(bin_), "HOME": str(tmp_path)}
    return add


def _calls(fake) -> list[str]:
    return fake.calls.read_text().splitlines() if fake.calls.exists() else []


def test_no_terminal_no_system_package(fake_path):
    r = subprocess.run(["bash", str(REPO / "scripts/install-browser.sh")], env=fake_path.env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "no terminal to ask before installing a system package, so none is" in r.stdout
    assert "the browser tests will skip" in r.stdout and "ANVIL_INSTALL_BROWSER=1" in r.stdout
    assert not [c for c in _calls(fake_path) if c.startswith("apt-get")]


def test_installing_without_asking_needs_a_yes_beforehand(fake_path):
    env = {**fake_path.env, "ANVIL_INSTALL_BROWSER": "1"}
    r = subprocess.run(["bash", str(REPO / "scripts/install-browser.sh")], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [c for c in _calls(fake_path) if c.startswith("apt-get")] == [
        "apt-get update -q", "apt-get install -y -q --no-install-recommends chromium"]


def _in_a_terminal(env, answer: str) -> str:
    """Run install-browser.sh on a pseudo-terminal, answering its question."""
    master, slave = pty.openpty()
    p = subprocess.Popen(["bash", str(REPO / "scripts/install-browser.sh")], env=env, stdin=slave, stdout=slave,
                         stderr=slave, close_fds=True)
    os.close(slave)
    out, answered, deadline = b"", False, time.time() + 60
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the script exited: the terminal is gone
                break
            if not chunk:
                break
            out += chunk
        if not answered and b"[y/N]" in out:
            os.write(master, answer.encode() + b"\n")
            answered = True
        if p.poll() is not None and not ready:
            break
    p.wait(timeout=10)
    os.close(master)
    assert p.returncode == 0 and answered, out
    return out.decode(errors="replace")


@pytest.mark.parametrize("answer,installs", [("n", False), ("", False), ("y", True)])
def test_a_terminal_is_asked_first(fake_path, answer, installs):
    out = _in_a_terminal(fake_path.env, answer)
    assert "install Debian's chromium (apt-get, as root) for the browser tests? [y/N]" in out
    assert bool([c for c in _calls(fake_path) if c.startswith("apt-get install")]) == installs
    if not installs:
        assert "not installed: the browser tests will skip" in out


@pytest.mark.parametrize("fail", [False, True])
def test_the_llama_cpp_build_says_how_far_it_is(fake_path, tmp_path, fail):
    fake_path("python", """
if [ "$3" = wheel ]; then
  for i in 1 2 3; do echo "[$i/3] Building C object vendor/llama.cpp/ggml.c.o"; sleep 1.1; done
  [ -n "$FAIL" ] && { echo "error: the compiler stopped"; exit 1; }
  for a; do [ "$prev" = -w ] && touch "$a/llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"; prev=$a; done
fi""")
    env = {**fake_path.env, "ANVIL_WHEELHOUSE": str(tmp_path / "wh"), "PROGRESS_S": "1", "FAIL": "1" if fail else ""}
    r = subprocess.run(["bash", str(REPO / "scripts/llamacpp-python.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    log = tmp_path / "wh" / "llama-cpp-python-0.3.36-build.log"
    assert f"(once, ~4 min; log: {log})" in r.stdout
    assert "s, build step [" in r.stdout  # a line while it builds: how long, and the compiler's step
    if fail:
        assert r.returncode == 1 and "did not build; the end of" in r.stdout and "the compiler stopped" in r.stdout
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "built in " in r.stdout and _calls(fake_path)[-1].startswith("python -m pip install -q --find-links")


def test_readme_says_how_to_put_harness_on_path_and_ci_runs_its_test_command():
    readme = (REPO / "README.md").read_text()
    assert "source .venv/bin/activate" in readme
    two = readme.split("## Two commands", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert [ln.split()[0] for ln in two.strip().splitlines()] == ["scripts/quickstart.sh", "scripts/test.sh"]
    assert "exec scripts/test.sh" in (REPO / ".ci" / "run").read_text()
