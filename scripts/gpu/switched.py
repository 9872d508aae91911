"""Run a Python module or script with kernel switches that are off in the tree
turned on, in this process only:

    int8   the int8 grouped MoE GEMM (launchers/moe_gemm.py INT8); the faithful
           oracle reads the same switch, so a validation under it holds the
           int8 GEMM to its own rounding
    wgmma  the dense prefill GEMM from the quantised blocks (launchers/gemm.py
           WGMMA); its roundings are those of the path it replaces
    wgmma_moe  its grouped form for the MoE projections (WGMMA_GROUPED); the same

    python3 scripts/gpu/switched.py int8 -m harness.cli validate-catalog --backend cuda --model tiny-qwen3moe
    python3 scripts/gpu/switched.py int8 scripts/gpu/moe_stages.py tiny-gemma4moe
    python3 scripts/gpu/switched.py int8,wgmma -m engine bench MODEL.gguf -p 512 -n 0
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.backends.cuda.launchers import gemm, moe_gemm  # noqa: E402

SWITCHES = {"int8": (moe_gemm, "INT8"), "wgmma": (gemm, "WGMMA"), "wgmma_moe": (gemm, "WGMMA_GROUPED")}
USAGE = f"usage: switched.py SWITCH[,SWITCH...] (-m MODULE | SCRIPT) [ARGS...]; switches: {', '.join(SWITCHES)}"


def main() -> None:
    if len(sys.argv) < 3 or (sys.argv[2] == "-m" and len(sys.argv) < 4):
        sys.exit(USAGE)
    names = sys.argv[1].split(",")
    unknown = [n for n in names if n not in SWITCHES]
    if unknown:
        sys.exit(f"switched.py: no switch {', '.join(unknown)} ({USAGE})")
    os.environ["ANVIL_SWITCHES"] = ",".join(names)  # the processes it starts (a mutant's) too
    for n in names:
        module, attr = SWITCHES[n]
        setattr(module, attr, True)
    args = sys.argv[2:]
    if args[0] == "-m":
        module, sys.argv = args[1], [args[1], *args[2:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, sys.argv = args[0], args
        if not Path(script).is_file():
            sys.exit(f"switched.py: no script {script}")
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
