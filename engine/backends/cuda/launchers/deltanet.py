"""Launchers for deltanet.cu: the Gated DeltaNet layer's causal conv (with
its carried inputs), gates and delta rule (with its carried state)."""

from __future__ import annotations

from ....errors import AnvilError
from .. import launch
from ..device import DArray, Device

DR_WARPS = 8       # deltanet.cu: warps per delta_rule block (S_k rows split among them)
DR_C = 64          # deltanet.cu: tokens per chunk of delta_rule_chunked
CONV_TT = 16       # deltanet.cu: tokens per causal_conv thread
CHUNKED_MIN_T = 16  # from this many tokens on, the chunked form


def causal_conv(dev: Device, x: DArray, w: DArray, state: DArray, y: DArray) -> None:
    """y [T, C] = SiLU(causal depthwise conv of x [T, C] with w [C, K]), the
    last K-1 inputs carried in state [K-1, C] (read, then replaced)."""
    launch.check_f32(x, w, state, y)
    T, C = x.shape
    K = w.size // C
    if w.size != C * K or not 1 <= K <= 16 or state.size != (K - 1) * C or y.size != T * C:
        raise AnvilError(f"CUDA causal_conv: x {x.shape}, w {w.shape}, state {state.shape}, y {y.shape}")
    fn = launch.function(dev, "deltanet.cu", "causal_conv", {"CONV_K": K, "CONV_TT": CONV_TT})
    dev.launch(fn, (launch.ceil_div(C, 128), max(1, launch.ceil_div(T, CONV_TT))), (128,), [x, w, state, y, T, C])


def decay_gates(dev: Device, b: DArray, a: DArray, dt_bias: DArray, ssm_a: DArray, beta: DArray, g: DArray) -> None:
    """beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a: b, a, beta, g [T, H]; dt_bias, ssm_a [H]."""
    launch.check_f32(b, a, dt_bias, ssm_a, beta, g)
    H = dt_bias.size
    n = b.size
    assert a.size == beta.size == g.size == n and ssm_a.size == H and n % H == 0
    fn = launch.function(dev, "deltanet.cu", "decay_gates")
    dev.launch(fn, (max(1, min(launch.ceil_div(n, 256), 4 * dev.sm_count)),), (256,),
               [b, a, dt_bias, ssm_a, beta, g, n, H])


def chunked_smem(S_k: int) -> int:
    """delta_rule_chunked's dynamic shared memory: K and Q of a chunk, the
    block's 32 state columns, rhs/Delta and Q S0, A and P, G and beta."""
    return 4 * (2 * DR_C * (S_k + 1) + S_k * 32 + 2 * DR_C * 33 + 2 * DR_C * (DR_C + 1) + 2 * DR_C)


def delta_rule(dev: Device, q: DArray, k: DArray, v: DArray, g: DArray, beta: DArray, S: DArray, out: DArray,
               path: str | None = None) -> None:
    """The gated delta rule over T tokens, advancing S [H_v, S_k, S_v] in
    place: q, k [T, H_k, S_k], v [T, H_v, S_v], g, beta [T, H_v], out [T, H_v,
    S_v]; value head h reads key head h mod H_k. ``path``: "tokens" (the
    token loop; decode) or "chunked" (DR_C tokens at a time); None picks by T."""
    launch.check_f32(q, k, v, g, beta, S, out)
    T, H_k, S_k = q.shape
    _, H_v, S_v = v.shape
    if (k.shape != q.shape or v.shape[0] != T or g.size != T * H_v or beta.size != T * H_v
            or S.size != H_v * S_k * S_v or out.size != T * H_v * S_v or S_k % DR_WARPS or H_v % H_k):
        raise AnvilError(f"CUDA delta_rule: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
                         f"state {S.shape}, out {out.shape}")
    path = path or ("chunked" if T >= CHUNKED_MIN_T else "tokens")
    grid, args = (H_v, launch.ceil_div(S_v, 32)), [q, k, v, g, beta, S, out, T, H_k, H_v, S_v]
    if path == "tokens":
        fn = launch.function(dev, "deltanet.cu", "delta_rule", {"HEAD_K": S_k})
        dev.launch(fn, grid, (32 * DR_WARPS,), args)
        return
    assert path == "chunked", path
    shared = chunked_smem(S_k)
    if shared > 227 * 1024:
        raise AnvilError(f"CUDA delta_rule: key heads of {S_k} need {shared} bytes of shared memory per block "
                         f"in chunks of {DR_C} (at most {227 * 1024})")
    fn = launch.function(dev, "deltanet.cu", "delta_rule_chunked", {"HEAD_K": S_k}, shared=shared)
    dev.launch(fn, grid, (32 * DR_WARPS,), args, shared=shared)
