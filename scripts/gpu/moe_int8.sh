#!/usr/bin/env bash
# Runs on the GPU host: the int8 grouped MoE GEMM (moe_gemm.cu moe_gemm_i8,
# launchers/moe_gemm.py INT8, off in the tree) tried in one call, within LIMIT
# seconds (default 540) from the start:
#   1. its kernel tests (the gpu-marked int8 tests of tests/test_kernels_moe.py);
#      nothing else runs unless they pass;
#   2. both grouped GEMMs timed at the Qwen3-30B-A3B shapes (moe_bench, 512
#      and 4096 tokens, each with the rounding of its input), and the gate
#      projection's two kernels under Nsight Compute;
#   3. MODEL (default qwen3moe-30b-a3b, generated here from the start) prefill
#      pp512 and pp4096, ROUNDS rounds (default 3) alternating INT8 off and
#      on, a fresh process each, round 0 dropped, no round started past
#      LIMIT - 150 s;
#   4. with INT8 on (switched in each process only: scripts/gpu/with_int8.py),
#      the tiny MoE models validated on the CUDA engine while the time lasts
#      (their stage-wise MoE check holds the int8 GEMM to the faithful oracle,
#      which follows the switch), then tiny-gemma4moe's stages printed.
# Nothing is saved under reports/ (a build with INT8 on would carry the
# tree's build hash): logs, the bench JSON among them, in $OUT/int8-logs.tgz.
set -uo pipefail
source scripts/gpu/host-env.sh
deadline=$(( $(date +%s) + ${LIMIT:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
LOG=/tmp/int8-logs; rm -rf $LOG; mkdir -p $LOG
model=${MODEL:-qwen3moe-30b-a3b}
tiny="tiny-qwen3moe tiny-qwen3moe-f32 tiny-qwen35moe tiny-qwen35moe-f32 tiny-gemma4moe tiny-gemma4moe-f32"
finish() {
  tar czf $OUT/int8-logs.tgz -C /tmp int8-logs
  exit "$1"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $LOG/gpu.txt
( python3 -m harness.cli models -q "$model" $tiny > $LOG/models.txt 2>&1 ) &  # generated beside 1-2
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_moe.py -k "int8" > $LOG/tests.txt 2>&1
rc=$?; tail -3 $LOG/tests.txt
if [ $rc -ne 0 ]; then grep -E "^E |Error|FAILED" $LOG/tests.txt | head -20; finish 1; fi
python3 -c "from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device
moe_bench.bench_all(Device(), tokens=(512, 4096))" 2>&1 | tee $LOG/moe_bench.txt | tail -12
# both kernels of the 30B-A3B gate projection under Nsight Compute: time, instructions, shared-memory
# bank conflicts (what to tune next: the int8 GEMM is meant to be instruction bound, like the bf16 one)
timeout 120 ncu --metrics gpu__time_duration.sum,smsp__inst_executed.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum \
  --kernel-name regex:moe_gemm --launch-count 4 --csv python3 -c "
from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device; from engine.quants import QType
d = Device(); moe_bench.bench_grouped(d, QType.Q4_K, 2048, 768, iters=1); moe_bench.bench_grouped(d, QType.Q4_K, 2048, 768, iters=1, int8=True)" \
  > $LOG/ncu.csv 2>&1; grep -E "moe_gemm" $LOG/ncu.csv | cut -c1-200 | tail -8
wait  # the models
tail -3 $LOG/models.txt
path=$(python3 -c "from harness import catalog; print(catalog.model_path('$model', progress=False))") || finish 1
for r in $(seq 0 $((${ROUNDS:-3} - 1))); do
  [ $(left) -gt 150 ] || { echo "round $r and after: not run (time)"; break; }
  for v in off on; do
    run="python3"; [ $v = on ] && run="python3 scripts/gpu/with_int8.py"
    for p in 512 4096; do
      $run -m engine bench "$path" --backend cuda -p $p -n 0 -r 2 --json > $LOG/bench-r$r-$v-p$p.json 2> $LOG/bench-r$r-$v-p$p.err
    done
  done
done
python3 - "$LOG" <<'PY'
import glob, json, statistics, sys
rows = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/bench-r*-p*.json")):
    r, v, p = f.rsplit("/", 1)[1][len("bench-r"):-len(".json")].split("-")
    try:
        t = json.load(open(f))["results"][0]["tok_s_mean"]
    except (OSError, ValueError, KeyError, IndexError):  # a failed run: its .err says why
        t = None
    if int(r) > 0 and t:  # round 0 warms up
        rows.setdefault((p, v), []).append(t)
for p in ("p512", "p4096"):
    off, on = rows.get((p, "off"), []), rows.get((p, "on"), [])
    if off and on:
        print(f"{p}: bf16 {statistics.median(off):.0f} t/s, int8 {statistics.median(on):.0f} t/s, "
              f"x{statistics.median(on) / statistics.median(off):.3f} ({len(off)} rounds each)")
PY
for m in $tiny; do
  [ $(left) -gt 30 ] || { echo "validate $m and after: not run (time)"; break; }
  timeout $(left) python3 scripts/gpu/with_int8.py -m harness.cli validate-catalog --backend cuda --model $m \
    > $LOG/validate-$m.txt 2>&1
  echo "validate $m (INT8 on): exit $?"
done
grep -h "^FAIL" $LOG/validate-*.txt 2>/dev/null | cut -c1-240 | head -20
[ $(left) -gt 30 ] && timeout $(left) python3 scripts/gpu/with_int8.py scripts/gpu/moe_stages.py tiny-gemma4moe \
  > $LOG/stages.txt 2>&1 && tail -12 $LOG/stages.txt
finish 0
