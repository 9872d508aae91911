#!/usr/bin/env bash
# Runs on the GPU host: the correctness gate of one sitting, in stages.
#   build     start building llama-cpp-python with CUDA in the background
#             (~5 min; it outlives this call while the machine stays warm;
#             nothing to do once built, a failed build starts again)
#   refs      wait for that build (started now if it was not); make the catalog's synthetic models and the
#             llama.cpp CUDA references (references/gpu/) still missing for
#             the models present (real ones only if carried: the host is offline)
#   validate  harness validate-catalog --backend cuda over every tier (--save --calibrate)
#   variation llama.cpp CUDA against its own gpu-tier references with other
#             settings (harness reference --variation --save): its noise floor
# New references and result records come back in $OUT/results.tgz (unpack in
# the repository root and commit). Default: build refs validate.
# Carry .gpu/whl, .gpu/llamacpp (build), .gpu/vocab (synthetic models'
# tokenizers); real models travel in pieces first (scripts/gpu/split-model.sh).
# Usage: bash scripts/gpu/validate.sh [build|refs|validate|variation]...
set -uo pipefail
source scripts/gpu/host-env.sh
stages=${*:-build refs validate}
T0=$(date +%s)
mark=$(mktemp /tmp/validate-start.XXXXXX)  # this call's new references and records come back
collect() {
  find references/gpu reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
  echo "stages [$stages] done in $(( $(date +%s) - T0 )) s"
}
trap collect EXIT

for stage in $stages; do case $stage in
build)
  llamacpp_build || exit 1 ;;
refs)
  llamacpp_build || exit 1
  synth=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth'))")
  python3 -m harness.cli models -q $synth > "$OUT/models.txt" 2>&1 || tail -3 "$OUT/models.txt"
  llamacpp_wait 480 || exit 1
  missing=$(python3 -c "
from harness import catalog, fetch, refs
for n, e in catalog.load().items():
    f = catalog.synth_path(e) if e.source == 'synth' else fetch.models_dir() / n / e.raw['filename']
    if 'gpu' in e.reference_tiers and not refs.reference_path(n, 'gpu').exists() and f.exists():
        print(n)")
  for m in $missing; do
    python3 -m harness.cli reference --tier gpu --model "$m" 2>&1 | tail -3
  done ;;
validate)
  python3 -m harness.cli validate-catalog --backend cuda --save --calibrate > "$OUT/validate.txt" 2>&1
  echo "validate-catalog --backend cuda: exit $?"
  grep -E "^\| |near_tie" "$OUT/validate.txt" ;;
variation)
  for m in $(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if 'gpu' in e.reference_tiers))"); do
    python3 -m harness.cli reference --variation --tier gpu --model "$m" --save >> "$OUT/variation.txt" 2>&1
    echo "reference --variation --tier gpu --model $m: exit $?"
  done
  grep -E "^\| |over .* steps" "$OUT/variation.txt" ;;
*) echo "unknown stage $stage (build, refs, validate, variation)"; exit 2 ;;
esac; done
