"""Shared fixtures: real model files (fetched once into the model cache) and
loaded models (loaded once per session; loading gemma3 takes seconds)."""

from __future__ import annotations

import functools

import pytest

from harness import catalog


def _has_gpu() -> bool:
    try:
        from cuda.bindings import driver

        err, = driver.cuInit(0)[:1]
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU with a working driver on this machine")
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
def loaded_model(model_path):
    """``loaded_model(name)``: an engine Model, loaded once per session."""
    import engine

    return functools.cache(lambda name: engine.load(model_path(name)))
