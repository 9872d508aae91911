"""``harness models``: fetch or generate catalog models and print their paths."""

from __future__ import annotations


def add(sub) -> None:
    m = sub.add_parser("models", help="fetch or generate catalog models and print their paths")
    m.add_argument("names", nargs="*", help="catalog model names (default: every cpu-tier model)")
    m.add_argument("--tier", choices=["cpu", "gpu"], default=None)
    m.add_argument("-q", "--quiet", action="store_true")
    m.set_defaults(func=run)


def run(args) -> int:
    from .. import catalog

    cat = catalog.load()
    names = args.names or [n for n, e in cat.items() if args.tier in (None, e.tier)]
    for name in names:
        e = catalog.entry(name, cat)
        if e.tier == "gpu" and not args.names and args.tier is None:
            continue  # real-shape files are GBs: only on request
        path = catalog.model_path(name, catalog=cat, progress=not args.quiet)
        print(f"{name:20s} {e.tier:4s} {e.source:6s} {path}")
    return 0
