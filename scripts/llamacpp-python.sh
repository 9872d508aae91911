#!/usr/bin/env bash
# Install llama-cpp-python (the `reference` extra: llama.cpp in-process, for the
# tests that run it) into the active environment from a portable wheel, built
# once into $ANVIL_WHEELHOUSE (default ~/.cache/anvil/wheelhouse; 4.2 min on 2 cores).
# PyPI has only its source, and its default build is -march=native: on a VM
# whose CPU advertises AMX that the kernel does not enable, llama.cpp's AMX
# tiles die with SIGILL. This wheel targets AVX2/FMA/F16C, which every x86-64
# CI machine has; pip's cache of a native build is never used for it.
# The build's output goes to a log beside the wheel; every PROGRESS_S seconds
# a line says how long it has run and the compiler's step (one line each, so a
# CI log shows it too).
set -euo pipefail
ver=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$(dirname "$0")/../pyproject.toml")
wh=${ANVIL_WHEELHOUSE:-$HOME/.cache/anvil/wheelhouse}
PROGRESS_S=${PROGRESS_S:-20}
if ! ls "$wh"/llama_cpp_python-"$ver"-*.whl >/dev/null 2>&1; then
  mkdir -p "$wh"
  log="$wh/llama-cpp-python-$ver-build.log"
  echo "building a portable llama-cpp-python $ver wheel into $wh (once, ~4 min; log: $log)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    python -m pip wheel -v --no-deps --no-cache-dir -w "$wh" "llama-cpp-python==$ver" >"$log" 2>&1 &
  build=$!
  trap 'kill "$build" 2>/dev/null' EXIT INT TERM  # Ctrl-C stops the build too
  start=$SECONDS
  while kill -0 "$build" 2>/dev/null; do
    for _ in $(seq "$PROGRESS_S"); do kill -0 "$build" 2>/dev/null && sleep 1; done
    # ninja's "[12/80]" or make's "[ 45%]": the step the compiler is at
    step=$(grep -aoE '\[ *[0-9]+(/[0-9]+|%)\]' "$log" | tail -1 || true)
    ! kill -0 "$build" 2>/dev/null || echo "  ... $((SECONDS - start)) s${step:+, build step $step}"
  done
  trap - EXIT INT TERM
  if ! wait "$build"; then
    echo "llama-cpp-python $ver did not build; the end of $log:"
    tail -n 15 "$log"
    exit 1
  fi
  echo "built in $((SECONDS - start)) s"
fi
python -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true  # a native build installed earlier
python -m pip install -q --find-links "$wh" "llama-cpp-python==$ver"
