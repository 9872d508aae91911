"""``--gpus`` and ``--ray`` for ``harness validate-catalog``, ``harness
mutants`` and ``harness bench``: each command's work cut into per-model
units (harness/pool.py runs them), and their outcomes merged back into the
one table and record the command makes in one process, each result saying
where it ran (``gpu_index``, and the GPU's name and host).

- validate-catalog: a unit per model, all its reference sets (one load);
- mutants: a unit per mutant, and per model for the control run first,
  each in a fresh process as ``python -m harness.mutants`` is;
- bench: a unit per model, both arms and every depth on one GPU (a ratio
  is only ever of one GPU); different models on different GPUs.

A unit that fails is reported for its models: validate-catalog a FAIL
(check ``error``) for each of the model's sets, mutants a row not judged,
bench an ERROR line below the table (exit status 1); the others finish.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from . import pool


def add_options(p, what: str) -> None:
    """``--gpus`` / ``--ray`` on a command's parser (``what``: the command's unit, for the help)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gpus", type=pool.gpu_list, metavar="all|0,1,...",
                   help=f"one worker process per GPU (all: every GPU NVML reports), {what} handed out largest "
                        f"first, the results merged into one table and record")
    g.add_argument("--ray", metavar="ADDRESS|auto",
                   help=f"{what} as Ray tasks of one GPU each on the cluster at ADDRESS (auto: the running one, "
                        f"else a local instance); needs {pool.RAY_EXTRA}")


def requested(args) -> bool:
    return bool(getattr(args, "gpus", None) or getattr(args, "ray", None))


class Spread:
    """Where a command's units run: this machine's GPUs (``--gpus``) or a Ray
    cluster (``--ray``). Made before any work, so that a machine without a
    GPU, or without Ray, says so in one line first."""

    def __init__(self, args, num_gpus: float = 1):
        self.ray, self.num_gpus = getattr(args, "ray", None), num_gpus
        self.gpus = self.names = None
        if self.ray:
            pool.import_ray()
        else:
            from . import nvml

            self.gpus = pool.resolve_gpus(args.gpus)
            self.names = nvml.devices()[0]

    def describe(self) -> str:
        return f"on Ray ({self.ray})" if self.ray else f"on GPUs {', '.join(map(str, self.gpus))}, a worker each"

    def run(self, units: list[pool.Unit], progress=None) -> list[pool.Outcome]:
        print(f"{len(units)} unit(s) {self.describe()}", file=sys.stderr, flush=True)
        if self.ray:
            return pool.run_ray(units, self.ray, self.num_gpus, progress)
        from .commands import common

        log_dir = common.workdir() / "gpus" / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
        outs = pool.run_local(units, self.gpus, log_dir, progress)
        if not any(o.error for o in outs):
            shutil.rmtree(log_dir, ignore_errors=True)  # kept where an error names its log
        return outs

    def placement(self, out: pool.Outcome, gpu_named: bool = True) -> dict:
        """Where ``out`` ran, as a result record says it: the GPU's NVML index
        and (``gpu_named``: a CUDA run) its name, and the host."""
        name = None
        if gpu_named and out.gpu is not None:
            name = out.gpu_name or (self.names[out.gpu] if self.names and out.gpu < len(self.names) else None)
        return {"gpu_index": out.gpu, **({"gpu": name} if name else {}), "host": out.host}


def _say(out: pool.Outcome, done: int, total: int, verdict: str) -> None:
    print(f"[{done}/{total}] {out.unit.name} on {out.where}: {verdict} ({out.seconds:.1f} s)", file=sys.stderr,
          flush=True)


# ---- validate-catalog ----------------------------------------------------------------------

def validate_unit(model: str, sets: list[str], backend: str) -> list:
    """In a worker: ``model`` against each of its reference sets ``sets``, loaded once."""
    from . import catalog, refs, validate

    cat = catalog.load()
    e = catalog.entry(model, cat)
    loaded = validate.Loaded(cat, backend, quiet=True)
    return [validate.run(cat, e, refs.for_entry(e, s), s, backend, quiet=True, loaded=loaded) for s in sets]


def validate_plan(plan, backend: str, spread: Spread, quiet: bool = False) -> list:
    """validate-catalog's ``plan`` ([(entry, reference, set)], as the command
    makes it) as a unit per model; the ModelResults in the plan's order."""
    from . import catalog, validate

    by_model: dict[str, tuple] = {}
    for e, _, s in plan:
        by_model.setdefault(e.name, (e, []))[1].append(s)
    units = [pool.Unit(name, validate_unit, (name, sets, backend), catalog.approx_bytes(e))
             for name, (e, sets) in by_model.items()]

    def progress(out, done, total):
        if not quiet:
            _say(out, done, total, f"ERROR: {out.error}" if out.error else
                 ", ".join(f"{r.tier} {'pass' if r.passed else 'FAIL'}" for r in out.result))

    results = []
    for out, (e, sets) in zip(spread.run(units, progress), by_model.values()):
        where = spread.placement(out, gpu_named=backend == "cuda")
        got = out.result if out.error is None else [
            validate.ModelResult(e.name, s, backend, e.gate(backend, s), seconds=out.seconds,
                                 failures=[validate.Failure(-1, None, "error", out.error)]) for s in sets]
        for r in got:
            r.placement = where
            results.append(r)
    return results


# ---- mutants ---------------------------------------------------------------------------------

def mutant_unit(name: str, backend: str, pairs: list[tuple[str, str]]) -> dict:
    """In a fresh worker: what ``python -m harness.mutants NAME`` prints (the control's, or one mutant's row)."""
    from . import mutants

    if name == mutants.CONTROL:
        return mutants.run_control(backend, pairs)
    return mutants.run_one(mutants.BY_NAME[name], backend, pairs)


def mutant_rows(spread: Spread, jobs: list[tuple[str, list]], backend: str, progress=None,
                extra=lambda name: {}) -> list[dict]:
    """Each (mutant or control, its pairs) of ``jobs`` in a fresh worker; the
    rows ``_child`` would return, in the order of ``jobs``, each with the GPU
    that ran it, its seconds and ``extra(name)``; a failed unit a row with
    ``error``, as a failed child's. ``progress(row)`` as each ends."""
    from . import catalog

    cat = catalog.load()
    units = [pool.Unit(name, mutant_unit, (name, backend, pairs),
                       catalog.approx_bytes(catalog.entry(pairs[0][0], cat)) if pairs else 0, fresh=True)
             for name, pairs in jobs]
    rows: dict[int, dict] = {}  # id(outcome) -> its row: progress and the result share one dict

    def row(out: pool.Outcome) -> dict:
        if id(out) not in rows:
            r = dict(out.result) if out.error is None else {"mutant": out.unit.name, "caught": False, "tried": [],
                                                            "error": f"the mutant's process: {out.error}"}
            rows[id(out)] = {**r, **extra(out.unit.name), "seconds": round(out.seconds, 1),
                             **spread.placement(out, gpu_named=backend == "cuda")}
        return rows[id(out)]

    def said(out, done, total):
        if progress:
            progress(row(out))

    return [row(o) for o in spread.run(units, said)]


# ---- bench -----------------------------------------------------------------------------------

def bench_unit(name: str, engine: str, llamacpp: str | None, settings: dict, sitting: str) -> list[list[dict]]:
    """In a worker: both arms on ``name`` at each depth, on this worker's GPU
    (the runners made and prepared here: installs and probes are idempotent
    and safe side by side); [[engine rec, llama.cpp rec?] per depth]."""
    from . import ab
    from .commands import common
    from .runners import make_runner

    arms = [make_runner(engine, common.workdir())] + ([make_runner(llamacpp, common.workdir())] if llamacpp else [])
    for runner in arms:
        runner.prepare()
    path, identity = common.model(name)
    out = []
    for depth in settings["depths"]:
        recs = []
        for runner in arms:
            rec = ab.bench_record(runner, path, n_prompt=settings["n_prompt"], n_gen=settings["n_gen"],
                                  reps=settings["reps"], pp_reps=settings["pp_reps"], depth=depth)
            rec.update(identity, sitting=sitting)
            recs.append(rec)
        out.append(recs)
    return out


def bench_models(args, spread: Spread, sitting: str, save) -> tuple[list, list[str]]:
    """``harness bench``'s models as a unit each; (the rows as the command
    prints them, in the order of --model; one line per model that failed).
    ``save(rec)``: keeps a record as the command does, as its unit ends."""
    from . import catalog

    settings = {"depths": list(args.n_depth), "n_prompt": args.n_prompt, "n_gen": args.n_gen,
                "reps": args.repetitions, "pp_reps": args.pp_repetitions}
    cat = catalog.load()

    def size(name: str) -> int:
        from pathlib import Path

        return Path(name).stat().st_size if name.endswith(".gguf") else catalog.approx_bytes(catalog.entry(name, cat))

    units = [pool.Unit(name, bench_unit, (name, args.engine, args.llamacpp, settings, sitting), size(name))
             for name in args.model]

    def progress(out, done, total):
        if out.error is None:
            for recs in out.result:
                for rec in recs:  # the GPU's name is the record's own (NVML, in the worker)
                    rec.update(spread.placement(out, gpu_named=False))
                    save(rec)
        _say(out, done, total, f"ERROR: {out.error}" if out.error else "measured")

    rows, failed = [], []
    for out in spread.run(units, progress):
        if out.error:
            failed.append(f"ERROR {out.unit.name} on {out.where}: {out.error}")
        else:
            rows += [(out.unit.name, recs) for recs in out.result]
    return rows, failed
