"""llama.cpp reference outputs: the format, and loading/saving it.

One JSON file per (model, reference set): ``references/<set>/<model>.json``
(sets: catalog.REFERENCE_SETS). It pins
the exact model file (sha256) and every llama.cpp setting that changes its
numbers, and holds, per prompt, the prompt ids llama.cpp produced, its greedy
tokens, and per step the top-k (token, logit) pairs, so an engine's
disagreement can later be judged: a near-tie flip or real drift.

    {
      "schema_version": 1,
      "model": "smollm2-135m", "model_file": "...gguf", "model_sha256": "...",
      "llama_cpp": {"package": "llama-cpp-python", "version": "0.3.36", "system_info": "..."},
      "settings": {"n_gpu_layers": 0, "flash_attn": false, "type_k": "f32", ...},
      "device": "...", "created": "2026-11-29T14:00:00Z", "top_k": 16,
      "cases": [{"prompt": "...", "prompt_ids": [...], "tokens": [...],
                 "top_ids": [[...] per step], "top_logits": [[...] per step]}]
    }
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.atomic import atomic_open
from engine.errors import AnvilError

from . import project

SCHEMA_VERSION = 1
REFERENCES_DIR = project.ROOT / "references"


@dataclass
class Case:
    prompt: str
    prompt_ids: list[int]
    tokens: list[int]  # llama.cpp's greedy continuation
    top_ids: list[list[int]]  # per step, token ids by descending logit
    top_logits: list[list[float]]

    def margin(self, step: int) -> float:
        """llama.cpp's own top-1 minus top-2 logit at a step: small means a near-tie."""
        return self.top_logits[step][0] - self.top_logits[step][1]


@dataclass
class Reference:
    model: str
    model_file: str
    model_sha256: str
    llama_cpp: dict
    settings: dict
    device: str
    created: str
    top_k: int
    cases: list[Case] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    # what llama.cpp ran when it was not the model file itself (the F32
    # twin): {"file": ..., "sha256": ..., "made_by": ...}
    llama_cpp_input: dict | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["cases"] = [_compact(c) for c in d["cases"]]
        return d

    @classmethod
    def from_json(cls, d: dict, source: str = "<json>") -> "Reference":
        if d.get("schema_version") != SCHEMA_VERSION:
            raise AnvilError(f"{source}: schema_version {d.get('schema_version')!r}, this Anvil reads {SCHEMA_VERSION}")
        try:
            cases = [Case(**c) for c in d["cases"]]
            return cls(**{**d, "cases": cases})
        except (KeyError, TypeError) as e:
            raise AnvilError(f"{source}: malformed reference ({e})") from None


def _compact(case: dict) -> dict:
    # 7 significant digits keep a float32 logit exact enough (< 1e-6 relative)
    case["top_logits"] = [[float(f"{v:.7g}") for v in row] for row in case["top_logits"]]
    return case


def reference_path(model: str, reference_set: str, root: Path | None = None) -> Path:
    return (root or REFERENCES_DIR) / reference_set / f"{model}.json"


def load(path: str | os.PathLike) -> Reference:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise AnvilError(f"{path}: no such reference (generate it with `harness reference`)") from None
    except json.JSONDecodeError as e:
        raise AnvilError(f"{path}: not valid JSON ({e})") from None
    return Reference.from_json(d, str(path))


def save(ref: Reference, path: str | os.PathLike) -> Path:
    """Write atomically: a crash leaves the old file, never half a new one."""
    return write_json_atomic(path, ref.to_json())


def dumps(obj) -> str:
    """Indented JSON with every innermost list of numbers on one line, so a
    reference stays readable and diffs line by line per step."""
    text = json.dumps(obj, indent=1)
    flat = re.sub(r"\[\s+([-+0-9.eE,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    return flat + "\n"


def write_json_atomic(path: str | os.PathLike, obj) -> Path:
    with atomic_open(path, "w") as f:
        f.write(dumps(obj))
    return Path(path)


def for_entry(entry, reference_set: str) -> Reference:
    """A catalog model's references of ``reference_set``, made from the very
    file the catalog pins (an entry of ``harness.catalog``)."""
    path = reference_path(entry.name, reference_set)
    if not path.exists():
        raise AnvilError(f"{entry.name}: no llama.cpp reference at {path}; make it with "
                         f"`harness reference --tier {reference_set} --model {entry.name}` (needs llama-cpp-python"
                         f"{', built with CUDA, on the GPU' if reference_set == 'gpu' else ''})")
    ref = load(path)
    if ref.model_sha256 != entry.sha256:
        raise AnvilError(f"{path} was made from a different file than the catalog pins for {entry.name}; "
                         f"regenerate it with `harness reference --tier {reference_set} --model {entry.name} --force`")
    return ref
