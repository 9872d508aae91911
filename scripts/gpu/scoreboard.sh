#!/usr/bin/env bash
# Runs on the GPU host: everything the scoreboard needs from one sitting.
# Builds llama.cpp with CUDA in the background (~5 min, from the carried
# llama-cpp-python sdist) while the CUDA engine is validated on the catalog
# models present, then, one gpu-tier model at a time, validates the engine on
# it and benchmarks Anvil beside llama-bench, recording peak GPU memory per
# process. A speed figure belongs to a build that passed the gate on that
# model in the same sitting (harness/report/validated.py): the first failed
# validation stops the call with exit 1, so no model is benchmarked after it
# and none without having passed in this call. New result records (the failed
# validation's too) come back in $OUT/results.tgz (unpack in the repository
# root and commit).
# Carry: .gpu/whl, .gpu/vocab, .gpu/llamacpp (scripts/gpu/llamacpp.sh says
# how they are made). A real model too big for one call travels in pieces
# first (scripts/gpu/split-model.sh prints the calls).
# Usage: bash scripts/gpu/scoreboard.sh [MODEL...]   (default: the gpu tier; DEPTHS=0,4096: the
# depths each test runs at, llama-bench's -d)
set -uo pipefail
T0=$(date +%s)
source scripts/gpu/host-env.sh
models=${*:-$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.tier == 'gpu'))")}
mark=$(mktemp /tmp/scoreboard-start.XXXXXX)  # this call's new records come back
smi=""
status=0
collect() {  # on every exit, a stop at a failed validation included
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
  echo "done at +$(( $(date +%s) - T0 )) s"
}
trap collect EXIT
validate() {  # the gate on one model (--save: the record the scoreboard backs its figures with); a failure ends the call
  python3 -m harness.cli validate-catalog --backend cuda --model "$1" --save > "$OUT/val-$1.txt" 2>&1 && return 0
  echo "$1: validation FAILED (exit $?, $OUT/val-$1.txt); stopping: nothing is benchmarked after a failed gate"
  grep -E "^\| |^FAIL" "$OUT/val-$1.txt" | grep -v "^| model\|^|---" | tail -5
  exit 1
}
bench=/tmp/llamacpp/build/bin/llama-bench
llamacpp_build || exit 1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
# the rooflines the scoreboard reads this sitting's numbers against: measured here, on this GPU
python3 -m harness.cli roofline --save || status=1
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > "$OUT/models.txt" 2>&1 || tail -3 "$OUT/models.txt"
# every cpu-tier model whose file is here (the real ones only if carried: the host is offline)
present=$(python3 -c "
from harness import catalog, fetch
print(' '.join(n for n, e in catalog.load().items() if e.tier == 'cpu' and
               (e.source == 'synth' or (fetch.models_dir() / n / e.raw['filename']).exists())))")
for m in $present; do
  validate "$m"
done
llamacpp_wait $(( 420 - ($(date +%s) - T0) )) || exit 1
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/mem.csv" &
smi=$!
# the gpu tier one model at a time: generated, validated, benchmarked, deleted (together they
# are ~110 GB, the host's disk 64 GB)
for m in $models; do
  python3 -m harness.cli models -q "$m" >> "$OUT/models.txt" 2>&1 || { tail -3 "$OUT/models.txt"; status=1; continue; }
  validate "$m"
  python3 -m harness.cli bench --save --llamacpp llama-bench:$bench --pp-repetitions 40 -d "${DEPTHS:-0,4096}" \
    --model "$m" 2>&1 | tail -10
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "$m: bench failed"; status=1; }
  rm -f "$ANVIL_MODELS_DIR/synth/$m.gguf"
done
grep -h "| cuda |" "$OUT"/val-*.txt
kill $smi; smi=""
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
exit $status
