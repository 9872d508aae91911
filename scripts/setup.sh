#!/usr/bin/env bash
# Create .venv (once) and install Anvil into it with the given extras.
# Sourced by the other scripts: `source scripts/setup.sh test`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extras=${1:-}
if [ ! -x "$root/.venv/bin/python" ]; then
  python3 -m venv "$root/.venv"
fi
stamp="$root/.venv/.anvil-installed${extras:+-$extras}"
# reinstall when the dependency list changes
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$root/.venv/bin/python" -m pip install -q --upgrade pip
  "$root/.venv/bin/python" -m pip install -q -e "$root${extras:+[$extras]}"
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
