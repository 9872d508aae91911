"""``harness validate-catalog``: greedy parity of the engine with llama.cpp over the catalog."""

from __future__ import annotations

import sys

from engine.errors import AnvilError

from .. import distribute


def add(sub) -> None:
    v = sub.add_parser("validate-catalog", help="greedy parity of the engine with llama.cpp over the catalog")
    v.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                   help="default: cpu with the NumPy backend, every tier with CUDA")
    v.add_argument("--model", action="append", help="a catalog model (repeatable; default: the whole catalog)")
    v.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto",
                   help="auto (default): cuda when an NVIDIA GPU is usable, else numpy")
    v.add_argument("--json", action="store_true", help="print the results as JSON")
    v.add_argument("--save", action="store_true", help="append the outcome to the results store (reports/results)")
    distribute.add_options(v, "models")
    v.set_defaults(func=run)


def run(args) -> int:
    import json
    import platform

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

    from tqdm import tqdm

    results = []
    total = sum(len(ref.cases) for _, ref, _ in plan)
    if spread is not None:  # a model per worker or Ray task, merged here in the plan's order
        results = distribute.validate_plan(plan, backend, spread, quiet=args.json)
    else:
        with tqdm(total=total, desc="validate", unit="prompt", disable=args.json or not sys.stderr.isatty()) as bar:
            loaded = validate.Loaded(cat, backend, quiet=args.json)  # a model's sets one after another: loaded once
            for e, ref, rset in plan:
                bar.set_postfix_str(f"{e.name} ({rset})")
                results.append(validate.run(cat, e, ref, rset, backend, progress=lambda: bar.update(1),
                                            quiet=args.json, loaded=loaded))
                if not args.json and not sys.stderr.isatty():
                    r = results[-1]
                    print(f"{e.name} ({rset} references): {'pass' if r.passed else 'FAIL'} ({r.seconds:.1f} s)",
                          file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1))
    else:
        print(validate.format_table(results))
        for text in (validate.format_flips(results), validate.format_failures(results)):
            if text:
                print("\n" + text)
        for e, s in ungated:
            print(f"not judged: {e.name} against its {s} references with the {backend} backend (the catalog has "
                  f"no gate.{e.gate_key(backend, s)} thresholds)")
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
