"""``harness bench``: pp/tg of the engine beside llama.cpp, llama-bench style."""

from __future__ import annotations

import sys
import uuid

from engine.errors import count_int, positive_int

from .. import distribute
from . import common


def add(sub) -> None:
    b = sub.add_parser("bench", help="benchmark the engine (and llama.cpp) on catalog models or files")
    b.add_argument("--engine", default="installed", help="'installed' (default) or an engine wheel")
    b.add_argument("--llamacpp", help="llama-bench:PATH or llama-cpp-python[:SITE] for a llama.cpp arm")
    b.add_argument("--model", nargs="+", default=None,
                   help=f"catalog model names or .gguf paths (default: {common.GPU_DEFAULT_MODEL} with a GPU, "
                        f"else {common.CPU_DEFAULT_MODEL})")
    b.add_argument("-p", "--n-prompt", type=count_int, default=512, help="prefill test length, tokens (0: skip)")
    b.add_argument("-n", "--n-gen", type=count_int, default=128, help="decode test length, tokens (0: skip)")
    b.add_argument("-d", "--n-depth", type=common.depth_list, default=[0],
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
    distribute.add_options(b, "models (both arms of one on one GPU)")
    b.set_defaults(func=run)


def run(args) -> int:
    from .. import ab, results
    from ..runners import make_runner

    common.something_to_measure(args)
    for name in args.model or []:  # every name checked before anything is fetched or generated
        common.model(name, check_only=True)
    spread = distribute.Spread(args) if distribute.requested(args) else None
    arms = [make_runner(args.engine, common.workdir())]
    if args.llamacpp:
        arms.append(make_runner(args.llamacpp, common.workdir()))
    for runner in arms:
        runner.prepare()
    args.model = args.model or [common.default_model("bench")]
    rows, failed = [], []
    sitting = uuid.uuid4().hex[:16]  # the scoreboard takes ratios only within one sitting (results.same_sitting)

    def save(rec: dict) -> None:
        if common.saving(args):
            rec["path"] = str(results.save({k: v for k, v in rec.items() if k != "path"}, "bench", args.results_dir))
            print(f"saved {rec['path']}", file=sys.stderr)

    if spread is not None:  # a model per worker or Ray task, its records saved as it ends
        rows, failed = distribute.bench_models(args, spread, sitting, save)
    for name in args.model if spread is None else ():  # in this process
        path, identity = common.model(name)
        for depth in args.n_depth:  # one record per engine and depth, as llama-bench's rows
            recs = []
            for runner in arms:
                rec = ab.bench_record(runner, path, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.repetitions,
                                      pp_reps=args.pp_repetitions, depth=depth)
                rec.update(identity, sitting=sitting)
                save(rec)
                recs.append(rec)
            rows.append((name, recs))
    print(ab.format_bench(rows, args.output))
    for line in failed:  # a model whose worker failed: below the table (on stderr where stdout is data)
        print(line, file=sys.stdout if args.output == "md" else sys.stderr)
    if not common.saving(args):
        print(common.NOT_SAVED, file=sys.stderr)
    return 1 if failed else 0
