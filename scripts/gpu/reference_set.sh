#!/usr/bin/env bash
# Runs on the GPU host: a reference set made anew for some models, and judged.
# For each of MODELS (default qwen3-8b), in turn, while LIMIT seconds (default
# 540) last: llama.cpp with CUDA makes the TIER (gpu or deep, default deep)
# reference (`harness reference --force`), then measures its own spread on it
# (flash attention on, one-token batches: `reference --variation --save`), the
# gate that spread proposes (gates.propose) replaces the model's
# gate.TIER-cuda in the host's catalog copy (the line to commit is printed);
# then, every model's spread measured, the CUDA engine is validated on each.
# Back in $OUT: the references and records (results.tgz), the gate lines
# (gates.txt), the logs (logs.tgz).
# Carry: .gpu/whl, .gpu/vocab.tar.xz, .gpu/llamacpp.
set -uo pipefail
source scripts/gpu/host-env.sh
MODELS=${MODELS:-qwen3-8b}; TIER=${TIER:-deep}
deadline=$(( $(date +%s) + ${LIMIT:-540} ))
mark=$(mktemp /tmp/refset-start.XXXXXX)
LOG=/tmp/refset-logs; rm -rf $LOG; mkdir -p $LOG
finish() {
  find references/$TIER reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
  tar czf $OUT/logs.tgz -C /tmp refset-logs
  cat $OUT/gates.txt 2>/dev/null
}
trap finish EXIT
llamacpp_build || exit 1
for M in $MODELS; do  # generated while llama.cpp builds
  python3 -m harness.cli models -q "$M" > $LOG/models-$M.txt 2>&1 || { tail -3 $LOG/models-$M.txt; exit 1; }
done
llamacpp_wait 480 || exit 1
for M in $MODELS; do
  left=$(( deadline - $(date +%s) ))
  [ $left -gt 120 ] || { echo "$M: not run (time)"; continue; }
  timeout $left python3 -m harness.cli reference --tier $TIER --model "$M" --force > $LOG/reference-$M.txt 2>&1 \
    || { echo "$M: reference failed"; tail -5 $LOG/reference-$M.txt; continue; }
  timeout $(( deadline - $(date +%s) )) python3 -m harness.cli reference --variation --tier $TIER --model "$M" --save \
    > $LOG/variation-$M.txt 2>&1 || { echo "$M: variation failed"; tail -5 $LOG/variation-$M.txt; continue; }
  grep -E "^\| " $LOG/variation-$M.txt | cut -c1-200
  python3 - "$M" "$TIER" <<'PY' >> $OUT/gates.txt
import json, pathlib, sys
from types import SimpleNamespace as NS
from harness import catalog, gates, results
m, tier = sys.argv[1:]
recs = sorted(pathlib.Path(results.DEFAULT_DIR).glob("variation-*.json"))
rec = json.loads(recs[-1].read_text())
spread = [NS(**{**r, "cases": [NS(**c) for c in r["cases"]]}) for r in rec["results"] if r["model"] == m]
g = gates.propose(catalog.entry(m), tier, spread)
print(f"{m}: gate.{tier}-cuda = {{ margin = {g.margin:g}, logit = {g.logit:g}, kl = {g.kl:g}, flips = {g.flips:g} }}  # "
      + ", ".join(f"llama.cpp CUDA {r.variant} {r.max_margin_shift:.3g} / {r.max_logit_diff:.3g} / {r.max_kl:.3g}"
                  for r in spread) + f" ({recs[-1].name})")
PY
  python3 - "$M" "$TIER" <<'PY'
import os, re, sys
from harness import fetch
m, tier = sys.argv[1:]
line = [x for x in open(os.environ["OUT"] + "/gates.txt") if x.startswith(m + ": ")][-1].split(": ", 1)[1]
t = fetch.CATALOG.read_text()
block = re.search(rf"\[models\.{re.escape(m)}\]\n(?:(?!\[).*\n)*", t)
body = re.sub(rf"gate\.{tier}-cuda = .*\n", "", block.group(0))
body = re.sub(r"(gate\.gpu-cuda = .*\n)" if tier != "gpu" else r"(n_steps = .*\n)", lambda k: k.group(1) + line, body, 1)
fetch.CATALOG.write_text(t[:block.start()] + body + t[block.end():])
PY
done
for M in $MODELS; do  # every model's spread first, then the validations the time leaves
  left=$(( deadline - $(date +%s) ))
  [ $left -gt 60 ] && grep -q "^$M: " $OUT/gates.txt 2>/dev/null || { echo "validate $M: not run"; continue; }
  timeout $left python3 -m harness.cli validate-catalog --backend cuda --model "$M" --save \
    > $LOG/validate-$M.txt 2>&1; echo "validate $M ($TIER): exit $?"
  grep -E "^\| |^FAIL" $LOG/validate-$M.txt | cut -c1-220 | tail -6
done
