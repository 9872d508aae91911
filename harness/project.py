"""Where a project's files live: its catalog and references (``references/``),
its results store and scoreboard (``reports/``).

The project is, in order: ``harness --project DIR`` (which sets
``ANVIL_PROJECT``), ``$ANVIL_PROJECT``, the nearest directory at or above
the current one that holds ``references/catalog.toml`` (a checkout you are
in, as asv finds its config), else the checkout this harness runs from (an
editable install). An installed harness outside any project says so where
it needs the catalog (``fetch.load_catalog``).
"""

from __future__ import annotations

import os
from pathlib import Path

CATALOG_FILE = Path("references") / "catalog.toml"
ENV = "ANVIL_PROJECT"


def root() -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser().resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / CATALOG_FILE).is_file():
            return d
    return Path(__file__).resolve().parents[1]


ROOT = root()
