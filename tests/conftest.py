"""Shared fixtures: real model files (fetched once into the model cache) and
loaded models (loaded once per session; loading gemma3 takes seconds)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import catalog


REQUIRE_GPU = "ANVIL_REQUIRE_GPU"  # =1: a missing or broken GPU fails the run instead of skipping its tests


@functools.cache
def _gpu_missing() -> str | None:
    from engine.backends.cuda.device import gpu_probe

    return gpu_probe()


def gpu_skip_reason(missing: str | None, required: bool) -> str | None:
    """Why the gpu-marked tests are skipped (None: they run). Where a GPU is
    required (on the GPU host), its absence is an error with the driver's
    message: a broken driver that skipped every GPU test looked like a pass."""
    if missing is None:
        return None
    if required:
        raise pytest.UsageError(f"{REQUIRE_GPU}=1 but no usable NVIDIA GPU: {missing}")
    return f"no usable NVIDIA GPU: {missing}"


def pytest_configure(config):
    if os.environ.get(REQUIRE_GPU) == "1":  # before any worker starts: the run stops at once
        gpu_skip_reason(_gpu_missing(), required=True)


# scripts/test.sh runs the suite on two pytest-xdist workers, a file at a
# time each (--dist loadfile, in this order): the parity checks first and
# the mutant suite (whose children run models on both cores) next, the
# longest files starting first; the rest fill in around them.
FIRST = ("test_parity_cpu.py", "test_mutants.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))  # stable
    reason = gpu_skip_reason(_gpu_missing(), required=os.environ.get(REQUIRE_GPU) == "1")
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_path():
    """``model_path(name)``: the verified file of a catalog model."""
    return functools.cache(lambda name: catalog.model_path(name, progress=False))


@pytest.fixture(scope="session")
def smollm2_path(model_path):
    return model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path(model_path):
    return model_path("gemma3-270m")


@pytest.fixture(scope="session")
def qwen2_vocab_path():
    from harness import fetch

    return fetch.fetch_llamacpp_vocab("qwen2", progress=False)


@pytest.fixture(scope="session")
def big_model_lock(tmp_path_factory):
    """A lock held while a real catalog model (gemma3-270m: 1.1 GB of float32
    weights on the NumPy engine) is loaded, shared by every pytest-xdist
    worker of the run, so that two such models are never held at once."""
    import fcntl

    # the parent of this worker's temporary directory is the run's, shared by its workers
    f = open(tmp_path_factory.getbasetemp().parent / "big-model.lock", "w")
    yield lambda: fcntl.flock(f, fcntl.LOCK_EX), lambda: fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def is_big(name: str) -> bool:
    return catalog.entry(name).source == "pypi"  # the real models; the synthetic ones are tiny


@pytest.fixture(scope="module")
def loaded_model(model_path, big_model_lock):
    """``loaded_model(name)``: an engine Model, kept while the next tests use it.
    One at a time, and none after the module: the tests that share a model
    take it one after another, and models held at once (float32 weights on
    the NumPy backend) were most of the suite's peak memory."""
    import gc

    import engine

    acquire, release = big_model_lock
    held = {}

    def drop():
        if held:
            big = is_big(next(iter(held)))
            held.clear()
            gc.collect()
            if big:
                release()

    def load(name):
        if name not in held:
            drop()
            if is_big(name):
                acquire()
            held[name] = engine.load(model_path(name))
        return held[name]

    yield load
    drop()


REPO = Path(__file__).resolve().parents[1]


def _copy_ignore(top: Path):
    def ignore(d, names):
        skip = {n for n in names if n in ("__pycache__", "build", "dist") or n.endswith((".egg-info", ".pyc",
                                                                                          ".gguf", ".whl"))}
        if Path(d) == top:
            skip |= {n for n in names if n.startswith(".")}
        return skip
    return ignore


@pytest.fixture(scope="session")
def build_engine_wheel(tmp_path_factory):
    """``build_engine_wheel(tag, edit=None)``: a wheel of this checkout (built
    from a copy, so nothing lands in the repository), after ``edit(src_dir)``
    changes the copy; built once per tag per session."""
    built = {}

    def build(tag: str, edit=None) -> Path:
        if tag not in built:
            tmp = tmp_path_factory.mktemp(f"wheel-{tag}")
            src = tmp / "src"
            shutil.copytree(REPO, src, ignore=_copy_ignore(REPO))
            if edit is not None:
                edit(src)
            p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                                "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, p.stderr[-3000:]
            (built[tag],) = (tmp / "dist").glob("anvil-*.whl")
        return built[tag]

    return build
