"""``harness reference``: llama.cpp's (or the NumPy oracle's) reference outputs, or
llama.cpp's own spread against them (``--variation``), which the gate's
thresholds are set from."""

from __future__ import annotations

import sys

from engine.errors import AnvilError


def add(sub) -> None:
    r = sub.add_parser("reference", help="regenerate llama.cpp reference outputs")
    r.add_argument("--model", help="one catalog model (default: every model of the tier)")
    r.add_argument("--tier", choices=["cpu", "twin", "gpu", "oracle", "deep", "f16kv"], default="cpu",
                   help="reference set: cpu (llama.cpp CPU on the file), twin (the same on its F32 twin), "
                        "gpu (llama.cpp CUDA), oracle (the NumPy engine: the CUDA engine's reference), "
                        "deep (llama.cpp CUDA on a ~4.8k-token prompt), f16kv (as cpu, with an F16 KV cache)")
    r.add_argument("--force", action="store_true", help="replace a reference made from a different model file")
    r.add_argument("--variation", action="store_true",
                   help="instead: measure llama.cpp against its existing references under other settings "
                        "(harness/gates.py) and print the gate thresholds they support beside the catalog's")
    r.add_argument("--faithful", action="store_true",
                   help="with --variation: measure the rounding-faithful oracle (the CUDA engine's roundings in "
                        "NumPy) instead of llama.cpp: the CUDA engine's gate against a CPU-made set")
    r.add_argument("--save", action="store_true", help="with --variation: append the measurement to reports/results")
    r.set_defaults(func=run)


def run(args) -> int:
    from ..reference import CPU_SETTINGS, GPU_SETTINGS, make_reference  # first: it loads llama.cpp before NumPy

    from .. import catalog, refs

    cat = catalog.load()
    rset = args.tier
    names = [args.model] if args.model else [n for n, e in cat.items() if rset in e.reference_sets]
    if args.variation:
        return _reference_variation(cat, names, rset, args.save, args.faithful)
    if args.save or args.faithful:
        raise AnvilError("--save and --faithful go with --variation (a reference is always written to references/)")
    settings = GPU_SETTINGS if catalog.REFERENCE_SETS[rset] == "gpu" else CPU_SETTINGS
    for name in names:
        e = catalog.entry(name, cat)
        if rset not in e.reference_sets:
            raise AnvilError(f"catalog: {name} has no '{rset}' reference set (its references: "
                             f"{', '.join(e.reference_sets)})")
        out = refs.reference_path(name, rset)
        if out.exists() and not args.force:
            old = refs.load(out)
            if old.model_sha256 != e.sha256:
                raise AnvilError(f"{out} was made from a model with sha256 {old.model_sha256}, the catalog now pins "
                                 f"{e.sha256}; pass --force to replace it")
        path = catalog.model_path(name, catalog=cat)
        if rset == "oracle":
            from ..reference import make_oracle_reference

            print(f"{name}: running the NumPy engine on {path.name} (the cpu references' prompts)...",
                  file=sys.stderr)
            refs.save(make_oracle_reference(e, path, refs.for_entry(e, "cpu")), out)
            print(f"wrote {out}")
            continue
        run = catalog.twin_path(name, catalog=cat) if rset == "twin" else path
        prompts = e.prompts_for(rset)
        print(f"{name}: running llama.cpp on {run.name} ({len(prompts)} prompts x {e.n_steps} steps)...",
              file=sys.stderr)
        ref = make_reference(name, run, e.sha256, list(prompts), e.n_steps,
                             settings={**settings, **catalog.SET_SETTINGS.get(rset, {})})
        if rset == "twin":  # judged against the engine on the original file
            from ..fetch import sha256_file

            ref.model_file = path.name
            ref.llama_cpp_input = {"file": run.name, "sha256": sha256_file(run),
                                   "made_by": "harness/twin.py: every tensor dequantised to F32 by Anvil"}
        refs.save(ref, out)
        print(f"wrote {out}")
    return 0


def _reference_variation(cat, names: list[str], rset: str, save: bool, faithful: bool = False) -> int:
    """llama.cpp against its own references under settings that should not
    matter (harness/gates.py), measured as validate-catalog measures the
    engine: the spread the gate's thresholds are set from."""
    import time

    from engine.bench import build_hash

    from .. import catalog, gates, validate
    from .. import results as store
    from ..reference import CPU_SETTINGS, GPU_SETTINGS, device_description

    if faithful and catalog.REFERENCE_SETS[rset] != "cpu":
        raise AnvilError(f"--faithful measures CPU-made sets (cpu, twin, oracle, f16kv), not '{rset}'")
    measured = (gates.measure_faithful if faithful else gates.measure)(cat, names, rset)
    if not measured:
        raise AnvilError(f"no catalog model among {', '.join(names)} has '{rset}' references")
    device = device_description(CPU_SETTINGS if catalog.REFERENCE_SETS[rset] == "cpu" else GPU_SETTINGS)
    print(validate.format_table([r for *_, r in measured]))
    who = "the faithful oracle" if faithful else "llama.cpp"
    print(f"\nthresholds from {who}'s spread ({gates.HEADROOM} x, KL {gates.HEADROOM}² x) or the stated "
          f"budget, whichever is larger; nothing is written, edit references/catalog.toml to adopt:")
    print(gates.format_proposals(cat, measured, rset))
    if save:
        rec = {"engine": gates.FAITHFUL_ENGINE if faithful else "llama.cpp", "build": build_hash(),
               "backend": "numpy (rounding cuda)" if faithful else "llama.cpp", "tiers": [rset],
               "device": device, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "results": [{**r.to_json(), "variant": v, "settings": st, "model_sha256": cat[m].sha256}
                           for m, v, st, r in measured]}
        print(f"saved {store.save(rec, 'variation')}", file=sys.stderr)
    return 0
