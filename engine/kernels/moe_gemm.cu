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
    constexpr int APR = BK / 8, ACH = BM * APR / NT;                   // 16-byte activation pieces
    constexpr int SPR = BK / 32, DCH = (BN * SPR + NT - 1) / NT;       // 32-weight segments
    static_assert(BM * APR % NT == 0, "activation pieces divide among the threads");
    WeightSteps<BN, S::SPAN, NT> wsteps;
    wsteps.init(w_row, tid);
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

    // Issue the copies of step st into buffer b: the weight rows' bytes and the activations.
    auto stage = [&](int st, int b) {
        const int k0 = st * BK, kn = min(BK, K - k0);
        wsteps.issue(raw + b * BN * S::SPAN, st * S::RAW, kn / Dq::QK * Dq::BYTES);
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

// ---- the grouped GEMM on the int8 tensor cores (launchers/moe_gemm.py INT8) -----------
// The activations as int8 in groups of 32 with a float scale each (llama.cpp's
// q8_1: its MMQ kernels feed the tensor cores the same way), the weights'
// integer values unpacked from their blocks (no dequantisation), the products
// exact in int32, and the scales applied per group of 32 columns:
//   y = sum_c [ (d_W·sc)_c · dx_c · sum(q_W·q_x)_c  -  (dmin_W·m)_c · dx_c·sum(q_x)_c ]
// (the second term only for the types with a min, Q4_K and Q5_K; Q6_K's scale
// changes every 16 columns, so it takes two k16 products a group).

// moe_quant_q8: rows of x as int8 in groups of 32, rounded as gemv.cuh's quant16
// (d = amax/127, q = rint(x·(127/amax))), with xd = d and xsum = d·sum(q) per
// group. Row i is x[pair_at[i] / k] (the gather into expert order) or, with
// pair_at NULL, x[i]. xq rows are ld bytes apart, xd/xsum rows ld/32 floats
// (ld: n rounded up to 256, so a GEMM step's 8 scales are 32 bytes aligned).
// One thread per group of 32.
extern "C" __global__ void moe_quant_q8(const float* x, const int* pair_at, int P, int k, int n, int ld,
                                        int8_t* xq, float* xd, float* xsum) {
    KERNEL_START();
    const int gpr = n / 32;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < (size_t)P * gpr;
         g += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(g / gpr), c = 32 * (int)(g % gpr);
        const float* src = x + (size_t)(pair_at ? pair_at[i] / k : i) * n + c;
        float4 v[8];
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[j] = reinterpret_cast<const float4*>(src)[j];
            m = amax4(v[j], m);
        }
        const float d = __fdiv_rn(m, 127.0f), inv = m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f;
        uint32_t q[8];
        int s = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[j] = pack_i8(v[j], inv);
            s = __dp4a((int)q[j], 0x01010101, s);
        }
        uint4* dst = reinterpret_cast<uint4*>(xq + (size_t)i * ld + c);
        dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
        dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
        const size_t at = (size_t)i * (ld / 32) + c / 32;
        xd[at] = d;
        xsum[at] = d * (float)s;  // |s| <= 32 * 127: exact, one rounding
    }
}

// Bytes v - k, each on its own (no borrow between bytes), for bytes of v and k below 128.
__device__ __forceinline__ uint32_t sub_bytes(uint32_t v, uint32_t k) { return ((v | 0x80808080u) - k) ^ 0x80808080u; }

// The int8 unpackers: group c (32 consecutive columns) of the block at p as 8
// words of int8 values in column order, the scale of each of its SUB-column
// runs (s[0], and s[1] when SUB is 16) and, with MIN, the min (y = s·q - m).
// The values are the integers quants.py's dequantisation multiplies, so
// s·q - m is that dequantisation's value up to fp32 rounding.
struct I8Q4_0 {  // y = (q - 8)·d
    static constexpr int QK = 32, BYTES = 18, SUB = 32;
    static constexpr bool MIN = false;
    __device__ static void unpack(const uint8_t* p, int, uint32_t* q, float* s, float&) {
        s[0] = __half2float(reinterpret_cast<const block_q4_0*>(p)->d);
        uint32_t w[4];
        ld_words<4>(p + 2, w);
#pragma unroll
        for (int i = 0; i < 4; i++) {  // low nibbles are columns 0-15, high ones 16-31
            q[i] = sub_bytes(w[i] & 0x0F0F0F0Fu, 0x08080808u);
            q[4 + i] = sub_bytes((w[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
    }
};
struct I8Q8_0 {  // y = q·d
    static constexpr int QK = 32, BYTES = 34, SUB = 32;
    static constexpr bool MIN = false;
    __device__ static void unpack(const uint8_t* p, int, uint32_t* q, float* s, float&) {
        s[0] = __half2float(reinterpret_cast<const block_q8_0*>(p)->d);
        ld_words<8>(p + 2, q);
    }
};
struct I8Q4_K {  // group c is sub-block c: y = (d·sc)·q - dmin·m
    static constexpr int QK = 256, BYTES = 144, SUB = 32;
    static constexpr bool MIN = true;
    __device__ static void unpack(const uint8_t* p, int c, uint32_t* q, float* s, float& m) {
        const block_q4_K* b = reinterpret_cast<const block_q4_K*>(p);
        int sc, mn;
        scale_min_k4(c, b->scales, sc, mn);
        s[0] = __half2float(b->d) * (float)sc;
        m = __half2float(b->dmin) * (float)mn;
        uint32_t w[8];
        ld_words<8>(b->qs + 32 * (c >> 1), w);
        const int sh = (c & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = (w[i] >> sh) & 0x0F0F0F0Fu;
    }
};
struct I8Q5_K {  // as Q4_K, the 5th bit from qh
    static constexpr int QK = 256, BYTES = 176, SUB = 32;
    static constexpr bool MIN = true;
    __device__ static void unpack(const uint8_t* p, int c, uint32_t* q, float* s, float& m) {
        const block_q5_K* b = reinterpret_cast<const block_q5_K*>(p);
        int sc, mn;
        scale_min_k4(c, b->scales, sc, mn);
        s[0] = __half2float(b->d) * (float)sc;
        m = __half2float(b->dmin) * (float)mn;
        uint32_t w[8], h[8];
        ld_words<8>(b->qs + 32 * (c >> 1), w);
        ld_words<8>(b->qh, h);
        const int sh = (c & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = ((w[i] >> sh) & 0x0F0F0F0Fu) | (((h[i] >> c) & 0x01010101u) << 4);
    }
};
struct I8Q6_K {  // y = (d·scales[j])·(q - 32), a scale per 16 columns
    static constexpr int QK = 256, BYTES = 210, SUB = 16;
    static constexpr bool MIN = false;
    __device__ static void unpack(const uint8_t* p, int c, uint32_t* q, float* s, float&) {
        const block_q6_K* b = reinterpret_cast<const block_q6_K*>(p);
        const int n = c >> 2, g = c & 3;
        const float d = __half2float(b->d);
        s[0] = d * (float)b->scales[2 * c];
        s[1] = d * (float)b->scales[2 * c + 1];
        uint32_t ql[8], qh[8];
        ld_words<8>(b->ql + 64 * n + 32 * (g & 1), ql);
        ld_words<8>(b->qh + 32 * n, qh);
        const int sl = (g >> 1) * 4, sh = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; i++)
            q[i] = sub_bytes(((ql[i] >> sl) & 0x0F0F0F0Fu) | (((qh[i] >> sh) & 0x03030303u) << 4), 0x20202020u);
    }
};

// An int32 sum started at 1.5·2^23's bits holds, read as a float, 1.5·2^23 +
// the sum for |sum| < 2^22 (a group's is at most 32·127·128), so one FADD
// takes the float (I2F runs at a quarter of the rate).
#define I8_BIAS 0x4B400000
__device__ __forceinline__ float biased_to_float(int c) { return __int_as_float(c) - 12582912.0f; }

// d = I8_BIAS + the integer products (mma.sync, row.col: A's rows are weight
// rows, B's columns activation rows, both with k contiguous); the bias is an
// operand, not a register set per product.
__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(I8_BIAS));
}
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(I8_BIAS));
}
// Four 8x8 matrices of 16-bit elements (here: 8 rows x 16 int8) from shared
// memory: lane 8j + r gives the address of row r of matrix j; register j of
// lane l holds row l/4 of matrix j, bytes 4(l%4)..4(l%4)+3: for an int8 tile
// of 16 rows x 32 columns read as (rows 0-7 | 8-15) x (columns 0-15 | 16-31),
// exactly an m16n8k32 A fragment.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// y[i][c] for the tile's MOE_BM (= 32) sorted positions i and I8_BN features c.
// 4 warps, 2 x 2: warp (wf, wp) takes features 32wf..32wf+31 (two 16-row A
// tiles) and positions 16wp..16wp+15 (two 8-column B tiles). Per step of 256
// columns: the raw weight rows and the int8 activations with their scales are
// copied with cp.async one step ahead (double-buffered, as moe_gemm); the
// weights are unpacked to int8 rows and their scales; then per group of 32
// columns the products and the scaled sums. Dynamic shared memory: I8Shape::SMEM
// (launchers/moe_gemm.py gemm_i8_smem computes the same).
#define I8_BN 64
#define I8_THREADS 128
template <class Q>
struct I8Shape {
    static constexpr int BK = 256, G = BK / 32;                  // columns and groups a step
    static constexpr int RAW = BK / Q::QK * Q::BYTES;            // bytes of a row's step
    static constexpr int SPAN = (RAW + 15 + 15) / 16 * 16;       // staged, with alignment slack
    static constexpr int LD = BK + 16;                           // int8 row stride: rows 4 banks apart
    static constexpr int SL = 2 * G + 1, ML = G + 1, XL = 12;    // float strides: weight scales, mins, x scales
    static constexpr int RAW_BYTES = 2 * I8_BN * SPAN;
    static constexpr int XQ_BYTES = 2 * MOE_BM * LD;
    static constexpr int XS_BYTES = 2 * 2 * MOE_BM * XL * 4;      // [buffer][xd, xsum][row][XL]
    static constexpr int WQ_BYTES = I8_BN * LD;
    static constexpr int WS_BYTES = I8_BN * (SL + ML) * 4;
    static constexpr int SMEM = RAW_BYTES + XQ_BYTES + XS_BYTES + WQ_BYTES + WS_BYTES;
};

template <class Q>
__device__ __forceinline__ void moe_gemm_i8_impl(const uint8_t* __restrict__ W, int expert_bytes,
                                                 const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                                 const float* __restrict__ xsum, int ld, const int* tile_e,
                                                 const int* tile_r0, const int* offsets, float* y, int N, int K) {
    using S = I8Shape<Q>;
    constexpr int BM = MOE_BM, BN = I8_BN, BK = S::BK, G = S::G, LD = S::LD, NT = I8_THREADS;
    static_assert(BM == 32 && BN == 64 && NT == 128, "tile layout: 4 warps of 32 features x 16 positions");
    extern __shared__ __align__(128) uint8_t i8_smem[];
    uint8_t* raw = i8_smem;                                                   // [2][BN][SPAN]
    int8_t* Xq = reinterpret_cast<int8_t*>(i8_smem + S::RAW_BYTES);          // [2][BM][LD]
    float* Xs = reinterpret_cast<float*>(i8_smem + S::RAW_BYTES + S::XQ_BYTES);  // [2][2][BM][XL]
    int8_t* Wq = reinterpret_cast<int8_t*>(i8_smem + S::RAW_BYTES + S::XQ_BYTES + S::XS_BYTES);  // [BN][LD]
    float* Ws = reinterpret_cast<float*>(i8_smem + S::RAW_BYTES + S::XQ_BYTES + S::XS_BYTES + S::WQ_BYTES);
    float* Wm = Ws + BN * S::SL;                                              // [BN][ML]
    check_stage_smem(S::SMEM);
    const int e = tile_e[blockIdx.y];
    if (e < 0) return;
    const int r0 = tile_r0[blockIdx.y], rows = min(BM, offsets[e + 1] - r0);
    const int n0 = blockIdx.x * BN, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wf = warp & 1, wp = warp >> 1, g = lane >> 2, t = lane & 3;
    const size_t row_bytes = (size_t)(K / Q::QK) * Q::BYTES;
    const uint8_t* w0 = W + (size_t)e * expert_bytes;
    auto w_row = [&](int r) { return w0 + (size_t)min(n0 + r, N - 1) * row_bytes; };
    auto x_row = [&](int i) { return (size_t)(r0 + min(i, rows - 1)); };  // past the tile: its last row
    const int steps = (K + BK - 1) / BK, xl = ld / 32;

    // each thread's copies, the same every step but for the column offset
    constexpr int XCH = BM * (BK / 16) / NT;                           // 16-byte activation chunks
    static_assert(BM * 2 * 2 == NT, "one 16-byte chunk of scales a thread: 2 per row of xd and of xsum");
    WeightSteps<BN, S::SPAN, NT> wsteps;
    wsteps.init(w_row, tid);
    const int8_t* x_src[XCH];
    int x_dst[XCH], x_col[XCH];
#pragma unroll
    for (int j = 0; j < XCH; j++) {
        const int c = tid + j * NT, i = c / (BK / 16);
        x_col[j] = 16 * (c % (BK / 16));
        x_src[j] = xq + x_row(i) * ld + x_col[j];
        x_dst[j] = i * LD + x_col[j];
    }
    const int s_i = tid & (BM - 1), s_half = (tid >> 5) & 1, s_which = tid >> 6;  // row, 4 of its 8 scales, xd/xsum
    const float* s_src = (s_which ? xsum : xd) + x_row(s_i) * xl + 4 * s_half;
    const int s_dst = (s_which * BM + s_i) * S::XL + 4 * s_half;
    // unpacking: lane -> row (rows 4 banks apart: the 16-byte stores of 8 lanes meet no bank twice)
    const int u_row = tid & (BN - 1), u_g0 = tid / BN;  // groups u_g0, u_g0 + 2, ...
    const int u_mod = (int)(reinterpret_cast<size_t>(w_row(u_row)) & 15);

    auto stage = [&](int st, int b) {
        const int k0 = st * BK, kn = min(BK, K - k0);
        wsteps.issue(raw + b * BN * S::SPAN, st * S::RAW, kn / Q::QK * Q::BYTES);
#pragma unroll
        for (int j = 0; j < XCH; j++)
            if (x_col[j] < kn) cp_async16(Xq + b * BM * LD + x_dst[j], x_src[j] + k0);
        cp_async16(Xs + b * 2 * BM * S::XL + s_dst, s_src + st * G);  // past a short step: unread
        cp_async_commit();
    };

    float acc[2][2][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    stage(0, 0);
    for (int st = 0; st < steps; st++) {
        const int b = st & 1, kn = min(BK, K - st * BK), groups = kn / 32;
        cp_async_wait_all();
        __syncthreads();  // step st's bytes are in; every warp is done with step st-1's tiles
        if (st + 1 < steps) stage(st + 1, b ^ 1);
        const uint8_t* rawb = raw + b * BN * S::SPAN + u_row * S::SPAN + ((u_mod + st * S::RAW) & 15);
        for (int c = u_g0; c < groups; c += NT / BN) {
            uint32_t q[8];
            float s[2] = {0.0f, 0.0f}, m = 0.0f;
            Q::unpack(rawb + (32 * c / Q::QK) * Q::BYTES, (32 * c % Q::QK) / 32, q, s, m);
            uint4* dst = reinterpret_cast<uint4*>(Wq + u_row * LD + 32 * c);
            dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
            dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            Ws[u_row * S::SL + 2 * c] = s[0];
            Ws[u_row * S::SL + 2 * c + 1] = s[1];
            Wm[u_row * S::ML + c] = m;
        }
        __syncthreads();
        const int8_t* Xb = Xq + b * BM * LD;
        const float* Xd = Xs + b * 2 * BM * S::XL;
        const float* Xsum = Xd + BM * S::XL;
        for (int c = 0; c < groups; c++) {
            const int k = 32 * c;
            // A (per 16-row tile): lane l addresses row (l & 7) + 8((l >> 3) & 1), columns 16(l >> 4) on;
            // B (both 8-row tiles at once): matrix j = l >> 3 is tile j >> 1, columns 16(j & 1) on, so
            // its registers are (tile 0: columns 0-15, 16-31; tile 1: the same)
            uint32_t a[2][4], bq[4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(a[mt], Wq + (32 * wf + 16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + k + 16 * (lane >> 4));
            ldsm_x4(bq, Xb + (16 * wp + 8 * (lane >> 4) + (lane & 7)) * LD + k + 16 * ((lane >> 3) & 1));
            float dx[2][2], sx[2][2];  // [B tile][column 2t, 2t+1]
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int i = 16 * wp + 8 * nt + 2 * t + j;
                    dx[nt][j] = Xd[i * S::XL + c];
                    sx[nt][j] = Q::MIN ? Xsum[i * S::XL + c] : 0.0f;
                }
            int cq[2][2][2][4];  // [run of SUB columns][mt][nt][element]
            constexpr int RUNS = 32 / Q::SUB;
#pragma unroll
            for (int u = 0; u < RUNS; u++)
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        if constexpr (Q::SUB == 32) {
                            mma_k32(cq[u][mt][nt], a[mt], bq[2 * nt], bq[2 * nt + 1]);
                        } else {  // columns 16u..16u+15: A's registers 2u, 2u + 1, B's 2nt + u
                            mma_k16(cq[u][mt][nt], a[mt][2 * u], a[mt][2 * u + 1], bq[2 * nt + u]);
                        }
                    }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {  // rows g and g + 8 of the A tile
                    const int f = 32 * wf + 16 * mt + g + 8 * h;
                    const float m = Q::MIN ? Wm[f * S::ML + c] : 0.0f;
#pragma unroll
                    for (int u = 0; u < RUNS; u++) {
                        const float sw = Ws[f * S::SL + 2 * c + u];
#pragma unroll
                        for (int nt = 0; nt < 2; nt++)
#pragma unroll
                            for (int j = 0; j < 2; j++) {
                                float& o = acc[mt][nt][2 * h + j];
                                o = fmaf(sw * dx[nt][j], biased_to_float(cq[u][mt][nt][2 * h + j]), o);
                                if (Q::MIN && u == 0) o = fmaf(-m, sx[nt][j], o);
                            }
                    }
                }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int f = n0 + 32 * wf + 16 * mt + g + 8 * (i >> 1), p = 16 * wp + 8 * nt + 2 * t + (i & 1);
                if (p < rows && f < N) y[(size_t)(r0 + p) * N + f] = acc[mt][nt][i];
            }
}

#define MOE_GEMM_I8(name, Q)                                                                                        \
    extern "C" __global__ void __launch_bounds__(I8_THREADS) moe_gemm_i8_##name(                                   \
        const void* W, int expert_bytes, const int8_t* xq, const float* xd, const float* xsum, int ld,              \
        const int* tile_e, const int* tile_r0, const int* offsets, float* y, int N, int K) {                        \
        KERNEL_START();                                                                                             \
        moe_gemm_i8_impl<Q>(static_cast<const uint8_t*>(W), expert_bytes, xq, xd, xsum, ld, tile_e, tile_r0, offsets, \
                            y, N, K);                                                                               \
    }
MOE_GEMM_I8(q4_0, I8Q4_0)
MOE_GEMM_I8(q8_0, I8Q8_0)
MOE_GEMM_I8(q4_k, I8Q4_K)
MOE_GEMM_I8(q5_k, I8Q5_K)
MOE_GEMM_I8(q6_k, I8Q6_K)

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
