"""``harness roofline``: this GPU's copy bandwidth and bf16 GEMM rate, the scoreboard's rooflines."""

from __future__ import annotations

import sys

from . import common


def add(sub) -> None:
    r = sub.add_parser("roofline", help="measure this GPU's copy bandwidth and bf16 GEMM rate (the scoreboard's "
                                        "rooflines; needs a GPU)")
    r.add_argument("--save", action="store_true", help="keep the record in the results store (reports/results)")
    r.add_argument("--results-dir", default=None, help="keep the record in this results store instead")
    r.set_defaults(func=run)


def run(args) -> int:
    from engine.backends.cuda.device import gpu_probe
    from engine.errors import AnvilError

    from .. import results, roofline

    if why := gpu_probe():
        raise AnvilError(f"harness roofline measures a GPU, and none is usable here: {why}")
    rec = roofline.measure_record()
    print(roofline.format_record(rec))
    if common.saving(args):
        print(f"saved {results.save(rec, 'roofline', args.results_dir)}", file=sys.stderr)
    else:
        print(common.NOT_SAVED, file=sys.stderr)
    return 0
