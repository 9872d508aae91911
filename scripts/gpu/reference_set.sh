#!/usr/bin/env bash
# Runs on the GPU host: a reference set made anew for some models, and judged.
# For each of MODELS (default qwen3-8b), in turn, while LIMIT seconds (default
# 540) last: llama.cpp with CUDA makes the TIER (gpu or deep, default deep)
# reference (`harness reference --force`; with KEEP=1 the committed one is
# kept: only the spread is measured anew), then measures its own spread on it
# (gates.GPU_VARIANTS, four settings: `reference --variation --save`), and
# scripts/adopt_gates.py writes the gates the spreads set (every CUDA gate,
# gates.propose_measured: a new spread moves the held-out headroom) into
# the host's catalog copy (the gate.TIER-cuda line is printed);
# then, every model's spread measured, the CUDA engine is validated on each.
# Back in $OUT: the references, records and the catalog (results.tgz), the
# gate lines (gates.txt), the logs (logs.tgz).
# Carry: .gpu/whl, .gpu/vocab.tar.xz, .gpu/llamacpp.
set -uo pipefail
source scripts/gpu/host-env.sh
MODELS=${MODELS:-qwen3-8b}; TIER=${TIER:-deep}
deadline=$(( $(date +%s) + ${LIMIT:-540} ))
mark=$(mktemp /tmp/refset-start.XXXXXX)
LOG=/tmp/refset-logs; rm -rf $LOG; mkdir -p $LOG
finish() {
  { find references/$TIER reports/results -newer "$mark" -name '*.json'; echo references/catalog.toml; } \
    | xargs -r tar czf "$OUT/results.tgz"
  tar czf $OUT/logs.tgz -C /tmp refset-logs
  cat $OUT/gates.txt 2>/dev/null
}
trap finish EXIT
llamacpp_build || exit 1
for M in $MODELS; do  # generated while llama.cpp builds
  python3 -m harness.cli models -q "$M" > $LOG/models-$M.txt 2>&1 || { tail -3 $LOG/models-$M.txt; exit 1; }
done
llamacpp_wait 480 || exit 1
for M in $MODELS; do
  left=$(( deadline - $(date +%s) ))
  [ $left -gt 120 ] || { echo "$M: not run (time)"; continue; }
  if [ "${KEEP:-0}" != 1 ]; then
    timeout $left python3 -m harness.cli reference --tier $TIER --model "$M" --force > $LOG/reference-$M.txt 2>&1 \
      || { echo "$M: reference failed"; tail -5 $LOG/reference-$M.txt; continue; }
  fi
  timeout $(( deadline - $(date +%s) )) python3 -m harness.cli reference --variation --tier $TIER --model "$M" --save \
    > $LOG/variation-$M.txt 2>&1 || { echo "$M: variation failed"; tail -5 $LOG/variation-$M.txt; continue; }
  grep -E "^\| " $LOG/variation-$M.txt | cut -c1-200
  python3 scripts/adopt_gates.py > $LOG/gates-$M.txt 2>&1 \
    || { echo "$M: gates not adopted"; tail -3 $LOG/gates-$M.txt; continue; }
  grep -F "$M: gate.$TIER-cuda" $LOG/gates-$M.txt >> $OUT/gates.txt
done
for M in $MODELS; do  # every model's spread first, then the validations the time leaves
  left=$(( deadline - $(date +%s) ))
  [ $left -gt 60 ] && grep -q "^$M: " $OUT/gates.txt 2>/dev/null || { echo "validate $M: not run"; continue; }
  timeout $left python3 -m harness.cli validate-catalog --backend cuda --model "$M" --save \
    > $LOG/validate-$M.txt 2>&1; echo "validate $M ($TIER): exit $?"
  grep -E "^\| |^FAIL" $LOG/validate-$M.txt | cut -c1-220 | tail -6 || true  # (a run that printed no table)
done
