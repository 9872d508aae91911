#!/usr/bin/env bash
# Runs on the GPU host: build llama.cpp with CUDA (sm_90) from the carried
# llama-cpp-python sdist and wait for it (~5 min): llama-cpp-python in
# /tmp/site (harness reference --tier gpu), llama-bench in
# /tmp/llamacpp/build/bin (harness bench --llamacpp). validate.sh and
# scoreboard.sh start the same build themselves.
# Carry: .gpu/whl, .gpu/llamacpp (../shared/gpuhost/llamacpp-sdist.sh + build-llamacpp.sh).
set -uo pipefail
source scripts/gpu/host-env.sh
llamacpp_build && llamacpp_wait 560 && ls /tmp/llamacpp/build/bin | grep -E '^llama-(bench|quantize)$'
