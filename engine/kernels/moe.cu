// Mixture-of-Experts FFN (engine/models/moe.py; architectures.md §0.6): routing,
// the selected experts' projections, and their weighted sum, with expert ids
// that stay on the device (a decode step is one CUDA graph, MoE included).
//
// Expert tensors are 3-D GGUF tensors: expert e's [n_out, n_in] matrix starts
// at byte e * expert_bytes (expert_bytes = n_out * row_bytes). ids/weights are
// [T, k] (k experts per token, in selection order).
//
// Decode (launchers/moe.py; also any small T: grid.z = token):
//   moe_route       logits [T, E] -> ids, weights: softmax, top-k (ties to the lower
//                   id, descending), renormalised; one warp per token
//   moe_glu_<t>     h[t, j] = SiLU(gate[e]·x_t) ⊙ (up[e]·x_t),  e = ids[t, j]
//   moe_gemv_<t>    y[t, j] = W[e]·x_t    (gate and up of different types: then silu_mul)
//   moe_down_<t>    y[t] = add[t] + sum_j weights[t, j] · down[e]·h[t, j]
// Each warp of a block takes one selected expert (slot j) and GEMV_ROWS rows of
// it (gemv.cuh's stage_rows/dot_rows), so the k experts of a token run in one
// launch; moe_down sums the slots across its warps in selection order (llama.cpp's
// moe_weighted_reduction: e0·w0, then + e_j·w_j), fusing the weighted sum and
// the residual add into the down projection.
//
// Prefill (many tokens): the (token, slot) pairs are grouped by expert on the
// device and each projection is one grouped GEMM over all experts:
//   moe_sort        pairs sorted by expert (stable), tiles of MOE_BM pairs of one expert
//   moe_gather_bf16 xs[i] = bf16(x[token of pair i])
//   moe_gemm_<t>    y[i] = W[expert of i]·xs[i] on the tensor cores (bf16 in, fp32
//                   accumulate and out), dequantising W's tiles on the way (exact
//                   values, rounded to bf16 as the dense prefill's dequant_bf16)
//   moe_combine     y[t] = add[t] + sum_j weights[t, j] · d[pos of pair (t, j)]
#include "gemv.cuh"
#include <mma.h>

#ifndef MOE_MAX_WARPS
#define MOE_MAX_WARPS 8  // selected experts a block runs side by side; k > 8 loops
#endif

// ---- routing ------------------------------------------------------------------------
#define ROUTE_WARPS 4
#define NORM_CLAMP 6.103515625e-5f  // 2^-14: llama.cpp clamps the renormalising sum

// One warp per token. Dynamic shared memory: ROUTE_WARPS * n_expert floats.
// A non-finite logit makes the row's weights NaN (ids stay in range), so the
// step's logits turn NaN and the argmax reports it instead of a wrong token.
extern "C" __global__ void moe_route(const float* logits, int T, int n_expert, int k, int norm, int* ids,
                                     float* weights) {
    KERNEL_START();
    extern __shared__ float route_p[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_WARPS + warp;
    if (t >= T) return;
    float* p = route_p + warp * n_expert;
    const float* l = logits + (size_t)t * n_expert;
    float mx = -INFINITY;
    bool finite = true;
    for (int e = lane; e < n_expert; e += 32) {
        const float v = l[e];
        finite &= isfinite(v);
        p[e] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    finite = __all_sync(0xffffffffu, finite);
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += 32) {
        const float v = __expf(p[e] - mx);
        p[e] = v;
        sum += v;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int e = lane; e < n_expert; e += 32) p[e] *= inv;  // softmax as llama.cpp: exp(x - max) * (1/sum)
    __syncwarp();
    // k rounds of a warp argmax over the probabilities; the winner is removed.
    // Lane j keeps pick j.
    int my_id = 0;
    float my_w = 0.0f, wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_expert; e += 32) {  // ascending: '>' keeps the lane's lowest id among equals
            const float v = p[e];
            if (v > bv) {
                bv = v;
                bi = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi >= n_expert) bi = j;  // only without a finite probability: the weights are NaN below
        if (lane == j) {
            my_id = bi;
            my_w = bv;
        }
        wsum += bv;
        __syncwarp();
        if (lane == 0) p[bi] = -INFINITY;
        __syncwarp();
    }
    const float scale = norm ? 1.0f / fmaxf(wsum, NORM_CLAMP) : 1.0f;
    if (lane < k) {
        ids[(size_t)t * k + lane] = my_id;
        weights[(size_t)t * k + lane] = finite ? my_w * scale : __int_as_float(0x7fc00000);
    }
}

// ---- decode: the selected experts as matrix-vector products ---------------------------
// Grid (row groups, 1, T); blockDim.x = 32 * min(k, MOE_MAX_WARPS); warp w runs
// slots w, w + nw, ... Dynamic shared memory: nw * GEMV_ROWS * Q::SPAN bytes.
__device__ __forceinline__ void check_stage_smem(int need) {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (uint32_t)need) __trap();  // launcher passed too little shared memory
}

// GLU: rows 0..R/2-1 of the warp are gate rows, R/2..R-1 the same up rows, and
// h = SiLU(gate)·up; otherwise R rows of W and h = W·x.
template <class Q, bool GLU>
__device__ __forceinline__ void moe_rows_impl(const uint8_t* Wg, const uint8_t* Wu, const int* ids, const float* x,
                                              float* h, int n_in, int n_out, int expert_bytes, int k) {
    constexpr int R = GEMV_ROWS, RH = GLU ? GEMV_ROWS / 2 : GEMV_ROWS;
    extern __shared__ __align__(16) uint8_t moe_stage[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, t = blockIdx.z;
    check_stage_smem(nw * R * Q::SPAN);
    const int row0 = blockIdx.x * RH;
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;
    uint8_t* buf = moe_stage + warp * (R * Q::SPAN);
    x += (size_t)t * n_in;
    pdl_wait();  // the ids come from the kernel just before
    pdl_launch_next();
    for (int j = warp; j < k; j += nw) {
        const size_t e = (size_t)ids[(size_t)t * k + j] * expert_bytes;
        auto row = [&](int r) {
            const bool up = GLU && r >= RH;
            return (up ? Wu : Wg) + e + (size_t)min(row0 + (up ? r - RH : r), n_out - 1) * row_bytes;
        };
        float acc[R];
        int off[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        stage_rows<Q>(buf, off, row, 0, U, lane);
        dot_rows<Q>(buf, off, row, x, 0, 32, U, lane, acc);
        float* hj = h + ((size_t)t * k + j) * n_out;
#pragma unroll
        for (int r = 0; r < RH; r++) {
            const float a = warp_sum(acc[r]);
            if constexpr (GLU) {
                const float u = warp_sum(acc[r + RH]);
                if (lane == r && row0 + r < n_out) hj[row0 + r] = a / (1.0f + __expf(-a)) * u;
            } else {
                if (lane == r && row0 + r < n_out) hj[row0 + r] = a;
            }
        }
    }
}

template <class Q>
__device__ __forceinline__ void moe_down_impl(const uint8_t* W, const int* ids, const float* weights, const float* h,
                                              float* y, const float* add, int n_in, int n_out, int expert_bytes,
                                              int k) {
    constexpr int R = GEMV_ROWS;
    extern __shared__ __align__(16) uint8_t moe_stage[];
    __shared__ float red[MOE_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5, t = blockIdx.z;
    check_stage_smem(nw * R * Q::SPAN);
    const int row0 = blockIdx.x * R;
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;
    uint8_t* buf = moe_stage + warp * (R * Q::SPAN);
    auto rows_of = [&](int j) {
        const uint8_t* base = W + (size_t)ids[(size_t)t * k + j] * expert_bytes;
        return [=](int r) { return base + (size_t)min(row0 + r, n_out - 1) * row_bytes; };
    };
    int off[R];
    // The ids were written two kernels back (moe_route, then the gate/up kernel
    // waited for it before letting this one start: common.cuh), so the first
    // slot's weights are fetched before waiting; h and add only after.
    if (warp < k) stage_rows<Q>(buf, off, rows_of(warp), 0, U, lane);
    pdl_wait();
    pdl_launch_next();
    float total[R];
#pragma unroll
    for (int r = 0; r < R; r++) total[r] = 0.0f;
    for (int j = warp; j < k; j += nw) {
        const auto row = rows_of(j);
        if (j != warp) stage_rows<Q>(buf, off, row, 0, U, lane);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        dot_rows<Q>(buf, off, row, h + ((size_t)t * k + j) * n_in, 0, 32, U, lane, acc);
        const float wj = weights[(size_t)t * k + j];
#pragma unroll
        for (int r = 0; r < R; r++) total[r] = fmaf(acc[r], wj, total[r]);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(total[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (tid < R && row0 + tid < n_out) {
        float s = red[0][tid];
        for (int w = 1; w < min(nw, k); w++) s += red[w][tid];  // selection order (k <= MOE_MAX_WARPS)
        if (add) s += add[(size_t)t * n_out + row0 + tid];
        y[(size_t)t * n_out + row0 + tid] = s;
    }
}

#define MOE_GLU_CALL(Q) \
    moe_rows_impl<Q, true>(static_cast<const uint8_t*>(Wg), static_cast<const uint8_t*>(Wu), ids, x, h, n_in, n_out, \
                           expert_bytes, k)
#define MOE_GEMV_CALL(Q) \
    moe_rows_impl<Q, false>(static_cast<const uint8_t*>(W), nullptr, ids, x, y, n_in, n_out, expert_bytes, k)
#define MOE_DOWN_CALL(Q) \
    moe_down_impl<Q>(static_cast<const uint8_t*>(W), ids, weights, h, y, add, n_in, n_out, expert_bytes, k)
#define MOE_DECODE(name)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MAX_WARPS, 2)                                     \
        moe_glu_##name(const void* Wg, const void* Wu, const int* ids, const float* x, float* h, int n_in, \
                       int n_out, int expert_bytes, int k) {                                                \
        WITH_LAYOUT_##name(n_in, MOE_GLU_CALL)                                                              \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MAX_WARPS, 2)                                     \
        moe_gemv_##name(const void* W, const int* ids, const float* x, float* y, int n_in, int n_out,      \
                        int expert_bytes, int k) {                                                          \
        WITH_LAYOUT_##name(n_in, MOE_GEMV_CALL)                                                             \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MAX_WARPS, 2)                                     \
        moe_down_##name(const void* W, const int* ids, const float* weights, const float* h, float* y,     \
                        const float* add, int n_in, int n_out, int expert_bytes, int k) {                   \
        WITH_LAYOUT_##name(n_in, MOE_DOWN_CALL)                                                             \
    }
FOR_EACH_WEIGHT_TYPE(MOE_DECODE)

// ---- prefill: pairs grouped by expert ---------------------------------------------------
#define MOE_BM 32   // GEMM tile: pairs (rows) of one expert
#define MOE_BN 128  // output features
#define MOE_BK 64   // inner dimension per step
#define MOE_GEMM_THREADS 256

// One block of 32 * SORT_WARPS threads. For the P = T*k pairs (pair p = t*k + j):
// offsets[e] = first sorted position of expert e (offsets[E] = P), pair_at[i] =
// the pair at sorted position i (stable: by expert, then pair), pos_of[p] its
// position; tiles i < max_tiles: (tile_e, tile_r0) = (expert, first position)
// of each run of up to MOE_BM positions of one expert, then tile_e = -1.
// Dynamic shared memory: (n_expert + 1 + P) ints (the ids are read from there,
// each warp taking SORT_EPW experts per pass over them).
#define SORT_WARPS 32
#define SORT_EPW 4
extern "C" __global__ void moe_sort(const int* ids, int P, int n_expert, int max_tiles, int* offsets, int* pair_at,
                                    int* pos_of, int* tile_e, int* tile_r0) {
    KERNEL_START();
    extern __shared__ int sort_smem[];
    int* count = sort_smem;                // n_expert + 1
    int* sid = sort_smem + n_expert + 1;   // P
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int p = threadIdx.x; p < P; p += blockDim.x) sid[p] = ids[p];
    __syncthreads();
    for (int e0 = warp * SORT_EPW; e0 < n_expert; e0 += SORT_WARPS * SORT_EPW) {  // count
        int c[SORT_EPW] = {};
        for (int p0 = 0; p0 < P; p0 += 32) {
            const int id = p0 + lane < P ? sid[p0 + lane] : -1;
#pragma unroll
            for (int i = 0; i < SORT_EPW; i++) c[i] += __popc(__ballot_sync(0xffffffffu, id == e0 + i));
        }
#pragma unroll
        for (int i = 0; i < SORT_EPW; i++)
            if (lane == 0 && e0 + i < n_expert) count[e0 + i] = c[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // exclusive scan, then the tiles (a few hundred entries: serial is fine)
        int s = 0, n = 0;
        for (int e = 0; e < n_expert; e++) {
            const int c = count[e];
            count[e] = s;
            offsets[e] = s;
            for (int r = 0; r < c; r += MOE_BM) {
                tile_e[n] = e;
                tile_r0[n] = s + r;
                n++;
            }
            s += c;
        }
        offsets[n_expert] = s;
        for (; n < max_tiles; n++) tile_e[n] = -1;
    }
    __syncthreads();
    for (int e0 = warp * SORT_EPW; e0 < n_expert; e0 += SORT_WARPS * SORT_EPW) {  // stable compaction
        int at[SORT_EPW];
#pragma unroll
        for (int i = 0; i < SORT_EPW; i++) at[i] = e0 + i < n_expert ? count[e0 + i] : 0;
        for (int p0 = 0; p0 < P; p0 += 32) {
            const int p = p0 + lane, id = p < P ? sid[p] : -1;
#pragma unroll
            for (int i = 0; i < SORT_EPW; i++) {
                const unsigned m = __ballot_sync(0xffffffffu, id == e0 + i);
                if (id == e0 + i) {
                    const int pos = at[i] + __popc(m & ((1u << lane) - 1u));
                    pair_at[pos] = p;
                    pos_of[p] = pos;
                }
                at[i] += __popc(m);
            }
        }
    }
}

// xs[i][c] = bf16(x[pair_at[i] / k][c]); grid-stride over P * n / 8 groups of 8.
extern "C" __global__ void moe_gather_bf16(const float* x, const int* pair_at, int P, int k, int n,
                                           __nv_bfloat16* xs) {
    KERNEL_START();
    const int gpr = n / 8;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < (size_t)P * gpr;
         g += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(g / gpr), c = (int)(g % gpr) * 8;
        const float4* src = reinterpret_cast<const float4*>(x + (size_t)(pair_at[i] / k) * n + c);
        const float4 a = src[0], b = src[1];
        __nv_bfloat162 o[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        *reinterpret_cast<uint4*>(xs + (size_t)i * n + c) = *reinterpret_cast<uint4*>(o);
    }
}

// y[i][c] for the tile's MOE_BM positions i and MOE_BN features c: 8 warps,
// each 16 rows x 32 features (two wmma 16x16x16 accumulators). W's tile is
// dequantised (quants.cuh deq8, exact) and rounded to bf16 into shared memory.
// Each thread loads its share of the next step (one 16-byte piece of xs, four
// 8-element groups of W, all independent loads) before the barrier, while
// other warps still multiply the step before. Grid (ceil(N / MOE_BN),
// max_tiles); K % MOE_BK == 0.
template <class Dq>
__device__ __forceinline__ void moe_gemm_impl(const uint8_t* __restrict__ W, int expert_bytes,
                                              const __nv_bfloat16* __restrict__ xs, const int* tile_e,
                                              const int* tile_r0, const int* offsets, float* y, int N, int K) {
    using namespace nvcuda;
    constexpr int BM = MOE_BM, BN = MOE_BN, BK = MOE_BK, LDS = BK + 8, LDC = BN + 4, NT = MOE_GEMM_THREADS;
    constexpr int GPR = BK / 8, BG = BN * GPR / NT;  // 8-element groups per tile row, W groups per thread
    static_assert(BM * GPR == NT && BN * GPR % NT == 0 && NT == 8 * 32 && BM == 32 && BN == 128, "tile layout");
    // bf16 row stride of 144 bytes: every fragment pointer (16-row steps) stays 32-byte aligned
    __shared__ __align__(128) uint8_t smem[(BM + BN) * LDS * 2];
    auto As = reinterpret_cast<__nv_bfloat16(*)[LDS]>(smem);
    auto Bs = reinterpret_cast<__nv_bfloat16(*)[LDS]>(smem + BM * LDS * 2);
    auto Cs = reinterpret_cast<float(*)[LDC]>(smem);  // the output tile, after the last step
    static_assert(BM * LDC * 4 <= (BM + BN) * LDS * 2, "the output tile fits in the staging buffers");
    const int e = tile_e[blockIdx.y];
    if (e < 0) return;
    const int r0 = tile_r0[blockIdx.y], rows = min(BM, offsets[e + 1] - r0);
    const int n0 = blockIdx.x * BN, tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1;
    const size_t row_bytes = (size_t)(K / Dq::QK) * Dq::BYTES;
    // this thread's pieces: A row tid / GPR (rows past the tile repeat its last), group tid % GPR;
    // W rows (tid + i*NT) / GPR, groups (tid + i*NT) % GPR
    const int ar = tid / GPR, ag = tid % GPR;
    const __nv_bfloat16* a_src = xs + (size_t)(r0 + min(ar, rows - 1)) * K + 8 * ag;
    const uint8_t* b_row[BG];
#pragma unroll
    for (int i = 0; i < BG; i++)
        b_row[i] = W + (size_t)e * expert_bytes + (size_t)min(n0 + (tid + i * NT) / GPR, N - 1) * row_bytes;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int k0 = 0; k0 < K; k0 += BK) {
        const uint4 a = *reinterpret_cast<const uint4*>(a_src + k0);
        float v[BG][8];
#pragma unroll
        for (int i = 0; i < BG; i++) {
            const int col = k0 + 8 * ((tid + i * NT) % GPR);
            Dq::deq8(b_row[i] + (size_t)(col / Dq::QK) * Dq::BYTES, col % Dq::QK, v[i]);
        }
        __syncthreads();  // every warp is done with the previous step's tiles
        *reinterpret_cast<uint4*>(&As[ar][8 * ag]) = a;
#pragma unroll
        for (int i = 0; i < BG; i++) {
            __nv_bfloat162 o[4] = {__floats2bfloat162_rn(v[i][0], v[i][1]), __floats2bfloat162_rn(v[i][2], v[i][3]),
                                   __floats2bfloat162_rn(v[i][4], v[i][5]), __floats2bfloat162_rn(v[i][6], v[i][7])};
            *reinterpret_cast<uint4*>(&Bs[(tid + i * NT) / GPR][8 * ((tid + i * NT) % GPR)]) =
                *reinterpret_cast<uint4*>(o);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, &As[16 * wm][kk], LDS);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, &Bs[32 * wn + 16 * f][kk], LDS);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
    }
    __syncthreads();  // the staging buffers become the output tile
#pragma unroll
    for (int f = 0; f < 2; f++) wmma::store_matrix_sync(&Cs[16 * wm][32 * wn + 16 * f], acc[f], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int c = tid; c < BM * BN; c += NT) {
        const int r = c / BN, n = c % BN;
        if (r < rows && n0 + n < N) y[(size_t)(r0 + r) * N + n0 + n] = Cs[r][n];
    }
}

#define MOE_GEMM(name, Dq)                                                                                       \
    extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS, 2) moe_gemm_##name(                                           \
        const void* W, int expert_bytes, const __nv_bfloat16* xs, const int* tile_e, const int* tile_r0,        \
        const int* offsets, float* y, int N, int K) {                                                            \
        KERNEL_START();                                                                                          \
        moe_gemm_impl<Dq>(static_cast<const uint8_t*>(W), expert_bytes, xs, tile_e, tile_r0, offsets, y, N, K); \
    }
MOE_GEMM(f32, DqF32)
MOE_GEMM(f16, DqF16)
MOE_GEMM(bf16, DqBF16)
MOE_GEMM(q4_0, DqQ4_0)
MOE_GEMM(q4_1, DqQ4_1)
MOE_GEMM(q5_0, DqQ5_0)
MOE_GEMM(q5_1, DqQ5_1)
MOE_GEMM(q8_0, DqQ8_0)
MOE_GEMM(q4_k, DqQ4_K)
MOE_GEMM(q5_k, DqQ5_K)
MOE_GEMM(q6_k, DqQ6_K)

// y[t][c] = add[t][c] + sum_j weights[t, j] · d[pos_of[t*k + j]][c], in selection order
// (e0·w0, then + e_j·w_j, as llama.cpp), then the residual.
extern "C" __global__ void moe_combine(const float* d, const int* pos_of, const float* weights, const float* add,
                                       float* y, int T, int k, int n) {
    KERNEL_START();
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < (size_t)T * n;
         g += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(g / n), c = (int)(g % n);
        float s = d[(size_t)pos_of[(size_t)t * k] * n + c] * weights[(size_t)t * k];
        for (int j = 1; j < k; j++) s = fmaf(d[(size_t)pos_of[(size_t)t * k + j] * n + c], weights[(size_t)t * k + j], s);
        y[g] = add ? add[g] + s : s;
    }
}
