"""llama.cpp reference outputs: the format, and loading/saving it.

One JSON file per (model, tier): ``references/<tier>/<model>.json``. It pins
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

SCHEMA_VERSION = 1
REFERENCES_DIR = Path(__file__).resolve().parents[1] / "references"


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


def reference_path(model: str, tier: str, root: Path | None = None) -> Path:
    return (root or REFERENCES_DIR) / tier / f"{model}.json"


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
