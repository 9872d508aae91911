"""Run ``python -m engine bench`` from an engine wheel, or from the engine
installed here, in a fresh process per run.

A wheel is identified by its sha256 and installed once into its own site
directory ``<workdir>/sites/<sha12>``, with its own kernel cache
``<workdir>/kernels/<sha12>`` (``ANVIL_CACHE_DIR``): two builds measured side
by side never import each other's code nor run each other's compiled kernels.

Why ``pip install --no-deps --target`` and not a venv per wheel: the child is
this interpreter with PYTHONPATH set to the wheel's site dir, so the
dependencies (numpy, gguf, cuda-python, ...) come from this environment.
That takes about a second and needs no package index (the GPU host is
offline: a venv could not resolve them there), and two wheels differ only
in the engine itself, which is what an A/B comparison should vary. The
price: a wheel that needs a different dependency version is measured with
this environment's one; ``describe()`` records the engine file and build
hash the child actually imported so that is visible.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

from engine.errors import AnvilError

from . import (Runner, RunnerError, RunResult, check_model, inherited_pythonpath, parse_json_output,
               pythonpath_without, run_process, tests_from_results)

REQUIRED_MEMBERS = ("engine/__init__.py", "engine/bench.py")
_MARKER = ".anvil-wheel.json"

# Printed by a child with the run's environment: which engine it imports,
# its build hash and where it would cache kernels.
_PROBE = ("import json, sys, engine, engine.bench\n"
          "from engine.backends.cuda import compile as c\n"
          "print(json.dumps({'engine_file': engine.__file__, 'build': engine.bench.build_hash(),\n"
          "                  'version': getattr(engine, '__version__', None), 'cache_dir': str(c.cache_dir()),\n"
          "                  'python': sys.version.split()[0]}))\n")


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


def _child_env(pythonpath: list[str], cache_dir: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env["ANVIL_CACHE_DIR"] = str(cache_dir)
    env.pop("PYTHONSAFEPATH", None)
    return env


class _EngineRunner(Runner):
    """Shared by the wheel and the installed engine: the bench child and its probe."""

    def __init__(self, workdir, *, extra_args=(), label: str | None = None):
        self.workdir = Path(workdir).resolve()
        self.extra_args = [str(a) for a in extra_args]
        self._label = label
        self.probe: dict | None = None

    # subclasses: self.pythonpath(), self.cache_dir, self._check_probe(probe)
    def _env(self) -> dict:
        return _child_env(self.pythonpath(), self.cache_dir)

    def _cwd(self) -> Path:
        # neutral: `-m` puts the cwd first on sys.path, and a checkout there
        # would shadow the engine under test (-P also drops it, belt and braces)
        d = self.workdir / "run"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _probe(self) -> dict:
        cmd = [sys.executable, "-P", "-c", _PROBE]
        out, err, _ = run_process(cmd, env=self._env(), cwd=self._cwd(), timeout_s=300, what="engine probe")
        probe = parse_json_output(out, cmd, err, what="engine probe")
        self._check_probe(probe, cmd)
        return probe

    def run(self, model_path, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5,
            timeout_s: float = 1800) -> RunResult:
        model = check_model(model_path)
        if self.probe is None:
            self.prepare()
        cmd = [sys.executable, "-P", "-m", "engine", "bench", str(model), "-p", str(n_prompt), "-n", str(n_gen),
               "-r", str(reps), "--json", *self.extra_args]
        out, err, wall = run_process(cmd, env=self._env(), cwd=self._cwd(), timeout_s=timeout_s,
                                     what=f"engine bench ({self.label})")
        raw = parse_json_output(out, cmd, err)
        if not isinstance(raw, dict):
            raise RunnerError("engine bench printed JSON that is not an object", cmd, 0, err)
        if raw.get("build") != self.probe["build"]:
            raise RunnerError(f"engine bench reports build {raw.get('build')} but the engine under test is build "
                              f"{self.probe['build']} ({self.probe['engine_file']}): another engine was imported",
                              cmd, 0, err)
        return RunResult(tests=tests_from_results(raw, cmd, err), tokens=raw.get("tokens"), raw=raw,
                         wall_s=wall, cmd=cmd, returncode=0)

    def _identity(self) -> dict:
        p = self.probe or {}
        return {"engine_file": p.get("engine_file"), "build": p.get("build"), "version": p.get("version"),
                "python": p.get("python"), "cache_dir": str(self.cache_dir), "extra_args": self.extra_args}


class EngineWheelRunner(_EngineRunner):
    kind = "engine-wheel"

    def __init__(self, wheel, workdir, *, extra_args=(), label: str | None = None):
        super().__init__(workdir, extra_args=extra_args, label=label)
        self.wheel = Path(wheel).resolve()
        self.sha256 = check_wheel(self.wheel)
        self.sha12 = self.sha256[:12]
        self.site_dir = self.workdir / "sites" / self.sha12
        self.cache_dir = self.workdir / "kernels" / self.sha12
        self.label = label or f"{self.wheel.name.split('-')[0]}-{self.wheel.name.split('-')[1]}@{self.sha12}"

    def pythonpath(self) -> list[str]:
        return [str(self.site_dir)] + pythonpath_without("engine", inherited_pythonpath())

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "wheel": str(self.wheel), "sha256": self.sha256,
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

    def _check_probe(self, probe: dict, cmd) -> None:
        f = Path(probe.get("engine_file") or "").resolve()
        if not f.is_relative_to(self.site_dir.resolve()):
            raise RunnerError(f"the child imported engine from {f}, not from the wheel's site dir {self.site_dir}",
                              cmd, 0)
        if Path(probe.get("cache_dir", "")) != self.cache_dir:
            raise RunnerError(f"the child's kernel cache is {probe.get('cache_dir')}, expected {self.cache_dir}",
                              cmd, 0)


class InstalledEngineRunner(_EngineRunner):
    """The engine this interpreter imports (an editable checkout, say). The
    child gets that engine's parent directory first on PYTHONPATH, and a
    kernel cache keyed by its build hash."""

    kind = "engine-installed"

    def __init__(self, workdir, *, extra_args=(), label: str | None = None):
        super().__init__(workdir, extra_args=extra_args, label=label)
        import engine
        import engine.bench

        self.engine_dir = Path(engine.__file__).resolve().parent
        self.build = engine.bench.build_hash()
        self.cache_dir = self.workdir / "kernels" / f"installed-{self.build}"
        self.label = label or f"installed@{self.build}"

    def pythonpath(self) -> list[str]:
        return [str(self.engine_dir.parent)] + pythonpath_without("engine", inherited_pythonpath())

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "engine_dir": str(self.engine_dir), **self._identity()}

    def prepare(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.probe = self._probe()

    def _check_probe(self, probe: dict, cmd) -> None:
        f = Path(probe.get("engine_file") or "").resolve()
        if f.parent != self.engine_dir:
            raise RunnerError(f"the child imported engine from {f}, not {self.engine_dir}", cmd, 0)
        if probe.get("build") != self.build:
            raise RunnerError(f"the child's engine is build {probe.get('build')}, this one {self.build} "
                              f"(sources changed since this process started?)", cmd, 0)
