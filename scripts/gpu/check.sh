#!/usr/bin/env bash
# Runs on the GPU host (offline): install the carried wheels, generate the
# synthetic catalog models from carried tokenizer extracts, run the GPU tests,
# and benchmark. Carry: .gpu (whl/ wheels, vocab/ tokenizer GGUFs; with
# pytest-xdist and execnet among the wheels the tests run in 8 processes, which
# matters: their time is mostly NVRTC compiling kernel variants).
# Usage: bash scripts/gpu/check.sh [tests|bench|all] [PYTEST -k EXPRESSION]   (logs and JSON in $OUT)
set -uo pipefail
what=${1:-all}
sel=${2:-}   # optional pytest -k expression
source scripts/gpu/host-env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/gpu.txt
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > $OUT/models.txt 2>&1 || cat $OUT/models.txt
workers=$(python3 -m pytest -q -n 2 --co -p no:cacheprovider tests/test_project.py >/dev/null 2>&1 && echo "-n 8")
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 480 python3 -m pytest -q -m gpu $workers --maxfail=15 tests/test_kernels_quant.py tests/test_kernels_core.py \
    tests/test_kernels_moe.py tests/test_kernels_deltanet.py tests/test_cuda_engine.py -p no:cacheprovider ${sel:+-k "$sel"} 2>&1 > $OUT/pytest-gpu.txt
  grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest-gpu.txt | tail -20
  [ -n "${GEMV_BENCH:-}" ] && timeout 150 python3 -c "$GEMV_BENCH" 2>&1 | tail -40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  q8b=$(python3 -m harness.cli models -q qwen3-8b | awk '{print $4}')
  timeout 240 python3 -m engine bench "$q8b" --backend cuda --json > $OUT/bench-qwen3-8b.json 2> $OUT/bench-qwen3-8b.err
  tail -3 $OUT/bench-qwen3-8b.err
  python3 -c "import json,sys; from engine.bench import format_table; print(format_table(json.load(open('$OUT/bench-qwen3-8b.json'))))"
fi
