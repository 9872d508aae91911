"""``harness wheel``: the engine wheel of git revisions (built once, cached)."""

from __future__ import annotations


def add(sub) -> None:
    w = sub.add_parser("wheel", help="build (or find in the cache) the engine wheel of git revisions; print paths")
    w.add_argument("revs", nargs="+", help="git revisions of the project (HEAD, HEAD~3, a commit id, a tag)")
    w.set_defaults(func=run)


def run(args) -> int:
    from .. import wheels

    for rev in args.revs:
        print(wheels.wheel_for(rev))
    return 0
