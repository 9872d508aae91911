#!/usr/bin/env bash
# Runs on the GPU host: qwen3-8b's "deep" reference set (llama.cpp with CUDA,
# one prompt of ~4.8k tokens, 32 decode steps after it: harness/catalog.py
# deep_prompts), llama.cpp's own spread on it (flash attention on, one-token
# batches: `harness reference --variation --tier deep --save`), then the CUDA
# engine validated on it under the gate that spread proposes (the host's
# catalog copy only; the line to commit is printed). Back in $OUT: the
# reference, the records (results.tgz), the logs.
# Carry: .gpu/whl, .gpu/vocab.tar.xz, .gpu/llamacpp.
set -uo pipefail
source scripts/gpu/host-env.sh
M=${MODEL:-qwen3-8b}
mark=$(mktemp /tmp/deep-start.XXXXXX)
llamacpp_build || exit 1
python3 -m harness.cli models -q "$M" > $OUT/models.txt 2>&1 || tail -3 $OUT/models.txt
llamacpp_wait 480 || exit 1
python3 -m harness.cli reference --tier deep --model "$M" --force > $OUT/reference.txt 2>&1 || { tail -5 $OUT/reference.txt; exit 1; }
cp references/deep/$M.json $OUT/
python3 -m harness.cli reference --variation --tier deep --model "$M" --save > $OUT/variation.txt 2>&1 \
  || { tail -5 $OUT/variation.txt; exit 1; }
grep -E "^\| " $OUT/variation.txt | cut -c1-200
python3 - "$M" <<'PY' > $OUT/gate.txt
import sys
from harness import catalog, gates, results
import json, pathlib
m = sys.argv[1]
recs = sorted(pathlib.Path(results.DEFAULT_DIR).glob("variation-*.json"))
rec = json.loads(recs[-1].read_text())
from types import SimpleNamespace as NS
spread = [NS(**{**r, "cases": [NS(**c) for c in r["cases"]]}) for r in rec["results"] if r["model"] == m]
g = gates.propose(catalog.entry(m), "deep", spread)
print(f"gate.deep-cuda = {{ margin = {g.margin:g}, logit = {g.logit:g}, kl = {g.kl:g}, flips = {g.flips:g} }}  # "
      + ", ".join(f"llama.cpp CUDA {r.variant} {r.max_margin_shift:.3g} / {r.max_logit_diff:.3g} / {r.max_kl:.3g}"
                  for r in spread) + f" ({recs[-1].name})")
PY
cat $OUT/gate.txt
python3 - "$M" <<'PY'
import re, sys
from harness import fetch
m, line = sys.argv[1], open(__import__("os").environ["OUT"] + "/gate.txt").read()
t = fetch.CATALOG.read_text()
t = re.sub(rf"(\[models\.{re.escape(m)}\]\n(?:.*\n)*?)(gate\.gpu-cuda = .*\n)", lambda k: k.group(1) + k.group(2) + line, t, 1)
fetch.CATALOG.write_text(t)
PY
python3 -m harness.cli validate-catalog --backend cuda --model "$M" --save > $OUT/validate.txt 2>&1; echo "validate $M (gpu, deep): exit $?"
grep -E "^\| |^FAIL" $OUT/validate.txt | cut -c1-220 | tail -6
find reports/results -newer "$mark" -name '*.json' | xargs -r tar czf "$OUT/results.tgz"
