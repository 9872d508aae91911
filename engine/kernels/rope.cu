// Rotary position embedding, in place on x [T, n_heads, head_dim], and the
// per-head Q/K RMSNorm before it: the arithmetic is rope.cuh's.
#include "rope.cuh"

// rope_<norm|neox>: grid (T, n_heads), block = n_rot/2 threads rounded up to 32
// (one thread per rotated pair; <= 256 pairs for head_dim 512).
template <bool NEOX>
__device__ __forceinline__ void rope_pair(float* x, const int* pos, int n_heads, int head_dim, int n_rot,
                                          float theta_scale, float freq_scale, const float* freq_div) {
    const int i = threadIdx.x;
    if (i >= n_rot / 2) return;
    float* xh = x + ((size_t)blockIdx.x * n_heads + blockIdx.y) * head_dim;
    const int i0 = pair_lo<NEOX>(i, n_rot), i1 = pair_hi<NEOX>(i, n_rot);
    const float2 r = rotate(xh[i0], xh[i1], pos[blockIdx.x], i, theta_scale, freq_scale, freq_div);
    xh[i0] = r.x;
    xh[i1] = r.y;
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

// qk_norm_rope_<norm|neox>: per-head RMSNorm with its weight, then RoPE, of q
// and k in place, in one launch (the Q/K norms of qwen3-style attention; two
// RMSNorm launches and one RoPE before). One warp a head (rope.cuh qk_head), so
// a head needs no block barrier: a block takes up to 4 heads of one token (a
// prefill of 512 tokens and 40 heads was latency bound with a block a head:
// 26 us for 21 MB). Launch: grid (T, ceil((n_head + n_head_kv) / heads a
// block)), heads y*heads + warp < n_head are q's.
template <bool NEOX>
__device__ __forceinline__ void qk_norm_rope_impl(QK_HEADS_PARAMS) {
    const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (h < n_head + n_head_kv) qk_head<NEOX>(blockIdx.x, h, threadIdx.x & 31, QK_HEADS_ARGS);
}

extern "C" __global__ void qk_norm_rope_norm(QK_HEADS_PARAMS) {
    KERNEL_START();
    qk_norm_rope_impl<false>(QK_HEADS_ARGS);
}

extern "C" __global__ void qk_norm_rope_neox(QK_HEADS_PARAMS) {
    KERNEL_START();
    qk_norm_rope_impl<true>(QK_HEADS_ARGS);
}
