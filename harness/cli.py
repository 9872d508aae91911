"""``harness``: the workbench around the engine.

    harness models [NAME ...]                 fetch/generate catalog models, print their paths
    harness synth --preset NAME OUT.gguf      write a random-weight GGUF at a real model shape
    harness reference [--model NAME] [--tier cpu|gpu] [--force]
                                              regenerate llama.cpp references (needs llama-cpp-python)
    harness validate-catalog [--tier cpu|gpu] [--model NAME] [--backend cuda|numpy] [--json] [--save]
                                              greedy parity with llama.cpp; exit 0 only if every model passes
    harness diff MODEL --prompt TEXT [--backend numpy|cuda] [--against llama.cpp|numpy] [--mutant NAME]
                                              per-layer, per-op error; marks the first op that diverges
    harness mutants [--backend cuda|numpy] [--mutant NAME]
                                              the gate against deliberate engine bugs; exit 0 only if all are caught
    harness ab --rounds 8 BASE CANDIDATE [--model NAME|FILE] [--commits]
                                              interleaved A/B of two engine wheels (or git revisions, or a llama.cpp arm)
    harness wheel REV [REV ...]               the engine wheel of each git revision (built once, cached)
    harness bench [--engine installed|WHEEL] [--llamacpp SPEC] [--model NAME|FILE ...]
                                              pp512/tg128 beside llama.cpp, appended to reports/results
    harness doctor                            what this machine can do, and how to fix what is missing
    harness report [--format html|md]         the scoreboard (reports/index.html) from the results store
"""

from __future__ import annotations

import argparse
import signal
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
    from engine.atomic import check_writable

    from . import catalog

    if args.preset not in synth.PRESETS:
        raise AnvilError(f"unknown preset '{args.preset}'; available: {', '.join(synth.PRESETS)}")
    preset = synth.PRESETS[args.preset]
    check_writable(args.out)  # before the vocabulary is fetched
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
    rset = args.tier
    names = [args.model] if args.model else [n for n, e in cat.items() if rset in e.reference_sets]
    if args.variation:
        return _reference_variation(cat, names, rset, args.save)
    if args.save:
        raise AnvilError("--save goes with --variation (a reference is always written to references/)")
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
            from .reference import make_oracle_reference

            print(f"{name}: running the NumPy engine on {path.name} (the cpu references' prompts)...",
                  file=sys.stderr)
            refs.save(make_oracle_reference(e, path, refs.for_entry(e, "cpu")), out)
            print(f"wrote {out}")
            continue
        run = catalog.twin_path(name, catalog=cat) if rset == "twin" else path
        print(f"{name}: running llama.cpp on {run.name} ({len(e.prompts)} prompts x {e.n_steps} steps)...",
              file=sys.stderr)
        ref = make_reference(name, run, e.sha256, list(e.prompts), e.n_steps, settings=settings)
        if rset == "twin":  # judged against the engine on the original file
            from .fetch import sha256_file

            ref.model_file = path.name
            ref.llama_cpp_input = {"file": run.name, "sha256": sha256_file(run),
                                   "made_by": "harness/twin.py: every tensor dequantised to F32 by Anvil"}
        refs.save(ref, out)
        print(f"wrote {out}")
    return 0


def _reference_variation(cat, names: list[str], rset: str, save: bool) -> int:
    """llama.cpp against its own references under settings that should not
    matter (harness/gates.py), measured as validate-catalog measures the
    engine: the spread the gate's thresholds are set from."""
    import time

    from engine.bench import build_hash

    from . import catalog, gates, validate
    from . import results as store
    from .reference import CPU_SETTINGS, GPU_SETTINGS, device_description

    measured = gates.measure(cat, names, rset)
    if not measured:
        raise AnvilError(f"no catalog model among {', '.join(names)} has '{rset}' references")
    device = device_description(CPU_SETTINGS if catalog.REFERENCE_SETS[rset] == "cpu" else GPU_SETTINGS)
    print(validate.format_table([r for *_, r in measured]))
    print(f"\nthresholds from llama.cpp's spread ({gates.HEADROOM} x, KL {gates.HEADROOM}² x) or the stated "
          f"budget, whichever is larger; nothing is written, edit references/catalog.toml to adopt:")
    print(gates.format_proposals(cat, measured, rset))
    if save:
        rec = {"engine": "llama.cpp", "build": build_hash(), "backend": "llama.cpp", "tiers": [rset],
               "device": device, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "results": [{**r.to_json(), "variant": v, "settings": st} for _, v, st, r in measured]}
        print(f"saved {store.save(rec, 'variation')}", file=sys.stderr)
    return 0


def cmd_validate(args) -> int:
    import json

    backend = args.backend
    if backend == "auto":
        from engine.backends.cuda.device import gpu_available

        backend = "cuda" if gpu_available() else "numpy"
    tiers = [args.tier] if args.tier else (["cpu", "gpu"] if backend == "cuda" else ["cpu"])
    from . import catalog, refs, validate

    cat = catalog.load()
    pairs, ungated = validate.plan(cat, backend, tiers, args.model)
    if not pairs:
        raise AnvilError(f"nothing to validate: no {'/'.join(tiers)}-tier reference set"
                         f"{' of ' + args.model if args.model else ''} has thresholds for the {backend} backend "
                         f"(catalog keys gate.<set>{'' if backend == 'numpy' else '-' + backend})")
    plan = [(e, refs.for_entry(e, s), s) for e, s in pairs]  # every reference exists, before the long part

    from tqdm import tqdm

    results = []
    total = sum(len(ref.cases) for _, ref, _ in plan)
    with tqdm(total=total, desc="validate", unit="prompt", disable=args.json or not sys.stderr.isatty()) as bar:
        for e, ref, rset in plan:
            bar.set_postfix_str(f"{e.name} ({rset})")
            results.append(validate.run(cat, e, ref, rset, backend, progress=lambda: bar.update(1),
                                        quiet=args.json))
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

        from . import results as store

        rec = {"engine": "anvil", "build": build_hash(), "backend": backend, "tiers": tiers,
               **(gpu_info() if backend == "cuda" else {"gpu": None}),
               "date": __import__("time").strftime("%Y-%m-%dT%H:%M:%SZ", __import__("time").gmtime()),
               "results": [r.to_json() for r in results]}
        print(f"saved {store.save(rec, 'validate')}", file=sys.stderr)
    return 0 if all(r.passed for r in results) else 1


def cmd_diff(args) -> int:
    from . import reference  # noqa: F401  (first: llama.cpp loads before NumPy)
    from .diff import main_diff

    return main_diff(args, _model(args.model)[0])


def cmd_mutants(args) -> int:
    from .mutants import main_suite

    return main_suite(args)


def _model(name_or_path: str, check_only: bool = False) -> tuple[Path, dict] | None:
    """A catalog model (fetched or generated) or a .gguf path, and what result
    records say about it: its name and, for a catalog model, the sha256 the
    catalog pins (catalog.model_path has verified the file). ``check_only``:
    only say whether the name is good (nothing fetched or generated)."""
    from . import catalog

    p = Path(name_or_path)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise AnvilError(f"{p}: no such model file")
        return None if check_only else (p, {"model_name": p.stem})
    entry = catalog.entry(name_or_path)  # an unknown name fails here
    if check_only:
        return None
    return catalog.model_path(name_or_path), {"model_name": name_or_path, "model_sha256": entry.sha256 or None}


def _workdir() -> Path:
    from . import fetch

    d = fetch.models_dir().parent / "harness"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cmd_wheel(args) -> int:
    from . import wheels

    for rev in args.revs:
        print(wheels.wheel_for(rev))
    return 0


def cmd_ab(args) -> int:
    from . import ab, wheels

    if args.commits:  # the arms are git revisions: their engine wheels, built (or found) first
        args.base, args.candidate = (str(wheels.wheel_for(rev)) for rev in (args.base, args.candidate))
    # every input is checked (the wheels installed and probed, the model
    # named) before any model is downloaded or generated: that can take minutes
    _model(args.model, check_only=True)
    runners = ab.prepare_arms(args.base, args.candidate, _workdir(), allow_same=args.allow_same)
    path, identity = _model(args.model)
    cfg = ab.ABConfig(model=path, n_prompt=args.n_prompt, n_gen=args.n_gen, depth=args.n_depth, reps=args.repetitions,
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
        record = ab.run_ab(args.base, args.candidate, cfg, _workdir(), progress=progress, runners=runners,
                           results_dir=args.results_dir, save=_saving(args))
    except ab.Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    print(ab.format_report(record))
    print(f"saved {record['path']}" if record["path"] else NOT_SAVED, file=sys.stderr)
    slower = ab.slower_tests(record)
    if slower and not args.allow_slower:
        print(f"slower: {', '.join(slower)}: exit status 1 (--allow-slower: 0)", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args) -> int:
    from . import ab, results
    from .runners import make_runner

    for name in args.model:  # every name checked before anything is fetched or generated
        _model(name, check_only=True)
    arms = [make_runner(args.engine, _workdir())]
    if args.llamacpp:
        arms.append(make_runner(args.llamacpp, _workdir()))
    for runner in arms:
        runner.prepare()
    rows = []
    for name in args.model:
        path, identity = _model(name)
        for depth in args.n_depth:  # one record per engine and depth, as llama-bench's rows
            recs = []
            for runner in arms:
                rec = ab.bench_record(runner, path, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.repetitions,
                                      pp_reps=args.pp_repetitions, depth=depth)
                rec.update(identity)
                if _saving(args):
                    rec["path"] = str(results.save({k: v for k, v in rec.items() if k != "path"}, "bench",
                                                   args.results_dir))
                    print(f"saved {rec['path']}", file=sys.stderr)
                recs.append(rec)
            rows.append((name, recs))
    print(ab.format_bench(rows, args.output))
    if not _saving(args):
        print(NOT_SAVED, file=sys.stderr)
    return 0


NOT_SAVED = "not saved: --save keeps the records in reports/results (or --results-dir DIR)"


def _saving(args) -> bool:
    """Records enter a store only when asked: --save (the committed store) or an explicit --results-dir."""
    return bool(args.save or args.results_dir)


def cmd_report(args) -> int:
    from .report import main_report

    return main_report(args)


def cmd_doctor(args) -> int:
    from .doctor import main_doctor

    return main_doctor(args)


def at_least_two(text: str) -> int:
    n = positive_int(text)
    if n < 2:
        raise argparse.ArgumentTypeError(f"expected at least 2 rounds (a verdict needs two), got {text!r}")
    return n


def factor_above_one(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not x > 1 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a ratio above 1 (e.g. 1.05), got {text!r}")
    return x


def depth_list(text: str) -> list[int]:
    """``0,4096,16384``: the depths of a sweep, each a token count >= 0."""
    try:
        return [count_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected token counts >= 0 separated by commas (e.g. 0,4096), "
                                         f"got {text!r}") from None


class _Help(argparse.HelpFormatter):
    """--help shows each option's default (where it has one its help does not already name)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        default = ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        return f"{text} (default: {default})" if text else f"default: {default}"


def build_parser() -> argparse.ArgumentParser:
    import functools

    from engine import __version__

    p = argparse.ArgumentParser(prog="harness", description="Anvil workbench: correctness and speed against llama.cpp",
                                formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"harness (anvil) {__version__}")
    p.add_argument("--project", metavar="DIR",
                   help="the project: its references/ (catalog, references) and reports/ (results, scoreboard); "
                        "default $ANVIL_PROJECT, else the checkout holding the current directory")
    sub = p.add_subparsers(dest="command", required=True,
                           parser_class=functools.partial(argparse.ArgumentParser, formatter_class=_Help))

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
    r.add_argument("--tier", choices=["cpu", "twin", "gpu", "oracle"], default="cpu",
                   help="reference set: cpu (llama.cpp CPU on the file), twin (the same on its F32 twin), "
                        "gpu (llama.cpp CUDA), oracle (the NumPy engine: the CUDA engine's reference)")
    r.add_argument("--force", action="store_true", help="replace a reference made from a different model file")
    r.add_argument("--variation", action="store_true",
                   help="instead: measure llama.cpp against its existing references under other settings "
                        "(harness/gates.py) and print the gate thresholds they support beside the catalog's")
    r.add_argument("--save", action="store_true", help="with --variation: append the measurement to reports/results")
    r.set_defaults(func=cmd_reference)

    v = sub.add_parser("validate-catalog", help="greedy parity of the engine with llama.cpp over the catalog")
    v.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                   help="default: cpu with the NumPy backend, every tier with CUDA")
    v.add_argument("--model", help="one catalog model")
    v.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto",
                   help="auto (default): cuda when an NVIDIA GPU is usable, else numpy")
    v.add_argument("--json", action="store_true", help="print the results as JSON")
    v.add_argument("--save", action="store_true", help="append the outcome to the results store (reports/results)")
    v.set_defaults(func=cmd_validate)

    df = sub.add_parser("diff", help="the first layer and op where the engine departs from llama.cpp (or NumPy)")
    df.add_argument("model", help="catalog model name or a .gguf path")
    df.add_argument("--prompt", required=True, help="text to prefill (at least two tokens)")
    df.add_argument("--backend", choices=["numpy", "cuda"], default="numpy", help="the engine under test")
    df.add_argument("--against", choices=["llama.cpp", "numpy"], default="llama.cpp",
                    help="the reference side: llama.cpp on the CPU (default) or the NumPy engine")
    df.add_argument("--no-twin", action="store_true",
                    help="run llama.cpp on the quantised file itself, not its F32 twin (8-bit activation noise)")
    df.add_argument("--mutant", help="switch on a mutant of `harness mutants` in the engine under test")
    df.add_argument("--tol", type=float, default=1e-3, help="normalised error that counts as divergence (default 1e-3)")
    df.set_defaults(func=cmd_diff)

    mu = sub.add_parser("mutants", help="run the gate on deliberately broken engines: every mutant must be caught")
    mu.add_argument("--mutant", action="append", help="one mutant (repeatable; default: the whole suite)")
    mu.add_argument("--model", action="append", help="only these catalog models (repeatable; default: all)")
    mu.add_argument("--tier", choices=["cpu", "gpu"], default=None,
                    help="default: cpu with the NumPy backend, every tier with CUDA")
    mu.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto")
    mu.add_argument("--save", action="store_true", help="append the outcome to the results store (reports/results)")
    mu.set_defaults(func=cmd_mutants)

    a = sub.add_parser("ab", help="interleaved A/B benchmark of two builds")
    a.add_argument("base", help="base arm: an engine wheel, 'installed', llama-bench:PATH or llama-cpp-python[:SITE]; "
                                "with --commits, a git revision")
    a.add_argument("candidate", help="candidate arm (same forms)")
    a.add_argument("--commits", action="store_true",
                   help="BASE and CANDIDATE are git revisions of the project: build (or reuse) their engine wheels")
    a.add_argument("--model", default="qwen3-8b", help="catalog model name or a .gguf path (default qwen3-8b)")
    a.add_argument("--rounds", type=at_least_two, default=8,
                   help="measured rounds, at least 2 (one more cold round is run and dropped)")
    a.add_argument("-p", "--n-prompt", type=count_int, default=512, help="prefill test length, tokens (0: skip)")
    a.add_argument("-n", "--n-gen", type=count_int, default=128, help="decode test length, tokens (0: skip)")
    a.add_argument("-d", "--n-depth", type=count_int, default=0,
                   help="context tokens in the cache before each test, untimed (llama-bench's -d)")
    a.add_argument("-r", "--repetitions", type=positive_int, default=3, help="repetitions inside each run")
    a.add_argument("--factor", type=factor_above_one, default=1.05,
                   help="smallest ratio that counts as a change, > 1 (asv; default 1.05)")
    a.add_argument("--allow-same", action="store_true", help="allow two identical builds")
    a.add_argument("--allow-token-diff", action="store_true", help="do not fail when greedy tokens differ")
    a.add_argument("--allow-slower", action="store_true",
                   help="exit 0 even when a test's verdict is \"slower\" (by default exit 1: a CI gate)")
    a.add_argument("--save", action="store_true", help="keep the record in the results store (reports/results)")
    a.add_argument("--results-dir", default=None, help="keep the record in this results store instead")
    a.set_defaults(func=cmd_ab)

    b = sub.add_parser("bench", help="benchmark the engine (and llama.cpp) on catalog models or files")
    b.add_argument("--engine", default="installed", help="'installed' (default) or an engine wheel")
    b.add_argument("--llamacpp", help="llama-bench:PATH or llama-cpp-python[:SITE] for a llama.cpp arm")
    b.add_argument("--model", nargs="+", default=["qwen3-8b"], help="catalog model names or .gguf paths")
    b.add_argument("-p", "--n-prompt", type=count_int, default=512, help="prefill test length, tokens (0: skip)")
    b.add_argument("-n", "--n-gen", type=count_int, default=128, help="decode test length, tokens (0: skip)")
    b.add_argument("-d", "--n-depth", type=depth_list, default=[0],
                   help="context tokens in the cache before each test, untimed; a comma list sweeps "
                        "(llama-bench's -d, e.g. 0,4096,16384)")
    b.add_argument("-r", "--repetitions", type=positive_int, default=5, help="measured repetitions per test")
    b.add_argument("--pp-repetitions", type=positive_int, default=None,
                   help="repetitions of the prefill test (default: -r); ~40 make its NVML window long enough "
                        "to diagnose")
    b.add_argument("-o", "--output", choices=["md", "json", "jsonl", "csv"], default="md",
                   help="output format of the table (llama-bench's -o)")
    b.add_argument("--save", action="store_true", help="keep the records in the results store (reports/results)")
    b.add_argument("--results-dir", default=None, help="keep the records in this results store instead")
    b.set_defaults(func=cmd_bench)

    w = sub.add_parser("wheel", help="build (or find in the cache) the engine wheel of git revisions; print paths")
    w.add_argument("revs", nargs="+", help="git revisions of the project (HEAD, HEAD~3, a commit id, a tag)")
    w.set_defaults(func=cmd_wheel)

    d = sub.add_parser("doctor", help="what this machine can do, with fixes")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)

    rp = sub.add_parser("report", help="render the scoreboard from the results store")
    rp.add_argument("--format", choices=["html", "md"], default="html")
    rp.add_argument("--out", default=None, help="output file (default reports/index.html; md prints to stdout)")
    rp.add_argument("--results-dir", default=None, help="results store (default reports/results)")
    rp.set_defaults(func=cmd_report)
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.project:
        import os

        if "harness.project" in sys.modules and sys.modules["harness.project"].ROOT != Path(args.project).resolve():
            raise SystemExit("error: --project must be given before any harness module is loaded (use ANVIL_PROJECT)")
        os.environ["ANVIL_PROJECT"] = str(Path(args.project).resolve())  # read once, as the modules load

    # `kill` or a closed terminal stops the harness the way Ctrl-C does: its
    # benchmark children (each in its own process group) are killed first
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
