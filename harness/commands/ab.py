"""``harness ab``: an interleaved A/B of two builds (engine wheels, git revisions, or a llama.cpp arm),
or with ``--aa`` of one build against itself: the noise band later A/Bs on this device are judged by."""

from __future__ import annotations

import sys

from engine.errors import AnvilError, count_int, positive_int

from . import common


def add(sub) -> None:
    a = sub.add_parser("ab", help="interleaved A/B benchmark of two builds")
    a.add_argument("base", help="base arm: an engine wheel, 'installed', llama-bench:PATH or llama-cpp-python[:SITE]; "
                                "with --commits, a git revision")
    a.add_argument("candidate", nargs="?", help="candidate arm (same forms); none with --aa")
    a.add_argument("--commits", action="store_true",
                   help="BASE and CANDIDATE are git revisions of the project: build (or reuse) their engine wheels")
    a.add_argument("--aa", action="store_true",
                   help="an A/A run: BASE against itself, measuring each test's noise band on this device (--save "
                        "keeps it; later A/Bs here are judged by the newest)")
    a.add_argument("--model", default=None,
                   help=f"catalog model name or a .gguf path (default: {common.GPU_DEFAULT_MODEL} with a GPU, "
                        f"else {common.CPU_DEFAULT_MODEL})")
    a.add_argument("--rounds", type=common.verdict_rounds, default=8,
                   help="measured rounds, at least 4 (one more cold round is run and dropped)")
    a.add_argument("-p", "--n-prompt", type=count_int, default=512, help="prefill test length, tokens (0: skip)")
    a.add_argument("-n", "--n-gen", type=count_int, default=128, help="decode test length, tokens (0: skip)")
    a.add_argument("-d", "--n-depth", type=count_int, default=0,
                   help="context tokens in the cache before each test, untimed (llama-bench's -d)")
    a.add_argument("-r", "--repetitions", type=positive_int, default=3, help="repetitions inside each run")
    a.add_argument("--factor", type=common.factor_above_one, default=None,
                   help="a change must also lie beyond this ratio, > 1 (e.g. 1.05: only 5%% changes count; "
                        "default: the noise band alone)")
    a.add_argument("--allow-same", action="store_true", help="allow two identical builds")
    a.add_argument("--allow-token-diff", action="store_true", help="do not fail when greedy tokens differ")
    a.add_argument("--allow-slower", action="store_true",
                   help="exit 0 even when a test's verdict is \"slower\" (by default exit 1: a CI gate)")
    a.add_argument("--save", action="store_true", help="keep the record in the results store (reports/results)")
    a.add_argument("--results-dir", default=None, help="keep the record in this results store instead")
    a.set_defaults(func=run)


def run(args) -> int:
    from .. import ab, wheels

    if args.aa == (args.candidate is not None):
        raise AnvilError("--aa measures one build against itself: name BASE alone" if args.aa else
                         "name the CANDIDATE arm too (or --aa: BASE against itself, the noise band)")
    common.something_to_measure(args)
    if not args.commits:
        for spec in (args.base, args.candidate):
            if spec and wheels.looks_like_revision(spec):
                revs = " ".join(filter(None, ("--aa" if args.aa else None, args.base, args.candidate)))
                raise AnvilError(f"{spec!r} is a git revision, not a build: pass --commits to measure the engine "
                                 f"wheels of revisions (harness ab --commits {revs})")
    if args.commits:  # the arms are git revisions: their engine wheels, built (or found) first
        args.base = str(wheels.wheel_for(args.base))
        args.candidate = args.candidate and str(wheels.wheel_for(args.candidate))
    if args.aa:
        args.candidate, args.allow_same = args.base, True
    # every input is checked (the wheels installed and probed, the model
    # named) before any model is downloaded or generated: that can take minutes
    if args.model:
        common.model(args.model, check_only=True)
    runners = ab.prepare_arms(args.base, args.candidate, common.workdir(), allow_same=args.allow_same)
    args.model = args.model or common.default_model("ab")
    path, identity = common.model(args.model)
    cfg = ab.ABConfig(model=path, n_prompt=args.n_prompt, n_gen=args.n_gen, depth=args.n_depth, reps=args.repetitions,
                      rounds=args.rounds, factor=args.factor, aa=args.aa, allow_same=args.allow_same,
                      allow_token_diff=args.allow_token_diff, identity=identity)
    total = 2 * (cfg.rounds + 1)
    done = [0]

    def progress(r, arm, res):
        done[0] += 1
        # the value the verdict takes from this run: the median of its repetitions
        tests = ", ".join(f"{t} {ab.run_value(res, t):.1f}" for t in res.tests)
        print(f"[{done[0]}/{total}] round {r}{' (cold, dropped)' if r == 0 else ''} {arm}: {tests} t/s "
              f"(median of the run's repetitions)", file=sys.stderr, flush=True)

    try:
        record = ab.run_ab(args.base, args.candidate, cfg, common.workdir(), progress=progress, runners=runners,
                           results_dir=args.results_dir, save=common.saving(args))
    except ab.Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    print(ab.format_report(record))
    print(f"saved {record['path']}" if record["path"] else common.NOT_SAVED, file=sys.stderr)
    if args.aa and not record["path"]:
        print("the noise band judges later A/Bs only from the store: --save keeps it", file=sys.stderr)
    slower = ab.slower_tests(record)
    if slower and not args.allow_slower:
        print(f"slower: {', '.join(slower)}: exit status 1 (--allow-slower: 0)", file=sys.stderr)
        return 1
    return 0
