"""Run a Python module or script with the int8 grouped MoE GEMM switched on
(launchers/moe_gemm.py INT8) in this process only: the engine and the
faithful oracle both read the switch, so a validation under it holds the
int8 GEMM to its own rounding.

    python3 scripts/gpu/with_int8.py -m harness.cli validate-catalog --backend cuda --model tiny-qwen3moe
    python3 scripts/gpu/with_int8.py scripts/gpu/moe_stages.py tiny-gemma4moe
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.backends.cuda.launchers import moe_gemm  # noqa: E402


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        sys.exit("usage: with_int8.py (-m MODULE | SCRIPT) [ARGS...]")
    moe_gemm.INT8 = True
    if sys.argv[1] == "-m":
        module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, sys.argv = sys.argv[1], sys.argv[1:]
        if not Path(script).is_file():
            sys.exit(f"with_int8.py: no script {script}")
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
