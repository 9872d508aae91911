"""engine/backends/cuda/cubin.py: a kernel's registers, stack and static
shared memory read from its sm_90 cubin (NVRTC, no GPU), and the SM
arithmetic that says how many blocks fit, alone and beside another kernel's;
``python -m engine launches --resources`` over a decode step."""

from __future__ import annotations

import json

import pytest

from engine import cli
from engine.backends.cuda import compile as nvrtc
from engine.backends.cuda import cubin
from engine.errors import AnvilError
from harness import catalog

DECODE = {"GQA": 4, "HEAD_DIM": 128, "KV_F16": 1}


def test_resources_read_from_the_cubin():
    """ptxas's register count and stack frame, and the static shared memory:
    a register cap lowers the count and spills into the frame; the wide
    decode kernel's merge registers raise it; rms_norm declares a scratch."""
    plain = cubin.resources(nvrtc.compile_cubin("attention.cu", "sm_90", DECODE))["attention_decode"]
    capped = cubin.resources(nvrtc.compile_cubin("attention.cu", "sm_90",
                                                 {**DECODE, "DEC_MAX_REGS": 104}))["attention_decode"]
    wide = cubin.resources(nvrtc.compile_cubin("attention.cu", "sm_90",
                                               {**DECODE, "DEC_MERGE_REGS": 80}))["attention_decode"]
    assert 64 < plain.registers <= 255 and capped.registers <= 104 < plain.registers < wide.registers
    assert capped.local_bytes > plain.local_bytes
    norms = cubin.resources(nvrtc.compile_cubin("norm.cu", "sm_90", {}))
    assert set(norms) == {"rms_norm", "add_rms_norm"}
    # rms_norm declares float scratch[32], the whole of its static shared memory (the reserve is not its own)
    assert norms["rms_norm"].static_shared == 32 * 4 and norms["rms_norm"].local_bytes == 0
    argmax = cubin.resources(nvrtc.compile_cubin("argmax.cu", "sm_90", {}))
    assert argmax["argmax"].static_shared == 2 * 32 * 4  # a float and an int a warp
    assert argmax["argmax_blocks"].static_shared == 2 * 32 * 4 + 4  # and last_block's flag
    with pytest.raises(AnvilError, match="not a 64-bit ELF"):
        cubin.resources(b"not a cubin")


def test_blocks_an_sm_holds_alone_and_beside():
    """sm_90's limits: registers per sub-partition in 256-register warp
    units, shared memory with a 1 KB reserve a block, warps, blocks."""
    K = cubin.KernelResources
    wide = cubin.footprint(K(184, 0, 1040), 256, 10368)  # the wide decode attention: 23 units a warp
    long = cubin.footprint(K(128, 0, 1040), 256, 10368)  # the long-cache one
    wo = cubin.footprint(K(72, 0, 1152), 128, 36880)  # the Wo GEMV after it
    glu = cubin.footprint(K(72, 0, 1152), 128, 73792)  # gate/up after Wo
    assert (wide.warps, wide.warp_registers, wide.shared) == (8, 5888, 1040 + 10368 + 1024)
    assert cubin.blocks_beside(wide) == 1 and cubin.blocks_beside(long) == 2
    # two Wo blocks take the 2 x 2304 registers a sub-partition has left beside the wide kernel's block;
    # beside two long-cache blocks, none
    assert cubin.blocks_beside(wo, [(wide, 1)]) == 2 and cubin.blocks_beside(wo, [(long, 2)]) == 0
    assert cubin.blocks_beside(wo) == 5  # alone: shared memory (5 x 39056 of 228 KB)
    assert cubin.blocks_beside(glu) == 3 and cubin.blocks_beside(glu, [(wo, 2)]) == 2  # 2 x 39056 + 2 x 75968
    tiny = cubin.footprint(K(16, 0, 0), 32, 0)
    assert cubin.blocks_beside(tiny) == 32  # the block limit
    assert cubin.blocks_beside(cubin.footprint(K(16, 0, 0), 1024, 0)) == 2  # the warp limit


def test_launches_resources_plans_an_h200s_grids(capsys):
    """--resources: the step's distinct launches in order, each after the one
    before; grids planned from the cubins' occupancy (a resident-limited
    GEMV's grid is its blocks an SM times the SMs), not the recording
    device's stand-in answer of 2."""
    path = catalog.model_path("tiny-qwen3", progress=False)
    assert cli.main(["launches", str(path), "--resources", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["launches"]
    assert rows[0]["after"] is None and all(r["after"] in {p["launch"] for p in rows} for r in rows[1:])
    assert all(r["blocks_per_sm"] >= 1 and r["registers"] > 0 and r["shared"] >= 1024 for r in rows)
    assert all(0 <= r["beside_before"] <= r["blocks_per_sm"] for r in rows)
    head = [r for r in rows if r["launch"].startswith("gemv_q6_k") and r["after"].startswith("rms_norm")][-1]
    grid = int(head["launch"].split("(")[1].split(",")[0])
    assert grid == head["blocks_per_sm"] * 132 and head["blocks_per_sm"] != 2
    assert cli.main(["launches", str(path), "--resources"]) == 0
    assert "| launch | after | a step |" in capsys.readouterr().out
