"""``harness validate-catalog``: greedy parity of the engine with llama.cpp over the catalog."""

from __future__ import annotations

import sys

from engine.errors import AnvilError

from .. import distribute
from . import common


def add(sub) -> None:
    v = sub.add_parser("validate-catalog", help="greedy parity of the engine with llama.cpp over the catalog")
    v.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                   help="default: cpu with the NumPy backend, every tier with CUDA")
    v.add_argument("--model", action="append", help="a catalog model (repeatable; default: the whole catalog)")
    v.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto",
                   help="auto (default): cuda when an NVIDIA GPU is usable, else numpy")
    v.add_argument("--json", action="store_true", help="print the results as JSON")
    v.add_argument("-v", "--verbose", action="store_true",
                   help="list every near-tie flip (by default: per model their count and the one closest to the bound)")
    v.add_argument("--save", action="store_true", help="append the outcome to the results store (reports/results)")
    distribute.add_options(v, "models")
    v.set_defaults(func=run)


def run(args) -> int:
    import contextlib
    import json
    import platform
    import textwrap

    from .. import table

    backend = args.backend
    if backend == "auto":
        from engine.backends.cuda.device import gpu_available

        backend = "cuda" if gpu_available() else "numpy"
    spread = distribute.Spread(args, num_gpus=int(backend == "cuda")) if distribute.requested(args) else None
    tiers = [args.tier] if args.tier else (["cpu", "gpu"] if backend == "cuda" else ["cpu"])
    from .. import catalog, refs, validate

    cat = catalog.load()
    pairs, ungated = validate.plan(cat, backend, tiers, args.model)
    if not pairs:
        raise AnvilError(f"nothing to validate: no {'/'.join(tiers)}-tier reference set"
                         f"{' of ' + ', '.join(args.model) if args.model else ''} has thresholds for the "
                         f"{backend} backend "
                         f"(catalog keys gate.<set>{'' if backend == 'numpy' else '-' + backend})")
    plan = [(e, refs.for_entry(e, s), s) for e, s in pairs]  # every reference exists, before the long part

    results = []
    if spread is not None:  # a model per worker or Ray task, merged here in the plan's order
        results = distribute.validate_plan(plan, backend, spread, quiet=args.json)
    else:
        bar = common.progress_bar("prompts") if not args.json and sys.stderr.isatty() else None
        with bar or contextlib.nullcontext():
            task = bar.add_task("validate", total=sum(len(ref.cases) for _, ref, _ in plan)) if bar else None
            loaded = validate.Loaded(cat, backend, quiet=args.json)  # a model's sets one after another: loaded once
            for k, (e, ref, rset) in enumerate(plan, 1):
                what = f"[{k}/{len(plan)}] {e.name} ({rset} references)"
                if bar:
                    bar.update(task, description=what)
                r = validate.run(cat, e, ref, rset, backend, progress=bar and (lambda: bar.advance(task)),
                                 quiet=args.json, loaded=loaded)
                results.append(r)
                if not args.json:
                    common.say(f"{what}: {'pass' if r.passed else 'FAIL'} ({r.seconds:.1f} s)", bar)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1))
    else:  # the details first, the table last (where the terminal stops scrolling)
        for text in (validate.format_flips(results, args.verbose), validate.format_failures(results)):
            if text:
                print(text + "\n")
        for e, s in ungated:
            print(f"not judged: {e.name} against its {s} references with the {backend} backend (the catalog has "
                  f"no gate.{e.gate_key(backend, s)} thresholds)")
        print(textwrap.fill(validate.table_legend(results), table.WIDTH))
        table.show(validate.TABLE_HEADER, validate.table_rows(results))
    if args.save:
        from engine.bench import build_hash, gpu_info

        from .. import results as store

        # host: with GPU, build and date, what ties a speed figure to this validation (report/validated.py)
        rec = {"engine": "anvil", "build": build_hash(), "backend": backend, "tiers": tiers,
               "host": platform.node(),
               **(gpu_info() if backend == "cuda" else {"gpu": None}),
               "date": __import__("time").strftime("%Y-%m-%dT%H:%M:%SZ", __import__("time").gmtime()),
               "results": [r.to_json() for r in results]}
        print(f"saved {store.save(rec, 'validate')}", file=sys.stderr)
    return 0 if all(r.passed for r in results) else 1
