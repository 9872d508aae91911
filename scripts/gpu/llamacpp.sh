#!/usr/bin/env bash
# Runs on the GPU host: build llama.cpp (CUDA, sm_90) from the carried
# llama-cpp-python sdist (~5 min), then for the gpu-tier models: llama-bench
# (pp512/tg128, flash attention on) and the llama.cpp CUDA greedy references.
# Carry: .gpu (whl/, vocab/, llamacpp/ from ../shared/gpuhost/llamacpp-sdist.sh).
# Usage: bash scripts/gpu/llamacpp.sh MODEL...   (results in $OUT)
set -uo pipefail
models=${*:-qwen3-8b}
source scripts/gpu/host-env.sh
[ -x /tmp/llamacpp/build/bin/llama-bench ] || bash .gpu/llamacpp/build-llamacpp.sh .gpu/llamacpp/llama-cpp-python.tar.gz
for m in $models; do
  path=$(python3 -m harness.cli models -q "$m" | awk '{print $4}')
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/mem-llamabench-$m.txt" &
  smi=$!
  /tmp/llamacpp/build/bin/llama-bench -m "$path" -p 512 -n 128 -r 5 -fa 1 -ngl 99 -o json \
    > "$OUT/llamabench-$m.json" 2> "$OUT/llamabench-$m.err" || tail -5 "$OUT/llamabench-$m.err"
  kill $smi; echo "$m llama-bench peak GPU memory used: $(sort -n "$OUT/mem-llamabench-$m.txt" | tail -1) MiB"; rm -f "$OUT/mem-llamabench-$m.txt"
  python3 -X faulthandler -m harness.cli reference --tier gpu --model "$m" --force 2>&1 | tail -30
  cp references/gpu/$m.json "$OUT/"
done
python3 - <<'PY'
import json, glob
import os
for f in sorted(glob.glob(os.environ["OUT"] + "/llamabench-*.json")):
    for r in json.load(open(f)):
        print(f.split("/")[-1], f"n_prompt={r['n_prompt']} n_gen={r['n_gen']} t/s={r['avg_ts']:.1f} ± {r['stddev_ts']:.1f}", r.get("build_commit"))
PY
