#!/usr/bin/env bash
# Here (not on the GPU host): cut a cached catalog model into pieces that fit
# the device tool's 64 MiB per call, one folder each (.gpu/parts/<name>/pNN/),
# so they can be carried one per call while the machine stays warm (30 s).
# On the host, each call copies its piece to /tmp/parts/<name>/; the last one
# joins them: cat /tmp/parts/<name>/* > $ANVIL_MODELS_DIR/<name>/<file>
# (harness checks the sha256 the catalog pins before using it).
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
for d in "$out"/p*; do echo "  $d   (host: mkdir -p /tmp/parts/$name && cp $d/* /tmp/parts/$name/)"; done
echo "then: mkdir -p \$ANVIL_MODELS_DIR/$name && cat /tmp/parts/$name/piece.* > \$ANVIL_MODELS_DIR/$name/$(basename "$file")"
