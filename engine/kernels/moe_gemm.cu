// Mixture-of-Experts prefill (engine/models/moe.py; architectures.md §0.6): the
// (token, slot) pairs of many tokens grouped by expert on the device, and each
// projection one grouped GEMM over all experts (launchers/moe_gemm.py). Expert
// tensors and ids/weights as in moe.cu (which holds routing and decode).
//
//   moe_sort        pairs sorted by expert (stable), tiles of MOE_BM pairs of one expert
//   moe_gather_bf16 xs[i] = bf16(x[token of pair i])
//   moe_gemm_<t>    y[i] = W[expert of i]·xs[i] on the tensor cores (bf16 in, fp32
//                   accumulate and out), dequantising W's tiles on the way (exact
//                   values, rounded to bf16 as the dense prefill's dequant_bf16)
//   moe_combine     y[t] = add[t] + sum_j weights[t, j] · d[pos of pair (t, j)]
#include "gemv.cuh"  // cp.async staging, check_stage_smem
#include <mma.h>

#define MOE_BM 32   // GEMM tile: pairs (rows) of one expert
#ifndef MOE_BN
#define MOE_BN 64   // output features (a multiple of 64)
#endif
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

// y[i][c] for the tile's MOE_BM positions i and MOE_BN features c. 8 warps,
// 2 x 4, each 16 rows x MOE_BN/4 features (MOE_BN/64 wmma 16x16x16
// accumulators). Per k-step of BK columns (256 for block-quantised types: one
// K-quant block or eight 32-element blocks per row; 64 for float rows):
//   the raw bytes of the tile's MOE_BN weight rows and the BM x BK bf16
//   activations are copied to shared memory with cp.async, one step ahead
//   (double-buffered), so the copies of step s+1 fly while step s computes;
//   the weights are dequantised from shared memory (quants.cuh deq32, exact)
//   and rounded to bf16 into the B tile; then the MMAs.
// Dequantisation is most of the kernel's instructions (Nsight Compute, 30B-A3B
// gate, 8 deq8 calls per thread and step: ~26 instructions per weight, ALU
// pipe first); deq32 decodes the scales once per 32 weights and reads words.
// Dynamic shared memory: gemm_smem() bytes (launchers/moe_gemm.py computes the same).
template <class Dq>
struct GemmShape {
    static constexpr int BK = Dq::QK == 1 ? 64 : 256;
    static constexpr int RAW = BK / Dq::QK * Dq::BYTES;          // bytes of a row's step
    static constexpr int SPAN = (RAW + 15 + 15) / 16 * 16;       // staged, with alignment slack
    static constexpr int LDS = BK + 8;                           // bf16 row stride of the A and B tiles
    static constexpr int RAW_BYTES = 2 * MOE_BN * SPAN;
    static constexpr int A_BYTES = 2 * MOE_BM * LDS * 2;
    static constexpr int B_BYTES = MOE_BN * LDS * 2;
    static constexpr int SMEM = RAW_BYTES + A_BYTES + B_BYTES;
};

template <class Dq>
__device__ __forceinline__ void moe_gemm_impl(const uint8_t* __restrict__ W, int expert_bytes,
                                              const __nv_bfloat16* __restrict__ xs, const int* tile_e,
                                              const int* tile_r0, const int* offsets, float* y, int N, int K) {
    using namespace nvcuda;
    using S = GemmShape<Dq>;
    constexpr int BM = MOE_BM, BN = MOE_BN, BK = S::BK, LDS = S::LDS, NT = MOE_GEMM_THREADS;
    constexpr int NF = BN / 64, LDC = BN + 4;  // accumulators per warp; output tile stride (floats)
    static_assert(NT == 8 * 32 && BM == 32 && BN % 64 == 0, "tile layout: 8 warps of 16 x BN/4");
    static_assert(BM * LDC * 4 <= S::B_BYTES, "the output tile fits in the B tile");
    extern __shared__ __align__(128) uint8_t gemm_smem[];
    uint8_t* raw = gemm_smem;                                                            // [2][BN][SPAN]
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(gemm_smem + S::RAW_BYTES);      // [2][BM][LDS]
    __nv_bfloat16* Bs = reinterpret_cast<__nv_bfloat16*>(gemm_smem + S::RAW_BYTES + S::A_BYTES);  // [BN][LDS]
    float* Cs = reinterpret_cast<float*>(Bs);  // the output tile, after the last step
    check_stage_smem(S::SMEM);
    const int e = tile_e[blockIdx.y];
    if (e < 0) return;
    const int r0 = tile_r0[blockIdx.y], rows = min(BM, offsets[e + 1] - r0);
    const int n0 = blockIdx.x * BN, tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1;
    const size_t row_bytes = (size_t)(K / Dq::QK) * Dq::BYTES;
    const uint8_t* w0 = W + (size_t)e * expert_bytes;
    // weight row r of the tile (rows past N repeat the last); activation row i (past the tile: its last)
    auto w_row = [&](int r) { return w0 + (size_t)min(n0 + r, N - 1) * row_bytes; };
    auto a_row = [&](int i) { return xs + (size_t)(r0 + min(i, rows - 1)) * K; };
    const int steps = (K + BK - 1) / BK;

    // Each thread's share of a step, the same every step (only the column
    // moves): weight chunks, activation pieces, dequantised segments. Their
    // addresses are worked out once here; a step adds its offset.
    constexpr int CPR = S::SPAN / 16, WCH = (BN * CPR + NT - 1) / NT;  // 16-byte weight chunks per row, per thread
    constexpr int APR = BK / 8, ACH = BM * APR / NT;                   // 16-byte activation pieces
    constexpr int SPR = BK / 32, DCH = (BN * SPR + NT - 1) / NT;       // 32-weight segments
    static_assert(BM * APR % NT == 0, "activation pieces divide among the threads");
    const uint8_t* w_src[WCH];
    int w_dst[WCH], w_i[WCH];
#pragma unroll
    for (int j = 0; j < WCH; j++) {
        const int c = tid + j * NT, r = min(c / CPR, BN - 1);
        w_src[j] = w_row(r);
        w_dst[j] = r * S::SPAN + 16 * (c % CPR);
        w_i[j] = c < BN * CPR ? c % CPR : CPR;  // CPR: no chunk
    }
    const __nv_bfloat16* a_src[ACH];
    int a_dst[ACH], a_col[ACH];
#pragma unroll
    for (int j = 0; j < ACH; j++) {
        const int c = tid + j * NT, i = c / APR;
        a_col[j] = 8 * (c % APR);
        a_src[j] = a_row(i) + a_col[j];
        a_dst[j] = i * LDS + a_col[j];
    }
    // dequantisation: lane l of a warp takes row l % 4 of its 4-row group and
    // segment l / 4, so the 8 lanes of each 16-byte store phase write 4 rows x
    // 2 segments: distinct banks (the B tile's row stride is 4 banks mod 32)
    int d_row[DCH], d_col[DCH], d_mod[DCH];
#pragma unroll
    for (int j = 0; j < DCH; j++) {
        const int c = tid + j * NT;
        d_row[j] = min(4 * (c / (4 * SPR)) + c % 4, BN - 1);
        d_col[j] = c < BN * SPR ? 32 * ((c / 4) % SPR) : BK;  // BK: no segment
        d_mod[j] = (int)(reinterpret_cast<size_t>(w_row(d_row[j])) & 15);
    }

    // Issue the copies of step st into buffer b: each row's bytes as 16-byte
    // chunks from the aligned floor (the slack chunks stay inside the granules
    // of wanted bytes), and the activations.
    auto stage = [&](int st, int b) {
        const int k0 = st * BK, kn = min(BK, K - k0);
        const int skip = st * S::RAW, len = kn / Dq::QK * Dq::BYTES;
#pragma unroll
        for (int j = 0; j < WCH; j++) {
            const size_t src = reinterpret_cast<size_t>(w_src[j] + skip), a0 = src & ~(size_t)15;
            if (w_i[j] < CPR && a0 + 16 * (size_t)w_i[j] < src + len)
                cp_async16(raw + b * BN * S::SPAN + w_dst[j], reinterpret_cast<const void*>(a0 + 16 * (size_t)w_i[j]));
        }
#pragma unroll
        for (int j = 0; j < ACH; j++)
            if (a_col[j] < kn) cp_async16(As + b * BM * LDS + a_dst[j], a_src[j] + k0);
        cp_async_commit();
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(acc[f], 0.0f);
    stage(0, 0);
    for (int st = 0; st < steps; st++) {
        const int b = st & 1, k0 = st * BK, kn = min(BK, K - k0);
        cp_async_wait_all();
        __syncthreads();  // step st's bytes are in; every warp is done with step st-1's tiles
        if (st + 1 < steps) stage(st + 1, b ^ 1);
        const int skip = st * S::RAW;
#pragma unroll
        for (int j = 0; j < DCH; j++) {
            const int col = d_col[j];
            if (col >= kn) continue;
            const int off = (d_mod[j] + skip) & 15;
            float v[32];
            Dq::deq32(raw + (b * BN + d_row[j]) * S::SPAN + off + (col / Dq::QK) * Dq::BYTES, col % Dq::QK, v);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                __nv_bfloat162 o[4];
#pragma unroll
                for (int i = 0; i < 4; i++) o[i] = __floats2bfloat162_rn(v[8 * q + 2 * i], v[8 * q + 2 * i + 1]);
                *reinterpret_cast<uint4*>(Bs + d_row[j] * LDS + col + 8 * q) = *reinterpret_cast<uint4*>(o);
            }
        }
        __syncthreads();
        const __nv_bfloat16* Ab = As + b * BM * LDS;
        for (int kk = 0; kk < kn; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
            wmma::load_matrix_sync(fa, Ab + 16 * wm * LDS + kk, LDS);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, Bs + (BN / 4 * wn + 16 * f) * LDS + kk, LDS);
                wmma::mma_sync(acc[f], fa, fb, acc[f]);
            }
        }
    }
    __syncthreads();  // the B tile becomes the output tile
#pragma unroll
    for (int f = 0; f < NF; f++)
        wmma::store_matrix_sync(Cs + 16 * wm * LDC + BN / 4 * wn + 16 * f, acc[f], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int c = tid; c < BM * BN; c += NT) {
        const int r = c / BN, n = c % BN;
        if (r < rows && n0 + n < N) y[(size_t)(r0 + r) * N + n0 + n] = Cs[r * LDC + n];
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
