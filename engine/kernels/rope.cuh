// Rotary position embedding and the per-head Q/K RMSNorm, on one head: what
// rope.cu's kernels and the GEMV that forms the heads after its wait
// (gemv.cu GEMV_HEADS) compute.
//
// Same arithmetic as llama.cpp's rope_norm / rope_neox (architectures.md
// §0.3, ext_factor 0, attn_factor 1):
//   theta_base = pos * theta_scale^i            (theta_scale = base^(-2/n_rot), from the host)
//   theta      = freq_scale * (theta_base / freq_div[i])
//   x0' = x0*cos(theta) - x1*sin(theta),  x1' = x0*sin(theta) + x1*cos(theta)
// NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_rot/2); dims >= n_rot untouched.
// llama.cpp writes powf/sinf/cosf and builds with --use_fast_math, which turns
// them into __powf/__sinf/__cosf; we call those intrinsics explicitly so the
// reader sees what runs. __sinf/__cosf lose absolute accuracy as |theta| grows
// (≈|theta|·2^-22: ~1e-3 at position 4000), exactly as llama.cpp does.
//
// The host passes theta_scale = powf(freq_base, -2.0f/n_rot) computed in
// float, as llama.cpp's ggml_cuda_op_rope_impl does, rather than freq_base.
// Positions come from device memory (pos[t]): a replayed decode graph must
// see the current position, not the one at capture time.
#pragma once
#include "common.cuh"

// The two dims of pair i (< n_rot/2).
template <bool NEOX>
__device__ __forceinline__ int pair_lo(int i, int n_rot) { return NEOX ? i : 2 * i; }
template <bool NEOX>
__device__ __forceinline__ int pair_hi(int i, int n_rot) { return NEOX ? i + n_rot / 2 : 2 * i + 1; }

// Pair i's values (x0, x1) at position p, rotated. The fused multiply-adds are
// spelled out: left to the compiler, which product of x0*c - x1*s it fuses
// depends on the code around it, and every kernel that rotates (rope, the Q/K
// norms, the GEMV forming the heads) must round alike.
__device__ __forceinline__ float2 rotate(float x0, float x1, int p, int i, float theta_scale, float freq_scale,
                                         const float* freq_div) {
    const float theta_base = (float)p * __powf(theta_scale, (float)i);
    const float theta_extrap = freq_div ? theta_base / freq_div[i] : theta_base;
    const float theta = freq_scale * theta_extrap;
    const float c = __cosf(theta), s = __sinf(theta);
    return make_float2(fmaf(x0, c, -(x1 * s)), fmaf(x0, s, x1 * c));
}

// The arguments of a Q/K heads launch (launchers/rope.py Heads.args, in this
// order): q [T, n_head, head_dim] and k [T, n_head_kv, head_dim] in place,
// token t at position pos[t]; q_w and k_w [head_dim] the per-head RMSNorm's
// weights, or both null: RoPE only.
#define QK_HEADS_PARAMS                                                                                     \
    float *q, float *k, const int *pos, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, \
        float freq_scale, const float *freq_div, const float *q_w, const float *k_w, float qk_eps
#define QK_HEADS_ARGS q, k, pos, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, freq_div, q_w, k_w, qk_eps

// Head h (< n_head + n_head_kv; q's heads first, then k's) of token t, by one
// warp, in place: RMSNorm over the head with its weight (norm.cu's rms_norm:
// fp32 sum of squares, rsqrtf(sum/D + eps), (scale*x)*w; here the sum is one
// warp's), then RoPE. Every lane has read the whole head (the warp sum) before
// any writes, and each pair is one lane's, so no shared copy of the head is needed.
template <bool NEOX>
__device__ __forceinline__ void qk_head(int t, int h, int lane, QK_HEADS_PARAMS) {
    const bool is_q = h < n_head;
    float* xh = is_q ? q + ((size_t)t * n_head + h) * head_dim : k + ((size_t)t * n_head_kv + (h - n_head)) * head_dim;
    const float* w = is_q ? q_w : k_w;
    float scale = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += 32) ss += xh[i] * xh[i];
        scale = rsqrtf(warp_sum(ss) / (float)head_dim + qk_eps);
    }
    const int p = pos[t];
    for (int i = lane; i < n_rot / 2; i += 32) {
        const int i0 = pair_lo<NEOX>(i, n_rot), i1 = pair_hi<NEOX>(i, n_rot);
        float x0 = xh[i0], x1 = xh[i1];
        if (w) {
            x0 = (scale * x0) * w[i0];
            x1 = (scale * x1) * w[i1];
        }
        const float2 r = rotate(x0, x1, p, i, theta_scale, freq_scale, freq_div);
        xh[i0] = r.x;
        xh[i1] = r.y;
    }
    if (w)
        for (int i = n_rot + lane; i < head_dim; i += 32) xh[i] = (scale * xh[i]) * w[i];  // normalised only
}
