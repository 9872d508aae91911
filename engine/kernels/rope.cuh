// RoPE of one pair and the per-head RMSNorm with RoPE of qwen3-style
// attention: rope.cu's, and the decode attention's, which forms its query
// heads and the step's key head itself in registers (attention.cu
// norm_rope_lane: the same angles, its own layout of the sums).
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
#pragma once
#include "common.cuh"

// (cos, sin) of pair i's angle at position p.
__device__ __forceinline__ float2 rope_cos_sin(int p, int i, float theta_scale, float freq_scale,
                                               const float* freq_div) {
    const float theta_base = (float)p * __powf(theta_scale, (float)i);
    const float theta_extrap = freq_div ? theta_base / freq_div[i] : theta_base;
    const float theta = freq_scale * theta_extrap;
    return make_float2(__cosf(theta), __sinf(theta));
}

// Pair i (< n_rot/2) of a head at position p: read from src, rotated into dst
// (the same buffer, or a shared-memory copy of the head and its global row).
template <bool NEOX>
__device__ __forceinline__ void rotate_pair(const float* src, float* dst, int p, int i, int n_rot, float theta_scale,
                                            float freq_scale, const float* freq_div) {
    const float2 cs = rope_cos_sin(p, i, theta_scale, freq_scale, freq_div);
    const float c = cs.x, s = cs.y;
    const int i0 = NEOX ? i : 2 * i;
    const int i1 = NEOX ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = src[i0], x1 = src[i1];
    dst[i0] = x0 * c - x1 * s;
    dst[i1] = x0 * s + x1 * c;
}

// RoPE's parameters as the host passes them (launchers/rope.py).
struct Rope {
    int n_rot;
    float theta_scale, freq_scale;
    const float* freq_div;  // [n_rot/2] divisors (llama3 rope_freqs, gemma4's full layers) or null
    int neox;               // NEOX pairs, else NORM
};

// One warp: head x [head_dim] (global) through RMSNorm with weight w, then
// RoPE at position p, into dst (global, the head itself, or shared memory).
// xs: head_dim floats of shared memory, the warp's own (may be dst).
// Arithmetic as rms_norm (norm.cu: fp32 sum of squares, rsqrtf(sum/D +
// eps), (scale*x)*w; here the sum is one warp's).
__device__ __forceinline__ void norm_rope_head(const float* x, float* xs, float* dst, const float* w, float eps,
                                               int head_dim, int p, const Rope& r) {
    const int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) {
        const float v = x[i];
        xs[i] = v;
        ss += v * v;
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) xs[i] = (scale * xs[i]) * w[i];
    __syncwarp();  // a pair's two values were written by different lanes
    for (int i = lane; i < r.n_rot / 2; i += 32) {
        if (r.neox) rotate_pair<true>(xs, dst, p, i, r.n_rot, r.theta_scale, r.freq_scale, r.freq_div);
        else rotate_pair<false>(xs, dst, p, i, r.n_rot, r.theta_scale, r.freq_scale, r.freq_div);
    }
    if (dst != xs)
        for (int i = r.n_rot + lane; i < head_dim; i += 32) dst[i] = xs[i];  // dims past n_rot: normalised only
    __syncwarp();  // dst complete for the whole warp
}
