"""Launcher for gemm.cu: the prefill GEMMs that read the quantised weight
blocks themselves, on Hopper's warpgroup tensor cores: a dense run of
projections (``gemm``, instead of dequantising the weights to a bf16 scratch
matrix for cuBLAS: dequant.py + cublas.py) and the Mixture-of-Experts grouped
projection (``grouped``, instead of moe_gemm.py's grouped GEMM).

``WGMMA`` switches the dense prefill onto ``gemm`` (``Ops._gemms``),
``WGMMA_GROUPED`` the MoE projections onto ``grouped`` (``Ops._grouped``).
Both off (reports/notes/prefill-wgmma-2026-12-05.md): on an H100 the dense
form measured slower than dequantisation + cuBLAS; the grouped one faster
than moe_gemm's, and on once every MoE file is validated with it."""

from __future__ import annotations

from ....errors import AnvilError
from ....quants import BLOCK, QType, row_bytes
from .. import launch
from ..device import DArray, Device
from .moe import check_experts

WGMMA = launch.switched_on("wgmma")
WGMMA_GROUPED = launch.switched_on("wgmma_moe")
BN = 128         # gemm.cu GEMM_BN: features a block
BMS = (128, 256) # tokens a block: gemm_<t> (MT 1) and gemm256_<t> (MT 2)
BK = 64          # gemm.cu GEMM_BK: columns a sub-step
THREADS = 256    # gemm.cu GEMM_THREADS
RAWK = 256       # gemm.cu QGemmShape::RAWK: columns of raw weight bytes a copy step
A_SLOTS = 4      # gemm.cu GEMM_A_SLOTS; B's: QGemmShape::B_SLOTS
MAX_OUTS = 3     # outputs one launch splits its columns into
TYPES = frozenset({QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K})
# gemm256_<t>: the types whose raw step fits in shared memory beside the 256-token A buffers
TYPES256 = frozenset({QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q4_K, QType.Q5_K})
ARCH = "sm_90"   # wgmma: Hopper only (compile.ARCH_SPECIFIC builds gemm.cu for sm_90a)


def smem(qtype, bm: int = 128) -> int:
    """gemm.cu QGemmShape<Dq, MT>::SMEM: the A and B tile buffers, two raw
    steps of BN rows, and 1024 bytes to align the base to the swizzle's period."""
    qk, nbytes = BLOCK[QType(int(qtype))]
    span = (RAWK // qk * nbytes + 30) // 16 * 16
    b_slots = 4 if bm == 128 else 3
    return 1024 + A_SLOTS * bm * BK * 2 + b_slots * BN * BK * 2 + 2 * BN * span


def takes(dev: Device, qtype, n_in: int, widths) -> bool:
    """Whether a run of ``qtype`` weights of ``n_in`` columns and these output
    widths goes through ``gemm`` (the switch on, a Hopper GPU, a block type,
    whole sub-steps, outputs of even widths)."""
    return (WGMMA and dev.arch == ARCH and QType(int(qtype)) in TYPES and n_in % BK == 0
            and all(w % 2 == 0 for w in widths))


def gemm(dev: Device, W: DArray, qtype, x: DArray, outs: list[DArray], T: int, n_in: int,
         accumulate: bool = False, bm: int = 128) -> None:
    """outs = x · Wᵀ split by columns: W [N, n_in] raw blocks (N = the outputs'
    widths summed, at most MAX_OUTS of them, each [T, width] fp32, each width
    even), x [T, n_in] bf16 bits; bf16 weights (as dequant_bf16 rounds them),
    fp32 sums. ``accumulate``: added to what the outputs hold. ``bm``: tokens
    a block (256: the types of TYPES256)."""
    qt = launch.weight_type(qtype, "gemm")
    types = TYPES if bm == 128 else TYPES256 if bm == 256 else frozenset()
    if qt not in types:
        raise AnvilError(f"CUDA gemm: no wgmma GEMM of {bm} tokens a block for {qt.name} weights (it has "
                         f"{', '.join(sorted(t.name for t in types)) or 'none'})")
    if not 1 <= len(outs) <= MAX_OUTS:
        raise AnvilError(f"CUDA gemm: 1 to {MAX_OUTS} outputs, got {len(outs)}")
    widths = [o.shape[-1] for o in outs]
    N = sum(widths)
    if n_in % BK or any(w % 2 for w in widths) or not 1 <= T * n_in < 2**31:
        raise AnvilError(f"CUDA gemm: needs n_in a multiple of {BK}, even output widths and T·n_in inside int, "
                         f"got n_in {n_in}, widths {widths}, {T} tokens")
    launch.check_f32(*outs)
    short = any(o.size < T * w for o, w in zip(outs, widths))
    if W.nbytes < N * row_bytes(qt, n_in) or x.nbytes < 2 * T * n_in or short:
        raise AnvilError(f"CUDA gemm {qt.name} [{N} x {n_in}] for {T} tokens: W {W.nbytes} bytes, "
                         f"x {x.nbytes} bytes, outputs {[o.shape for o in outs]}")
    launch.aligned(W, "W")  # Q4_K/Q5_K blocks then lie on 16-byte granules in shared memory too
    launch.aligned(x, "x")
    for o in outs:
        launch.aligned(o, "an output", 8)
    ys = list(outs) + [outs[-1]] * (MAX_OUTS - len(outs))
    n0 = widths[0]
    n1 = widths[1] if len(widths) > 1 else 0
    shared = smem(qt, bm)
    fn = launch.function(dev, "gemm.cu", f"gemm{'' if bm == 128 else bm}_{launch.TYPE_SUFFIX[qt]}", shared=shared)
    grid = (launch.ceil_div(T, bm) * launch.ceil_div(N, BN),)
    dev.launch(fn, grid, (THREADS,), (W, x, *ys, n0, n1, T, N, n_in, int(accumulate)), shared=shared)


def takes_grouped(dev: Device, qtype, n_in: int, n_out: int) -> bool:
    """Whether a grouped expert projection goes through ``grouped`` (its switch
    on, a Hopper GPU, a block type, whole sub-steps, an even width)."""
    return (WGMMA_GROUPED and dev.arch == ARCH and QType(int(qtype)) in TYPES and n_in % BK == 0
            and n_out % 2 == 0)


def grouped(dev: Device, W: DArray, qtype, xs: DArray, g, y: DArray, n_in: int, n_out: int) -> None:
    """y[i] = W[expert of sorted pair i]·xs[i] for all P pairs of ``g``
    (moe_gemm.Grouping): xs [P, n_in] bf16 bits, y [P, n_out] f32; the
    numerics of ``gemm``."""
    qt = launch.weight_type(qtype, "gemm_grouped")
    if qt not in TYPES:
        raise AnvilError(f"CUDA gemm_grouped: no wgmma GEMM for {qt.name} weights (it has "
                         f"{', '.join(sorted(t.name for t in TYPES))})")
    eb = check_experts("gemm_grouped", W, qt, g.n_expert, n_out, n_in)
    if n_in % BK or n_out % 2 or not g.P * n_in < 2**31:
        raise AnvilError(f"CUDA gemm_grouped: needs n_in a multiple of {BK}, n_out even and P·n_in inside int, "
                         f"got n_in {n_in}, n_out {n_out}, {g.P} pairs")
    launch.check_f32(y)
    if xs.nbytes < 2 * g.P * n_in or y.size < g.P * n_out:
        raise AnvilError(f"CUDA gemm_grouped: xs {xs.nbytes} bytes, y {y.shape} for {g.P} pairs [{n_out} x {n_in}]")
    launch.aligned(W, "W")
    launch.aligned(xs, "xs")
    launch.aligned(y, "y", 8)
    shared = smem(qt)
    fn = launch.function(dev, "gemm.cu", f"gemm_grouped_{launch.TYPE_SUFFIX[qt]}", shared=shared)
    dev.launch(fn, (launch.ceil_div(n_out, BN), g.n_expert), (THREADS,),
               (W, eb, xs, g.offsets, y, n_out, n_in), shared=shared)
