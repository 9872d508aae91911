source scripts/gpu/host-env.sh >/dev/null 2>&1
path=$(python3 -c "from harness import catalog; print(catalog.model_path('qwen3moe-30b-a3b', progress=False))") || exit 1
timeout 170 python3 scripts/gpu/switched.py wgmma_moe -m harness.cli validate-catalog --backend cuda --model qwen3moe-30b-a3b > $OUT/validate.txt 2>&1
echo "validate qwen3moe-30b-a3b (wgmma_moe on): exit $?"; grep -E "PASS|FAIL|pass|fail" $OUT/validate.txt | tail -6
for v in on off; do
  run="python3"; [ $v = on ] && run="python3 scripts/gpu/switched.py wgmma_moe"
  for p in 512 4096; do
    timeout 45 $run -m engine bench "$path" --backend cuda -p $p -n 0 -r 2 --json > $OUT/b-r1-$v-p$p.json 2>/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], round(d['results'][0]['tok_s_mean'],1))" $OUT/b-r1-$v-p$p.json "r1 $v p$p" 2>&1 | tail -1
  done
done
