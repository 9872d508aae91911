#!/usr/bin/env bash
# Runs on the GPU host: the speed-regression tools on real builds. A scratch git
# repository of this tree gets nine commits on top of it ("base"), the planted
# regression in the middle; engine edits that move nothing make new builds
# around it, the other edits keep the build:
#   c1 a comment in norm.cu   c2 README   c3 harness   c4 a comment in rope.cu
#   c5 a planted slowdown: the argmax kernels, once a decode step, spin on
#      %globaltimer for PLANT (default 0.02) of the step time the base build
#      measures here first (engine bench, tg128)
#   c6 README   c7 a comment in gemv.cu   c8 harness   c9 README
# Then on MODEL (default qwen3-8b), tg128 only (-p 0), -r 2, ROUNDS rounds (default 4):
#   1. harness ab --aa base          (the noise band every later verdict takes)
#   2. harness ab base c5, 3 times   (each must say "slower" and exit 1)
#   3. harness ab old base           (OLD: a wheel from before `python -m engine info`,
#                                     carried in .gpu/wheels/old with its commit.json)
#   4. harness bisect base c9        (must name c5)
# STEPS (default "aa plant old bisect") picks the steps; SPIN_NS sets the plant's
# spin in ns instead of measuring the base build first (a later call keeps the
# plant of an earlier one). Each step stops at LIMIT seconds (default 560) all
# told. The records come back in $OUT/results.tgz, every step's log in
# $OUT/logs.tgz (a call brings back 8 files at most); the summary last.
set -uo pipefail
source scripts/gpu/host-env.sh
ROOT=$PWD
mark=$(mktemp /tmp/rc-start.XXXXXX)
LOG=/tmp/rc-logs; rm -rf $LOG; mkdir -p $LOG
deadline=$(( $(date +%s) + ${LIMIT:-560} ))
left() { echo $(( deadline - $(date +%s) )); }
M=${MODEL:-qwen3-8b}; R=${ROUNDS:-4}; PLANT=${PLANT:-0.02}
export ANVIL_WHEELS_DIR=/tmp/wheels
STORE=$ROOT/reports/results
SETTINGS="--model $M -p 0 -n 128 -r 2 --rounds $R"
python3 -m harness.cli models -q $M > $LOG/models.txt 2>&1 || tail -3 $LOG/models.txt
gguf=$(awk '{print $4}' $LOG/models.txt | tail -1)

# the scratch repository
S=/tmp/scratch; rm -rf $S; mkdir -p $S
tar c --exclude=./.gpu --exclude=./reports/results . | tar x -C $S
cd $S
git init -q && git config user.email regression@anvil && git config user.name regression-check
commit() { git add -A && git commit -qm "$1" && git rev-parse HEAD; }
base=$(commit "base: this tree")
note() { echo "$1" >> "$2"; commit "$3"; }
c1=$(note "// one more line, no code" engine/kernels/norm.cu "c1: a comment in norm.cu")
c2=$(note "" README.md "c2: a README line")
c3=$(note "# one more line" harness/__init__.py "c3: a harness line")
c4=$(note "// one more line, no code" engine/kernels/rope.cu "c4: a comment in rope.cu")
cd $ROOT
want() { [[ " ${STEPS:-aa plant old bisect} " == *" $1 "* ]]; }
if [ -n "${SPIN_NS:-}" ]; then spin_ns=$SPIN_NS; echo "the plant spins $spin_ns ns a step (SPIN_NS)" | tee $LOG/plant.txt
else
step_s=$(python3 -m engine bench "$gguf" --backend cuda --json -p 0 -n 128 -r 3 2> $LOG/calibrate.err \
  | python3 -c "import json,sys; r=json.load(sys.stdin)['results']; print(1.0 / next(x for x in r if x['test'] == 'tg128')['tok_s_mean'])")
spin_ns=$(python3 -c "print(int($PLANT * $step_s * 1e9))")
echo "base tg128 step $(python3 -c "print(f'{$step_s * 1e3:.3f}')") ms: the plant spins $spin_ns ns a step" | tee $LOG/plant.txt
fi
cd $S
python3 - "$spin_ns" <<'EOF'
import re, sys
from pathlib import Path
p = Path("engine/kernels/argmax.cu")
s = p.read_text()
spin = ("__device__ __forceinline__ void planted_spin() {\n"
        "    if (threadIdx.x != 0) return;\n"
        "    unsigned long long t0, t;\n"
        '    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));\n'
        f'    do {{ asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }} while (t - t0 < {sys.argv[1]}ull);\n'
        "}\n\n")
s = s.replace('extern "C" __global__ void argmax(', spin + 'extern "C" __global__ void argmax(', 1)
s, n = re.subn(r"(\n    answer\((?:finite|all_finite), bi, out, token, pos, history\);)", r"\1\n    planted_spin();", s)
assert n == 2, n
p.write_text(s)
EOF
c5=$(commit "c5: planted slowdown (argmax spins)")
c6=$(note "" README.md "c6: a README line")
c7=$(note "// one more line, no code" engine/kernels/gemv.cu "c7: a comment in gemv.cu")
c8=$(note "# one more line" harness/__init__.py "c8: a harness line")
c9=$(note "" README.md "c9: a README line")
want aa || want plant || want old && for rev in $base $c5; do PYTHONPATH=/tmp/site:$S python3 -m harness.cli wheel $rev > /dev/null 2>> $LOG/wheels.err; done
whl() { ls $ANVIL_WHEELS_DIR/$1/anvil-*.whl; }
cd $ROOT

run() {  # name, command...: logged, its exit status kept
  local name=$1; shift
  if [ "$(left)" -lt 60 ]; then echo "$name: not run (time)" | tee -a $LOG/summary.txt; return; fi
  timeout "$(left)" "$@" > $LOG/$name.txt 2>&1
  echo "$name: exit $? $(grep -E '^(verdict|first slower|the first)|slower|faster|same' $LOG/$name.txt | tail -1 | cut -c1-160)" \
    | tee -a $LOG/summary.txt
}
want aa && run aa python3 -m harness.cli ab --aa "$(whl $base)" $SETTINGS --save --results-dir $STORE
want plant && for k in 1 2 3; do
  run plant-$k python3 -m harness.cli ab "$(whl $base)" "$(whl $c5)" $SETTINGS --save --results-dir $STORE
done
want old && run old python3 -m harness.cli ab .gpu/wheels/old/anvil-*.whl "$(whl $base)" $SETTINGS --allow-token-diff \
  --allow-slower --save --results-dir $STORE
cd $S
want bisect && run bisect env PYTHONPATH=/tmp/site:$S python3 -m harness.cli bisect $base $c9 --test tg128 --model $M -r 2 \
  --rounds $R --save --results-dir $STORE
cd $ROOT
echo "commits: base ${base:0:12}, planted c5 ${c5:0:12}, BAD c9 ${c9:0:12}" | tee -a $LOG/summary.txt
find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
tar czf $OUT/logs.tgz -C /tmp rc-logs
cat $LOG/summary.txt
