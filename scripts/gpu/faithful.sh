#!/usr/bin/env bash
# Runs on the GPU host: the CUDA engine against the rounding-faithful oracle on
# the tiny catalog (scripts/gpu/faithful_check.py), then `harness diff --against
# faithful` per op on the models given in DIFF (default: none).
# Carry .gpu/whl and .gpu/vocab.tar.xz. Usage: bash scripts/gpu/faithful.sh [STEPS]
set -uo pipefail
source scripts/gpu/host-env.sh
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > $OUT/models.txt 2>&1 || tail -3 $OUT/models.txt
python3 scripts/gpu/faithful_check.py --steps "${1:-16}" $tiny 2> $OUT/faithful-progress.txt | tee $OUT/faithful.txt
for m in ${DIFF:-}; do
  python3 -m harness.cli diff "$m" --backend cuda --against faithful --tol 1e-5 \
    --prompt "$(head -c 600 references/prompts/long.txt)" > $OUT/diff-$m.txt 2>&1
  echo "diff $m: exit $?"; head -40 $OUT/diff-$m.txt
done
