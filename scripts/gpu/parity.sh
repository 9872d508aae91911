#!/usr/bin/env bash
# Runs on the GPU host: build llama.cpp with CUDA (~5 min), make the gpu-tier
# llama.cpp references, and compare the CUDA engine with them (greedy, then
# teacher-forced where tokens differ). Carry: .gpu. Usage: parity.sh MODEL...
set -uo pipefail
models=${*:-qwen3-8b}
source scripts/gpu/host-env.sh
[ -x /tmp/llamacpp/build/bin/llama-bench ] || bash .gpu/llamacpp/build-llamacpp.sh .gpu/llamacpp/llama-cpp-python.tar.gz | tail -2
for m in $models; do
  python3 -m harness.cli models -q "$m" > /dev/null
  timeout 240 python3 -X faulthandler -m harness.cli reference --tier gpu --model "$m" --force 2>&1 | tail -25
  [ -f references/gpu/$m.json ] && cp references/gpu/$m.json "$OUT/"
  timeout 200 python3 - "$m" <<'PY'
import sys, numpy as np, engine
from harness import catalog, refs
from harness.compare import compare_case
m = sys.argv[1]
ref = refs.load(refs.reference_path(m, "gpu"))
model = engine.load(catalog.model_path(m, progress=False), backend="cuda")
for case in ref.cases:
    r = compare_case(model, case)
    print(f"{m} {r.mode:15s} matched {r.matched}/{r.n_steps} max|dlogit| {r.max_logit_diff:.3f} "
          f"flips {[(f.step, round(f.ref_margin, 3), f.ref_in_engine_top2) for f in r.flips]}")
PY
done
