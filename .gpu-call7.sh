#!/usr/bin/env bash
set -uo pipefail
T0=$(date +%s)
source scripts/gpu/host-env.sh
mkdir -p $OUT/r
touch /tmp/start7
python3 -m harness.cli models -q tiny-gemma4 tiny-gemma4moe > $OUT/r/models.txt 2>&1 || tail -3 $OUT/r/models.txt
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels_core.py -k "512 or qk_norm_rope" -p no:cacheprovider > $OUT/r/pytest-k.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E  .*(Assert|assert)" $OUT/r/pytest-k.txt | tail -10
echo "kernels +$(( $(date +%s) - T0 ))"
timeout 150 python3 -m pytest -q -m gpu tests/test_cuda_engine.py -k "gemma4" -p no:cacheprovider > $OUT/r/pytest-e.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E  .*(Assert|assert)" $OUT/r/pytest-e.txt | tail -10
echo "engine +$(( $(date +%s) - T0 ))"
for m in tiny-gemma4 tiny-gemma4moe; do
  timeout 120 python3 -m harness.cli validate-catalog --backend cuda --model $m --save > $OUT/r/val-$m.txt 2>&1; grep -E "^\| [a-z]|FAIL|rror" $OUT/r/val-$m.txt | grep -v "^| model" | tail -4
done
echo "validate +$(( $(date +%s) - T0 ))"
find reports/results -newer /tmp/start7 -name '*.json' | xargs -r tar czf $OUT/r/results.tgz
tar czf $OUT/r.tgz -C $OUT r
echo "done +$(( $(date +%s) - T0 ))"
