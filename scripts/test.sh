#!/usr/bin/env bash
# The full test suite on a fresh machine: install with test extras, fetch the
# catalog's CPU-tier models on first use, run pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh test
# Debian's chromium for the scoreboard's browser test (which skips, saying why, if it cannot be installed)
scripts/install-browser.sh || echo "could not install chromium: the browser tests will skip"
python -m pytest -q -rs --durations=15 "$@"  # why each skip, and the slowest tests
