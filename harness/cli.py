"""``harness``: the workbench around the engine.

    harness models [NAME ...]                 fetch/generate catalog models, print their paths
    harness synth --preset NAME OUT.gguf      write a random-weight GGUF at a real model shape
    harness reference [--model NAME] [--tier cpu|gpu] [--force]
                                              regenerate llama.cpp references (needs llama-cpp-python)
    harness validate-catalog [--tier cpu|gpu] [--model NAME] [--backend cuda|numpy] [--json] [--calibrate]
                                              greedy parity with llama.cpp; exit 0 only if every model passes
    harness ab --rounds 8 BASE CANDIDATE [--model NAME|FILE]
                                              interleaved A/B of two engine wheels (or a llama.cpp arm)
    harness bench [--engine installed|WHEEL] [--llamacpp SPEC] [--model NAME|FILE ...]
                                              pp512/tg128 beside llama.cpp, appended to reports/results
    harness doctor                            what this machine can do, and how to fix what is missing
    harness report [--format html|md]         the scoreboard (reports/index.html) from the results store
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import AnvilError, count_int, positive_int, run_command


def cmd_models(args) -> int:
    from . import catalog

    cat = catalog.load()
    names = args.names or [n for n, e in cat.items() if args.tier in (None, e.tier)]
    for name in names:
        e = catalog.entry(name, cat)
        if e.tier == "gpu" and not args.names and args.tier is None:
            continue  # real-shape files are GBs: only on request
        path = catalog.model_path(name, catalog=cat, progress=not args.quiet)
        print(f"{name:20s} {e.tier:4s} {e.source:6s} {path}")
    return 0


def cmd_synth(args) -> int:
    from engine import synth

    from . import catalog

    if args.preset not in synth.PRESETS:
        raise AnvilError(f"unknown preset '{args.preset}'; available: {', '.join(synth.PRESETS)}")
    preset = synth.PRESETS[args.preset]
    vocab = Path(args.vocab) if args.vocab else catalog.vocab_source(preset.vocab)
    info = synth.write_synthetic(preset, args.out, vocab_gguf=vocab, seed=args.seed)
    print(f"wrote {info['path']}: {info['bytes'] / 1e6:.1f} MB, {info['n_params'] / 1e6:.1f}M params, "
          f"sha256 {info['sha256']}")
    if args.margin:
        _report_margin(Path(info["path"]))
    return 0


def _report_margin(path: Path) -> None:
    """Median top-2 logit margin of greedy decoding with the NumPy engine: the
    headroom a synthetic model leaves for numerical noise between engines."""
    import numpy as np

    import engine
    from engine.generate import greedy

    model = engine.load(path)
    margins = []
    for seed in range(3):
        prompt = np.random.default_rng(seed).integers(0, model.config.n_vocab, 8).tolist()
        for logits in greedy(model, prompt, 16, keep_logits=True).logits:
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
    print(f"median top-2 logit margin over {len(margins)} greedy steps: {np.median(margins):.3f} "
          f"(min {min(margins):.3f})")


def cmd_reference(args) -> int:
    from .reference import CPU_SETTINGS, GPU_SETTINGS, make_reference  # first: it loads llama.cpp before NumPy

    from . import catalog, refs

    cat = catalog.load()
    names = [args.model] if args.model else [n for n, e in cat.items() if args.tier in e.reference_tiers]
    settings = CPU_SETTINGS if args.tier == "cpu" else GPU_SETTINGS
    if args.variation:
        return _reference_variation(cat, names, args.tier, args.save)
    if args.save:
        raise AnvilError("--save goes with --variation (a reference is always written to references/)")
    for name in names:
        e = catalog.entry(name, cat)
        out = refs.reference_path(name, args.tier)
        if out.exists() and not args.force:
            old = refs.load(out)
            if old.model_sha256 != e.sha256:
                raise AnvilError(f"{out} was made from a model with sha256 {old.model_sha256}, the catalog now pins "
                                 f"{e.sha256}; pass --force to replace it")
        path = catalog.model_path(name, catalog=cat)
        print(f"{name}: running llama.cpp ({len(e.prompts)} prompts x {e.n_steps} steps)...", file=sys.stderr)
        ref = make_reference(name, path, e.sha256, list(e.prompts), e.n_steps, settings=settings)
        refs.save(ref, out)
        print(f"wrote {out}")
    return 0


def _reference_for(e, tier: str):
    """The model's llama.cpp references of ``tier``, made from the very file the catalog pins."""
    from . import refs

    path = refs.reference_path(e.name, tier)
    if not path.exists():
        raise AnvilError(f"{e.name}: no llama.cpp reference at {path}; make it with "
                         f"`harness reference --tier {tier} --model {e.name}` (needs llama-cpp-python"
                         f"{', built with CUDA, on the GPU' if tier == 'gpu' else ''})")
    ref = refs.load(path)
    if ref.model_sha256 != e.sha256:
        raise AnvilError(f"{path} was made from a different file than the catalog pins for {e.name}; "
                         f"regenerate it with `harness reference --tier {tier} --model {e.name} --force`")
    return ref


def _reference_variation(cat, names: list[str], tier: str, save: bool) -> int:
    """llama.cpp against its own references under settings that should not
    matter (reference.VARIANTS), measured as validate-catalog measures the
    engine: the noise floor the near-tie thresholds are read against."""
    import time

    from engine.bench import build_hash

    from . import catalog, validate
    from . import results as store
    from .reference import CPU_SETTINGS, GPU_SETTINGS, VARIANTS, LlamaCppModel, device_description

    device, results = None, []
    for name in names:
        e = catalog.entry(name, cat)
        ref = _reference_for(e, tier)  # on another file, llama.cpp would pass for its own spread
        model_path = catalog.model_path(name, catalog=cat)
        for variant, change in VARIANTS.items():
            print(f"{name}: llama.cpp {variant} vs its {tier}-tier reference...", file=sys.stderr)
            llm = LlamaCppModel(model_path, {**ref.settings, **change})
            try:
                # asked while llama.cpp holds the GPU, as make_reference does
                device = device or device_description(CPU_SETTINGS if tier == "cpu" else GPU_SETTINGS)
                results.append((variant, llm.settings, validate.validate_model(llm, e, ref, f"llama.cpp {variant}",
                                                                                tier=tier)))
            finally:
                llm.close()
    print(validate.format_table([r for _, _, r in results]))
    print("\nmax |margin shift| (what --calibrate multiplies by 1.25 for an engine):")
    for variant, _, r in results:
        print(f"  {r.model} ({tier}-tier references), llama.cpp {variant}: {r.max_margin_shift:.3g} "
              f"over {r.steps} steps")
    if save:
        rec = {"engine": "llama.cpp", "build": build_hash(), "backend": "llama.cpp", "tiers": [tier], "device": device,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "results": [{**r.to_json(), "variant": v, "settings": st} for v, st, r in results]}
        print(f"saved {store.save(rec, 'variation')}", file=sys.stderr)
    return 0


def cmd_validate(args) -> int:
    import json

    from . import catalog, validate

    backend = args.backend
    if backend == "auto":
        from engine.backends.cuda.device import gpu_available

        backend = "cuda" if gpu_available() else "numpy"
    tiers = [args.tier] if args.tier else (["cpu", "gpu"] if backend == "cuda" else ["cpu"])
    cat = catalog.load()
    # (model, reference set) pairs: a small real model can have cpu- and gpu-tier references
    if args.model:
        e = catalog.entry(args.model, cat)
        pairs = [(args.model, t) for t in e.reference_tiers if t in tiers] or [(args.model, e.tier)]
    else:
        pairs = [(n, t) for n, e in cat.items() for t in e.reference_tiers if t in tiers]
    plan = []
    for name, tier in pairs:  # check every reference exists before the long part
        e = catalog.entry(name, cat)
        ref = _reference_for(e, tier)
        if e.threshold(backend, tier) <= 0 and not args.calibrate:  # calibrating: every flip counts as drift
            key = e.threshold_key(backend, tier)
            raise AnvilError(f"catalog: {name} has no {key} threshold for its {tier}-tier references; calibrate "
                             f"with `harness validate-catalog --model {name} --tier {tier} --backend {backend} "
                             f"--calibrate`")
        plan.append((e, ref, tier))

    import engine
    from tqdm import tqdm

    results = []
    total = sum(len(ref.cases) for _, ref, _ in plan)
    with tqdm(total=total, desc="validate", unit="prompt", disable=args.json or not sys.stderr.isatty()) as bar:
        for e, ref, tier in plan:
            bar.set_postfix_str(e.name)
            path = catalog.model_path(e.name, catalog=cat, progress=not args.json)
            # the KV cache type llama.cpp used for the reference (f32 on the CPU tier, f16 on the GPU)
            options = {"kv_f16": ref.settings.get("type_k") != "f32"} if backend == "cuda" else {}
            model = engine.load(path, backend=backend, **options)
            results.append(validate.validate_model(model, e, ref, backend, progress=lambda: bar.update(1), tier=tier))
            del model
            if not args.json and not sys.stderr.isatty():
                r = results[-1]
                print(f"{e.name}: {'pass' if r.passed else 'DRIFT'} ({r.matched}/{r.steps} matched, "
                      f"{r.n_flips} flips, {r.seconds:.1f} s)", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1))
    else:
        print(validate.format_table(results))
        flips = validate.format_flips(results)
        if flips:
            print("\n" + flips)
    if args.save:
        from engine.bench import build_hash, gpu_info

        from . import results as store

        rec = {"engine": "anvil", "build": build_hash(), "backend": backend, "tiers": tiers,
               **(gpu_info() if backend == "cuda" else {"gpu": None}),
               "date": __import__("time").strftime("%Y-%m-%dT%H:%M:%SZ", __import__("time").gmtime()),
               "results": [r.to_json() for r in results]}
        print(f"saved {store.save(rec, 'validate')}", file=sys.stderr)
    if args.calibrate:
        print("\nnear-tie calibration (1.25 x max |margin shift|), catalog keys:", file=sys.stderr)
        for (name, tier), (t, n) in validate.calibrate(results).items():
            key = catalog.entry(name, cat).threshold_key(backend, tier)
            print(f"  {name} ({tier}-tier references): {key} = {t:.3g}   # over {n} steps", file=sys.stderr)
    return 0 if all(r.passed for r in results) else 1


def _model(name_or_path: str) -> tuple[Path, dict]:
    """A catalog model (fetched or generated) or a .gguf path, and what result
    records say about it: its name and, for a catalog model, the sha256 the
    catalog pins (catalog.model_path has verified the file)."""
    from . import catalog

    p = Path(name_or_path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise AnvilError(f"{p}: no such model file")
        return p, {"model_name": p.stem}
    return catalog.model_path(name_or_path), {"model_name": name_or_path,
                                              "model_sha256": catalog.entry(name_or_path).sha256 or None}


def _workdir() -> Path:
    from . import fetch

    d = fetch.models_dir().parent / "harness"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cmd_ab(args) -> int:
    from . import ab

    path, identity = _model(args.model)
    cfg = ab.ABConfig(model=path, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.repetitions,
                      rounds=args.rounds, factor=args.factor, allow_same=args.allow_same,
                      allow_token_diff=args.allow_token_diff, identity=identity)
    total = 2 * (cfg.rounds + 1)
    done = [0]

    def progress(r, arm, res):
        done[0] += 1
        tests = ", ".join(f"{t} {sum(v) / len(v):.1f}" for t, v in res.tests.items())
        print(f"[{done[0]}/{total}] round {r}{' (cold, dropped)' if r == 0 else ''} {arm}: {tests} t/s",
              file=sys.stderr, flush=True)

    try:
        record = ab.run_ab(args.base, args.candidate, cfg, _workdir(), progress=progress)
    except KeyboardInterrupt:
        print("interrupted: the completed rounds are saved in reports/results/", file=sys.stderr)
        return 130
    print(ab.format_report(record))
    print(f"saved {record['path']}", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from . import ab, results
    from .runners import make_runner

    arms = [make_runner(args.engine, _workdir())]
    if args.llamacpp:
        arms.append(make_runner(args.llamacpp, _workdir()))
    for runner in arms:
        runner.prepare()
    rows = []
    for name in args.model:
        path, identity = _model(name)
        recs = []
        for runner in arms:
            rec = ab.bench_record(runner, path, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.repetitions,
                                  pp_reps=args.pp_repetitions)
            rec.update(identity)
            rec["path"] = str(results.save({k: v for k, v in rec.items() if k != "path"}, "bench"))
            recs.append(rec)
        rows.append((name, recs))
    print(ab.format_bench(rows))
    return 0


def cmd_report(args) -> int:
    from .report import main_report

    return main_report(args)


def cmd_doctor(args) -> int:
    from .doctor import main_doctor

    return main_doctor(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness", description="Anvil workbench: correctness and speed against llama.cpp")
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("models", help="fetch or generate catalog models and print their paths")
    m.add_argument("names", nargs="*", help="catalog model names (default: every cpu-tier model)")
    m.add_argument("--tier", choices=["cpu", "gpu"], default=None)
    m.add_argument("-q", "--quiet", action="store_true")
    m.set_defaults(func=cmd_models)

    s = sub.add_parser("synth", help="write a random-weight GGUF at a real model shape")
    s.add_argument("--preset", required=True, help="e.g. tiny-llama, qwen3-8b, llama3-8b")
    s.add_argument("out", help="output .gguf path")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--vocab", help="GGUF to copy the tokenizer from (default: the preset's)")
    s.add_argument("--margin", action="store_true", help="report the median top-2 logit margin (NumPy engine)")
    s.set_defaults(func=cmd_synth)

    r = sub.add_parser("reference", help="regenerate llama.cpp reference outputs")
    r.add_argument("--model", help="one catalog model (default: every model of the tier)")
    r.add_argument("--tier", choices=["cpu", "gpu"], default="cpu")
    r.add_argument("--force", action="store_true", help="replace a reference made from a different model file")
    r.add_argument("--variation", action="store_true",
                   help="instead: measure llama.cpp against its existing references under other settings "
                        "(flash attention on, one-token batches), the noise floor for near-tie thresholds")
    r.add_argument("--save", action="store_true", help="with --variation: append the measurement to reports/results")
    r.set_defaults(func=cmd_reference)

    v = sub.add_parser("validate-catalog", help="greedy parity of the engine with llama.cpp over the catalog")
    v.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                   help="default: cpu with the NumPy backend, every tier with CUDA")
    v.add_argument("--model", help="one catalog model")
    v.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto",
                   help="auto (default): cuda when an NVIDIA GPU is usable, else numpy")
    v.add_argument("--json", action="store_true", help="print the results as JSON")
    v.add_argument("--calibrate", action="store_true", help="also print each model's measured near_tie")
    v.add_argument("--save", action="store_true", help="append the outcome to the results store (reports/results)")
    v.set_defaults(func=cmd_validate)

    a = sub.add_parser("ab", help="interleaved A/B benchmark of two builds")
    a.add_argument("base", help="base arm: an engine wheel, 'installed', llama-bench:PATH or llama-cpp-python[:SITE]")
    a.add_argument("candidate", help="candidate arm (same forms)")
    a.add_argument("--model", default="qwen3-8b", help="catalog model name or a .gguf path (default qwen3-8b)")
    a.add_argument("--rounds", type=positive_int, default=8, help="measured rounds (one more cold round is run and dropped)")
    a.add_argument("-p", "--n-prompt", type=count_int, default=512)
    a.add_argument("-n", "--n-gen", type=count_int, default=128)
    a.add_argument("-r", "--repetitions", type=positive_int, default=3, help="repetitions inside each run")
    a.add_argument("--factor", type=float, default=1.05, help="smallest ratio that counts as a change (asv)")
    a.add_argument("--allow-same", action="store_true", help="allow two identical builds")
    a.add_argument("--allow-token-diff", action="store_true", help="do not fail when greedy tokens differ")
    a.set_defaults(func=cmd_ab)

    b = sub.add_parser("bench", help="benchmark the engine (and llama.cpp) on catalog models or files")
    b.add_argument("--engine", default="installed", help="'installed' (default) or an engine wheel")
    b.add_argument("--llamacpp", help="llama-bench:PATH or llama-cpp-python[:SITE] for a llama.cpp arm")
    b.add_argument("--model", nargs="+", default=["qwen3-8b"], help="catalog model names or .gguf paths")
    b.add_argument("-p", "--n-prompt", type=count_int, default=512)
    b.add_argument("-n", "--n-gen", type=count_int, default=128)
    b.add_argument("-r", "--repetitions", type=positive_int, default=5)
    b.add_argument("--pp-repetitions", type=positive_int, default=None,
                   help="repetitions of the prefill test (default: -r); ~40 make its NVML window long enough "
                        "to diagnose")
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("doctor", help="what this machine can do, with fixes")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)

    rp = sub.add_parser("report", help="render the scoreboard from the results store")
    rp.add_argument("--format", choices=["html", "md"], default="html")
    rp.add_argument("--out", default=None, help="output file (default reports/index.html; md prints to stdout)")
    rp.add_argument("--results-dir", default=None, help="results store (default reports/results)")
    rp.set_defaults(func=cmd_report)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
