#!/usr/bin/env bash
# Runs on the GPU host: everything the scoreboard needs from one sitting.
# Builds llama.cpp with CUDA in the background (~5 min, from the carried
# llama-cpp-python sdist) while the CUDA engine is validated on the catalog
# models present, then benchmarks Anvil beside llama-bench on the gpu-tier
# models, recording peak GPU memory per process. New result records come
# back in $OUT/results.tgz (unpack in the repository root and commit).
# Carry: .gpu/whl, .gpu/vocab, .gpu/llamacpp (scripts/gpu/llamacpp.sh says
# how they are made). A real model too big for one call travels in pieces
# first (scripts/gpu/split-model.sh prints the calls).
# Usage: bash scripts/gpu/scoreboard.sh [MODEL...]   (default: the gpu tier; DEPTHS=0,4096: the
# depths each test runs at, llama-bench's -d)
set -uo pipefail
T0=$(date +%s)
source scripts/gpu/host-env.sh
models=${*:-$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.tier == 'gpu'))")}
touch /tmp/scoreboard-start
bench=/tmp/llamacpp/build/bin/llama-bench
llamacpp_build || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > "$OUT/models.txt" 2>&1 || tail -3 "$OUT/models.txt"
# every cpu-tier model whose file is here (the real ones only if carried: the host is offline)
present=$(python3 -c "
from harness import catalog, fetch
print(' '.join(n for n, e in catalog.load().items() if e.tier == 'cpu' and
               (e.source == 'synth' or (fetch.models_dir() / n / e.raw['filename']).exists())))")
for m in $present; do
  python3 -m harness.cli validate-catalog --backend cuda --model "$m" --save > "$OUT/val-$m.txt" 2>&1 \
    || echo "$m: validation FAILED"
done
llamacpp_wait $(( 420 - ($(date +%s) - T0) )) || exit 1
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/mem.csv" &
smi=$!
# the gpu tier one model at a time: generated, validated, benchmarked, deleted (together they
# are ~110 GB, the host's disk 64 GB)
for m in $models; do
  python3 -m harness.cli models -q "$m" >> "$OUT/models.txt" 2>&1 || { tail -3 "$OUT/models.txt"; continue; }
  python3 -m harness.cli validate-catalog --backend cuda --model "$m" --save > "$OUT/val-$m.txt" 2>&1 \
    || echo "$m: validation FAILED"
  python3 -m harness.cli bench --save --llamacpp llama-bench:$bench --pp-repetitions 40 -d "${DEPTHS:-0,4096}" \
    --model "$m" 2>&1 | tail -10
  rm -f "$ANVIL_MODELS_DIR/synth/$m.gguf"
done
grep -h "| cuda |" "$OUT"/val-*.txt
kill $smi
python3 - "$OUT/mem.csv" <<'PY'
import sys
mem = [int(f[1]) for f in (l.split(",") for l in open(sys.argv[1])) if len(f) == 2 and f[1].strip().isdigit()]
base, segs, cur = min(mem, default=0), [], []
for m in mem + [0]:
    if m > base + 200:
        cur.append(m)
    elif cur:
        segs.append(max(cur)); cur = []
print("peak MiB per GPU process, in run order (per model: its validation, then Anvil pp, Anvil tg, llama.cpp pp, llama.cpp tg):", segs)
PY
find reports/results -newer /tmp/scoreboard-start -name '*.json' | xargs tar czf "$OUT/results.tgz"
echo "done at +$(( $(date +%s) - T0 )) s"
