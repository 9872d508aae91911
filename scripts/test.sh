#!/usr/bin/env bash
# The full test suite on a fresh machine: install with the test (and cluster) extras, fetch the
# catalog's CPU-tier models on first use, run pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# the cluster extra (Ray) too: tests/test_multi_gpu.py runs --ray on a local Ray instance
source scripts/setup.sh test,cluster
# chromium for the scoreboard's browser test: a system package, so only if you say yes (asked in a terminal;
# in CI none is installed, ANVIL_INSTALL_BROWSER=1 to install it) - else that test skips, saying why
scripts/install-browser.sh || echo "could not install chromium: the browser tests will skip"
# llama-cpp-python (the `reference` extra) for the tests that run llama.cpp itself, from a portable
# wheel built on the first run (scripts/llamacpp-python.sh); a build with AMX compiled in is replaced
python -c "import llama_cpp, sys; sys.exit(b'AMX' in llama_cpp.llama_print_system_info())" 2>/dev/null \
  || scripts/llamacpp-python.sh || echo "could not build llama-cpp-python: the tests that run llama.cpp will skip"
# two workers (pytest-xdist), a file at a time each, in the order tests/conftest.py
# sets; one BLAS thread each: more threads than cores only spin against each other
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} \
       MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
python -m pytest -q -rs --durations=15 -n 2 --dist loadfile --no-loadscope-reorder "$@"  # why each skip, the slowest tests
