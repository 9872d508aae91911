#!/usr/bin/env bash
# Runs on the GPU host: `harness mutants --backend cuda --save` over the tiny
# catalog (every mutant, one sitting, one record), JOBS at a time (default 10),
# within LIMIT seconds (default 500). The record comes back in $OUT/results.tgz.
set -uo pipefail
source scripts/gpu/host-env.sh
mark=$(mktemp /tmp/mt-start.XXXXXX)
tiny=$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")
python3 -m harness.cli models -q $tiny > $OUT/models.txt 2>&1 || tail -3 $OUT/models.txt
timeout ${LIMIT:-500} python3 -m harness.cli mutants --backend cuda --save --jobs ${JOBS:-10} \
  $(printf -- '--model %s ' $tiny) > $OUT/mutants.txt 2>&1
echo "mutants --backend cuda: exit $?"
grep -E "NOT CAUGHT|NOT JUDGED|^caught" $OUT/mutants.txt | head -30
find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
