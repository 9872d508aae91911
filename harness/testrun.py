"""A test-suite run as a record: ``scripts/gpu/check.sh tests`` runs the
whole ``-m gpu`` suite with ``--junitxml``, then

    python -m harness.testrun JUNIT.xml --command "python3 -m pytest -m gpu ..." --started DATE --save

counts the report's outcomes into a ``tests`` record of the results store
(harness/results.py):

    {"engine": "anvil", "build", "gpu", "driver", "host", "date", "marker",
     "command", "passed", "failed", "errors", "skipped", "duration_s",
     "failures": [{"test", "message"}, ...], "skip_reasons": {reason: count}}

and exits 1 unless the run stands as evidence that the build works on the
GPU: no test failed or errored, and some test ran (a suite that skipped
every GPU test proves nothing, whatever pytest's exit status says).
"""

from __future__ import annotations

import argparse
import collections
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from engine.errors import AnvilError, run_command

MAX_LISTED = 50  # failures kept by name: a broken build fails hundreds of tests alike


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0][:300]


def count(junit: str | Path) -> dict:
    """The outcome counts of a pytest JUnit XML report. Each test counts once:
    failed, else errored (setup or teardown, or a file that did not
    collect), else skipped (xfail included), else passed."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        raise AnvilError(f"{junit}: no readable pytest report ({type(e).__name__}: {e}); "
                         "pytest stopped before writing it: see its output") from None
    n = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    failures, reasons = [], collections.Counter()
    for case in root.iter("testcase"):
        name = "::".join(x for x in (case.get("classname"), case.get("name")) if x)
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            n["failed" if bad.tag == "failure" else "errors"] += 1
            if len(failures) < MAX_LISTED:
                failures.append({"test": name, "message": _first_line(bad.get("message") or bad.text)})
        elif (skip := case.find("skipped")) is not None:
            n["skipped"] += 1
            reasons[_first_line(skip.get("message")) or "no reason given"] += 1
        else:
            n["passed"] += 1
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    duration = sum(float(s.get("time") or 0) for s in suites)
    return {**n, "duration_s": round(duration, 3), "failures": failures, "skip_reasons": dict(reasons.most_common())}


def verdict(rec: dict) -> str | None:
    """Why the run does not stand (one line), or None."""
    if rec["failed"] or rec["errors"]:
        return f"{rec['failed']} failed, {rec['errors']} errors"
    if rec["passed"] == 0:
        why = next(iter(rec.get("skip_reasons") or {}), "none collected")
        return f"no test ran ({rec['skipped']} skipped; {why})"
    return None


def record(junit: str | Path, command: str, started: str | None = None, marker: str = "gpu") -> dict:
    """A tests record of this checkout's engine build on this machine's GPU."""
    from engine.bench import build_hash, gpu_info

    rec = {"engine": "anvil", "build": build_hash(), **gpu_info(), "host": platform.node(), "marker": marker,
           "command": command, **count(junit)}
    if started:
        rec["date"] = started
    return rec


def summary(rec: dict) -> str:
    return (f"{rec['passed']} passed, {rec['failed']} failed, {rec['errors']} errors, {rec['skipped']} skipped "
            f"in {rec['duration_s']:.0f} s (build {rec['build'][:12]}, {rec.get('gpu') or 'no GPU named'})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.testrun", description=__doc__.split("\n\n")[0])
    p.add_argument("junit", help="pytest's --junitxml report")
    p.add_argument("--command", required=True, help="the pytest command line that wrote it")
    p.add_argument("--started", help="UTC ISO time the run began (default: now)")
    p.add_argument("--marker", default="gpu", help="the -m selection the run made")
    p.add_argument("--save", action="store_true", help="append the record to the results store (reports/results)")
    p.add_argument("--results-dir", help="another results store")
    args = p.parse_args(argv)

    def run(args) -> int:
        rec = record(args.junit, args.command, args.started, args.marker)
        print(summary(rec))
        for f in rec["failures"]:
            print(f"  {f['test']}: {f['message']}")
        if args.save:
            from . import results

            print(f"saved {results.save(rec, 'tests', args.results_dir)}", file=sys.stderr)
        if why := verdict(rec):
            print(f"the {args.marker} suite does not pass: {why}", file=sys.stderr)
            return 1
        return 0

    return run_command(run, args)


if __name__ == "__main__":
    sys.exit(main())
