"""scripts/gpu/profile_decode.py --summarize reads Nsight Compute's CSV
(kernel names, grids, durations with thousands separators) into the
per-kernel table the decode notes quote."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "profile_decode.py"

CSV = '''==PROF== Connected to process 581 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","581","python3.12","127.0.0.1","rms_norm","1","13","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","3,712"
"1","581","python3.12","127.0.0.1","gemv_q4_k","1","13","(128, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","9,312"
"2","581","python3.12","127.0.0.1","gemv_q4_k","1","13","(128, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","5.504"
"3","581","python3.12","127.0.0.1","gemv_q6_k","1","13","(128, 1, 1)","(9496, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","244,608"
'''


def test_summarize_ncu_csv(tmp_path):
    f = tmp_path / "ncu.csv"
    f.write_text(CSV)
    out = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(f)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "4 kernels, 263.1 us of kernel time in the step"
    head, q4k, norm = lines[2], next(ln for ln in lines if ln.startswith("gemv_q4_k")), lines[-1]
    assert lines[2].split()[:2] == ["gemv_q6_k", "(9496,"] and "244.6" in head
    assert q4k.split()[-4:] == ["2", "14.8", "7.41", "5.6"]  # two launches, 9.312 + 5.504 us
    assert norm.startswith("rms_norm")


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_decode", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_launch_bytes_from_the_launch_arguments():
    """A GEMV's weight rows (a GLU GEMV's 2*n_out), x and y; the decode
    attention's K and V rows of the visible positions; activations for the
    rest; nothing for the kernels whose reads are chosen on the device."""
    import numpy as np

    from engine.backends.cuda.device import DArray
    from engine.quants import QType, row_bytes

    prof = _script()
    f32 = np.dtype(np.float32)

    def arr(*shape, dtype=f32):
        return DArray(0x1000, shape, np.dtype(dtype), None)

    x, y = arr(4096), arr(12288)
    W = arr(12288 * row_bytes(QType.Q4_K, 4096), dtype=np.uint8)
    assert prof.launch_bytes("gemv_q4_k", [W, x, y, None, 4096, 12288], 0) == 12288 * 2304 + 4 * 4096 + 4 * 12288
    glu = prof.launch_bytes("gemv_glu_silu_q6_k", [W, x, arr(6144), 4096, 6144], 0)
    assert glu == 2 * 6144 * row_bytes(QType.Q6_K, 4096) + 4 * 4096 + 4 * 6144
    kc = arr(8192, 8, 128, dtype=np.float16)
    q, out = arr(1, 32, 128), arr(1, 32 * 128)
    att = prof.launch_bytes("attention_decode", [q, kc, kc, out, arr(99), arr(99), arr(8), arr(1), 32, 8, 0.1, 0], 4097)
    assert att == 2 * 4097 * 8 * 128 * 2 + 2 * 4 * 32 * 128
    null = ctypes.c_uint64(0)
    args = [q, kc, kc, out, arr(99), arr(99), arr(8), arr(1), 32, 8, 0.1, 0]
    assert prof.launch_bytes("attention_decode", args + [null, null], 4097) == att
    assert prof.launch_bytes("attention_decode", args + [arr(1, 1024), arr(1, 1024)], 4097) == att + 2 * (4096 + 2048)
    assert prof.launch_bytes("rms_norm", [x, arr(4096), arr(4096), 4096, 1e-6], 0) == 3 * 4 * 4096
    assert prof.launch_bytes("kv_store", [arr(1024), arr(1024), kc, kc, arr(1)], 0) == 2 * 4096 + 2 * 2048 + 4
    assert prof.launch_bytes("moe_glu_q4_k", [W, x, y], 0) is None


def test_summarize_with_bytes(tmp_path):
    f, js = tmp_path / "ncu.csv", tmp_path / "launches.json"
    f.write_text(CSV)
    js.write_text('[["rms_norm", "(1, 1, 1)", 49152], ["gemv_q4_k", "(512, 1, 1)", 9437184], '
                  '["gemv_q4_k", "(512, 1, 1)", 9437184], ["gemv_q6_k", "(9496, 1, 1)", null]]')
    out = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(f), "--launches", str(js)],
                         capture_output=True, text=True, check=True).stdout
    q4k = next(ln for ln in out.splitlines() if ln.startswith("gemv_q4_k")).split()
    assert q4k[-2:] == ["9.437", "1274"]  # 2 x 9.44 MB in 14.816 us
    assert next(ln for ln in out.splitlines() if ln.startswith("gemv_q6_k")).split()[-2:] == ["-", "-"]
    js.write_text('[["gemv_q4_k", "(512, 1, 1)", 1]]')  # not the CSV's kernels: refused
    assert subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(f), "--launches", str(js)],
                          capture_output=True, text=True).returncode != 0


def test_launch_bytes_covers_a_real_decode_step():
    """Every launch of tiny-qwen3's decode step (on the recording device) gets
    a byte count but the row gather; its GEMVs read what the family says a
    token reads (bytes_per_token: the weights), within their x and y."""
    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model
    from engine.models import family
    from harness import catalog

    prof = _script()
    dev = RecordingDevice()
    m = Model(catalog.model_path("tiny-qwen3", progress=False), backend="cuda", eager=True, device=dev,
              cublas=RecordingCublas())
    m.forward([1, 2, 3])
    launched, launch = [], dev.launch

    def recording(fn, grid, block, args, shared=0):
        launched.append((fn[1], args))
        return launch(fn, grid, block, args, shared)

    dev.launch = recording
    m.decode_next(4)
    nbytes = {name: prof.launch_bytes(name, args, m.pos) for name, args in launched}
    assert [n for n, b in nbytes.items() if b is None] == ["get_rows_q6_k"]
    gemv = sum(prof.launch_bytes(n, a, m.pos) for n, a in launched if n.startswith("gemv_"))
    weights = family(m.config.arch).bytes_per_token(m.gguf, m.config)
    assert weights < gemv < 1.05 * weights


SWEEP = SCRIPT.parent / "attention_decode_sweep.py"


@pytest.mark.gpu
def test_attention_decode_sweep_times_and_compares_layouts():
    """One shape, one depth, the default layout and two warps per head, each
    with V requested late and early, one or four heads a warp, splits of
    any length or of 256 keys at least, and the launcher's wide kernel or
    not (a cache of 4096 rows takes it): a row each, all timed, every output
    as the first's (other sums)."""
    out = subprocess.run([sys.executable, str(SWEEP), "--shape", "qwen3-8b", "--depth", "1024", "--blocks-per-sm", "4",
                          "--tile-warps", "0", "2", "--v-early", "0", "1", "--heads-per-warp", "0", "4",
                          "--min-chunk", "0", "256", "--wide", "0", "1", "--n-ctx", "4096"],
                         capture_output=True, text=True, check=True).stdout
    rows = [ln.split("|")[1:-1] for ln in out.splitlines() if ln.startswith("| qwen3-8b")]
    assert [tuple(c.strip() for c in r[3:9]) for r in rows] == [
        (tw, ve, hpw, mc, "default", wd) for tw in ("default", "2") for ve in ("0", "1") for hpw in ("default", "4")
        for mc in ("default", "256") for wd in ("0", "1")]
    for r in rows:
        assert float(r[10]) > 0 and float(r[12]) < 1e-5, r
    # the wide kernel: a block an SM, so fewer splits than four blocks an SM
    assert max(int(r[9]) for r in rows if r[8].strip() == "1") < min(int(r[9]) for r in rows if r[8].strip() == "0")


def _variants_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_variants", SCRIPT.parent / "decode_variants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_leave_out_variants_partition_a_decode_step():
    """scripts/gpu/decode_variants.py's kernels left out, on the kernels of a
    real decode step (counted on the CPU): each variant leaves out something,
    the two GEMV variants split the GEMVs, and "every GEMV" and "all but
    GEMVs" split the step."""
    from engine.backends.cuda.recording import decode_launches
    from harness import catalog

    mod = _variants_script()
    counts, _ = decode_launches(catalog.model_path("tiny-qwen3", progress=False))
    kernels = set(counts)

    def out(label):
        return {k for k in kernels if mod.left_out(mod.LEAVE_OUT[label], k)}

    assert not {k for k in kernels if mod.left_out(None, k)}
    for label in mod.LEAVE_OUT:
        if label != "add_rms_norm":  # the llama family adds its residuals inside the Wo and W_down GEMVs
            assert out(label), label
    glu, other, every, rest = out("GLU GEMV"), out("GEMV (not GLU)"), out("every GEMV"), out("all but GEMVs")
    assert glu | other == every and not glu & other and all(k.startswith("gemv_glu") for k in glu)
    assert every | rest == kernels and not every & rest
    assert "attention_decode" in out("attention_decode") and out("rms_norm") == {"rms_norm"}
    # a launch is named with its grid (--each tells a type's projections apart); the variants still match
    name = mod.launch_name("gemv_q4_k", (256,))
    assert name == "gemv_q4_k (256, 1, 1)" and mod.left_out(mod.LEAVE_OUT["GEMV (not GLU)"], name)
    assert not mod.left_out(mod.LEAVE_OUT["rms_norm"], mod.launch_name("add_rms_norm", (1,)))


def test_knob_variants():
    """--knob MODULE.NAME=V1,V2: a variant per value, the launcher module's
    attribute and the value as a Python literal; knobs joined with + are one
    variant, with a kernel edit too where one part is edit=NAME; a wrong
    module, name or edit is a one-line error."""
    from engine.backends.cuda.launchers import attention, gemv

    mod = _variants_script()
    vs = mod.parse_knob("gemv.WARPS_PER_SM=8,24")
    assert [v.label for v in vs] == ["gemv.WARPS_PER_SM=8", "gemv.WARPS_PER_SM=24"]
    assert [v.knob for v in vs] == [((gemv, "WARPS_PER_SM", 8),), ((gemv, "WARPS_PER_SM", 24),)]
    assert mod.parse_knob("attention.V_EARLY=False")[0].knob == ((attention, "V_EARLY", False),)
    both = mod.parse_knob("attention.MIN_CHUNK=256+attention.TILE_WARPS=2")
    assert [v.knob for v in both] == [((attention, "MIN_CHUNK", 256), (attention, "TILE_WARPS", 2))]
    from engine.backends.cuda.launchers import norm

    edit = "rms_norm: next kernel before its wait"
    [with_edit] = mod.parse_knob(f"norm.MAX_THREADS=256+edit={edit}")
    assert with_edit.knob == ((norm, "MAX_THREADS", 256),) and with_edit.edit == edit
    import engine.backends.cuda as backend

    assert mod.parse_knob("backend.HEADS_IN_GEMV=False")[0].knob == ((backend, "HEADS_IN_GEMV", False),)
    for bad, says in (("gemv.NO_SUCH=1", "has no NO_SUCH"), ("nomodule.X=1", "MODULE.NAME"), ("gemv", "MODULE.NAME"),
                      ("gemv.WARPS_PER_SM=8,24+attention.MIN_CHUNK=256", "one value a knob"),
                      (f"norm.MAX_THREADS=256+edit={edit}+edit={edit}", "at most one edit"),
                      ("norm.MAX_THREADS=256+edit=no such edit", "expected 'all' or one of")):
        with pytest.raises(SystemExit, match=says):
            mod.parse_knob(bad)


def test_a_refused_knob_value_is_reported_and_the_rest_timed(capsys):
    """A knob value the launchers refuse (an AnvilError: a decode layout over 8
    warps) is dropped with its reason; the other variants still get every
    round, the warm-up round untimed. A refusal of the step itself is an error."""
    from engine.errors import AnvilError

    mod = _variants_script()
    variants = [mod.Variant("whole step")] + mod.parse_knob("attention.TILE_WARPS=2,8")
    calls = []

    def run(v):
        calls.append(v.label)
        if v.label.endswith("=8"):
            raise AnvilError("CUDA attention: 8 tile warps x 2 head warps is over 8 (GQA 4)")
        return 100.0 + len(calls)

    times, refused = mod.time_variants(variants, 2, run, lambda: [mod.Variant("extra", leave_out="^x$")])
    assert refused == {"attention.TILE_WARPS=8": "CUDA attention: 8 tile warps x 2 head warps is over 8 (GQA 4)"}
    assert [v.label for v in variants] == ["whole step", "attention.TILE_WARPS=2", "extra"]
    assert {k: len(t) for k, t in times.items()} == {"whole step": 2, "attention.TILE_WARPS=2": 2, "extra": 2}
    assert calls.count("attention.TILE_WARPS=8") == 1
    # every time as it is taken, on stderr (a run cut short still says what it measured)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 8 and err[0] == "round 0 (warm-up, dropped): whole step: 101.0 us a step"
    assert err[-1] == "round 2: extra: 109.0 us a step"

    def broken(v):
        raise AnvilError("no such model")

    with pytest.raises(AnvilError):
        mod.time_variants([mod.Variant("whole step")], 1, broken)


def test_kernel_edits_apply_once_and_compile():
    """decode_variants.py's kernel edits (--edit): each old text is in its
    kernel file exactly once, and the edited kernels compile (NVRTC, no GPU)
    for the decode shapes of qwen3-8b; a wrong name is a one-line error."""
    from engine.backends.cuda import compile as nvrtc

    mod = _variants_script()
    assert [v.edit for v in mod.parse_edit("all")] == list(mod.EDITS)
    with pytest.raises(SystemExit, match="expected 'all' or one of"):
        mod.parse_edit("no such edit")
    builds = {"attention.cu": ("attention.cu", {"KV_F16": 1, "HEAD_DIM": 128, "GQA": 4}),
              "gemv.cuh": ("gemv.cu", {"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_PASSES": 1, "GEMV_XQ": 1}),
              "argmax.cu": ("argmax.cu", {}), "common.cuh": ("norm.cu", {}), "norm.cu": ("norm.cu", {}),
              "rope.cu": ("rope.cu", {})}
    for name, (file, *edits) in mod.EDITS.items():
        text = (nvrtc.KERNELS_DIR / file).read_text()
        for old, new in edits:
            assert text.count(old) == 1, (name, old)
        compiled, defines = builds[file]
        with nvrtc.edited_kernels(file, *edits):
            edited = (nvrtc.KERNELS_DIR / file).read_text()
            assert all(old not in edited or old in new for old, new in edits), name
            assert len(nvrtc.compile_cubin(compiled, "sm_90", defines)) > 0, name
        assert (nvrtc.KERNELS_DIR / file).read_text() == text  # undone on exit


def test_also_without_pairs_the_whole_step_and_each_edit():
    """--also-without LABEL: the whole step and each edit again with LABEL's
    launches left out (the edit kept), not the knob or leave-out variants; a
    label not in LEAVE_OUT is a one-line error."""
    mod = _variants_script()
    edit = next(iter(mod.EDITS))
    base = [mod.Variant("whole step"), mod.Variant("rms_norm", leave_out=mod.LEAVE_OUT["rms_norm"]),
            mod.Variant("k=1", knob=((None, "K", 1),)), *mod.parse_edit(edit)]
    extra = mod.also_without(base, ["attention_decode"])
    assert [(v.label, v.leave_out, v.edit) for v in extra] == [
        ("whole step without attention_decode", mod.LEAVE_OUT["attention_decode"], None),
        (f"{edit} without attention_decode", mod.LEAVE_OUT["attention_decode"], edit)]
    with pytest.raises(SystemExit, match="--also-without 'nothing': expected one of"):
        mod.also_without(base, ["nothing"])


def test_variants_size_the_cache_as_the_bench(monkeypatch):
    """decode_variants.py times the step a bench at that depth runs: its
    cache is engine bench's (bench_ctx: depth + the longer test, the model's
    default at depth 0), since the decode attention's split plan follows the
    cache size; a --ctx too small for the steps is a one-line error."""
    from engine.backends.cuda.launchers import attention
    from engine.bench import bench_ctx

    assert bench_ctx(0) is None and bench_ctx(4096) == 4608 and bench_ctx(4096, 0, 128) == 4224
    # the plans differ: qwen3-8b's 8 KV heads at GQA 4 take the wide kernel at 4224 rows, not at 4608
    assert attention.decode_plan(132, 1, 8, 4224, 4, 128, True)[1] is not None
    assert attention.decode_plan(132, 1, 8, 4608, 4, 128, True)[1] is None
    mod = _variants_script()
    monkeypatch.setattr(sys, "argv", ["decode_variants.py", "model.gguf", "--depth", "4096", "--ctx", "4100"])
    with pytest.raises(SystemExit, match="--ctx 4100: depth 4096 and 128 steps need 4232 rows"):
        mod.main()


def _trace_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_trace", SCRIPT.parent / "decode_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trace_compiles_into_every_kernel_file():
    """compile.TRACE builds every kernel file with ANVIL_TRACE (NVRTC, no
    GPU): each cubin then holds the anvil_trace pointer device.py sets, the
    cache keys differ from the untraced build's, and TRACE off is the default."""
    from engine.backends.cuda import compile as nvrtc

    assert nvrtc.TRACE is False
    builds = {"norm.cu": {}, "argmax.cu": {}, "rope.cu": {},
              "attention.cu": {"KV_F16": 1, "HEAD_DIM": 128, "GQA": 4},
              "gemv.cu": {"GEMV_ROWS": 16, "GEMV_BULK": 1, "GEMV_PASSES": 1, "GEMV_XQ": 1}}
    for file, defines in builds.items():
        plain = nvrtc.cache_key(file, "sm_90", defines)
        nvrtc.TRACE = True
        try:
            assert nvrtc.cache_key(file, "sm_90", defines) != plain
            assert b"anvil_trace" in nvrtc.compile_cubin(file, "sm_90", defines), file
        finally:
            nvrtc.TRACE = False
        assert b"anvil_trace" not in nvrtc.compile_cubin(file, "sm_90", defines), file


def test_trace_segments_steps_and_reports_what_each_launch_held():
    """decode_trace.py: records of whole steps are checked against the
    step's launch grids in order; each launch holds the step to the next
    record (the last one to the next step's first); the table sums a name's
    launches in a step, per part of the steps and over all, with the step's
    total last. A record missing or of another grid is a one-line error."""
    mod = _trace_script()
    grids = [(2, 1, 1), (17, 8, 1), (256, 1, 1), (17, 8, 1)]
    names = ["get_rows (2, 1, 1)", "attention_decode (17, 8, 1)", "gemv_q4_k (256, 1, 1)",
             "attention_decode (17, 8, 1)"]
    # 3 steps of 10 us: get_rows 1, attention 2 + s (the context grows), gemv 4, attention 3 - s
    t, recs = 0, []
    for s in range(3):
        for g, d in zip(grids, [1000, 2000 + 1000 * s, 4000, 3000 - 1000 * s]):
            recs.append((t, mod.grid_word(g)))
            t += d
    records = np.array(recs, np.uint64)
    times = mod.segment(records, grids)
    assert times.shape == (3, 4)
    us = mod.held(times)
    assert us.tolist() == [[1, 2, 4, 3], [1, 3, 4, 2]]
    text = mod.table(us, names, 2)
    lines = text.splitlines()
    assert lines[0] == "| launch | a step | steps 1-1 | steps 2-2 | all steps | a launch |"
    assert lines[2] == "| attention_decode (17, 8, 1) | 2 | 5.0 | 5.0 | 5.0 | 2.50 |"
    assert lines[3] == "| gemv_q4_k (256, 1, 1) | 1 | 4.0 | 4.0 | 4.0 | 4.00 |"
    assert lines[-1] == "| whole step | 4 | 10.0 | 10.0 | 10.0 |  |"
    with pytest.raises(SystemExit, match="not whole steps of 4 launches"):
        mod.segment(records[:-1], grids)
    swapped = records.copy()
    swapped[5, 1] = mod.grid_word((256, 1, 1))
    with pytest.raises(SystemExit, match="step 1 launch 1: grid word 0x100"):
        mod.segment(swapped, grids)


@pytest.mark.gpu
def test_trace_of_a_real_decode(monkeypatch, capsys):
    """decode_trace.py on a GPU: every launch of every traced step recorded,
    in order and with its grid (segment() would stop the script otherwise),
    the traced kernels loaded beside the untraced ones; an edit's run
    compared beside main's."""
    from harness import catalog

    mod = _trace_script()
    path = catalog.model_path("tiny-qwen3", progress=False)
    monkeypatch.setattr(sys, "argv", ["decode_trace.py", str(path), "--steps", "8", "--parts", "2", "--ctx", "256",
                                      "--edit", "KERNEL_START: next kernel before the wait"])
    mod.main()
    out = capsys.readouterr().out
    assert "us a step untraced" in out and "| whole step |" in out and "| attention_decode (" in out
    assert "| launch | main | KERNEL_START: next kernel before the wait | Δ |" in out


def test_trace_compares_variants_slot_by_slot():
    """decode_trace.py --knob/--edit: each launch's µs a step in each run
    beside the first run's, with the difference; a launch only one run has
    (a knob changed its grid) gets blanks, not a wrong difference."""
    mod = _trace_script()
    main = (np.array([[1.0, 2.0, 4.0], [1.0, 4.0, 4.0]]), ["a (1, 1, 1)", "b (2, 1, 1)", "c (3, 1, 1)"])
    other = (np.array([[1.0, 1.5, 3.0], [1.0, 2.5, 3.0]]), ["a (1, 1, 1)", "b (4, 1, 1)", "c (3, 1, 1)"])
    lines = mod.compare({"main": main, "k=1": other}).splitlines()
    assert lines[0] == "| launch | main | k=1 | Δ |"
    assert lines[2] == "| c (3, 1, 1) | 4.0 | 3.0 | -1.0 |"
    assert lines[3] == "| b (2, 1, 1) | 3.0 |  |  |"
    assert "| b (4, 1, 1) |  | 2.0 |  |" in lines
    assert lines[-1] == "| whole step | 8.0 | 6.0 | -2.0 |"
