#!/usr/bin/env bash
# The main job on a fresh machine: install, fetch/generate the catalog's
# models into ~/.cache/anvil/models, and run the correctness gate
# (`harness validate-catalog`: CUDA on every tier when a GPU is usable,
# otherwise the NumPy engine on the cpu tier). Extra args go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
harness models
status=0
harness validate-catalog "$@" || status=$?
echo "to use harness in your shell: source .venv/bin/activate (or run .venv/bin/harness)"
exit $status
