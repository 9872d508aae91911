"""``python -m engine bench``: llama-bench's tests, with its names and semantics.

- ``pp<N>``: one N-token prefill from an empty cache, per repetition.
- ``tg<N>``: N single-token greedy decode steps from an empty cache, each
  step synchronised (the chosen token is read back before the next).
- at depth D (``pp512 @ d4096``): the same after D context tokens were put
  in the cache, untimed, before every repetition (llama-bench's ``-d``).
- 1 warm-up + R repetitions, reported as mean ± sd tokens/s; decode also as
  achieved GB/s: the weight bytes one token reads × tokens/s.
"""

from __future__ import annotations

import hashlib
import platform
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA_VERSION = 2  # the results store's (harness/results.py), whose bench records these are


def build_hash() -> str:
    """sha256 over the engine's own sources (.py, .cu, .cuh): the build under test."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".cu", ".cuh") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def weight_bytes_per_token(model) -> int:
    """The weight bytes one decode step reads, as the model's family counts them."""
    return model.family.bytes_per_token(model.gguf, model.config)


def params_per_token(model) -> int:
    """The weights a token is multiplied by (a Mixture-of-Experts model's active ones)."""
    from .models import weights

    return weights.params_read_per_token(model.gguf, model.config, model.family.layer_tensors)


def nvml_index() -> int:
    """NVML's index of the GPU this process computes on (its CUDA device 0):
    the first entry of ``CUDA_VISIBLE_DEVICES`` where that is an index
    (``harness --gpus`` pins each worker so, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    CUDA's order and NVML's), else 0. NVML itself ignores the variable."""
    import os

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def gpu_info() -> dict:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index())
        return {"gpu": pynvml.nvmlDeviceGetName(h), "driver": pynvml.nvmlSystemGetDriverVersion(),
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)}
    except Exception as e:
        return {"gpu": None, "nvml": f"unavailable ({type(e).__name__})"}


def cuda_versions() -> dict:
    """What the CUDA backend runs on, for a record's provenance: the driver
    API's CUDA version, NVRTC's and cuBLAS's (None where one is not loadable,
    e.g. cuBLAS on a machine without the ``cuda`` extra)."""
    out: dict = {"cuda_driver": None, "nvrtc": None, "cublas": None}
    try:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        if err == driver.CUresult.CUDA_SUCCESS:
            out["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        pass
    try:
        from .backends.cuda.compile import nvrtc_version

        out["nvrtc"] = "{}.{}".format(*nvrtc_version())
    except Exception:
        pass
    try:
        from .backends.cuda import cublas

        out["cublas"] = cublas.version()
    except Exception:
        pass
    return out


def _sync(model):
    dev = getattr(model.backend, "dev", None)
    if dev is not None:
        dev.synchronize()


def _fill(model, context) -> None:
    """A fresh sequence holding ``context`` (untimed): a test at depth ``len(context)``."""
    model.reset()
    if len(context):
        model.forward(context)


def run_pp(model, n: int, rng, context=()) -> float:
    tokens = rng.integers(0, model.config.n_vocab, n)
    _fill(model, context)
    _sync(model)
    t0 = time.perf_counter()
    model.forward(tokens)  # returns host logits: the pass has finished
    return n / (time.perf_counter() - t0)


TOP_K = 8  # logits kept per decode step of the warm-up (bench's "token_tops")


def run_tg(model, n: int, start_token: int, tokens_out: list | None = None, context=(),
           tops_out: list | None = None) -> float:
    """n greedy decode steps from ``start_token`` after ``context``; the tokens
    are kept so two builds can be checked to generate the same ones.
    ``tops_out`` (the untimed warm-up): each step's TOP_K token ids and
    logits, largest first, so a difference between builds can be judged
    (harness ab: a flip between near-tied tokens)."""
    _fill(model, context)
    token = start_token
    tokens = []
    _sync(model)
    t0 = time.perf_counter()
    if tops_out is None:  # the steps queued back to back, their tokens read once (Model.decode_greedy)
        tokens = model.decode_greedy(token, n)
    else:
        for _ in range(n):
            token = model.decode_next(token)  # reads the token back: synchronised
            tokens.append(token)
            logits = model.decode_logits()
            ids = np.argpartition(-logits, TOP_K)[:TOP_K]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            tops_out.append({"ids": [int(i) for i in ids], "logits": [float(logits[i]) for i in ids]})
    dt = time.perf_counter() - t0
    if tokens_out is not None:
        tokens_out[:] = tokens
    return n / dt


def bench_ctx(depth: int, n_prompt: int = 512, n_gen: int = 128) -> int | None:
    """The cache a bench at ``depth`` sizes, as llama-bench sizes its own:
    depth + the longer test (None at depth 0: the model's default). The
    decode attention's split plan depends on it (launchers/attention.py
    decode_plan), so whatever times a bench's step sizes its cache so too."""
    return depth + max(n_prompt, n_gen) if depth else None


def depth_context(n_vocab: int, depth: int, seed: int = 0) -> np.ndarray:
    """The ``depth`` context tokens a test at that depth starts from (the
    llama-cpp-python arm draws the same)."""
    return np.random.default_rng(seed + 1).integers(0, n_vocab, depth)


def bench(model, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, seed: int = 0, depth: int = 0,
          progress=None) -> dict:
    rng = np.random.default_rng(seed)
    start_token = int(rng.integers(0, model.config.n_vocab))
    context = depth_context(model.config.n_vocab, depth, seed)
    at = f" @ d{depth}" if depth else ""  # llama-bench's names
    tokens: list[int] = []
    tops: list[dict] = []
    tests = []
    if n_prompt:
        tests.append((f"pp{n_prompt}{at}", lambda warm=False: run_pp(model, n_prompt, rng, context)))
    if n_gen:
        tests.append((f"tg{n_gen}{at}",
                      lambda warm=False: run_tg(model, n_gen, start_token, tokens, context, tops if warm else None)))
    bytes_tok = weight_bytes_per_token(model)
    results = []
    for name, fn in tests:
        fn(warm=True)  # warm-up: compiles/loads kernels, captures the decode graph
        samples = []
        t0 = time.time()
        for _ in range(reps):
            samples.append(fn())
            if progress:
                progress(name, samples[-1])
        # wall-clock span of the measured repetitions: a sampler outside this
        # process (harness/nvml.py) keeps only its samples from this window
        window = [t0, time.time()]
        rec = {"test": name, "samples_tok_s": samples, "tok_s_mean": statistics.fmean(samples),
               "tok_s_sd": statistics.stdev(samples) if len(samples) > 1 else 0.0, "window_unix": window}
        if name.startswith("tg"):
            rec["gb_s"] = bytes_tok * rec["tok_s_mean"] / 1e9
        results.append(rec)
    be = model.backend
    return {
        "schema_version": SCHEMA_VERSION,
        "engine": "anvil", "build": build_hash(),
        "model": str(model.path), "model_bytes": model.path.stat().st_size,
        "weight_bytes_per_token": bytes_tok, "params_per_token": params_per_token(model),
        "backend": be.name,
        "settings": {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "reps": reps, "warmup": 1, "seed": seed,
                     "n_ctx": model.n_ctx, "kv": "f16" if getattr(be, "kv_f16", False) else "f32",
                     "graphs": not getattr(be, "eager", True), "ubatch": be.ubatch,
                     "pdl": bool(getattr(getattr(be, "dev", None), "pdl", False)),
                     # tg's steps queued back to back, the tokens read once (Model.decode_greedy)
                     "queued_steps": hasattr(be, "decode_greedy")},
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **gpu_info(),
        **(cuda_versions() if be.name == "cuda" else {}),
        "peak_device_bytes": getattr(getattr(be, "dev", None), "allocated", None),
        "results": results,
        # greedy tokens of the tg test (same start token every run): equal
        # across builds unless the numerics changed; the warm-up's top logits
        # of each step judge a difference (harness ab)
        "tokens": tokens,
        "token_tops": tops,
    }


def format_table(rec: dict) -> str:
    on = {"cuda": f" on {rec.get('gpu') or 'a GPU NVML did not name'}",
          "numpy": " (the NumPy engine, on the CPU)"}.get(rec["backend"], "")
    lines = [f"anvil build {rec['build']}, backend {rec['backend']}{on}",
             "| model | backend | test | t/s | GB/s |", "|---|---|---|---|---|"]
    for r in rec["results"]:
        gbs = f"{r['gb_s']:.0f}" if "gb_s" in r else ""
        lines.append(f"| {Path(rec['model']).name} | {rec['backend']} | {r['test']} | "
                     f"{r['tok_s_mean']:.2f} ± {r['tok_s_sd']:.2f} | {gbs} |")
    return "\n".join(lines)
