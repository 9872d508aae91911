# Sourced by the scripts that run on the GPU host (from the repository root):
# the carried wheels (.gpu/whl) installed into /tmp/site, this checkout
# importable, models and the kernel cache under /tmp, the carried tokenizer
# extracts (.gpu/vocab, or .gpu/vocab.tar.xz: a sixth of the size, which keeps
# a call under its carry limit) where synthetic models look for them, carried model
# pieces joined (scripts/gpu/join_parts.py), $OUT made.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl >/dev/null 2>&1 \
  || echo "host-env: no carried wheels installed (.gpu/whl missing?)" >&2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/tmp/llamacpp/build/bin:${LD_LIBRARY_PATH:-}
export ANVIL_MODELS_DIR=${ANVIL_MODELS_DIR:-/tmp/models} ANVIL_CACHE_DIR=${ANVIL_CACHE_DIR:-/tmp/anvil-kernels}
mkdir -p "$ANVIL_MODELS_DIR/vocab"
cp -n .gpu/vocab/*.gguf "$ANVIL_MODELS_DIR/vocab/" 2>/dev/null || true
if [ -f .gpu/vocab.tar.xz ]; then tar xJf .gpu/vocab.tar.xz -C "$ANVIL_MODELS_DIR/vocab" --skip-old-files; fi
# model pieces carried with this call wait in /tmp/parts until all are here
python3 scripts/gpu/join_parts.py

# llama.cpp with CUDA: llama-cpp-python into /tmp/site, llama-bench & co in
# /tmp/llamacpp/build/bin, built from the carried sdist (.gpu/llamacpp) in the
# background (~5 min); the build outlives its call while the machine stays warm.
LLAMACPP_RC=/tmp/llamacpp-build.rc
llamacpp_ready() {
  python3 -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)" 2>/dev/null
}
llamacpp_build() {  # start it unless built or building; a failed build starts again
  llamacpp_ready && return 0
  [ -e /tmp/llamacpp-build.log ] && [ ! -e $LLAMACPP_RC ] && return 0
  [ -d .gpu/llamacpp ] || { echo "llama.cpp: not built here and .gpu/llamacpp not carried" >&2; return 1; }
  rm -rf /tmp/llamacpp-carried $LLAMACPP_RC
  cp -r .gpu/llamacpp /tmp/llamacpp-carried  # later calls replace the working tree mid-build
  setsid bash -c "nice -n 10 bash /tmp/llamacpp-carried/build-llamacpp.sh /tmp/llamacpp-carried/llama-cpp-python.tar.gz \
    > /tmp/llamacpp-build.log 2>&1; echo \$? > $LLAMACPP_RC" < /dev/null > /dev/null 2>&1 &
  echo "llama.cpp build started"
}
llamacpp_wait() {  # up to $1 seconds (default 480) for the build
  local until=$(( $(date +%s) + ${1:-480} ))
  while ! llamacpp_ready && [ ! -e $LLAMACPP_RC ] && [ "$(date +%s)" -lt $until ]; do sleep 5; done
  llamacpp_ready || { echo "llama.cpp build failed or unfinished:" >&2; tail -20 /tmp/llamacpp-build.log >&2; return 1; }
  # the vendored sources know no commit ("build 0, commit unknown"): say what they are
  # (harness/runners/llamacpp.py BUILD_SOURCE_FILE, carried into every llama-bench record)
  local t=/tmp/llamacpp-carried/llama-cpp-python.tar.gz bin=/tmp/llamacpp/build/bin
  if [ -f $t ] && [ -d $bin ] && [ ! -e $bin/BUILD-SOURCE ]; then
    echo "llama.cpp vendored in $(tar tzf $t | head -1 | cut -d/ -f1) (sdist sha256 $(sha256sum $t | cut -c1-16))" \
      > $bin/BUILD-SOURCE
  fi
}
