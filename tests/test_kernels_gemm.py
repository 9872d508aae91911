"""The prefill GEMM from the quantised blocks on the warpgroup tensor cores
(gemm.cu via launchers/gemm.py, and the CUDA ``Ops`` prefill with
``launchers.gemm.WGMMA`` on) against NumPy.

CPU part: gemm.cu compiles for Hopper (sm_90a) with every kernel exported, no
spills, and nothing ptxas had to change in the asynchronous wgmma pipeline
(an injected ``wgmma.wait_group`` would serialise it); the launcher passes what
the kernel declares and its shared memory fits; bad shapes are refused in one
line; a tiny model's prefill takes the kernel exactly when the switch is on.

GPU part (@pytest.mark.gpu): random raw weights of every type the kernel
takes, outputs poisoned with NaN first, against bf16 weights and activations
summed in float64: the fp32 sums' tolerance.
Every failure message states the seed; ANVIL_KERNELS_SEED=<int> replays it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.backends.cuda import compile as nvrtc
from engine.backends.cuda import cubin, gemv_bench, launch
from engine.backends.cuda.launchers import gemm, moe_gemm
from engine.backends.cuda.recording import RecordingDevice
from engine.backends.numpy.faithful import bf16, from_bf16_bits
from engine.errors import AnvilError
from engine.quants import BLOCK, QType, dequantize

from test_kernels_core import SEED, assert_close, dev, device, param_kinds, poisoned, rng  # noqa: F401 (fixtures)

TYPES = sorted(gemm.TYPES)
gpu = pytest.mark.gpu


def kernel_name(t: QType, bm: int = 128) -> str:
    return f"gemm{'' if bm == 128 else bm}_{launch.TYPE_SUFFIX[t]}"


KERNELS = ([kernel_name(t) for t in TYPES] + [kernel_name(t, 256) for t in sorted(gemm.TYPES256)]
           + [f"gemm_grouped_{launch.TYPE_SUFFIX[t]}" for t in TYPES])


# ---- CPU ---------------------------------------------------------------------------


def test_gemm_compiles_for_hopper_without_serialised_wgmma():
    code = nvrtc.compile_cubin("gemm.cu", "sm_90")
    res = cubin.resources(code)
    assert set(res) == set(KERNELS)
    for name in KERNELS:
        assert res[name].local_bytes == 0, f"{name} spills ({res[name]})"
    log = nvrtc.compile_log("gemm.cu", "sm_90")
    assert "for 'sm_90a'" in log
    # C7510/C7517 and their kind: ptxas made a wgmma wait where the program has none
    changed = [line for line in log.splitlines() if re.search(r"C75\d\d|wgmma.*(serializ|inject)", line)]
    assert not changed, "ptxas changed the wgmma pipeline:\n" + "\n".join(changed)
    assert nvrtc.target("gemm.cu", "sm_90") == "sm_90a" and nvrtc.target("gemm.cu", "sm_100") == "sm_100"
    assert nvrtc.target("gemv.cu", "sm_90") == "sm_90"


def test_gemm_launcher_matches_kernel(monkeypatch):
    src = (nvrtc.KERNELS_DIR / "gemm.cu").read_text().replace("\\\n", " ")
    dense, grouped = (param_kinds(p) for p in re.findall(r"__launch_bounds__\(GEMM_THREADS, 1\) kernel\(\s*([^)]*)\)",
                                                         src))
    monkeypatch.setattr(gemm, "WGMMA", True)
    monkeypatch.setattr(gemm, "WGMMA_GROUPED", True)
    fd = RecordingDevice()
    T, K = 300, 4096
    for t in TYPES:
        n_el = K // BLOCK[t][0] * BLOCK[t][1]
        for widths in ([4096], [1024, 512], [4096, 1024, 1024]):
            W = fd.empty((sum(widths) * n_el,), np.uint8)
            assert gemm.takes(fd, t, K, widths)
            for bm in gemm.BMS if t in gemm.TYPES256 else (128,):
                gemm.gemm(fd, W, t, fd.empty((T, K), np.uint16), [fd.empty((T, w)) for w in widths], T, K, bm=bm)
        E, k, F = 128, 8, 768
        g = moe_gemm.Grouping.empty(fd.empty, T * k, E)
        assert gemm.takes_grouped(fd, t, K, F)
        gemm.grouped(fd, fd.empty((E * F * n_el,), np.uint8), t, fd.empty((T * k, K), np.uint16), g,
                     fd.empty((T * k, F)), K, F)
    assert {name for (_, name), *_ in fd.launches} == set(KERNELS)
    for (file, fn), grid, block, shared, kinds in fd.launches:
        want = grouped if "grouped" in fn else dense
        assert file == "gemm.cu" and kinds == want, f"{fn}: launcher passes {kinds}, kernel takes {want}"
        assert block == (gemm.THREADS, 1, 1) and 1 <= grid[0] < 2**31
        assert shared <= 227 * 1024, (fn, shared)
    # the largest staging (Q8_0: 8 blocks of 34 bytes a raw step) still fits beside the tiles, and the
    # largest of 256 tokens a block (Q5_K: 176 bytes a row) beside theirs
    assert gemm.smem(QType.Q8_0) == 1024 + 8 * 16384 + 2 * 128 * 288
    assert gemm.smem(QType.Q5_K, 256) == 1024 + 4 * 32768 + 3 * 16384 + 2 * 128 * 192 <= 227 * 1024
    assert gemm.smem(QType.Q6_K, 256) > 227 * 1024


def test_gemm_refuses_bad_shapes_in_one_line(monkeypatch):
    fd = RecordingDevice()
    x = fd.empty((4, 256), np.uint16)
    W = fd.empty((128 * 144,), np.uint8)
    with pytest.raises(AnvilError, match=r"no wgmma GEMM of 128 tokens a block for F16 weights \(it has Q4_0, "):
        gemm.gemm(fd, W, QType.F16, x, [fd.empty((4, 128))], 4, 256)
    with pytest.raises(AnvilError, match=r"no wgmma GEMM of 256 tokens a block for Q6_K weights \(it has Q4_0, "):
        gemm.gemm(fd, W, QType.Q6_K, x, [fd.empty((4, 128))], 4, 256, bm=256)
    with pytest.raises(AnvilError, match="n_in a multiple of 64, even output widths and T·n_in inside int, "
                                         "got n_in 256, widths"):
        gemm.gemm(fd, W, QType.Q4_K, x, [fd.empty((4, 127))], 4, 256)
    with pytest.raises(AnvilError, match="1 to 3 outputs, got 4"):
        gemm.gemm(fd, W, QType.Q4_K, x, [fd.empty((4, 32))] * 4, 4, 256)
    with pytest.raises(AnvilError, match=r"CUDA gemm Q4_K \[256 x 256\] for 4 tokens: W 18432 bytes"):
        gemm.gemm(fd, W, QType.Q4_K, x, [fd.empty((4, 256))], 4, 256)
    # the switch and the GPU decide as well as the shapes
    monkeypatch.setattr(gemm, "WGMMA", True)
    assert gemm.takes(fd, QType.Q4_K, 256, [128]) and not gemm.takes(fd, QType.Q4_K, 256, [127])
    assert not gemm.takes(fd, QType.Q8_0, 96, [128]) and not gemm.takes(fd, QType.BF16, 256, [128])
    monkeypatch.setattr(fd, "arch", "sm_80")
    assert not gemm.takes(fd, QType.Q4_K, 256, [128])


@pytest.mark.parametrize("on", [False, True], ids=["cublas", "wgmma"])
def test_prefill_takes_the_gemm_exactly_when_switched_on(on, monkeypatch):
    """tiny-qwen3's prefill on the recording device: with the switch on, each
    run of quantised projections stored back to back (Q/K/V, gate/up) is one
    gemm.cu launch reading the bf16 input its producer wrote, and no weight is
    dequantised to bf16 or goes through cuBLAS; off, the reverse."""
    from collections import Counter

    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.gguf_file import GGUFFile
    from engine.model import Model
    from harness import catalog

    monkeypatch.setattr(gemm, "WGMMA", on)
    dev, cublas = RecordingDevice(), RecordingCublas()
    calls = []
    cublas.gemm = lambda *a, **kw: calls.append(a)
    path = catalog.model_path("tiny-qwen3", progress=False)
    m = Model(path, backend="cuda", eager=True, device=dev, cublas=cublas)
    m.forward(list(range(1, 65)))
    counts = Counter(name for (_, name), *_ in dev.launches)
    gemms = sum(v for k, v in counts.items() if k.startswith("gemm_"))
    dequants = sum(v for k, v in counts.items() if k.startswith("dequant_"))
    gf = GGUFFile(path)
    runs = 0  # a run: the group's weights of one type stored back to back (Q4_K_M's V is Q6_K in some layers)
    for il in range(m.config.n_layer):
        for group in (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",)):
            types = [gf.tensor_type(f"blk.{il}.{t}.weight") for t in group]
            runs += 1 + sum(a != b for a, b in zip(types, types[1:]))
    assert (gemms, dequants, bool(calls)) == ((runs, 0, False) if on else (0, runs, True)), counts
    if on:
        assert counts["f32_to_bf16"] == 0, counts  # the inputs are the norms' and the GLU's own bf16 copies


@pytest.mark.parametrize("on", [False, True], ids=["moe_gemm", "wgmma"])
def test_moe_prefill_takes_the_grouped_gemm_exactly_when_switched_on(on, monkeypatch):
    """tiny-qwen3moe's prefill on the recording device: with the switch on,
    each expert projection (gate, up, down) of every layer is one
    gemm_grouped launch and moe_gemm's grouped GEMM never runs; off, the
    reverse."""
    from collections import Counter

    from engine.backends.cuda.recording import RecordingCublas, RecordingDevice
    from engine.model import Model
    from harness import catalog

    monkeypatch.setattr(gemm, "WGMMA_GROUPED", on)
    dev = RecordingDevice()
    m = Model(catalog.model_path("tiny-qwen3moe", progress=False), backend="cuda", eager=True, device=dev,
              cublas=RecordingCublas())
    m.forward(list(range(1, 65)))
    counts = Counter(name for (_, name), *_ in dev.launches)
    grouped = sum(v for n, v in counts.items() if n.startswith("gemm_grouped_"))
    theirs = sum(v for n, v in counts.items() if n.startswith("moe_gemm_"))
    n_moe = 3 * m.config.n_layer  # every layer of tiny-qwen3moe is MoE
    assert (grouped, theirs) == ((n_moe, 0) if on else (0, n_moe)), counts


def test_switches_reach_the_processes_a_run_starts():
    """scripts/gpu/switched.py turns a switch on in its process and, through
    ANVIL_SWITCHES, in those it starts (a mutant run's); unset, all are off."""
    import os
    import subprocess
    import sys

    code = ("from engine.backends.cuda.launchers import gemm, moe_gemm; "
            "print(gemm.WGMMA, gemm.WGMMA_GROUPED, moe_gemm.INT8)")
    env = {k: v for k, v in os.environ.items() if k != "ANVIL_SWITCHES"}
    run = lambda **e: subprocess.run([sys.executable, "-c", code], env={**env, **e}, capture_output=True,  # noqa: E731
                                     text=True, check=True).stdout.split()
    assert run() == ["False", "False", "False"]
    assert run(ANVIL_SWITCHES="wgmma_moe") == ["False", "True", "False"]
    assert run(ANVIL_SWITCHES="int8,wgmma") == ["True", "False", "True"]


# ---- GPU ---------------------------------------------------------------------------


CASES = [  # tokens, n_in, output widths: partial tiles of tokens and features, three outputs, one token
    (130, 512, [128, 64, 72]),
    (64, 768, [200]),
    (1, 256, [130]),
    (257, 1024, [384, 128]),
    (600, 512, [256]),
]


@gpu
@pytest.mark.parametrize("t,bm", [(t, 128) for t in TYPES] + [(t, 256) for t in sorted(gemm.TYPES256)],
                         ids=lambda v: v.name if isinstance(v, QType) else str(v))
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "accumulate"])
def test_gemm(dev, t, bm, case, accumulate, monkeypatch):
    monkeypatch.setattr(gemm, "WGMMA", True)
    T, K, widths = CASES[case]
    if not gemm.takes(dev, t, K, widths):
        pytest.skip(f"{dev.arch}: no wgmma GEMM")
    if BLOCK[t][0] == 32:
        K += 64  # a short last raw step (K not a multiple of 256)
    g = rng("gemm", t, bm, case, accumulate)
    N = sum(widths)
    raw = gemv_bench.random_weights(g, t, N, K)
    w = bf16(dequantize(raw, t, (N, K)).astype(np.float32)).astype(np.float64)  # the kernel's bf16 weights, exactly
    x = g.standard_normal((T, K), dtype=np.float32)
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)  # any bf16 bits: x truncated
    xf = from_bf16_bits(xb).astype(np.float64)
    base = [g.standard_normal((T, n), dtype=np.float32) for n in widths]
    outs = [dev.upload(b) if accumulate else poisoned(dev, (T, n)) for b, n in zip(base, widths)]
    gemm.gemm(dev, dev.upload(raw), t, dev.upload(xb), outs, T, K, accumulate=accumulate, bm=bm)
    want = xf @ w.T
    # exact bf16 products, fp32 accumulation over K terms: 2^-16 of sum |w x| leaves room (test_kernels_moe's bound)
    bound = 2.0**-16 * (np.abs(xf) @ np.abs(w).T)
    c0 = 0
    for o, b, n in zip(outs, base, widths):
        got = o.numpy() - (b if accumulate else 0)
        assert_close(got, want[:, c0:c0 + n], bound[:, c0:c0 + n] + (2.0**-22 * np.abs(b) if accumulate else 0),
                     0.0, f"gemm {t.name} bm={bm} T={T} K={K} widths={widths} output at column {c0}")
        c0 += n


@gpu
@pytest.mark.parametrize("t", [QType.Q4_K, QType.Q6_K, QType.Q8_0, QType.Q5_0], ids=lambda t: t.name)
def test_gemm_grouped(dev, t, monkeypatch):
    """The grouped expert GEMM: experts with no pairs, with fewer than a tile,
    with more than one tile (a block walks them with the same buffers), and a
    short last raw step (Q8_0, Q5_0), against each pair's product with its
    expert in float64 from the bf16 inputs."""
    from test_kernels_moe import expert_tensor

    monkeypatch.setattr(gemm, "WGMMA_GROUPED", True)
    if not gemm.takes_grouped(dev, t, 256, 160):
        pytest.skip(f"{dev.arch}: no wgmma GEMM")
    g = rng("gemm-grouped", t)
    T, E, k, n_out = 200, 6, 2, 160
    n_in = 512 if BLOCK[t][0] == 256 else 320
    raw, w3 = expert_tensor(g, t, E, n_out, n_in)
    ids = np.stack([g.choice(E - 1, k, replace=False) for _ in range(T)]).astype(np.int32)  # expert 5 idle
    ids[:150, 0] = 2  # expert 2: 150+ pairs, two tiles
    ids[:150, 1] = np.where(ids[:150, 1] == 2, 3, ids[:150, 1])
    P = T * k
    grouping = moe_gemm.Grouping.empty(dev.empty, P, E)
    moe_gemm.sort(dev, dev.upload(ids), grouping)
    pair_at = grouping.pair_at.numpy()
    x = g.standard_normal((P, n_in), dtype=np.float32)
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)
    xf = from_bf16_bits(xb).astype(np.float64)
    y = poisoned(dev, (P, n_out))
    gemm.grouped(dev, dev.upload(raw), t, dev.upload(xb), grouping, y, n_in, n_out)
    flat = ids.reshape(-1)
    wb = bf16(w3.astype(np.float32)).astype(np.float64)
    want = np.stack([wb[flat[p]] @ xf[i] for i, p in enumerate(pair_at)])
    bound = 2.0**-16 * np.stack([np.abs(wb[flat[p]]) @ np.abs(xf[i]) for i, p in enumerate(pair_at)])
    assert_close(y.numpy(), want, bound, 0.0, f"gemm_grouped {t.name}")
