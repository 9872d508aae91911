#!/usr/bin/env bash
# Runs on the GPU host: validate-catalog --backend cuda --save over the tiny
# catalog, PAR models at a time (default 3), then each model's ops check (the
# worst op against its budget) from the records; with MUTANTS=1, then
# `harness mutants --backend cuda --save` over the tiny catalog, JOBS mutants
# at a time (default 8). Records come back in $OUT/results.tgz.
set -uo pipefail
source scripts/gpu/host-env.sh
mark=$(mktemp /tmp/vt-start.XXXXXX)
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > $OUT/models.txt 2>&1 || tail -3 $OUT/models.txt
echo $tiny | tr ' ' '\n' | xargs -P ${PAR:-3} -I{} sh -c \
  'python3 -m harness.cli validate-catalog --backend cuda --model {} --save > $OUT/validate-{}.txt 2>&1; echo "{}: exit $?"'
if [ -n "${MUTANTS:-}" ]; then
  python3 -m harness.cli mutants --backend cuda --save --jobs ${JOBS:-8} $(printf -- '--model %s ' $tiny) \
    > $OUT/mutants.txt 2>&1
  echo "mutants --backend cuda: exit $?"
  grep -E "NOT CAUGHT|NOT JUDGED|^caught" $OUT/mutants.txt | head -30
fi
find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
python3 - <<'PY'
import json, glob, os
from harness import gates
for f in sorted(glob.glob("reports/results/validate-*.json"), key=os.path.getmtime)[-40:]:
    rec = json.load(open(f))
    for r in rec.get("results", []):
        if r.get("ops"):
            bad = {k: v for k, v in r["ops"].items() if v > gates.op_budget(k.split(" ", 1)[1])}
            top = sorted(r["ops"].items(), key=lambda kv: -kv[1])[:4]
            print(r["model"], "ops worst:", ", ".join(f"{k} {v:.2g}" for k, v in top), "| over budget:", bad or "none")
PY
grep -h "^FAIL" $OUT/validate-*.txt | cut -c1-220 | head -40
