"""The results store: append-only, schema-versioned JSON records.

One file per record, ``<kind>-<UTC YYYYmmddTHHMMSSZ>-<8 hex of sha256>.json``
in ``reports/results/`` (the repository's, unless a directory is given).
Files are written atomically (temp file in the same directory, fsync, then a
hard link / os.replace onto the final name) and an existing file is never
replaced: results are evidence, and the HTML report is a pure function of
them. Only the top level of the directory is read; subdirectories (records
committed by hand before this store existed) are left alone.

A bench record is what ``engine.bench.bench`` returns (plus, optionally,
``model_sha256`` and per-test ``nvml`` summaries):

    {"engine", "build", "model" (path or name), "model_sha256"?, "backend",
     "settings": {"n_prompt", "n_gen", "kv", "n_depth"?, ...}, "gpu", "driver",
     "date", "results": [{"test": "pp512", "samples_tok_s": [...],
     "tok_s_mean", "tok_s_sd", "gb_s"?, "nvml"?: {...}}, ...]}

A tests record is one run of the test suite (harness/testrun.py: the GPU
suite, ``scripts/gpu/check.sh tests``): the outcome counts, the build, the
GPU and the command that ran it.

An ab record is one ``harness ab`` (harness/ab.py): the arms, every round,
the analysis and what was measured (``backend``, ``device``, ``builds``). An
A/A record (``"aa": true``, one build against itself) also holds
``noise_band``, {test: band}: the band later A/Bs on that device and
backend are judged by (harness/noise.py).

A roofline record is what ``harness roofline --save`` measured on one GPU
(harness/roofline.py): ``copy_gb_s`` (device-to-device copy, bytes read and
written) and ``bf16_tflops`` (a cuBLAS bf16 GEMM), the ceilings the
scoreboard reads decode and prefill against.

The store adds ``schema_version``, ``kind`` and ``saved_at``.

Records are written compact: no indentation, and NVML traces and summaries
rounded (``nvml.compact``: trace times to the millisecond, power to 0.1 W,
summary fractions to 4 significant digits) - a sitting's records are what
the repository grows by. Records written before (indented, full floats)
load as they are.

Schema history (``upgrade()`` is the one path from any older record to the
current shape, applied on save and on load; files on disk are never rewritten):

- 1: the first store.
- 2: every record has ``date``, the UTC time of its measurement (a record
  that had none takes ``saved_at``), and an A/B record has
  ``measured_rounds``, the rounds its verdict stands on (the cold round and
  an interrupted round excluded).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from engine.errors import AnvilError

from . import nvml, project

SCHEMA_VERSION = 2
KINDS = ("bench", "ab", "validate", "variation", "mutants", "tests", "roofline")
DEFAULT_DIR = project.ROOT / "reports" / "results"

# What makes two measurements the same benchmark: the WORK done, not how an
# engine does it. Included: the test (and the prompt/generated/depth token
# counts it implies), the model file (sha256, else its file name), the
# backend (cuda vs numpy/cpu) and the KV-cache type (f16 vs f32 changes the
# bytes attention reads). Excluded on purpose: flash attention, CUDA graphs,
# batch sizes, n_ctx (capacity, not work), reps/warm-up/seed (how often and
# which random tokens, not what) - A/B-ing those is the point of the harness.
SPEC_FIELDS = ("test", "n_prompt", "n_gen", "n_depth", "model", "backend", "kv")


class ResultsWarning(UserWarning):
    """A results file that was skipped (unreadable or of another schema)."""


def _now() -> time.struct_time:  # one place, so tests can pin the clock
    return time.gmtime()


def _jsonable(o):
    # numpy scalars/arrays, Paths and dataclasses turn up in records built by hand
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def upgrade(rec: dict) -> dict:
    """``rec`` in the current schema (a new dict; see the schema history
    above). A record of an unknown or newer schema is returned unchanged,
    for check_record to refuse."""
    version = rec.get("schema_version")
    if type(version) is not int or not 1 <= version < SCHEMA_VERSION:
        return rec
    rec = dict(rec)
    if version < 2:
        if rec.get("date") is None and isinstance(rec.get("saved_at"), str):
            rec["date"] = rec["saved_at"]
        if rec.get("kind") == "ab" and isinstance(rec.get("rounds"), list):
            rec["measured_rounds"] = sum(1 for r in rec["rounds"] if isinstance(r, dict) and not r.get("cold"))
    rec["schema_version"] = SCHEMA_VERSION
    return rec


def save(record: dict, kind: str, dir: str | Path | None = None) -> Path:
    """Write ``record`` as a new file and return its path. Never overwrites.
    A record made in an older schema (an older engine's bench output) is
    upgraded first."""
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; one of {KINDS}")
    rec = {k: v for k, v in record.items() if k != "_path"}  # _path: added by load_all
    rec = upgrade({"schema_version": SCHEMA_VERSION, **rec})
    for key, want in (("schema_version", SCHEMA_VERSION), ("kind", kind)):
        if rec.get(key, want) != want:
            raise ValueError(f"record has {key}={rec[key]!r}, saving as {want!r}")
    now = _now()
    saved_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", now)
    rec = {"schema_version": SCHEMA_VERSION, "kind": kind, "saved_at": saved_at, "date": saved_at, **rec}
    if why := check_record(rec):  # only what load_all reads back is ever written
        raise ValueError(f"not saving a {kind} record that would not load: {why}")
    body = (json.dumps(nvml.compact(rec), separators=(",", ":"), default=_jsonable) + "\n").encode()
    d = Path(dir) if dir is not None else DEFAULT_DIR
    d.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", now)

    fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name appears
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are shared/committed
        for n in range(1000):
            # same record saved twice in one second: salt the hash, keep both
            salt = b"" if n == 0 else f"#{n}".encode()
            dst = d / f"{kind}-{stamp}-{hashlib.sha256(body + salt).hexdigest()[:8]}.json"
            try:
                os.link(tmp, dst)  # atomic and fails if dst exists: never overwrites
                return dst
            except FileExistsError:
                continue
            except OSError:  # a filesystem without hard links
                if dst.exists():
                    continue
                os.replace(tmp, dst)
                return dst
        raise AnvilError(f"{d}: no free result file name for {kind}-{stamp}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _sort_key(p: Path):
    parts = p.stem.split("-")
    return (parts[1] if len(parts) > 2 else "", p.name)


# The fields the report reads, by kind: (field, the JSON types it may have).
# A record whose fields have other types is skipped, never half-read.
_TEXT, _NUM, _LIST, _OBJ = (str,), (int, float), (list,), (dict,)
_FIELDS = {
    None: [("date", _TEXT), ("saved_at", _TEXT), ("gpu", _TEXT), ("driver", _TEXT), ("build", _TEXT),
           ("engine", _TEXT), ("backend", _TEXT), ("device", _TEXT), ("model", _TEXT), ("model_name", _TEXT),
           ("model_sha256", _TEXT)],
    "bench": [("results", _LIST), ("settings", _OBJ)],
    "validate": [("results", _LIST)],
    "variation": [("results", _LIST)],
    "mutants": [("mutants", _LIST), ("caught", (int,)), ("suite", _LIST), ("not_run", _LIST), ("partial", (bool,))],
    "ab": [("rounds", _LIST), ("arms", _OBJ), ("analysis", _OBJ), ("measured_rounds", (int,)), ("builds", _OBJ),
           ("aa", (bool,)), ("noise_band", _OBJ)],
    "tests": [("command", _TEXT), ("passed", (int,)), ("failed", (int,)), ("errors", (int,)), ("skipped", (int,)),
              ("duration_s", _NUM), ("failures", _LIST), ("skip_reasons", _OBJ)],
    "roofline": [("copy_gb_s", _NUM), ("bf16_tflops", _NUM), ("copy", _OBJ), ("gemm", _OBJ)],
}
_REQUIRED = {None: ("date",), "ab": ("measured_rounds",),  # schema 2
             "tests": ("command", "passed", "failed", "errors", "skipped"),
             "roofline": ("gpu", "copy_gb_s", "bf16_tflops")}
_ITEMS = {"bench": ("results", [("test", _TEXT), ("samples_tok_s", _LIST), ("tok_s_mean", _NUM)]),
          "validate": ("results", [("model", _TEXT), ("passed", (bool,)), ("steps", (int,))]),
          "variation": ("results", [("model", _TEXT), ("variant", _TEXT)]),
          "mutants": ("mutants", [("mutant", _TEXT), ("caught", (bool,))]),
          "ab": ("rounds", []),
          "tests": ("failures", [("test", _TEXT), ("message", _TEXT)])}


def _date_ok(text: str) -> bool:
    try:
        datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def check_record(rec: dict) -> str | None:
    """Why ``rec`` cannot be used (the first field at fault), or None."""
    version = rec.get("schema_version")
    if type(version) is int and version > SCHEMA_VERSION:
        return f"schema_version {version}: written by a newer Anvil (this one reads up to {SCHEMA_VERSION})"
    if version != SCHEMA_VERSION:
        return f"schema_version {version!r}, this Anvil reads 1 to {SCHEMA_VERSION}"
    kind = rec.get("kind")
    if kind not in KINDS:
        return f"unknown kind {kind!r}"
    for field in _REQUIRED[None] + _REQUIRED.get(kind, ()):
        if rec.get(field) is None:
            return f"field '{field}' is missing"
    for field, types in _FIELDS[None] + _FIELDS[kind]:
        v = rec.get(field)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool) and bool not in types):
            return f"field '{field}' is {type(v).__name__} {json.dumps(v)[:40]}, expected {types[0].__name__}"
    for field in ("date", "saved_at"):
        if isinstance(rec.get(field), str) and not _date_ok(rec[field]):
            return f"field '{field}' is not an ISO date: {rec[field]!r}"
    items, fields = _ITEMS.get(kind, ("", []))  # a roofline record has no list of items
    for i, item in enumerate(rec.get(items) or [] if items else []):
        if not isinstance(item, dict):
            return f"field '{items}[{i}]' is {type(item).__name__}, expected an object"
        for field, types in fields:
            v = item.get(field)
            if v is not None and (not isinstance(v, types) or isinstance(v, bool) and bool not in types):
                return f"field '{items}[{i}].{field}' is {type(v).__name__}, expected {types[0].__name__}"
    return None


def load_all(dir: str | Path | None = None, kind: str | None = None, *,
             strict: bool = False, skipped: list | None = None) -> list[dict]:
    """Every usable record of this schema (of ``kind``, if given), oldest
    first, each with ``_path``. A bad or foreign file (unreadable, not JSON,
    wrong field types, not a regular file) is skipped with a ResultsWarning
    and, if ``skipped`` is given, appended to it as (path, why); ``strict``
    raises AnvilError naming it instead."""
    d = Path(dir) if dir is not None else DEFAULT_DIR
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json"), key=_sort_key):
        rec, why = None, None
        if not p.is_file():  # a FIFO would block the read; a directory is not a record
            why = "not a regular file"
        else:
            try:
                rec = json.loads(p.read_text())
                why = None if isinstance(rec, dict) else "not a JSON object"
            except (OSError, ValueError) as e:
                why = f"unreadable ({type(e).__name__}: {str(e)[:80]})"
        if why is None:
            rec = upgrade(rec)
            why = check_record(rec)
        if why is not None:
            if strict:
                raise AnvilError(f"{p}: {why}")
            warnings.warn(f"skipping {p}: {why}", ResultsWarning, stacklevel=2)
            if skipped is not None:
                skipped.append((str(p), why))
            continue
        if kind is None or rec["kind"] == kind:
            rec["_path"] = str(p)
            out.append(rec)
    return out


def _token_counts(test: str) -> tuple[int | None, int | None]:
    """llama-bench names: pp512 -> (512, 0), tg128 -> (0, 128), pp512+tg128 -> (512, 128)."""
    m = re.fullmatch(r"(?:pp(\d+))?\+?(?:tg(\d+))?", test)
    if not m or not any(m.groups()):
        return None, None
    return int(m[1] or 0), int(m[2] or 0)


def _result(record: dict, test: str) -> dict | None:
    return next((r for r in record.get("results", []) if r.get("test") == test), None)


def spec(record: dict, test: str) -> dict:
    """The benchmark spec of one test of a bench record (fields: SPEC_FIELDS)."""
    s, r = record.get("settings", {}), _result(record, test) or {}
    n_prompt, n_gen = _token_counts(test)
    model = record.get("model_sha256") or (Path(str(record["model"])).name if record.get("model") else None)
    backend = record.get("backend")
    return {"test": test,
            "n_prompt": r.get("n_prompt", n_prompt), "n_gen": r.get("n_gen", n_gen),
            "n_depth": int(r.get("n_depth", s.get("n_depth", 0))),
            "model": model,
            "backend": backend.lower() if isinstance(backend, str) else backend,
            # the engine says "kv", llama-bench "type_k"
            "kv": s.get("kv") or record.get("kv") or s.get("type_k")}


SITTING_S = 900  # records without a sitting id: saved this close together count as one sitting


def same_sitting(rec_a: dict, rec_b: dict) -> bool:
    """Whether two bench records were measured in one sitting: one ``harness
    bench`` call (the ``sitting`` id it gives all its records), or, for
    records from before the id, saved within SITTING_S of each other. A
    ratio between sittings would mix clocks, drivers and builds of the other
    engine that nobody compared."""
    if rec_a.get("sitting") or rec_b.get("sitting"):
        return rec_a.get("sitting") == rec_b.get("sitting")
    try:
        ta, tb = (datetime.datetime.fromisoformat(str(r.get("date") or r.get("saved_at")).replace("Z", "+00:00"))
                  for r in (rec_a, rec_b))
        return abs((ta - tb).total_seconds()) <= SITTING_S
    except (ValueError, TypeError):  # no date, or one with a time zone and one without
        return False


def throughput(r: dict) -> float | None:
    """A bench test's tokens/s: the median of its repetitions (the mean
    where a record kept no samples); the scoreboard and ``bench`` compare
    engines by it. llama-bench's first timed prefill repetition runs ~20%
    slow even after its warm-up (in most of its pp records here): a mean
    of 3 would carry that into the ratio, in Anvil's favour."""
    samples = [float(x) for x in r.get("samples_tok_s") or [] if isinstance(x, (int, float)) and x > 0]
    if samples:
        return float(statistics.median(samples))
    tok = r.get("tok_s_mean")
    return float(tok) if isinstance(tok, (int, float)) else None


def spec_hash(record: dict, test: str) -> str:
    """16 hex of sha256 over the canonical JSON of ``spec``: stable across runs and machines."""
    blob = json.dumps(spec(record, test), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def comparable(rec_a: dict, rec_b: dict, test: str | None = None) -> bool:
    """Same GPU (name) and same spec for ``test``, or, without one, for every
    test both records ran (at least one). Numbers from different GPUs are
    never an A/B even when the work is identical."""
    if rec_a.get("gpu") != rec_b.get("gpu"):
        return False
    tests_a = {r.get("test") for r in rec_a.get("results", [])}
    tests_b = {r.get("test") for r in rec_b.get("results", [])}
    shared = tests_a & tests_b if test is None else {test} & tests_a & tests_b
    return bool(shared) and all(spec_hash(rec_a, t) == spec_hash(rec_b, t) for t in shared)
