// Rotary position embedding, in place on x [T, n_heads, head_dim].
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
//
// Launch: grid (T, n_heads), block = n_rot/2 threads rounded up to 32 (one
// thread per rotated pair; <= 256 pairs for head_dim 512).
#include "common.cuh"

// Pair i (< n_rot/2) of a head at position p: read from src, rotated into dst
// (the same buffer, or a shared-memory copy of the head and its global row).
template <bool NEOX>
__device__ __forceinline__ void rotate_pair(const float* src, float* dst, int p, int i, int n_rot, float theta_scale,
                                            float freq_scale, const float* freq_div) {
    const float theta_base = (float)p * __powf(theta_scale, (float)i);
    const float theta_extrap = freq_div ? theta_base / freq_div[i] : theta_base;
    const float theta = freq_scale * theta_extrap;
    const float c = __cosf(theta), s = __sinf(theta);
    const int i0 = NEOX ? i : 2 * i;
    const int i1 = NEOX ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = src[i0], x1 = src[i1];
    dst[i0] = x0 * c - x1 * s;
    dst[i1] = x0 * s + x1 * c;
}

template <bool NEOX>
__device__ __forceinline__ void rope_pair(float* x, const int* pos, int n_heads, int head_dim, int n_rot,
                                          float theta_scale, float freq_scale, const float* freq_div) {
    const int i = threadIdx.x;
    if (i >= n_rot / 2) return;
    float* xh = x + ((size_t)blockIdx.x * n_heads + blockIdx.y) * head_dim;
    rotate_pair<NEOX>(xh, xh, pos[blockIdx.x], i, n_rot, theta_scale, freq_scale, freq_div);
}

extern "C" __global__ void rope_norm(float* x, const int* pos, int n_heads, int head_dim, int n_rot,
                                     float theta_scale, float freq_scale, const float* freq_div) {
    KERNEL_START();
    rope_pair<false>(x, pos, n_heads, head_dim, n_rot, theta_scale, freq_scale, freq_div);
}

extern "C" __global__ void rope_neox(float* x, const int* pos, int n_heads, int head_dim, int n_rot,
                                     float theta_scale, float freq_scale, const float* freq_div) {
    KERNEL_START();
    rope_pair<true>(x, pos, n_heads, head_dim, n_rot, theta_scale, freq_scale, freq_div);
}

// ---------------------------------------------------------------------------
// qk_norm_rope_<norm|neox>: per-head RMSNorm with its weight, then RoPE, of q
// [T, n_head, D] and k [T, n_head_kv, D] in place, in one launch (the Q/K norms
// of qwen3-style attention; two RMSNorm launches and one RoPE before).
// Arithmetic as rms_norm (norm.cu: fp32 sum of squares, rsqrtf(sum/D + eps),
// (scale*x)*w; here the sum is one warp's) and rope (rotate_pair above).
// One warp a head, so a head needs no block barrier: a block of 32 threads a head
// takes up to QKNR_HEADS heads of one token (a prefill of 512 tokens and 40
// heads was latency bound with a block a head: 26 us for 21 MB). Launch: grid
// (T, ceil((n_head + n_head_kv) / heads a block)), heads y*heads + warp < n_head are q's.
#define QKNR_HEADS 4
template <bool NEOX>
__device__ __forceinline__ void qk_norm_rope_impl(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                                  int head_dim, int n_rot, float theta_scale, float freq_scale,
                                                  const float* freq_div, const float* q_w, const float* k_w,
                                                  float eps) {
    __shared__ float head[QKNR_HEADS][512];  // head_dim <= 512 (gemma4's full layers)
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y * (blockDim.x >> 5) + warp;
    if (h >= n_head + n_head_kv) return;  // the last block's spare warps (no block barrier below)
    const bool is_q = h < n_head;
    float* xh = is_q ? q + ((size_t)t * n_head + h) * head_dim : k + ((size_t)t * n_head_kv + (h - n_head)) * head_dim;
    const float* w = is_q ? q_w : k_w;
    float* xs = head[warp];
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) {
        const float v = xh[i];
        xs[i] = v;
        ss += v * v;
    }
    const float scale = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) xs[i] = (scale * xs[i]) * w[i];
    __syncwarp();  // a pair's two values were written by different lanes
    for (int i = lane; i < n_rot / 2; i += 32) rotate_pair<NEOX>(xs, xh, pos[t], i, n_rot, theta_scale, freq_scale, freq_div);
    for (int i = n_rot + lane; i < head_dim; i += 32) xh[i] = xs[i];  // dims past n_rot: normalised only
}

extern "C" __global__ void qk_norm_rope_norm(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                             int head_dim, int n_rot, float theta_scale, float freq_scale,
                                             const float* freq_div, const float* q_w, const float* k_w, float eps) {
    KERNEL_START();
    qk_norm_rope_impl<false>(q, k, pos, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, freq_div, q_w,
                             k_w, eps);
}

extern "C" __global__ void qk_norm_rope_neox(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                             int head_dim, int n_rot, float theta_scale, float freq_scale,
                                             const float* freq_div, const float* q_w, const float* k_w, float eps) {
    KERNEL_START();
    qk_norm_rope_impl<true>(q, k, pos, n_head, n_head_kv, head_dim, n_rot, theta_scale, freq_scale, freq_div, q_w,
                            k_w, eps);
}
