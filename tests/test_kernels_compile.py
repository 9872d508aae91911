"""Every kernel compiles with NVRTC (no GPU needed), and the compile cache is
keyed on everything that changes the machine code."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from engine.backends.cuda import compile as nvrtc


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANVIL_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("ANVIL_NO_COMPILE", raising=False)


# moe.cu: test_kernels_moe compiles it for every GEMV_ROWS its launcher uses
@pytest.mark.parametrize("name", [f for f in nvrtc.kernel_files() if f != "moe.cu"])
def test_every_kernel_compiles_for_sm90(name):
    defines = {"KV_F16": 1} if name == "attention.cu" else None
    assert len(nvrtc.compile_cubin(name, "sm_90", defines)) > 0


def test_decode_attention_tile_warps_override(monkeypatch):
    """A sweep's decode layouts (launchers/attention.py TILE_WARPS, V_EARLY,
    HEADS_PER_WARP): the launcher and attention.cu agree on the block, more
    than 8 warps is refused, and each compiles."""
    from engine.backends.cuda.launchers import attention
    from engine.errors import AnvilError

    assert attention.decode_layout(4) == (8, 2)  # the default: two heads a warp at GQA 4, four tile warps
    monkeypatch.setattr(attention, "TILE_WARPS", 2)
    assert attention.decode_layout(4) == (4, 2)
    monkeypatch.setattr(attention, "HEADS_PER_WARP", 1)
    with pytest.raises(AnvilError, match="over 8"):
        attention.decode_layout(8)
    assert len(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": 1, "GQA": 4, "DEC_TILE_WARPS": 2,
                                                             "DEC_HPW": 1, "DEC_V_EARLY": 0})) > 0
    monkeypatch.setattr(attention, "TILE_WARPS", None)
    monkeypatch.setattr(attention, "HEADS_PER_WARP", 4)  # one warp scores the 4 heads of each row it loads
    assert attention.decode_layout(4) == (8, 4) and attention.decode_layout(8) == (8, 4)
    assert len(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": 1, "GQA": 4, "DEC_HPW": 4})) > 0
    # fewer, longer splits (keys a split takes at least), more of the merge's loads at once; and a
    # layout with more outputs a thread than merge registers (one split's loads first)
    assert len(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": 1, "GQA": 4, "DEC_CHUNK": 256,
                                                             "DEC_MERGE_REGS": 80})) > 0
    assert len(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": 1, "GQA": 4, "HEAD_DIM": 512, "DEC_HPW": 4,
                                                             "DEC_TILE_WARPS": 1})) > 0
    # a register cap on the long-cache kernel (MAX_REGS: room for the next GEMV's block beside two of it)
    assert len(nvrtc.compile_cubin("attention.cu", "sm_90", {"KV_F16": 1, "GQA": 4, "HEAD_DIM": 128,
                                                             "DEC_MAX_REGS": 104})) > 0


def test_cache_key_covers_defines_arch_and_headers(tmp_path, monkeypatch):
    base = nvrtc.cache_key("argmax.cu", "sm_90")
    assert nvrtc.cache_key("argmax.cu", "sm_90", {"X": 1}) != base
    assert nvrtc.cache_key("argmax.cu", "sm_80") != base
    # an edit to an included header changes the key of every file including it
    kernels = tmp_path / "k"
    kernels.mkdir()
    for f in ("argmax.cu", "common.cuh"):
        (kernels / f).write_text((nvrtc.KERNELS_DIR / f).read_text())
    monkeypatch.setattr(nvrtc, "KERNELS_DIR", kernels)
    before = nvrtc.cache_key("argmax.cu", "sm_90")
    (kernels / "common.cuh").write_text((kernels / "common.cuh").read_text() + "\n// edit\n")
    assert nvrtc.cache_key("argmax.cu", "sm_90") != before


def test_cache_hit_and_no_compile_switch(monkeypatch):
    nvrtc.compile_cubin("argmax.cu", "sm_90")
    monkeypatch.setenv("ANVIL_NO_COMPILE", "1")
    assert nvrtc.compile_cubin("argmax.cu", "sm_90")  # cached: allowed
    with pytest.raises(nvrtc.AnvilError, match="ANVIL_NO_COMPILE"):
        nvrtc.compile_cubin("argmax.cu", "sm_90", {"SOMETHING_NEW": 1})


@pytest.mark.parametrize("damage", ["cut", "flip", "empty"])
def test_a_damaged_cache_entry_is_compiled_again(damage):
    fresh = nvrtc.compile_cubin("argmax.cu", "sm_90")
    (entry,) = nvrtc.cache_dir().glob("argmax-sm_90-*.cubin")
    data = entry.read_bytes()
    entry.write_bytes({"cut": data[: len(data) // 2], "flip": bytes([data[0] ^ 1]) + data[1:], "empty": b""}[damage])
    assert nvrtc.compile_cubin("argmax.cu", "sm_90") == fresh
    assert entry.read_bytes() == data  # repaired


def test_compile_error_carries_the_nvrtc_log(tmp_path, monkeypatch):
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k() { int x = ; }\n')
    monkeypatch.setattr(nvrtc, "KERNELS_DIR", tmp_path)
    with pytest.raises(nvrtc.CompileError, match=r"bad\.cu.*expected an expression"):
        nvrtc.compile_cubin("bad.cu", "sm_90")


def test_every_kernel_waits_for_the_previous_one_before_touching_memory():
    """Kernels are launched with programmatic dependent launch (common.cuh):
    a kernel that touched activations before pdl_wait() would race with the
    kernel before it. Each kernel body starts with KERNEL_START(), except the
    weight kernels (gemv.cu, moe.cu: ``WITH_LAYOUT_<type>`` into an impl; gemv_impl is gemv.cuh's),
    which prefetch only weights before their wait."""
    import re

    for name in nvrtc.kernel_files():
        src = (nvrtc.KERNELS_DIR / name).read_text()
        for m in re.finditer(r"__global__[^{;]*?(\w+)\s*\([^)]*\)\s*\{", src):
            body = src[m.end():m.end() + 400].lstrip(" \\\n")
            assert body.startswith("KERNEL_START();") or body.startswith("WITH_LAYOUT_"), \
                f"{name}: kernel {m.group(1)} does not start with KERNEL_START()"

    def before_wait(file, impl):
        src = (nvrtc.KERNELS_DIR / file).read_text()
        body = src[src.index(f"__device__ __forceinline__ void {impl}"):]
        return body[:body.index("pdl_wait();")]

    # dense: only the weight staging of the first step (stage_rows of W), no x / y / add access
    pre = before_wait("gemv.cuh", "gemv_impl")
    assert "x[" not in pre and "y[" not in pre and "add[" not in pre and "dot_rows" not in pre
    # experts: the gate/up kernel reads ids (the previous kernel's) only after its wait; the
    # down kernel stages the first expert's weights from ids two kernels back, nothing else
    pre = before_wait("moe.cu", "moe_rows_impl")
    assert "ids[" not in pre and "x[" not in pre and "stage_rows" not in pre
    pre = before_wait("moe.cu", "moe_down_impl")
    assert "h[" not in pre and "h +" not in pre and "add[" not in pre \
        and "weights[" not in pre and "dot_rows" not in pre


def _cuobjdump(cubin: bytes, *args: str) -> str:
    """cuobjdump's output for ``cubin`` (cuobjdump and the nvdisasm it runs, from
    the test extra's cuda-toolkit[cuobjdump,nvdisasm])."""
    spec = importlib.util.find_spec("nvidia")
    tools = [Path(p) / "cu13" / "bin" / "cuobjdump" for p in (spec.submodule_search_locations if spec else [])]
    tool = next((t for t in tools if t.is_file()), None)
    assert tool is not None and (tool.parent / "nvdisasm").is_file(), \
        "cuobjdump or nvdisasm missing: pip install 'cuda-toolkit[cuobjdump,nvdisasm]==13.*' (the test extra)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), *args, f.name], capture_output=True, text=True, check=True,
                              env={**os.environ, "NVDISASM_PATH": str(tool.parent)}).stdout


def _sass(cubin: bytes, function: str) -> list[str]:
    """The opcodes of ``function`` in ``cubin``, in order."""
    out = _cuobjdump(cubin, "-sass", "-fun", function)
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", out)


def _stack_bytes(cubin: bytes) -> dict[str, int]:
    """Each function's stack frame in bytes: arrays the compiler kept in local memory, and spills."""
    out = _cuobjdump(cubin, "--dump-resource-usage")
    return {m[0]: int(m[1]) for m in re.findall(r"Function (\w+):\s*\n\s*REG:\d+ STACK:(\d+)", out)}


@pytest.mark.parametrize("function, defines, copy", [
    ("gemv_q4_k", {"GEMV_ROWS": 16}, "LDGSTS"),                                          # per-warp staging
    ("gemv_q6_k", {"GEMV_ROWS": 4, "GEMV_BULK": 1, "GEMV_PASSES": 2}, "UBLKCP"),        # the bulk ring
    ("gemv_glu_silu_q4_k", {"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_GLU": 1, "GEMV_NORM": 1}, "UBLKCP"),
])
def test_gemv_weights_requested_before_the_pdl_wait(function, defines, copy):
    """The decode GEMVs ask for their first weights before waiting on the
    previous kernel (common.cuh: that overlap is what the PDL launch buys
    them). ptxas may move instructions, so the machine code is read: the
    weight copies (cp.async: LDGSTS; bulk: UBLKCP) come before the wait
    (griddepcontrol.wait: ACQBULK)."""
    ops = _sass(nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines}), function)
    assert "ACQBULK" in ops, f"{function}: no griddepcontrol.wait in its machine code"
    first_copy = next((i for i, op in enumerate(ops) if op.startswith(copy)), None)
    assert first_copy is not None and first_copy < ops.index("ACQBULK"), \
        f"{function} {defines}: the first {copy} is not before the PDL wait (ACQBULK)"


@pytest.mark.parametrize("defines", [{"GEMV_ROWS": 16}, {"GEMV_ROWS": 16, "GEMV_BULK": 1},
                                     {"GEMV_ROWS": 4, "GEMV_BULK": 1, "GEMV_PASSES": 2},
                                     {"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_GLU": 1, "GEMV_NORM": 1}],
                         ids=["warp", "bulk", "bulk-2-passes", "bulk-glu-norm"])
def test_decode_gemvs_keep_their_values_in_registers(defines):
    """No decode GEMV of a block type has a stack frame: an array the compiler
    cannot keep in registers (an index it cannot resolve, or a spill) puts a
    round trip through L1 on every unit of every row."""
    stacks = _stack_bytes(nvrtc.compile_cubin("gemv.cu", "sm_90", {"GEMV_XQ": 1, **defines}))
    names = [f"gemv_{'glu_silu_' if 'GEMV_GLU' in defines else ''}{t}" for t in
             ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")]
    assert {n: stacks.get(n) for n in names} == {n: 0 for n in names}
