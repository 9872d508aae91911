#!/usr/bin/env bash
# Here (not on the GPU host): cut a cached catalog model into pieces that fit
# the device tool's 64 MiB per call, one folder each (.gpu/parts/<name>/pNN/),
# so they can be carried one per call while the machine stays warm (30 s).
# On the host, sourcing scripts/gpu/host-env.sh stashes each carried piece in
# /tmp/parts/<name>/ and joins them once all are there (join_parts.py; the
# joined file must have the sha256 the catalog pins).
# Usage: scripts/gpu/split-model.sh MODEL [MB per piece, default 60]
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: split-model.sh MODEL [MB]}
mb=${2:-60}
file=$(python3 -m harness.cli models -q "$name" | awk '{print $4}')
out=.gpu/parts/$name
rm -rf "$out" && mkdir -p "$out"
split -b "${mb}000000" -d -a 2 "$file" "$out/piece."
for p in "$out"/piece.*; do d="$out/p${p##*.}"; mkdir -p "$d" && mv "$p" "$d/"; done
echo "$file -> $(ls "$out" | wc -l) pieces of <= $mb MB; carry in order:"
for d in "$out"/p*; do echo "  $d"; done
echo "each call: carry one piece folder and start with: source scripts/gpu/host-env.sh"
