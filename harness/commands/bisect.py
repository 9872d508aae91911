"""``harness bisect``: the first commit between two revisions that made a test slower."""

from __future__ import annotations

import sys

import argparse

from engine.errors import AnvilError, count_int, positive_int

from . import common


def _test_name(text: str) -> str:
    """ppN or tgN: the one test each step runs."""
    from .. import bisect

    try:
        bisect.lengths_of(text)
    except AnvilError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add(sub) -> None:
    b = sub.add_parser("bisect", help="the first commit from GOOD to BAD that made a test slower (A/B by bisection)")
    b.add_argument("good", help="a git revision whose speed is the reference")
    b.add_argument("bad", help="a later git revision that is slower")
    b.add_argument("--test", type=_test_name, default="tg128",
                   help="the llama-bench test to judge: ppN or tgN (default tg128)")
    b.add_argument("--model", default=None,
                   help=f"catalog model name or a .gguf path (default: {common.GPU_DEFAULT_MODEL} with a GPU, "
                        f"else {common.CPU_DEFAULT_MODEL})")
    b.add_argument("-d", "--n-depth", type=count_int, default=0,
                   help="context tokens in the cache before the test, untimed (llama-bench's -d)")
    b.add_argument("--rounds", type=common.verdict_rounds, default=8,
                   help="measured rounds of each step's A/B (one more cold round is run and dropped)")
    b.add_argument("-r", "--repetitions", type=positive_int, default=3, help="repetitions inside each run")
    b.add_argument("--allow-token-diff", action="store_true", help="do not stop when a commit's greedy tokens differ")
    b.add_argument("--save", action="store_true", help="keep each step's A/B record in the results store")
    b.add_argument("--results-dir", default=None, help="keep the records in this results store instead")
    b.set_defaults(func=run)


def run(args) -> int:
    from .. import ab, bisect, wheels

    n_prompt, n_gen = bisect.lengths_of(args.test)
    # the model and the revisions checked before the model is fetched or generated, and any wheel built
    if args.model:
        common.model(args.model, check_only=True)
    wheels.first_parent(args.good, args.bad)
    args.model = args.model or common.default_model("bisect")
    path, identity = common.model(args.model)
    cfg = ab.ABConfig(model=path, n_prompt=n_prompt, n_gen=n_gen, depth=args.n_depth, reps=args.repetitions,
                      rounds=args.rounds, allow_same=True, allow_token_diff=args.allow_token_diff, identity=identity)
    test = args.test + (f" @ d{args.n_depth}" if args.n_depth else "")
    try:
        result = bisect.run_bisect(args.good, args.bad, cfg, common.workdir(), test=test,
                                   results_dir=args.results_dir, save=common.saving(args))
    except ab.Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return 130
    print(bisect.format_result(result, args.good, args.bad, test))
    if not common.saving(args):
        print(common.NOT_SAVED, file=sys.stderr)
    return 0 if result["first_slower"] else 1
