#!/usr/bin/env bash
# Chromium for tests/test_browser.py, which opens the generated scoreboard
# (reports/index.html) in a real browser. It is a system package (Debian's
# chromium, through apt-get and root), so it is installed only when someone
# says yes: asked in a terminal, or ANVIL_INSTALL_BROWSER=1 set beforehand
# (a CI image that wants the browser test). Without a terminal to ask (CI, a
# pipe) nothing is installed and the browser tests SKIP, saying why.
# Always exits 0: the browser is optional.
set -euo pipefail

say() { echo "install-browser: $*"; }
found=${ANVIL_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -n "$found" ]; then
  say "$found is there: $({ "$found" --version 2>/dev/null || echo chromium; } | head -1)"
  exit 0
fi
skip="the browser tests will skip (chromium not found)"
if ! command -v apt-get >/dev/null 2>&1; then
  say "apt-get not available: install Chromium yourself (or set ANVIL_CHROMIUM to one); $skip"
  exit 0
fi
if [ "${ANVIL_INSTALL_BROWSER:-}" != 1 ]; then
  if [ ! -t 0 ] || [ ! -t 1 ]; then
    say "no terminal to ask before installing a system package, so none is: $skip." \
        "To run them: apt-get install --no-install-recommends chromium, or ANVIL_INSTALL_BROWSER=1"
    exit 0
  fi
  read -r -p "install-browser: install Debian's chromium (apt-get, as root) for the browser tests? [y/N] " answer
  case "$answer" in
    [yY]*) ;;
    *) say "not installed: $skip"; exit 0 ;;
  esac
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)  # asks for a password in a terminal; fails at once without one (-n below)
  [ -t 0 ] || as_root=(sudo -n)
else
  say "not root and no sudo: run as root: apt-get install --no-install-recommends chromium; $skip"
  exit 0
fi
if ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -q \
   && ${as_root[@]+"${as_root[@]}"} env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends chromium; then
  say "installed $(chromium --version 2>/dev/null || echo chromium)"
else
  say "apt-get install chromium failed; $skip"
fi
