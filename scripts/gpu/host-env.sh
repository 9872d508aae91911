# Sourced by the scripts that run on the GPU host (from the repository root):
# the carried wheels (.gpu/whl) installed into /tmp/site, this checkout
# importable, models and the kernel cache under /tmp, the carried tokenizer
# extracts (.gpu/vocab) where synthetic models look for them, carried model
# pieces joined (scripts/gpu/join_parts.py), $OUT made.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl >/dev/null 2>&1 \
  || echo "host-env: no carried wheels installed (.gpu/whl missing?)" >&2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/tmp/llamacpp/build/bin:${LD_LIBRARY_PATH:-}
export ANVIL_MODELS_DIR=${ANVIL_MODELS_DIR:-/tmp/models} ANVIL_CACHE_DIR=${ANVIL_CACHE_DIR:-/tmp/anvil-kernels}
mkdir -p "$ANVIL_MODELS_DIR/vocab"
cp -n .gpu/vocab/*.gguf "$ANVIL_MODELS_DIR/vocab/" 2>/dev/null || true
# model pieces carried with this call wait in /tmp/parts until all are here
python3 scripts/gpu/join_parts.py
