"""One module per ``harness`` command: each defines ``add(sub)``, its
parser (with ``run`` as its function), and ``run(args)``, the command.
``COMMANDS`` is their order in ``harness --help``; ``common`` holds what
several share."""

from __future__ import annotations

from . import ab, bench, bisect, diff, doctor, models, mutants, reference, report, roofline, synth, validate, wheel

COMMANDS = (models, synth, reference, validate, diff, mutants, ab, bisect, bench, roofline, wheel, doctor, report)
