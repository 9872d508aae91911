#!/usr/bin/env bash
# Assemble .gpu/, what the GPU host scripts (host-env.sh) read, on a machine
# that can download: the host is offline. From the repository root:
#   scripts/gpu/kit.sh [REV ...]
# - .gpu/whl: Python 3.12 wheels of the packages the host lacks (gguf,
#   diskcache for llama_cpp, and setuptools >= 77 with wheel: engine wheels
#   built there from revisions, harness wheel / bisect, without a package index);
# - .gpu/vocab.tar.xz: a tokenizer-only extract (tokenizer_extract.py) of
#   every vocabulary the synthetic catalog models borrow, so the host
#   generates byte-identical models;
# - .gpu/llamacpp: the llama-cpp-python sdist trimmed for the build
#   (llamacpp.sh), where the workplace's ../shared/gpuhost helper is present;
# - .gpu/wheels/<rev>/: the engine wheel of each REV (harness wheel), for
#   `harness ab` there.
# .gpu/ stays out of git (.git/info/exclude); carry it, or its parts, with the call.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '.gpu/' .git/info/exclude 2>/dev/null || echo '.gpu/' >> .git/info/exclude
source .venv/bin/activate
mkdir -p .gpu/whl
platforms=""
for n in 17 27 28; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  --platform any -d .gpu/whl "gguf==$(python -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')" \
  diskcache==5.6.3 setuptools==80.9.0 wheel==0.45.1
vocab=$(mktemp -d)
python - "$vocab" <<'EOF'
import shutil, subprocess, sys
from pathlib import Path
from engine import synth
from harness import catalog
out = Path(sys.argv[1])
for v in sorted({p.vocab for p in synth.PRESETS.values()}):
    src = catalog.vocab_source(v, progress=False)
    if src.parent.name == "vocab":  # already tokenizer-only (llama.cpp's test vocabularies, extracts)
        shutil.copy(src, out / f"{v}.gguf")
    else:
        subprocess.run([sys.executable, "scripts/gpu/tokenizer_extract.py", str(src), str(out / f"{v}.gguf")],
                       check=True, stdout=subprocess.DEVNULL)
    print("vocab", v, "from", src.name)
EOF
tar cJf .gpu/vocab.tar.xz -C "$vocab" . && rm -rf "$vocab"
if [ -x ../shared/gpuhost/llamacpp-sdist.sh ] && [ ! -f .gpu/llamacpp/llama-cpp-python.tar.gz ]; then
  ../shared/gpuhost/llamacpp-sdist.sh .gpu/llamacpp > /dev/null
fi
for rev in "$@"; do
  whl=$(python -m harness.cli wheel "$rev" 2>/dev/null | tail -1)
  dest=.gpu/wheels/$(git rev-parse --short=7 "$rev")
  mkdir -p "$dest" && cp "$whl" "$dest/"
  echo "wheel $rev -> $dest"
done
du -sh .gpu/*
