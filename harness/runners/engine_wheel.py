"""Run ``python -m engine bench`` from an engine wheel, or from the engine
installed here, in a fresh process per run.

A wheel is identified by its sha256 and installed once into its own site
directory ``<workdir>/sites/<sha12>``, with its own kernel cache
``<workdir>/kernels/<sha12>`` (``ANVIL_CACHE_DIR``): two builds measured side
by side never import each other's code nor run each other's compiled kernels.

Each child is this interpreter started isolated (``python -I -S``): no
PYTHON* variables, no user site, no current directory and, above all, no
``.pth`` files, so an editable install of a checkout (a ``.pth`` finder
that serves ``engine.*`` from the checkout) cannot supply a module the wheel
lacks. A small bootstrap sets ``sys.path`` explicitly to the wheel's site
directory followed by the dependency directories of this environment, runs
``python -m engine ...`` and, before exiting, checks that every ``engine``
module the run imported came from that site directory; a module the wheel
lacks fails the run with a line naming it.

Why ``pip install --no-deps --target`` and not a venv per wheel: the
dependencies (numpy, gguf, cuda-python, ...) come from this environment.
That takes about a second and needs no package index (the GPU host is
offline: a venv could not resolve them there), and two wheels differ only
in the engine itself, which is what an A/B comparison should vary. The
price: a wheel that needs a different dependency version is measured with
this environment's one; ``describe()`` records the engine file and build
hash the child actually imported so that is visible.

The build is asked about itself through its public command line
(``python -m engine info --json``), never by importing a private module, so
a restructured engine can still be measured. A build from before ``info``
(2026-11-30) is measured too: its first ``bench --json`` record names its
build, and the bootstrap checks the modules that run imported.

A wheel from the harness's wheel cache (harness/wheels.py) is named by its
commit and subject.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

from engine.errors import TRACEBACK_ENV, AnvilError

from .. import wheels
from . import (Runner, RunnerError, RunResult, check_model, inherited_pythonpath, parse_json_output,
               pythonpath_without, run_process, tests_from_results)

REQUIRED_MEMBERS = ("engine/__init__.py", "engine/__main__.py")  # `python -m engine` is the interface
SUBJECT_CHARS = 60  # of a commit's subject in an arm's label
_MARKER = ".anvil-wheel.json"
ISOLATION_EXIT = 86  # the bootstrap's exit status when the run broke isolation or lacked a module

# Run by `python -I -S -c _BOOT ROOT PATHS ARG...`: sys.path is ROOT (the
# directory holding the engine under test), the standard library, then
# PATHS; `python -m engine ARG...` runs; every imported engine module must
# lie under ROOT/engine.
_BOOT = r"""
import os, runpy, sys
root, paths, args = os.path.realpath(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.path[:] = [root] + sys.path + [p for p in paths.split(os.pathsep) if p]
sys.argv = ["engine"] + args
code = 0
try:
    runpy.run_module("engine", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("engine"):
        raise
    print(f"isolation: the build under test lacks module {e.name} ({root} has no such file)", file=sys.stderr)
    code = %d
pkg = os.path.join(root, "engine") + os.sep
stray = []
for name, m in list(sys.modules.items()):
    if name == "engine" or name.startswith("engine."):
        files = [getattr(m, "__file__", None)] if getattr(m, "__file__", None) else list(getattr(m, "__path__", []))
        stray += [f"{name} ({f})" for f in files if not os.path.realpath(f).startswith(pkg)]
if stray:
    print(f"isolation: engine modules imported from outside {pkg}: {', '.join(sorted(stray))}", file=sys.stderr)
    code = %d
sys.stdout.flush()
sys.exit(code)
""" % (ISOLATION_EXIT, ISOLATION_EXIT)


def dependency_paths() -> list[str]:
    """Where this environment's packages live, for the isolated child: the
    inherited PYTHONPATH (minus any entry holding an ``engine`` package) and
    the site-packages directories, never the entries their ``.pth`` files add."""
    import site

    dirs = pythonpath_without("engine", inherited_pythonpath()) + list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(dirs))


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def check_wheel(path) -> str:
    """Raise AnvilError saying what is wrong unless ``path`` is an engine
    wheel; return its sha256."""
    p = Path(path)
    if not p.exists():
        raise AnvilError(f"{p}: wheel not found")
    if not p.is_file():
        raise AnvilError(f"{p}: not a file (expected an engine wheel, *.whl)")
    if p.suffix != ".whl":
        raise AnvilError(f"{p}: not a wheel (the name must end in .whl)")
    if len(p.name[:-4].split("-")) not in (5, 6):
        raise AnvilError(f"{p}: not a valid wheel file name (expected NAME-VERSION-PYTAG-ABITAG-PLATFORM.whl, "
                         f"as `pip wheel` writes it)")
    if not zipfile.is_zipfile(p):
        raise AnvilError(f"{p}: not a zip archive, so not a wheel (truncated or not a wheel at all)")
    try:
        with zipfile.ZipFile(p) as z:
            names = set(z.namelist())
    except zipfile.BadZipFile as e:
        raise AnvilError(f"{p}: unreadable zip archive ({e})") from None
    missing = [m for m in REQUIRED_MEMBERS if m not in names]
    if missing:
        raise AnvilError(f"{p}: not an engine wheel: it lacks {', '.join(missing)}")
    return sha256_file(p)


class _EngineRunner(Runner):
    """Shared by the wheel and the installed engine: the isolated child, its
    probe and the bench run. Subclasses set ``root`` (the directory holding
    the ``engine`` package under test) and ``cache_dir``."""

    root: Path
    cache_dir: Path

    def __init__(self, workdir, *, extra_args=(), label: str | None = None):
        self.workdir = Path(workdir).resolve()
        self.extra_args = [str(a) for a in extra_args]
        self._label = label
        self.probe: dict | None = None

    def command(self, *engine_args) -> list[str]:
        """``python -m engine ENGINE_ARGS`` for the build under test, isolated."""
        return [sys.executable, "-I", "-S", "-c", _BOOT, str(self.root), os.pathsep.join(dependency_paths()),
                *map(str, engine_args)]

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # -I ignores them anyway
        env["ANVIL_CACHE_DIR"] = str(self.cache_dir)
        # a bug in the child raises with its traceback: into the failed run's log, and a module the
        # build lacks reaches the bootstrap's check (RunnerError says the last line of it)
        env[TRACEBACK_ENV] = "1"
        return env

    def _cwd(self) -> Path:
        d = self.workdir / "run"  # neutral: nothing importable, nothing written
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _child(self, cmd: list[str], timeout_s: float, what: str) -> tuple[str, str, float]:
        try:
            return run_process(cmd, env=self._env(), cwd=self._cwd(), timeout_s=timeout_s, what=what)
        except RunnerError as e:
            # the bootstrap's own verdict says everything: one line, not a stderr dump
            lines = [ln for ln in e.stderr_tail.splitlines() if ln.startswith("isolation: ")]
            if e.returncode == ISOLATION_EXIT and lines:
                raise AnvilError(f"{self.label}: {lines[-1][len('isolation: '):]}") from None
            raise

    def _probe(self) -> dict:
        cmd = self.command("info", "--json")
        try:
            out, err, _ = self._child(cmd, 300, f"engine probe ({self.label})")
        except RunnerError as e:
            if not _lacks_info(e):
                raise
            # a build from before `info`: its first bench record names the
            # build (run()); every module that run imports is checked by the
            # bootstrap; its kernel cache is ANVIL_CACHE_DIR, as every build's
            return {"build": None, "probe": "bench --json (this build has no `python -m engine info`)"}
        probe = parse_json_output(out, cmd, err, what="engine probe")
        if not isinstance(probe, dict) or not isinstance(probe.get("modules"), dict) or not probe.get("build"):
            raise RunnerError("`python -m engine info --json` printed no build and module list", cmd, 0, err)
        pkg = (self.root / "engine").resolve()
        outside = [f"{n} ({f})" for n, f in probe["modules"].items() if f and not Path(f).resolve().is_relative_to(pkg)]
        if outside:
            raise AnvilError(f"{self.label}: engine modules imported from outside {pkg}: {', '.join(outside)}")
        if Path(probe.get("cache_dir", "")) != self.cache_dir:
            raise RunnerError(f"the child's kernel cache is {probe.get('cache_dir')}, expected {self.cache_dir}",
                              cmd, 0)
        return probe

    def run(self, model_path, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, depth: int = 0,
            timeout_s: float = 1800) -> RunResult:
        model = check_model(model_path)
        if self.probe is None:
            self.prepare()
        at = ("-d", depth) if depth else ()  # builds before depth existed still run depth-0 tests
        cmd = self.command("bench", model, "-p", n_prompt, "-n", n_gen, "-r", reps, *at, "--json", *self.extra_args)
        out, err, wall = self._child(cmd, timeout_s, f"engine bench ({self.label})")
        raw = parse_json_output(out, cmd, err)
        if not isinstance(raw, dict):
            raise RunnerError("engine bench printed JSON that is not an object", cmd, 0, err)
        if self.probe["build"] is None:  # a build without `info` (_probe): its first record names it
            if not raw.get("build"):
                raise RunnerError("engine bench printed no build: which engine ran cannot be told", cmd, 0, err)
            self.probe["build"] = raw["build"]
        if raw.get("build") != self.probe["build"]:
            raise RunnerError(f"engine bench reports build {raw.get('build')} but the engine under test is build "
                              f"{self.probe['build']} ({self.probe.get('engine_file')}): another engine was imported",
                              cmd, 0, err)
        return RunResult(tests=tests_from_results(raw, cmd, err), tokens=raw.get("tokens"), raw=raw,
                         wall_s=wall, cmd=cmd, returncode=0)

    def _identity(self) -> dict:
        p = self.probe or {}
        return {"engine_file": p.get("engine_file"), "build": p.get("build"), "version": p.get("version"),
                "python": p.get("python"), "modules": len(p.get("modules") or {}), "cache_dir": str(self.cache_dir),
                "isolation": "python -I -S, explicit sys.path", "probe": p.get("probe", "info --json"),
                "extra_args": self.extra_args}


def _lacks_info(e: RunnerError) -> bool:
    """Whether the probe failed only because the build has no ``info``
    command: argparse's usage error (exit status 2) naming it."""
    return e.returncode == 2 and "invalid choice: 'info'" in e.stderr_tail


class EngineWheelRunner(_EngineRunner):
    kind = "engine-wheel"

    def __init__(self, wheel, workdir, *, extra_args=(), label: str | None = None):
        super().__init__(workdir, extra_args=extra_args, label=label)
        self.wheel = Path(wheel).resolve()
        self.sha256 = check_wheel(self.wheel)
        self.sha12 = self.sha256[:12]
        self.site_dir = self.root = self.workdir / "sites" / self.sha12
        self.cache_dir = self.workdir / "kernels" / self.sha12
        self.commit = wheels.commit_info(self.wheel) or {}  # a wheel from the wheel cache: its commit
        commit, subject = self.commit.get("commit"), self.commit.get("subject") or ""
        self.label = label or (f"{commit[:10]} {subject[:SUBJECT_CHARS]}".rstrip() if commit else
                               f"{self.wheel.name.split('-')[0]}-{self.wheel.name.split('-')[1]}@{self.sha12}")

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "wheel": str(self.wheel), "sha256": self.sha256,
                "commit": self.commit.get("commit"), "subject": self.commit.get("subject"),
                "site_dir": str(self.site_dir), **self._identity()}

    def installed(self) -> bool:
        try:
            return json.loads((self.site_dir / _MARKER).read_text())["sha256"] == self.sha256
        except (OSError, ValueError, KeyError):
            return False

    def prepare(self) -> None:
        if not self.installed():
            self._install()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.probe = self._probe()

    def _install(self) -> None:
        # into a private temp dir, then renamed: a half-finished install is
        # never reused, and two processes installing the same wheel both end
        # with one complete copy
        self.site_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.site_dir.parent / f".tmp-{self.sha12}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
               "--quiet", "--target", str(tmp), str(self.wheel)]
        try:
            run_process(cmd, timeout_s=600, what=f"installing {self.wheel.name}")
            (tmp / _MARKER).write_text(json.dumps({"sha256": self.sha256, "wheel": str(self.wheel)}) + "\n")
            if self.site_dir.exists() and not self.installed():
                shutil.rmtree(self.site_dir)  # a leftover without a marker: incomplete
            try:
                os.replace(tmp, self.site_dir)
            except OSError:
                if not self.installed():  # not another process's finished copy
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class InstalledEngineRunner(_EngineRunner):
    """The engine this interpreter imports (an editable checkout, say), run
    isolated the same way from the directory that holds it, with a kernel
    cache keyed by its build hash."""

    kind = "engine-installed"

    def __init__(self, workdir, *, extra_args=(), label: str | None = None):
        super().__init__(workdir, extra_args=extra_args, label=label)
        import engine
        from engine.bench import build_hash

        self.engine_dir = Path(engine.__file__).resolve().parent
        self.root = self.engine_dir.parent
        self.build = build_hash()
        self.cache_dir = self.workdir / "kernels" / f"installed-{self.build}"
        self.label = label or f"installed@{self.build}"

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "engine_dir": str(self.engine_dir), **self._identity()}

    def prepare(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.probe = self._probe()
        if self.probe["build"] != self.build:
            raise AnvilError(f"{self.label}: the child's engine is build {self.probe['build']}, this one "
                             f"{self.build} (sources changed since this process started?)")
