"""A model that does not fit is refused before it is loaded, in one line with
both numbers: the NumPy engine against the host's memory, the CUDA engine
against the device's (here the recording device, no GPU needed)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from engine import memory
from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
from engine.errors import AnvilError
from engine.model import Model


def test_numpy_refuses_a_model_beyond_the_memory_left(model_path, monkeypatch):
    path = model_path("tiny-qwen3")
    monkeypatch.setattr(memory, "host_available", lambda: (1 << 20, "available (MemAvailable)"))
    with pytest.raises(AnvilError) as e:
        Model(path, backend="numpy")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: the NumPy engine needs ")
    assert "float32 weights " in msg and "KV cache at --ctx 4096" in msg
    assert "but 0.0 GB is available (MemAvailable)" in msg and "ANVIL_MEMORY_CHECK=0 loads it anyway" in msg
    monkeypatch.setenv("ANVIL_MEMORY_CHECK", "0")
    assert Model(path, backend="numpy").forward([1, 2]).shape[0] > 0


def test_the_context_that_fits_is_said(model_path, monkeypatch):
    """Weights that fit with a context too long: the largest context that fits."""
    import engine

    path = model_path("tiny-qwen3")
    m = engine.load(path)
    gf, cfg = m.gguf, m.config
    per_token = memory.kv_bytes_per_token(cfg, ["attention"] * cfg.n_layer, 4)
    free = memory.float32_bytes(gf) + 1000 * per_token
    monkeypatch.setattr(memory, "host_available", lambda: (free, "available (MemAvailable)"))
    with pytest.raises(AnvilError, match=r"--ctx 768 would fit, or run it on a GPU"):
        Model(path, backend="numpy", n_ctx=4096)
    assert Model(path, backend="numpy", n_ctx=768).n_ctx == 768


def test_cuda_checks_device_memory_before_allocating(model_path, monkeypatch):
    path = model_path("tiny-qwen3")
    dev = RecordingDevice()
    Model(path, backend="cuda", eager=True, device=dev, cublas=RecordingCublas())  # an H200's free memory
    monkeypatch.setattr(RecordingDevice, "free_bytes", 100 << 20)
    dev = RecordingDevice()
    with pytest.raises(AnvilError) as e:
        Model(path, backend="cuda", eager=True, device=dev, cublas=RecordingCublas())
    msg = str(e.value)
    assert msg.startswith(f"{path}: the CUDA engine needs ") and "weights " in msg and "workspace " in msg
    assert "KV cache at --ctx 4096" in msg and "but 0.1 GB is free on the recording device" in msg
    assert dev._next == 1 << 32, "device memory was allocated before the check"


def test_an_address_space_limit_is_memory_left(gemma3_path):
    """Under ``ulimit -v`` (the README test's cap) the refusal comes before
    NumPy's MemoryError: gemma3-270m's 1.1 GB of float32 weights in 1 GB."""
    limit = 1000 << 20
    r = subprocess.run([sys.executable, "-m", "engine", "generate", str(gemma3_path), "--prompt-ids", "1,2", "-n", "2",
                        "--backend", "numpy"], capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "the NumPy engine needs 1.2 GB (float32 weights 1.1 GB + KV cache at --ctx 4096 0.2 GB) but " in r.stderr
    assert "left under the address-space limit (ulimit -v)" in r.stderr


@pytest.mark.gpu
def test_the_gpu_says_its_free_memory_and_a_load_is_checked_against_it(model_path, monkeypatch):
    """On the GPU host: cuMemGetInfo through Device.mem_free, and the refusal before any allocation."""
    from engine.backends.cuda.device import Device

    path = model_path("tiny-qwen3")
    model = Model(path, backend="cuda")
    free = model.backend.dev.mem_free()
    assert 0 < free < 1 << 50 and model.forward([1, 2]).shape[0] > 0
    monkeypatch.setattr(Device, "mem_free", lambda self: 1 << 20)
    with pytest.raises(AnvilError, match=r"the CUDA engine needs .* but 0\.0 GB is free on the NVIDIA"):
        Model(path, backend="cuda")
