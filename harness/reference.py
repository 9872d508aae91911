"""Make reference outputs: llama.cpp's with llama-cpp-python, in process,
and the NumPy oracle's (``make_oracle_reference``).

Settings are pinned, not left to defaults, because each changes llama.cpp's
numbers (architectures.md §8): flash attention off, KV cache type, GPU layers
(0 on the CPU tier, all on the GPU tier), batch sizes. Greedy decode is done
here from the raw logits (argmax, lowest index on ties), not by llama.cpp's
sampler, so the recorded token is exactly the argmax of the recorded logits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

try:
    # First, before NumPy: llama.cpp's CUDA build segfaults in Llama() when
    # NumPy (and its OpenBLAS) was loaded earlier in the process (seen on the
    # H200 host with llama-cpp-python 0.3.36; import order alone decides it).
    import llama_cpp
except ImportError:
    llama_cpp = None

import numpy as np

from engine.errors import AnvilError

from .refs import Case, Reference

GGML_TYPES = {"f32": 0, "f16": 1}

# The CPU tier compares against the float32 NumPy engine: F32 KV cache and no
# flash attention keep llama.cpp's own rounding to its quantised matmuls.
CPU_SETTINGS = {"n_gpu_layers": 0, "flash_attn": False, "type_k": "f32", "type_v": "f32",
                "n_ctx": 2048, "n_batch": 512, "n_ubatch": 512, "n_threads": 2, "swa_full": True}
GPU_SETTINGS = {**CPU_SETTINGS, "n_gpu_layers": -1, "type_k": "f16", "type_v": "f16", "n_threads": 8}


def _import_llama_cpp():
    if llama_cpp is None:
        raise AnvilError("llama-cpp-python is not installed: scripts/llamacpp-python.sh "
                         "(a portable build of llama.cpp from source; a few minutes)")
    return llama_cpp


def device_description(settings: dict) -> str:
    if settings["n_gpu_layers"] == 0:
        from .provenance import cpu_name

        return f"cpu: {cpu_name()} ({os.cpu_count()} cores)"
    from engine.bench import gpu_info

    info = gpu_info()
    return f"gpu: {info['gpu']}, driver {info['driver']}" if info.get("gpu") else f"gpu: unknown ({info.get('nvml')})"


def _open(model_path: Path, s: dict):
    llama_cpp = _import_llama_cpp()
    if s["n_gpu_layers"] != 0 and not llama_cpp.llama_supports_gpu_offload():
        # a CPU-only build ignores n_gpu_layers: its numbers would pass for CUDA ones
        raise AnvilError(f"{Path(model_path).name}: the gpu tier needs llama-cpp-python built with CUDA; this one "
                         f"({llama_cpp.__version__}) cannot offload to a GPU. Rebuild it with "
                         "CMAKE_ARGS='-DGGML_CUDA=on' (scripts/gpu/llamacpp.sh does it on the GPU host)")
    return llama_cpp.Llama(
        model_path=str(model_path), n_gpu_layers=s["n_gpu_layers"], n_ctx=s["n_ctx"], n_batch=s["n_batch"],
        n_ubatch=s["n_ubatch"], n_threads=s["n_threads"], n_threads_batch=s["n_threads"],
        flash_attn=s["flash_attn"], type_k=GGML_TYPES[s["type_k"]], type_v=GGML_TYPES[s["type_v"]],
        swa_full=s["swa_full"], logits_all=False, seed=0, verbose=False)


def _last_logits(llm) -> np.ndarray:
    # logits_all=False: llama.cpp computes only the last token's row; the
    # high-level Llama.scores is no longer filled then, so read it directly
    ptr = llm._ctx.get_logits_ith(-1)
    if not ptr:  # NULL: llama.cpp kept no logits for the last token
        raise AnvilError("llama.cpp returned no logits for the last token")
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


class LlamaCppModel:
    """llama.cpp in process, shaped like an engine model (reset, forward ->
    the last token's logits), so the engine's own comparison code can hold
    llama.cpp under other settings against a reference."""

    def __init__(self, model_path: Path, settings: dict):
        self.path, self.settings = Path(model_path), settings
        self.llm = _open(model_path, settings)
        self.n_ctx = settings["n_ctx"]
        self.config = SimpleNamespace(eos_token_id=self.llm.token_eos())

    def reset(self) -> None:
        self.llm.reset()

    def forward(self, tokens) -> np.ndarray:
        self.llm.eval([int(t) for t in tokens])
        self._logits = _last_logits(self.llm)
        return self._logits

    def decode_next(self, token: int) -> int:
        return int(np.argmax(self.forward([token])))

    def decode_logits(self) -> np.ndarray:
        return self._logits

    def close(self) -> None:
        # now, not whenever the garbage collector gets to it: a CUDA build
        # aborted (free(): invalid pointer) with several instances left to it
        self.llm.close()


def make_reference(model_name: str, model_path: Path, sha256: str, prompts: list[str], n_steps: int, *,
                   settings: dict, top_k: int = 16, progress=None) -> Reference:
    llama_cpp = _import_llama_cpp()
    s = settings
    llm = _open(model_path, s)
    try:
        ref = Reference(
            model=model_name, model_file=Path(model_path).name, model_sha256=sha256,
            llama_cpp={"package": "llama-cpp-python", "version": llama_cpp.__version__,
                       "system_info": llama_cpp.llama_print_system_info().decode().strip()},
            settings=dict(s), device=device_description(s),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), top_k=top_k)
        for prompt in prompts:
            # add_bos follows the model's own tokenizer.ggml.add_bos_token, as llama.cpp's CLI does
            prompt_ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
            if len(prompt_ids) + n_steps > s["n_ctx"]:
                raise AnvilError(f"prompt {prompt!r}: {len(prompt_ids)} tokens + {n_steps} steps exceed "
                                 f"n_ctx {s['n_ctx']}")
            ref.cases.append(_greedy_case(llm, prompt, prompt_ids, n_steps, top_k))
            if progress:
                progress()
        return ref
    finally:
        llm.close()  # now, not when collected: see LlamaCppModel.close


def _greedy_case(llm, prompt: str, prompt_ids: list[int], n_steps: int, top_k: int) -> Case:
    llm.reset()
    llm.eval(prompt_ids)
    tokens, top_ids, top_logits = [], [], []
    for step in range(n_steps):
        logits = _last_logits(llm)
        # stable sort on -logit keeps the lowest id first among equal logits
        order = np.argsort(-logits, kind="stable")[:top_k]
        token = int(order[0])
        tokens.append(token)
        top_ids.append([int(i) for i in order])
        top_logits.append([float(logits[i]) for i in order])
        if step < n_steps - 1:
            llm.eval([token])
    return Case(prompt=prompt, prompt_ids=[int(t) for t in prompt_ids], tokens=tokens,
                top_ids=top_ids, top_logits=top_logits)


def make_oracle_reference(entry, model_path: Path, prompts: Reference, top_k: int = 16) -> Reference:
    """The NumPy engine's greedy run on the model file, on llama.cpp's prompt
    ids (``prompts``: the model's cpu references): what the CUDA engine is
    held to without llama.cpp's noise in between."""
    import engine
    from engine.bench import build_hash
    from engine.generate import greedy

    model = engine.load(model_path, backend="numpy")
    ref = Reference(
        model=entry.name, model_file=Path(model_path).name, model_sha256=entry.sha256,
        llama_cpp={"package": "anvil NumPy engine (the oracle), not llama.cpp", "version": build_hash()},
        settings={"backend": "numpy", "n_gpu_layers": 0, "flash_attn": False, "type_k": "f32", "type_v": "f32",
                  "prompt_ids_from": "references/cpu"},
        device=device_description(CPU_SETTINGS), created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        top_k=top_k)
    for case in prompts.cases:
        g = greedy(model, case.prompt_ids, len(case.tokens), keep_logits=True)
        orders = [np.argsort(-lg, kind="stable")[:top_k] for lg in g.logits]
        ref.cases.append(Case(prompt=case.prompt, prompt_ids=list(case.prompt_ids), tokens=list(g.tokens),
                              top_ids=[[int(i) for i in o] for o in orders],
                              top_logits=[[float(lg[i]) for i in o] for lg, o in zip(g.logits, orders)]))
    return ref
