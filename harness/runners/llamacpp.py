"""llama.cpp as a runner: the ``llama-bench`` binary, or llama-cpp-python.

Both return the engine's record shape (``results[{test, samples_tok_s,
tok_s_mean, tok_s_sd}]``), so an A/B comparison reads them the same way.

- ``LlamaBenchRunner``: ``llama-bench -m M -p N -n N -r R -fa 1 -ngl 99 -o json``,
  llama.cpp's own benchmark (its warm-up included); its JSON list is mapped
  to ``pp<N>`` / ``tg<N>`` and kept whole under ``raw["llama_bench"]``.
- ``LlamaCppPythonRunner``: a child Python times llama.cpp through
  llama-cpp-python's C API with llama-bench's semantics (``child_main``),
  and also decodes greedily from the engine bench's start token, so the
  tokens of both engines can be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine.errors import AnvilError

from . import (Runner, RunnerError, RunResult, check_model, inherited_pythonpath, parse_json_output, run_process,
               tests_from_results)

GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}
# One line beside the llama-bench binary saying what it was built from, for
# builds that cannot know their commit (a source tarball, such as the llama.cpp
# llama-cpp-python vendors, reports "build 0, commit unknown"): the records
# carry it as ``build_source`` (scripts/gpu/host-env.sh writes it).
BUILD_SOURCE_FILE = "BUILD-SOURCE"


def llama_bench_test_name(rec: dict) -> str:
    """llama-bench's own names: pp512, tg128, pp512+tg128, "pp512 @ d4096"."""
    p, g, d = int(rec.get("n_prompt", 0)), int(rec.get("n_gen", 0)), int(rec.get("n_depth", 0) or 0)
    name = f"pp{p}+tg{g}" if p and g else (f"pp{p}" if p else f"tg{g}")
    return f"{name} @ d{d}" if d else name


def _mean_sd(samples: list[float]) -> tuple[float, float]:
    import statistics

    return statistics.fmean(samples), (statistics.stdev(samples) if len(samples) > 1 else 0.0)


class LlamaBenchRunner(Runner):
    kind = "llama-bench"

    def __init__(self, path, *, extra_args=(), flash_attn: bool = True, n_gpu_layers: int = 99,
                 label: str | None = None):
        p = str(path)
        found = shutil.which(p) if os.sep not in p else None  # a bare name: look on PATH
        self.path = Path(found or p).expanduser().resolve()
        self.extra_args = [str(a) for a in extra_args]
        self.flash_attn, self.n_gpu_layers = bool(flash_attn), int(n_gpu_layers)
        self.version: str | None = None
        self.sha256: str | None = None
        self.build: dict = {}  # build_commit / build_number, from the first run's records
        self.source: str | None = None  # BUILD_SOURCE_FILE's line, if the build left one
        self.label = label or "llama-bench"
        self._prepared = False

    def describe(self) -> dict:
        return {"kind": self.kind, "label": self.label, "binary": str(self.path), "sha256": self.sha256,
                "version": self.version, "build_source": self.source, **self.build,
                "settings": {"flash_attn": int(self.flash_attn), "n_gpu_layers": self.n_gpu_layers,
                             "extra_args": self.extra_args}}

    def _env(self) -> dict:
        # a CMake build leaves libllama/libggml beside the binary
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(self.path.parent)] + [
            e for e in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if e])
        return env

    def prepare(self) -> None:
        if not self.path.is_file():
            raise AnvilError(f"{self.path}: llama-bench not found (build llama.cpp, e.g. scripts/gpu/llamacpp.sh "
                             f"leaves it in /tmp/llamacpp/build/bin)")
        if not os.access(self.path, os.X_OK):
            raise AnvilError(f"{self.path}: not executable (chmod +x {self.path})")
        from .engine_wheel import sha256_file

        self.sha256 = sha256_file(self.path)
        self.version = self._version()
        src = self.path.parent / BUILD_SOURCE_FILE
        if src.is_file():
            self.source = (src.read_text(errors="replace").strip().splitlines() or [""])[0][:300] or None
        self._prepared = True

    def _version(self) -> str | None:
        try:
            p = subprocess.run([str(self.path), "--version"], capture_output=True, text=True, timeout=30,
                               env=self._env())
        except (OSError, subprocess.TimeoutExpired):
            return None
        if p.returncode != 0:
            return None
        lines = [ln.strip() for ln in (p.stdout + "\n" + p.stderr).splitlines() if ln.strip()]
        return next((ln for ln in lines if "version" in ln.lower()), lines[0] if lines else None)

    def run(self, model_path, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, depth: int = 0,
            timeout_s: float = 1800) -> RunResult:
        model = check_model(model_path)
        if not self._prepared:
            self.prepare()
        cmd = [str(self.path), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps),
               *(["-d", str(depth)] if depth else []),
               "-fa", str(int(self.flash_attn)), "-ngl", str(self.n_gpu_layers), "-o", "json", *self.extra_args]
        out, err, wall = run_process(cmd, env=self._env(), timeout_s=timeout_s, what="llama-bench")
        records = parse_json_output(out, cmd, err, what="llama-bench")
        if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
            raise RunnerError("llama-bench printed no test records (expected a JSON list of objects)", cmd, 0, err)
        try:
            raw = self._record(records, model, n_prompt, n_gen, reps, depth)
        except (KeyError, TypeError, ValueError) as e:
            raise RunnerError(f"llama-bench record lacks a field ({type(e).__name__}: {e})", cmd, 0, err) from None
        return RunResult(tests=tests_from_results(raw, cmd, err), tokens=None, raw=raw, wall_s=wall, cmd=cmd,
                         returncode=0)

    def _record(self, records: list[dict], model: Path, n_prompt: int, n_gen: int, reps: int, depth: int = 0) -> dict:
        results = []
        for r in records:
            samples = [float(x) for x in r["samples_ts"]]
            mean, sd = _mean_sd(samples)
            results.append({"test": llama_bench_test_name(r), "samples_tok_s": samples,
                            "tok_s_mean": float(r.get("avg_ts", mean)), "tok_s_sd": float(r.get("stddev_ts", sd))})
        r0 = records[0]
        self.build = {"build_commit": r0.get("build_commit"), "build_number": r0.get("build_number")}
        keys = ("type_k", "type_v", "n_batch", "n_ubatch", "n_threads", "flash_attn", "n_gpu_layers", "backends")
        return {
            "schema_version": 2, "engine": "llama.cpp", "source": "llama-bench -o json",
            "build": r0.get("build_commit"), "build_number": r0.get("build_number"), "version": self.version,
            "build_source": self.source,
            "binary": str(self.path), "binary_sha256": self.sha256,
            "model": str(model), "model_bytes": model.stat().st_size,
            "backend": r0.get("backends"), "gpu": r0.get("gpu_info"), "cpu": r0.get("cpu_info"),
            "settings": {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "reps": reps, "warmup": 1,
                         **{k: r0.get(k) for k in keys}, "extra_args": self.extra_args},
            "results": results, "tokens": None, "llama_bench": records,
        }


# ---- llama-cpp-python ------------------------------------------------------

# llama_cpp is imported first, before anything loads NumPy: llama.cpp's CUDA
# build segfaults in Llama() when NumPy (and its OpenBLAS) was loaded earlier
# in the process (llama-cpp-python 0.3.36 on the H200 host). The harness that
# holds child_main is then imported from the same checkout as the parent.
_CHILD = ("import llama_cpp\n"
          "import sys\n"
          "sys.path.insert(0, {harness_parent!r})\n"
          "from harness.runners.llamacpp import child_main\n"
          "sys.exit(child_main(sys.argv[1:]))\n")
_PROBE = ("import json, llama_cpp\n"
          "print(json.dumps({'version': llama_cpp.__version__, 'file': llama_cpp.__file__,\n"
          "                  'gpu_offload': bool(llama_cpp.llama_supports_gpu_offload()),\n"
          "                  'system_info': llama_cpp.llama_print_system_info().decode().strip()}))\n")


class LlamaCppPythonRunner(Runner):
    kind = "llama-cpp-python"

    def __init__(self, site_dir=None, workdir=None, *, flash_attn: bool = True, n_gpu_layers: int = -1,
                 kv: str = "f16", n_threads: int | None = None, seed: int = 0, label: str | None = None):
        if kv not in GGML_TYPES:
            raise AnvilError(f"llama-cpp-python runner: KV type {kv!r} is not one of {', '.join(GGML_TYPES)}")
        self.site_dir = Path(site_dir).resolve() if site_dir else None
        self.workdir = Path(workdir).resolve() if workdir else None
        self.settings = {"flash_attn": bool(flash_attn), "n_gpu_layers": int(n_gpu_layers), "kv": kv,
                         "n_threads": n_threads, "seed": int(seed)}
        self.probe: dict | None = None
        self.label = label or "llama-cpp-python"

    def describe(self) -> dict:
        p = self.probe or {}
        return {"kind": self.kind, "label": self.label, "site_dir": str(self.site_dir) if self.site_dir else None,
                "version": p.get("version"), "module": p.get("file"), "gpu_offload": p.get("gpu_offload"),
                "system_info": p.get("system_info"), "settings": dict(self.settings)}

    def _env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(([str(self.site_dir)] if self.site_dir else []) + inherited_pythonpath())
        return env

    def _cwd(self):
        if self.workdir is None:
            return None
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir

    def prepare(self) -> None:
        if self.site_dir is not None and not self.site_dir.is_dir():
            raise AnvilError(f"{self.site_dir}: no such directory (the site dir llama_cpp was installed into)")
        cmd = [sys.executable, "-P", "-c", _PROBE]
        try:
            out, err, _ = run_process(cmd, env=self._env(), cwd=self._cwd(), timeout_s=120,
                                      what="llama-cpp-python probe")
        except RunnerError as e:
            if "No module named 'llama_cpp'" in e.stderr_tail:
                where = f" in {self.site_dir}" if self.site_dir else ""
                raise AnvilError(f"llama-cpp-python is not importable{where}: scripts/llamacpp-python.sh "
                                 f"(CPU build), or with CUDA on the GPU host (scripts/gpu/llamacpp.sh)") from None
            raise
        probe = parse_json_output(out, cmd, err, what="llama-cpp-python probe")
        if self.site_dir and not Path(probe["file"]).resolve().is_relative_to(self.site_dir):
            raise RunnerError(f"the child imported llama_cpp from {probe['file']}, not from {self.site_dir}", cmd, 0)
        self.probe = probe

    def run(self, model_path, *, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, depth: int = 0,
            timeout_s: float = 1800) -> RunResult:
        model = check_model(model_path)
        if self.probe is None:
            self.prepare()
        s = self.settings
        code = _CHILD.format(harness_parent=str(Path(__file__).resolve().parents[2]))
        cmd = [sys.executable, "-P", "-c", code, "--model", str(model), "--n-prompt", str(n_prompt),
               "--n-gen", str(n_gen), "--n-depth", str(depth), "--reps", str(reps),
               "--flash-attn", str(int(s["flash_attn"])),
               "--n-gpu-layers", str(s["n_gpu_layers"]), "--kv", s["kv"], "--seed", str(s["seed"])]
        if s["n_threads"]:
            cmd += ["--n-threads", str(s["n_threads"])]
        out, err, wall = run_process(cmd, env=self._env(), cwd=self._cwd(), timeout_s=timeout_s,
                                     what="llama-cpp-python bench")
        raw = parse_json_output(out, cmd, err, what="llama-cpp-python bench")
        if not isinstance(raw, dict):
            raise RunnerError("llama-cpp-python bench printed JSON that is not an object", cmd, 0, err)
        return RunResult(tests=tests_from_results(raw, cmd, err), tokens=raw.get("tokens"), raw=raw, wall_s=wall,
                         cmd=cmd, returncode=0)


def child_main(argv=None) -> int:
    """In the child: time pp/tg with llama.cpp, print one JSON record.

    Semantics as llama-bench and ``engine.bench``: pp<N> is one N-token
    decode from an empty KV cache per repetition; tg<N> is N single-token
    decodes from an empty cache, each synchronised and its greedy token
    (argmax of the last logits, lowest id on ties) fed to the next. 1 warm-up
    + R repetitions. Tokens are drawn as ``engine.bench`` draws them (same
    seed, same order), so tg starts from the same token in both engines.
    """
    import llama_cpp  # noqa: F401  (already loaded by the -c line: before NumPy)

    ap = argparse.ArgumentParser(prog="llama-cpp-python bench child")
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-depth", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--flash-attn", type=int, default=1)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--kv", choices=sorted(GGML_TYPES), default="f16")
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    rec = bench_llama_cpp(ap.parse_args(argv))
    print(json.dumps(rec), flush=True)
    return 0


def bench_llama_cpp(a) -> dict:
    import platform
    import time

    import llama_cpp
    import numpy as np

    n_ctx = max(a.n_depth + max(a.n_prompt, a.n_gen), 32)
    n_batch = 2048  # llama-bench's defaults (n_ubatch 512); llama.cpp caps n_batch at n_ctx
    llm = llama_cpp.Llama(model_path=a.model, n_gpu_layers=a.n_gpu_layers, n_ctx=n_ctx, n_batch=n_batch,
                          n_ubatch=512, n_threads=a.n_threads, n_threads_batch=a.n_threads,
                          flash_attn=bool(a.flash_attn), type_k=GGML_TYPES[a.kv], type_v=GGML_TYPES[a.kv],
                          logits_all=False, seed=a.seed, verbose=False)
    ctx, n_vocab = llm._ctx.ctx, llm.n_vocab()
    n_batch = min(n_batch, llm.n_batch)

    def clear():
        llm.reset()
        if hasattr(llama_cpp, "llama_memory_clear"):
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        else:  # before llama.cpp's memory API
            llm._ctx.kv_cache_clear()

    def decode(arr, n):
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, n))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {n} tokens")

    rng = np.random.default_rng(a.seed)  # as engine.bench: start token first, then each pp's prompt
    start_token = int(rng.integers(0, n_vocab))
    tokens: list[int] = []
    # the depth's context tokens, as engine.bench.depth_context draws them
    context = np.random.default_rng(a.seed + 1).integers(0, n_vocab, a.n_depth).tolist()
    context_arrs = [((llama_cpp.llama_token * len(c))(*c), len(c))
                    for c in (context[i:i + n_batch] for i in range(0, len(context), n_batch))]

    def fill():
        """A fresh sequence holding the depth's context (untimed)."""
        clear()
        for arr, k in context_arrs:
            decode(arr, k)

    def run_pp(n):
        ids = rng.integers(0, n_vocab, n).tolist()
        chunks = [ids[i:i + n_batch] for i in range(0, n, n_batch)]
        arrs = [((llama_cpp.llama_token * len(c))(*c), len(c)) for c in chunks]
        fill()
        llama_cpp.llama_synchronize(ctx)
        t0 = time.perf_counter()
        for arr, k in arrs:
            decode(arr, k)
        llama_cpp.llama_synchronize(ctx)
        return n / (time.perf_counter() - t0)

    def run_tg(n):
        buf = (llama_cpp.llama_token * 1)()
        out, token = [], start_token
        fill()
        llama_cpp.llama_synchronize(ctx)
        t0 = time.perf_counter()
        for _ in range(n):
            buf[0] = token
            decode(buf, 1)
            llama_cpp.llama_synchronize(ctx)
            ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
            if not ptr:
                raise RuntimeError("llama.cpp kept no logits for the last token")
            token = int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())  # lowest id on ties
            out.append(token)
        dt = time.perf_counter() - t0
        tokens[:] = out
        return n / dt

    at = f" @ d{a.n_depth}" if a.n_depth else ""  # llama-bench's names
    tests = ([(f"pp{a.n_prompt}{at}", lambda: run_pp(a.n_prompt))] if a.n_prompt else []) + \
            ([(f"tg{a.n_gen}{at}", lambda: run_tg(a.n_gen))] if a.n_gen else [])
    results = []
    for name, fn in tests:
        fn()  # warm-up
        samples = [fn() for _ in range(a.reps)]
        mean, sd = _mean_sd(samples)
        results.append({"test": name, "samples_tok_s": samples, "tok_s_mean": mean, "tok_s_sd": sd})
    system_info = llama_cpp.llama_print_system_info().decode().strip()
    gpu = bool(llama_cpp.llama_supports_gpu_offload()) and a.n_gpu_layers != 0
    return {
        "schema_version": 2, "engine": "llama.cpp", "source": "llama-cpp-python",
        "build": f"llama-cpp-python {llama_cpp.__version__}",
        "llama_cpp": {"version": llama_cpp.__version__, "file": llama_cpp.__file__, "system_info": system_info},
        "model": str(Path(a.model).resolve()), "model_bytes": Path(a.model).stat().st_size,
        "backend": ("cuda" if "CUDA" in system_info else "gpu") if gpu else "cpu",
        "settings": {"n_prompt": a.n_prompt, "n_gen": a.n_gen, "n_depth": a.n_depth, "reps": a.reps, "warmup": 1,
                     "seed": a.seed,
                     "n_ctx": llm.n_ctx(), "n_batch": llama_cpp.llama_n_batch(ctx),
                     "n_ubatch": llama_cpp.llama_n_ubatch(ctx), "flash_attn": bool(a.flash_attn),
                     "n_gpu_layers": a.n_gpu_layers, "type_k": a.kv, "type_v": a.kv,
                     "n_threads": llm.context_params.n_threads},
        "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **_gpu_info(), "results": results, "tokens": tokens,
    }


def _gpu_info() -> dict:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        from engine.bench import nvml_index  # the GPU this process was pinned to (harness --gpus)

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index())
        return {"gpu": pynvml.nvmlDeviceGetName(h), "driver": pynvml.nvmlSystemGetDriverVersion(),
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000}
    except Exception as e:
        return {"gpu": None, "nvml": f"unavailable ({type(e).__name__})"}


if __name__ == "__main__":
    sys.exit(child_main())
