#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for tests/test_browser.py, which
# opens the generated scoreboard (reports/index.html) in a real browser.
# Idempotent: does nothing when chromium is already on PATH. Where apt is not
# available (not Debian/Ubuntu) or we cannot become root, it says so and exits
# 0: the browser tests then SKIP with "chromium not found", visibly.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
  echo "install-browser: $(chromium --version 2>/dev/null || echo chromium) already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: apt-get not available; install Chromium yourself (or set ANVIL_CHROMIUM)" \
       "or the browser tests will be skipped"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-browser: not root and no passwordless sudo; run as root:" \
       "apt-get install --no-install-recommends chromium (browser tests will be skipped)"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -q
${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
echo "install-browser: installed $(chromium --version 2>/dev/null || echo chromium)"
