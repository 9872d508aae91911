#!/usr/bin/env bash
# Install llama-cpp-python (the `reference` extra: llama.cpp in-process, for the
# tests that run it) into the active environment from a portable wheel, built
# once into $ANVIL_WHEELHOUSE (default ~/.cache/anvil/wheelhouse; 4.2 min on 2 cores).
# PyPI has only its source, and its default build is -march=native: on a VM
# whose CPU advertises AMX that the kernel does not enable, llama.cpp's AMX
# tiles die with SIGILL. This wheel targets AVX2/FMA/F16C, which every x86-64
# CI machine has; pip's cache of a native build is never used for it.
set -euo pipefail
ver=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$(dirname "$0")/../pyproject.toml")
wh=${ANVIL_WHEELHOUSE:-$HOME/.cache/anvil/wheelhouse}
if ! ls "$wh"/llama_cpp_python-"$ver"-*.whl >/dev/null 2>&1; then
  echo "building a portable llama-cpp-python $ver wheel into $wh (once, ~4 min)..."
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    python -m pip wheel -q --no-deps --no-cache-dir -w "$wh" "llama-cpp-python==$ver"
fi
python -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true  # a native build installed earlier
python -m pip install -q --find-links "$wh" "llama-cpp-python==$ver"
