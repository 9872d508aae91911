// Rotary position embedding, in place on x [T, n_heads, head_dim].
//
// Arithmetic: rope.cuh.
//
// Launch: grid (T, n_heads), block = n_rot/2 threads rounded up to 32 (one
// thread per rotated pair; <= 256 pairs for head_dim 512).
#include "rope.cuh"

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
// Arithmetic: norm_rope_head (rope.cuh).
// One warp a head, so a head needs no block barrier: a block of 32 threads a head
// takes up to QKNR_HEADS heads of one token (a prefill of 512 tokens and 40
// heads was latency bound with a block a head: 26 us for 21 MB). Launch: grid
// (T, ceil((n_head + n_head_kv) / heads a block)), heads y*heads + warp < n_head are q's.
#define QKNR_HEADS 4
__device__ __forceinline__ void qk_norm_rope_impl(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                                  int head_dim, const Rope& r, const float* q_w, const float* k_w,
                                                  float eps) {
    __shared__ float head[QKNR_HEADS][512];  // head_dim <= 512 (gemma4's full layers)
    const int t = blockIdx.x, warp = threadIdx.x >> 5;
    const int h = blockIdx.y * (blockDim.x >> 5) + warp;
    if (h >= n_head + n_head_kv) return;  // the last block's spare warps (no block barrier below)
    const bool is_q = h < n_head;
    float* xh = is_q ? q + ((size_t)t * n_head + h) * head_dim : k + ((size_t)t * n_head_kv + (h - n_head)) * head_dim;
    norm_rope_head(xh, head[warp], xh, is_q ? q_w : k_w, eps, head_dim, pos[t], r);
}

extern "C" __global__ void qk_norm_rope_norm(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                             int head_dim, int n_rot, float theta_scale, float freq_scale,
                                             const float* freq_div, const float* q_w, const float* k_w, float eps) {
    KERNEL_START();
    qk_norm_rope_impl(q, k, pos, n_head, n_head_kv, head_dim, Rope{n_rot, theta_scale, freq_scale, freq_div, 0}, q_w,
                      k_w, eps);
}

extern "C" __global__ void qk_norm_rope_neox(float* q, float* k, const int* pos, int n_head, int n_head_kv,
                                             int head_dim, int n_rot, float theta_scale, float freq_scale,
                                             const float* freq_div, const float* q_w, const float* k_w, float eps) {
    KERNEL_START();
    qk_norm_rope_impl(q, k, pos, n_head, n_head_kv, head_dim, Rope{n_rot, theta_scale, freq_scale, freq_div, 1}, q_w,
                      k_w, eps);
}
