#!/usr/bin/env bash
# Runs on the GPU host (offline): install the carried wheels, generate the
# synthetic catalog models from carried tokenizer extracts, run the GPU tests,
# and benchmark. Carry: .gpu (whl/ wheels, vocab/ tokenizer GGUFs; with
# pytest-xdist and execnet among the wheels the tests run in WORKERS processes,
# default 8, which matters: their time is mostly NVRTC compiling kernel variants).
# tests: every gpu-marked test of the suite (pytest -m gpu over tests/, no file
# picked by hand), with ANVIL_REQUIRE_GPU=1 (tests/conftest.py: a missing or
# broken GPU stops the run with the driver's message instead of skipping every
# test); the outcome is saved as a `tests` record (harness/testrun.py), which
# comes back in $OUT/results.tgz (unpack in the repository root and commit).
# Exit 1 when a test failed or errored, when none ran, or when pytest wrote no
# report (timed out: TESTS_TIMEOUT seconds, default 540). A -k EXPRESSION runs
# a subset: not the suite, so no record.
# Usage: bash scripts/gpu/check.sh [tests|bench|all] [PYTEST -k EXPRESSION]   (logs and JSON in $OUT)
set -uo pipefail
what=${1:-all}
sel=${2:-}   # optional pytest -k expression
status=0
source scripts/gpu/host-env.sh
export ANVIL_REQUIRE_GPU=${ANVIL_REQUIRE_GPU:-1}
mark=$(mktemp /tmp/check-start.XXXXXX)  # this call's new records come back
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/gpu.txt
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > $OUT/models.txt 2>&1 || cat $OUT/models.txt
workers=$(python3 -m pytest -q -n 2 --co -p no:cacheprovider tests/test_project.py >/dev/null 2>&1 && echo "-n ${WORKERS:-8}")
if [ "$what" = tests ] || [ "$what" = all ]; then
  started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  junit=$OUT/pytest-gpu.xml
  rm -f "$junit"
  cmd=(python3 -m pytest -q -m gpu $workers -p no:cacheprovider -rfEs --junitxml="$junit" ${sel:+-k "$sel"} tests)
  timeout "${TESTS_TIMEOUT:-540}" "${cmd[@]}" > "$OUT/pytest-gpu.txt" 2>&1
  rc=$?
  echo "pytest -m gpu: exit $rc$([ $rc = 124 ] && echo ", timed out after ${TESTS_TIMEOUT:-540} s")"
  grep -E "^(FAILED|ERROR)|passed|failed|no tests ran|^ERROR:" "$OUT/pytest-gpu.txt" | tail -20
  # the record says what ran, whatever pytest's exit status: a skipped suite exits 0 and proves nothing
  python3 -m harness.testrun "$junit" --command "ANVIL_REQUIRE_GPU=$ANVIL_REQUIRE_GPU ${cmd[*]}" \
    --started "$started" $([ -z "$sel" ] && echo --save) || status=1
  [ -n "${GEMV_BENCH:-}" ] && timeout 150 python3 -c "$GEMV_BENCH" 2>&1 | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  q8b=$(python3 -m harness.cli models -q qwen3-8b | awk '{print $4}')
  timeout 240 python3 -m engine bench "$q8b" --backend cuda --json > $OUT/bench-qwen3-8b.json 2> $OUT/bench-qwen3-8b.err
  tail -3 $OUT/bench-qwen3-8b.err
  python3 -c "import json,sys; from engine.bench import format_table; print(format_table(json.load(open('$OUT/bench-qwen3-8b.json'))))"
fi
find reports/results -newer "$mark" -name 'tests-*.json' | xargs -r tar czf "$OUT/results.tgz"
exit $status
