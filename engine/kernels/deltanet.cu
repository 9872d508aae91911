// Gated DeltaNet (engine/models/deltanet.py; architectures.md §5.4): the
// recurrent layer's own kernels. fp32 throughout, as llama.cpp keeps the
// state; fast-math exps as its CUDA build.
//
//   causal_conv   y = SiLU(causal depthwise conv of x over time), the layer's last
//                 K-1 inputs carried in `state` [K-1, C] (read, then replaced)
//   decay_gates   beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a, per token and value head
//   delta_rule    per value head h (key head h mod H_k), state S [S_k, S_v]:
//                 S <- e^g S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q / sqrt(S_v)
//                 token by token (decode); delta_rule_chunked: DR_C tokens at a time (prefill)
#include "common.cuh"

#ifndef CONV_K
#define CONV_K 4  // taps (d_conv); launchers/deltanet.py compiles one module per value
#endif

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

// grid (ceil(C / 128), ceil(T / CONV_TT)), block 128: thread (c, tile) computes
// channel c over the tile's CONV_TT tokens, its window of the K-1 inputs before
// the tile taken from x (or, before token 0, from the carried inputs) into
// registers: y[t, c] = SiLU(sum_j win[t + j, c] * w[c, j]), taps summed in order
// j = 0..K-1 (tap K-1 on the current token). Coalesced: the threads of a warp
// read consecutive channels of a row. Tiles run in parallel (a prefill's conv
// was a token walk of C threads). Only tile 0 reaches back before token 0
// (CONV_TT >= K-1), so its thread of channel c is the only reader of c's carried
// inputs, and it replaces them once it has read them.
#ifndef CONV_TT
#define CONV_TT 16  // launchers/deltanet.py passes its CONV_TT
#endif
static_assert(CONV_TT >= CONV_K - 1, "only tile 0 reads the carried inputs");
extern "C" __global__ void causal_conv(const float* x, const float* w, float* state, float* y, int T, int C) {
    KERNEL_START();
    constexpr int K = CONV_K;
    const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * CONV_TT;
    if (c >= C) return;
    float win[K], wc[K];  // win[K-1]: the current token
#pragma unroll
    for (int j = 0; j < K; j++) {
        wc[j] = w[(size_t)c * K + j];
        const int t = t0 - (K - 1) + j;  // state row i holds the input of token i - (K-1)
        if (j < K - 1) win[j] = t >= 0 ? x[(size_t)t * C + c] : state[(size_t)(t + K - 1) * C + c];
    }
    const int t1 = min(t0 + CONV_TT, T);
    for (int t = t0; t < t1; t++) {
        win[K - 1] = x[(size_t)t * C + c];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < K; j++) s += win[j] * wc[j];
        y[(size_t)t * C + c] = silu(s);
#pragma unroll
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
    if (blockIdx.y == 0) {
        // the new carried inputs: those of tokens T-(K-1)..T-1; before token 0 (T < K-1)
        // the old row T + j, above row j, so not yet replaced in this ascending walk
#pragma unroll
        for (int j = 0; j < K - 1; j++) {
            const int t = T - (K - 1) + j;
            state[(size_t)j * C + c] = t >= 0 ? x[(size_t)t * C + c] : state[(size_t)(t + K - 1) * C + c];
        }
    }
}

// n = T * H gates; head of gate i: i % H.
extern "C" __global__ void decay_gates(const float* b, const float* a, const float* dt_bias, const float* ssm_a,
                                       float* beta, float* g, int n, int H) {
    KERNEL_START();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int h = i % H;
        beta[i] = 1.0f / (1.0f + __expf(-b[i]));
        const float x = a[i] + dt_bias[h];
        // ggml's softplus; log1pf, not logf(1 + e^x): fast math makes logf an approximation
        // whose absolute error (~4e-7) swamps a small e^x
        const float sp = x > 20.0f ? x : log1pf(__expf(x));
        g[i] = sp * ssm_a[h];
    }
}

// grid (H_v, ceil(S_v / 32)), block 32 * DR_WARPS. Block (h, cb) owns columns
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

// ---------------------------------------------------------------------------
// delta_rule_chunked: the same rule a chunk of DR_C tokens at a time (prefill),
// in the WY / UT form (Yang et al., Gated Delta Networks; checked against the
// token loop in NumPy by tests/test_deltanet_ops.py). For a chunk with state
// S0, G_i = sum_{j<=i} g_j, Gamma_i = e^{G_i}:
//   (I + A) Delta = diag(beta) (V - diag(Gamma) K S0),  A_ij = beta_i e^{G_i-G_j} k_i.k_j  (j < i)
//   O   = (diag(Gamma) Q S0 + P Delta) / sqrt(S_v),     P_ij = e^{G_i-G_j} q_i.k_j      (j <= i)
//   S   = Gamma_n S0 + sum_j e^{G_n-G_j} k_j Delta_j^T
// Every exponent is <= 0 (g <= 0). The columns of S (and of V, Delta, O)
// are independent, so a block takes one value head and 32 columns: grid
// (H_v, ceil(S_v / 32)); the chunks run in order inside it. (I + A) is unit lower
// triangular: warp 0 substitutes forward, lane = column, while the others wait.
// Shared memory (floats): K, Q [DR_C][HEAD_K+1], S [HEAD_K][32], rhs/Delta
// and Q S0 [DR_C][33], A and P [DR_C][DR_C+1], G and beta [DR_C]
// (launchers/deltanet.py chunked_smem()).
#define DR_C 64
constexpr int DRK = HEAD_K + 1, DRV = 33, DRA = DR_C + 1;
static_assert(DR_C == 64 && DR_WARPS == 8, "A and P: 16 x 16 threads, each 4 x 4 pairs");

extern "C" __global__ void __launch_bounds__(32 * DR_WARPS)
delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, float* S,
                   float* out, int T, int H_k, int H_v, int S_v) {
    KERNEL_START();
    extern __shared__ float dr_smem[];
    float* Ks = dr_smem;
    float* Qs = Ks + DR_C * DRK;
    float* Ss = Qs + DR_C * DRK;
    float* Ds = Ss + HEAD_K * 32;  // rhs, then Delta
    float* Os = Ds + DR_C * DRV;   // Q S0
    float* As = Os + DR_C * DRV;
    float* Ps = As + DR_C * DRA;
    float* Gs = Ps + DR_C * DRA;
    float* Bs = Gs + DR_C;
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = 32 * DR_WARPS;
    const int c = lane, j0 = blockIdx.y * 32, hk = h % H_k;
    const bool col = j0 + c < S_v;
    float* Sh = S + (size_t)h * HEAD_K * S_v + j0;
    for (int i = tid; i < HEAD_K * 32; i += NT) Ss[i] = (j0 + i % 32 < S_v) ? Sh[(size_t)(i / 32) * S_v + i % 32] : 0.0f;
    const float inv_sqrt = rsqrtf((float)S_v);

    for (int t0 = 0; t0 < T; t0 += DR_C) {
        const int n = min(DR_C, T - t0);
        __syncthreads();  // the previous chunk is done with every buffer
        for (int i = tid; i < DR_C * HEAD_K; i += NT) {
            const int t = i / HEAD_K, d = i % HEAD_K;
            const size_t src = ((size_t)(t0 + t) * H_k + hk) * HEAD_K + d;
            Ks[t * DRK + d] = t < n ? k[src] : 0.0f;
            Qs[t * DRK + d] = t < n ? q[src] : 0.0f;
        }
        for (int i = tid; i < DR_C * 32; i += NT) {
            const int t = i / 32, cc = i % 32;
            Ds[t * DRV + cc] = (t < n && j0 + cc < S_v) ? v[((size_t)(t0 + t) * H_v + h) * S_v + j0 + cc] : 0.0f;
        }
        if (tid < DR_C) {  // past n: no decay and no beta (rows zero anyway)
            Gs[tid] = tid < n ? g[(size_t)(t0 + tid) * H_v + h] : 0.0f;
            Bs[tid] = tid < n ? beta[(size_t)(t0 + tid) * H_v + h] : 0.0f;
        }
        __syncthreads();
        if (tid == 0) {  // G: the running sums, in token order
            float G = 0.0f;
#pragma unroll
            for (int t = 0; t < DR_C; t++) Gs[t] = G += Gs[t];
        }
        __syncthreads();
        // A (strictly lower) and P (lower, diagonal included). Thread (tr, ts) takes rows
        // r = tr + 16a and columns s = ts + 16b (a, b < 4), so a warp reads 16 distinct rows of
        // K in one access; b > a lies above the diagonal: only the 10 pairs b <= a are summed.
        // Each pair sums d = 0..HEAD_K-1 in order.
        {
            const int tr = tid >> 4, ts = tid & 15;
            float kk[4][4], qk[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b <= a; b++) kk[a][b] = qk[a][b] = 0.0f;
#pragma unroll 4
            for (int d = 0; d < HEAD_K; d++) {
                float kr[4], qr[4], ks[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    kr[a] = Ks[(tr + 16 * a) * DRK + d];
                    qr[a] = Qs[(tr + 16 * a) * DRK + d];
                    ks[a] = Ks[(ts + 16 * a) * DRK + d];
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int b = 0; b <= a; b++) {
                        kk[a][b] += kr[a] * ks[b];
                        qk[a][b] += qr[a] * ks[b];
                    }
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int r = tr + 16 * a, s = ts + 16 * b;
                    float av = 0.0f, pv = 0.0f;
                    if (b <= a && s <= r && r < n) {
                        const float e = __expf(Gs[r] - Gs[s]);
                        if (s < r) av = Bs[r] * e * kk[a][b];
                        pv = e * qk[a][b];
                    }
                    As[r * DRA + s] = av;
                    Ps[r * DRA + s] = pv;
                }
        }
        // rhs = beta (V - Gamma K S0) and Q S0 for the warp's rows t = warp + 8m, each
        // state element read once for all of them
        {
            constexpr int RM = DR_C / DR_WARPS;
            float ks[RM], qs[RM];
#pragma unroll
            for (int m = 0; m < RM; m++) ks[m] = qs[m] = 0.0f;
#pragma unroll 4
            for (int d = 0; d < HEAD_K; d++) {
                const float sd = Ss[d * 32 + c];
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    const int t = warp + DR_WARPS * m;
                    ks[m] += Ks[t * DRK + d] * sd;
                    qs[m] += Qs[t * DRK + d] * sd;
                }
            }
#pragma unroll
            for (int m = 0; m < RM; m++) {
                const int t = warp + DR_WARPS * m;
                const float gam = __expf(Gs[t]);
                Ds[t * DRV + c] = Bs[t] * (Ds[t * DRV + c] - gam * ks[m]);
                Os[t * DRV + c] = gam * qs[m];
            }
        }
        __syncthreads();
        // Delta: forward substitution through I + A (warp 0, lane = column), the solved rows
        // in registers; every row, as past n both A and the rhs are zero
        if (warp == 0) {
            float dl[DR_C];
#pragma unroll
            for (int r = 0; r < DR_C; r++) {
                float acc = Ds[r * DRV + c];
#pragma unroll
                for (int s = 0; s < r; s++) acc -= As[r * DRA + s] * dl[s];
                dl[r] = acc;
                Ds[r * DRV + c] = acc;
            }
        }
        __syncthreads();
        // outputs of the chunk's tokens
        for (int t = warp; t < n; t += DR_WARPS) {
            float o = Os[t * DRV + c];
            for (int s = 0; s <= t; s++) o += Ps[t * DRA + s] * Ds[s * DRV + c];
            if (col) out[((size_t)(t0 + t) * H_v + h) * S_v + j0 + c] = o * inv_sqrt;
        }
        // the state after the chunk: S = Gamma_n S0 + sum_j e^{G_n - G_j} k_j Delta_j^T, the
        // warp's rows d = warp + 8m together (each token's decay and Delta read once)
        {
            constexpr int DM = HEAD_K / DR_WARPS;
            const float Gn = Gs[n - 1], gam_n = __expf(Gn);
            float acc[DM];
#pragma unroll
            for (int m = 0; m < DM; m++) acc[m] = 0.0f;
            for (int s = 0; s < n; s++) {
                const float e = __expf(Gn - Gs[s]), ds = Ds[s * DRV + c];
#pragma unroll
                for (int m = 0; m < DM; m++) acc[m] += e * Ks[s * DRK + warp + DR_WARPS * m] * ds;
            }
#pragma unroll
            for (int m = 0; m < DM; m++) {
                const int d = warp + DR_WARPS * m;
                Ss[d * 32 + c] = gam_n * Ss[d * 32 + c] + acc[m];
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < HEAD_K * 32; i += NT)
        if (j0 + i % 32 < S_v) Sh[(size_t)(i / 32) * S_v + i % 32] = Ss[i];
}
