// Gated DeltaNet (engine/models/deltanet.py; architectures.md §5.4): the
// recurrent layer's own kernels. fp32 throughout, as llama.cpp keeps the
// state; fast-math exps as its CUDA build.
//
//   causal_conv   y = SiLU(causal depthwise conv of x over time), the layer's last
//                 K-1 inputs carried in `state` [K-1, C] (read, then replaced)
//   decay_gates   beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a, per token and value head
//   delta_rule    per value head h (key head h mod H_k), state S [S_k, S_v]:
//                 S <- e^g S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q / sqrt(S_v)
//                 token by token (decode; prefill runs the same loop for now)
#include "common.cuh"

#ifndef CONV_K
#define CONV_K 4  // taps (d_conv); launchers/deltanet.py compiles one module per value
#endif

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// One thread per channel c, walking the T tokens with the window of the last
// K-1 inputs in registers: y[t, c] = SiLU(sum_j win[t + j, c] * w[c, j]), taps
// summed in order j = 0..K-1 (tap K-1 on the current token). Coalesced: the
// threads of a warp read consecutive channels of a row.
extern "C" __global__ void causal_conv(const float* x, const float* w, float* state, float* y, int T, int C) {
    KERNEL_START();
    constexpr int K = CONV_K;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float win[K], wc[K];  // win[K-1]: the current token
#pragma unroll
    for (int j = 0; j < K; j++) {
        wc[j] = w[(size_t)c * K + j];
        if (j < K - 1) win[j] = state[(size_t)j * C + c];
    }
    for (int t = 0; t < T; t++) {
        win[K - 1] = x[(size_t)t * C + c];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) s += win[j] * wc[j];
        y[(size_t)t * C + c] = silu(s);
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
#pragma unroll
    for (int j = 0; j < K - 1; j++) state[(size_t)j * C + c] = win[j];
}

// n = T * H gates; head of gate i: i % H.
extern "C" __global__ void decay_gates(const float* b, const float* a, const float* dt_bias, const float* ssm_a,
                                       float* beta, float* g, int n, int H) {
    KERNEL_START();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int h = i % H;
        beta[i] = 1.0f / (1.0f + __expf(-b[i]));
        const float x = a[i] + dt_bias[h];
        const float sp = x > 20.0f ? x : logf(1.0f + __expf(x));  // ggml's softplus
        g[i] = sp * ssm_a[h];
    }
}

// grid (H_v, S_v / 32), block 32 * DR_WARPS. Block (h, cb) owns columns
// 32cb..32cb+31 of head h's state (lane = column) and keeps them in registers:
// warp w holds rows i = w, w + DR_WARPS, ... (S_k / DR_WARPS of them). Per
// token: kv = S^T k and o = S^T q are sums over rows, reduced across the warps
// through shared memory; the state is read once and written once per call.
#define DR_WARPS 8
#ifndef HEAD_K
#define HEAD_K 128
#endif
constexpr int DR_ROWS = HEAD_K / DR_WARPS;
static_assert(HEAD_K % DR_WARPS == 0, "S_k a multiple of the warps");

extern "C" __global__ void __launch_bounds__(32 * DR_WARPS)
delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, float* S, float* out,
           int T, int H_k, int H_v, int S_v) {
    KERNEL_START();
    __shared__ float red[2][DR_WARPS][32];
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.y * 32 + lane, hk = h % H_k;
    const bool col = j < S_v;
    float* Sh = S + (size_t)h * HEAD_K * S_v;
    float s[DR_ROWS];
#pragma unroll
    for (int r = 0; r < DR_ROWS; r++) s[r] = col ? Sh[(size_t)(warp + r * DR_WARPS) * S_v + j] : 0.0f;
    const float inv_sqrt = rsqrtf((float)S_v);
    for (int t = 0; t < T; t++) {
        const float* kt = k + ((size_t)t * H_k + hk) * HEAD_K;
        const float* qt = q + ((size_t)t * H_k + hk) * HEAD_K;
        const float gamma = __expf(g[(size_t)t * H_v + h]), bt = beta[(size_t)t * H_v + h];
        const float vt = col ? v[((size_t)t * H_v + h) * S_v + j] : 0.0f;
        float kr[DR_ROWS], kv = 0.0f;
#pragma unroll
        for (int r = 0; r < DR_ROWS; r++) {
            kr[r] = kt[warp + r * DR_WARPS];
            kv += s[r] * kr[r];
        }
        red[0][warp][lane] = kv;
        __syncthreads();
        kv = 0.0f;
#pragma unroll
        for (int w = 0; w < DR_WARPS; w++) kv += red[0][w][lane];
        const float delta = bt * (vt - gamma * kv);
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < DR_ROWS; r++) {
            s[r] = gamma * s[r] + kr[r] * delta;
            o += s[r] * qt[warp + r * DR_WARPS];
        }
        red[1][warp][lane] = o;
        __syncthreads();
        if (warp == 0 && col) {
            o = 0.0f;
#pragma unroll
            for (int w = 0; w < DR_WARPS; w++) o += red[1][w][lane];
            out[((size_t)t * H_v + h) * S_v + j] = o * inv_sqrt;
        }
        // red[0] is rewritten next token only after every warp passed this token's second barrier
    }
    if (col) {
#pragma unroll
        for (int r = 0; r < DR_ROWS; r++) Sh[(size_t)(warp + r * DR_WARPS) * S_v + j] = s[r];
    }
}
