#!/usr/bin/env bash
# Runs on the GPU host: a kernel that is off in the tree (a switch that
# scripts/gpu/switched.py knows) tried in one call, within LIMIT seconds
# (default 540) from the start:
#   1. its kernel tests (gpu-marked); nothing else runs unless they pass;
#   2. its benchmark beside the kernel it would replace, and both under Nsight
#      Compute (time, instructions, shared-memory bank conflicts, throughputs);
#   3. MODEL's prefill pp512 and pp4096, ROUNDS rounds (default 3) alternating
#      the switch off and on, a fresh process each, round 0 dropped, no round
#      started past LIMIT - 150 s;
#   4. with the switch on (in each process only), VALIDATE's models validated
#      on the CUDA engine while the time lasts.
#
#   bash scripts/gpu/switch_trial.sh int8    the int8 grouped MoE GEMM (moe_gemm.cu moe_gemm_i8):
#       test_kernels_moe -k int8, moe_bench at the Qwen3-30B-A3B shapes, MODEL qwen3moe-30b-a3b,
#       the tiny MoE models (their stage-wise MoE check holds it to the faithful oracle, which
#       follows the switch), then tiny-gemma4moe's stages printed
#   bash scripts/gpu/switch_trial.sh wgmma   the dense prefill GEMM from the quantised blocks
#       (gemm.cu gemm_<t>, gemm256_<t>): test_kernels_gemm, gemm_bench at the Qwen3-8B shapes with
#       tiles of 128 and 256 tokens (and the kernels' SASS checked for HGMMA), MODEL qwen3-8b, then
#       qwen3-8b and the tiny dense models validated
#   bash scripts/gpu/switch_trial.sh wgmma_moe   its grouped form for the MoE projections
#       (gemm_grouped_<t>): its tests and the MoE Ops test with it, moe_bench's three grouped
#       GEMMs, MODEL qwen3moe-30b-a3b, then it and the tiny MoE models validated
# Nothing is saved under reports/ (a build with a switch on would carry the
# tree's build hash): logs, the benchmarks among them, in $OUT/<switch>-logs.tgz.
set -uo pipefail
switch=${1:-}
case "$switch" in
  int8)
    tests="tests/test_kernels_moe.py" k="int8"
    bench="from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device
moe_bench.bench_all(Device(), tokens=(512, 4096))"
    ncu_kernels="regex:moe_gemm"
    ncu_run="from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device; from engine.quants import QType
d = Device(); moe_bench.bench_grouped(d, QType.Q4_K, 2048, 768, iters=1); moe_bench.bench_grouped(d, QType.Q4_K, 2048, 768, iters=1, gemm='int8')"
    model=${MODEL:-qwen3moe-30b-a3b}
    validate=${VALIDATE:-"tiny-qwen3moe tiny-qwen3moe-f32 tiny-qwen35moe tiny-qwen35moe-f32 tiny-gemma4moe tiny-gemma4moe-f32"} ;;
  wgmma)
    tests="tests/test_kernels_gemm.py tests/test_kernels_moe.py" k="gemm or wgmma"
    bench="from engine.backends.cuda import gemm_bench; from engine.backends.cuda.device import Device
gemm_bench.bench_all(Device())"
    ncu_kernels="regex:gemm|dequant"
    ncu_run="from engine.backends.cuda import gemm_bench; from engine.backends.cuda.device import Device; from engine.quants import QType
d = Device()
for path, bm in (('cublas', 128), ('wgmma', 128), ('wgmma', 256)):
    gemm_bench.bench_gemm(d, QType.Q4_K, 512, 4096, (12288, 12288), path, iters=1, bm=bm)"
    model=${MODEL:-qwen3-8b}
    validate=${VALIDATE:-"qwen3-8b tiny-qwen3 tiny-llama tiny-qwen2 tiny-gemma3 tiny-qwen35 tiny-gemma4 tiny-qwen3-f32"} ;;
  wgmma_moe)
    tests="tests/test_kernels_gemm.py tests/test_kernels_moe.py" k="grouped or wgmma"
    bench="from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device
moe_bench.bench_all(Device(), rows=(), tokens=(512, 4096))"
    ncu_kernels="regex:gemm"
    ncu_run="from engine.backends.cuda import moe_bench; from engine.backends.cuda.device import Device; from engine.quants import QType
d = Device()
for g in ('bf16', 'wgmma'):
    moe_bench.bench_grouped(d, QType.Q4_K, 2048, 768, iters=1, gemm=g)"
    model=${MODEL:-qwen3moe-30b-a3b}
    validate=${VALIDATE:-"qwen3moe-30b-a3b qwen36-35b-a3b gemma4-26b-a4b tiny-qwen3moe tiny-qwen3moe-f32 tiny-qwen35moe tiny-qwen35moe-f32 tiny-gemma4moe tiny-gemma4moe-f32"} ;;
  *) echo "usage: switch_trial.sh int8|wgmma|wgmma_moe" >&2; exit 2 ;;
esac
source scripts/gpu/host-env.sh
deadline=$(( $(date +%s) + ${LIMIT:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
LOG=/tmp/$switch-logs; rm -rf $LOG; mkdir -p $LOG
finish() {
  tar czf $OUT/$switch-logs.tgz -C /tmp $switch-logs
  exit "$1"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $LOG/gpu.txt
( python3 -m harness.cli models -q "$model" $validate > $LOG/models.txt 2>&1 ) &  # generated beside 1-2
# bounded: a kernel that hangs must not take the call's logs with it
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider $tests -k "$k" > $LOG/tests.txt 2>&1
rc=$?; tail -3 $LOG/tests.txt
if [ $rc -ne 0 ]; then grep -E "^E |Error|FAILED" $LOG/tests.txt | head -20; finish 1; fi
if [ "${switch%_moe}" = wgmma ]; then  # the warpgroup MMAs are in the machine code (HGMMA), not a fallback
  python3 -c "from engine.backends.cuda import compile as nv
open('$LOG/gemm.cubin', 'wb').write(nv.compile_cubin('gemm.cu', 'sm_90'))" \
    && cuobjdump -sass $LOG/gemm.cubin > $LOG/gemm.sass 2>&1; echo "HGMMA in gemm.cu: $(grep -c HGMMA $LOG/gemm.sass)"
fi
timeout 200 python3 -c "$bench" 2>&1 | tee $LOG/bench.txt | tail -70
timeout 120 ncu --metrics gpu__time_duration.sum,smsp__inst_executed.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__throughput.avg.pct_of_peak_sustained_elapsed \
  --kernel-name "$ncu_kernels" --launch-count 12 --csv python3 -c "$ncu_run" \
  > $LOG/ncu.csv 2>&1; grep -E "gemm|dequant" $LOG/ncu.csv | cut -c1-220 | tail -16
wait  # the models
tail -3 $LOG/models.txt
path=$(python3 -c "from harness import catalog; print(catalog.model_path('$model', progress=False))") || finish 1
for r in $(seq 0 $((${ROUNDS:-3} - 1))); do
  [ $(left) -gt 150 ] || { echo "round $r and after: not run (time)"; break; }
  for v in off on; do
    run="python3"; [ $v = on ] && run="python3 scripts/gpu/switched.py $switch"
    for p in 512 4096; do
      $run -m engine bench "$path" --backend cuda -p $p -n 0 -r 2 --json > $LOG/bench-r$r-$v-p$p.json 2> $LOG/bench-r$r-$v-p$p.err
    done
  done
done
python3 - "$LOG" "$switch" <<'PY'
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
        print(f"{p}: off {statistics.median(off):.0f} t/s, {sys.argv[2]} on {statistics.median(on):.0f} t/s, "
              f"x{statistics.median(on) / statistics.median(off):.3f} ({len(off)} rounds each)")
PY
for m in $validate; do
  [ $(left) -gt 30 ] || { echo "validate $m and after: not run (time)"; break; }
  timeout $(left) python3 scripts/gpu/switched.py $switch -m harness.cli validate-catalog --backend cuda --model $m \
    > $LOG/validate-$m.txt 2>&1
  echo "validate $m ($switch on): exit $?"
done
grep -h "^FAIL" $LOG/validate-*.txt 2>/dev/null | cut -c1-240 | head -20
if [ "$switch" = int8 ] && [ $(left) -gt 30 ]; then
  timeout $(left) python3 scripts/gpu/switched.py int8 scripts/gpu/moe_stages.py tiny-gemma4moe \
    > $LOG/stages.txt 2>&1 && tail -12 $LOG/stages.txt
fi
finish 0
