#!/usr/bin/env bash
# Runs on the GPU host: one sitting of the tiny catalog at this build:
# validate-catalog --backend cuda --save (PAR models at a time, default 4) and,
# beside it, `harness mutants --backend cuda --save` (JOBS at a time, default 10),
# both within LIMIT seconds (default 480). EXTRA: more catalog models for both
# (EXTRA=qwen3-8b: its deep set is what reaches the decode attention past
# position 2048). Records come back in $OUT/results.tgz, the logs in $OUT/logs.tgz (a
# call brings back 8 files at most).
set -uo pipefail
source scripts/gpu/host-env.sh
mark=$(mktemp /tmp/st-start.XXXXXX)
export LOG=/tmp/st-logs; rm -rf $LOG; mkdir -p $LOG
tiny="$(python3 -c "from harness import catalog; print(' '.join(n for n, e in catalog.load().items() if e.source == 'synth' and e.tier == 'cpu'))")${EXTRA:+ $EXTRA}"
python3 -m harness.cli models -q $tiny > $LOG/models.txt 2>&1 || tail -3 $LOG/models.txt
( echo $tiny | tr ' ' '\n' | timeout ${LIMIT:-480} xargs -P ${PAR:-4} -I{} sh -c \
    'python3 -m harness.cli validate-catalog --backend cuda --model {} --save > $LOG/validate-{}.txt 2>&1; echo "validate {}: exit $?"' ) &
timeout ${LIMIT:-480} python3 -m harness.cli mutants --backend cuda --save --jobs ${JOBS:-10} \
  $(printf -- '--model %s ' $tiny) > $LOG/mutants.txt 2>&1
echo "mutants --backend cuda: exit $?"
wait
grep -E "NOT CAUGHT|NOT JUDGED|^caught" $LOG/mutants.txt | head -20
grep -h "^FAIL" $LOG/validate-*.txt | cut -c1-240 | head -30
find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
tar czf $OUT/logs.tgz -C /tmp st-logs
