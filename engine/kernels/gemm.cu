// The prefill GEMM straight from the quantised blocks, on Hopper's warpgroup
// tensor cores (wgmma, compiled for sm_90a): y = x · Wᵀ for one weight matrix or
// a run of them stored back to back (launchers/gemm.py), with no bf16 copy of W
// in device memory (the other path dequantises W to a bf16 scratch matrix for a
// cuBLAS GEMM: dequant.cu).
//
//   gemm_<t>(W, x, y0, y1, y2, n0, n1, T, N, K, accumulate)
//     x  [T][K] bf16, row-major (the activations as the GEMM rounds them)
//     W  N rows of K/QK blocks of type t
//     y  the [T][N] fp32 product split by columns: W's rows [0, n0) into y0
//        ([T][n0]), [n0, n0+n1) into y1 ([T][n1]), the rest into y2;
//        accumulate != 0: added to what y holds (the residual stream)
//   gemm_grouped_<t>(W, expert_bytes, xs, offsets, y, N, K)
//     the Mixture-of-Experts prefill's grouped projection (moe_gemm.cu's
//     layout: xs and y [P][K], [P][N] in expert order, expert e's rows
//     offsets[e]..offsets[e+1]-1, its matrix expert_bytes after e-1's):
//     y[i] = W[expert of i] · xs[i]. A block takes one expert's BN features
//     and walks its rows BM at a time, so each expert's weights are
//     dequantised once per BM of its rows.
//
// Numerics: every weight is quants.cuh deq32's exact value rounded to bf16
// (nearest even), the values dequant_bf16 writes for cuBLAS; the products of
// bf16 values are summed in fp32 by the tensor cores. The roundings of the
// dequant + cuBLAS path; only the order of the fp32 sums differs.
//
// A block of 256 threads, two warpgroups, makes a tile of BM = 128·MT tokens x
// GEMM_BN = 128 features: warpgroup g the tokens [64·MT·g, 64·MT·(g+1)) with MT
// wgmma.m64n128k16 per 16 columns (64·MT fp32 accumulators a thread). MT = 2
// (gemm256_<t>) makes each dequantised weight serve twice the tokens, for the
// types whose staging fits beside the larger A buffers. K goes by in
// sub-steps of 64 columns. The A (x) and B (W as bf16) tiles of a sub-step are
// 128-byte rows in the layout wgmma reads with the 128-byte swizzle: the 16-byte
// chunk c of row r at chunk c ^ (r % 8) of the row, 8 rows in 1024 aligned bytes.
// The weights' raw bytes come in steps of 256 columns (one K-quant block or
// eight 32-element blocks a row), copied as moe_gemm.cu copies them.
//
// Sub-step s, every thread (s from -3: the first three only fill the pipeline):
//   1. waits for its copies of two sub-steps ago and fences them and its own
//      dequantised stores of the last sub-step into the async proxy (wgmma reads
//      shared memory through it), then a barrier;
//   2. issues its warpgroup's 4 wgmma of sub-step s (asynchronous);
//   3. waits for its warpgroup's wgmma of s-1 (one batch in flight at most);
//   4. issues the copies of A for s+2 and, every 4th sub-step, of the raw bytes
//      of the weights' next 256 columns (for sub-steps s+3..s+6);
//   5. dequantises B of s+1 from the raw bytes (32 weights a thread) while the
//      tensor cores multiply s.
// So A takes 4 buffers (s+2 is written while s is read and s-1 may still be),
// B 3 (s+1 written, s and s-1; with MT = 1, 4, so that its index is a mask),
// the raw bytes 2 (256 columns each): a buffer is written only after the
// barrier that follows every warpgroup's wait for the wgmma that last read it.
// Per sub-step a thread issues ~280 instructions besides the wgmma, most of
// them the dequantisation (about 4 a weight: the nibble into a float, the
// scale and min in one fma, the bf16 rounding), against 512 cycles of tensor
// work for the block: its addresses are worked out once, before the loop.
#include "gemv.cuh"  // cp.async, WeightSteps, check_stage_smem

#define GEMM_BN 128  // features a block
#define GEMM_BK 64   // columns a sub-step: one 128-byte swizzled row of bf16
#define GEMM_THREADS 256
#define GEMM_A_SLOTS 4

template <class Dq, int MT>
struct QGemmShape {
    static_assert(Dq::QK == 32 || Dq::QK == 256, "block-quantised types only");
    static constexpr int BM = 128 * MT;                           // tokens a block
    static constexpr int RAWK = 256;                              // columns a raw step
    static constexpr int SUB = RAWK / GEMM_BK;                    // sub-steps a raw step
    static constexpr int RAW = RAWK / Dq::QK * Dq::BYTES;         // a row's bytes a raw step
    static constexpr int SPAN = (RAW + 15 + 15) / 16 * 16;        // staged, with alignment slack
    static constexpr int A_TILE = BM * GEMM_BK * 2;               // 16 KB a 128 tokens
    static constexpr int B_TILE = GEMM_BN * GEMM_BK * 2;          // 16 KB
    static constexpr int B_SLOTS = MT == 1 ? 4 : 3;
    static constexpr int A_OFF = 0;
    static constexpr int B_OFF = GEMM_A_SLOTS * A_TILE;
    static constexpr int RAW_OFF = B_OFF + B_SLOTS * B_TILE;
    static constexpr int SMEM = 1024 + RAW_OFF + 2 * GEMM_BN * SPAN;  // + 1024: the base aligned up
    static_assert(SUB == 4 && GEMM_A_SLOTS == 4, "indices by masks");
    static_assert(SMEM <= 227 * 1024, "shared memory of a block");
};

// The wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle:
// start address, leading byte offset 16 (unused by this layout), stride byte
// offset 1024 (8 rows of 128 bytes), layout 1 (128B swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (uint64_t)(16 >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           1ull << 62;
}
// byte offset of the 16-byte chunk c of row r of a swizzled tile
__device__ __forceinline__ int swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

#define WG_ACC8(i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// d += A·Bᵀ: A 64 x 16 and B 128 x 16 (K-major) from shared memory, d [64 x 128] in fp32 over the warpgroup.
__device__ __forceinline__ void wgmma_m64n128k16(float* d, uint64_t da, uint64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "l"(da), "l"(db));
}
#undef WG_ACC8
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// pins the accumulators at this point of the program (no move across an asynchronous wgmma)
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The block's shared memory, its base aligned up to 1024 bytes (the swizzle's period).
template <class S>
__device__ __forceinline__ uint8_t* qgemm_smem_base() {
    extern __shared__ __align__(16) uint8_t qgemm_smem[];
    check_stage_smem(S::SMEM);
    const uint32_t base_s = (uint32_t)__cvta_generic_to_shared(qgemm_smem);
    return qgemm_smem + (((base_s + 1023) & ~1023u) - base_s);
}

// One tile: rows [0, rows) of x (rows at most BM; x's rows K apart, those past
// `rows` read as the last) times W's rows [f0, f0 + BN) (past N: the last);
// out(i, c, v) takes the products of row i, columns c and c+1 (c even, < N).
template <class Dq, int MT, class Out>
__device__ __forceinline__ void qgemm_tile(uint8_t* smem, const uint8_t* __restrict__ W,
                                           const __nv_bfloat16* __restrict__ x, int rows, int f0, int N, int K,
                                           Out out) {
    using S = QGemmShape<Dq, MT>;
    constexpr int BM = S::BM, BN = GEMM_BN, BK = GEMM_BK, NT = GEMM_THREADS;
    const uint32_t smem_s = (uint32_t)__cvta_generic_to_shared(smem);
    uint8_t* raw = smem + S::RAW_OFF;
    const int tid = threadIdx.x, wg = tid >> 7;
    const size_t row_bytes = (size_t)(K / Dq::QK) * Dq::BYTES;
    auto w_row = [&](int r) { return W + (size_t)min(f0 + r, N - 1) * row_bytes; };  // rows past N: the last
    const int steps = K / BK, raw_steps = (K + S::RAWK - 1) / S::RAWK;

    // A: BM rows x 8 chunks of 16 bytes a sub-step, 4·MT chunks a thread: chunk tid % 8 of rows
    // tid / 8 + 32 j, which is the same swizzled chunk in each (32 j is a multiple of 8). Rows
    // past `rows` read the last (the launcher keeps the row offsets inside int).
    // Each pointer moves on by a sub-step as its copy is issued (so it is kept, not worked out anew).
    constexpr int ACH = BM * 8 / NT;
    const int a_dst = swz(tid >> 3, tid & 7);
    const __nv_bfloat16* a_src[ACH];
#pragma unroll
    for (int j = 0; j < ACH; j++) a_src[j] = x + min((tid >> 3) + 32 * j, rows - 1) * K + 8 * (tid & 7);
    WeightSteps<BN, S::SPAN, NT> wsteps;
    wsteps.init(w_row, tid);
    // dequantisation: 32 weights a thread, row d_row, columns [32 d_half, 32 d_half + 32) of the
    // sub-step; the 8 lanes of a 16-byte store phase take 8 consecutive rows: 8 distinct chunks
    const int d_row = (tid >> 4) * 8 + (tid & 7), d_half = (tid >> 3) & 1;
    const int d_mod = (int)(reinterpret_cast<size_t>(w_row(d_row)) & 15);

    auto issue = [&](int s) {  // the copies of A for sub-step s+2 and, when s+3 begins a raw step, of its raw bytes
        if (s + 2 >= 0 && s + 2 < steps) {
            uint8_t* a = smem + S::A_OFF + ((s + 2) & 3) * S::A_TILE + a_dst;
#pragma unroll
            for (int j = 0; j < ACH; j++) {
                cp_async16(a + 32 * 128 * j, a_src[j]);
                a_src[j] += BK;
            }
        }
        if (((s + 3) & 3) == 0 && (s + 3) >> 2 < raw_steps) {
            const int r = (s + 3) >> 2, k0 = r * S::RAWK;
            wsteps.issue(raw + (r & 1) * BN * S::SPAN, r * S::RAW, min(S::RAWK, K - k0) / Dq::QK * Dq::BYTES);
        }
        cp_async_commit();  // one group a sub-step, empty or not
    };
    auto dequant = [&](int s) {  // B of sub-step s from the raw bytes, as bf16
        const int r = s >> 2, col = (s & 3) * BK + 32 * d_half;  // column within the raw step
        const int off = (d_mod + r * S::RAW) & 15;
        float v[32];
        const uint8_t* blk = raw + ((r & 1) * BN + d_row) * S::SPAN + off + (col / Dq::QK) * Dq::BYTES;
        if constexpr (Dq::QK == 256 && Dq::BYTES % 16 == 0)  // Q4_K, Q5_K: whole granules, W aligned (launcher)
            Dq::template deq32<true>(blk, col % Dq::QK, v);
        else
            Dq::deq32(blk, col % Dq::QK, v);
        uint8_t* b = smem + S::B_OFF + (unsigned)s % S::B_SLOTS * S::B_TILE;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            __nv_bfloat162 o[4];
#pragma unroll
            for (int i = 0; i < 4; i++) o[i] = __floats2bfloat162_rn(v[8 * q + 2 * i], v[8 * q + 2 * i + 1]);
            *reinterpret_cast<uint4*>(b + swz(d_row, 4 * d_half + q)) = *reinterpret_cast<uint4*>(o);
        }
    };

    // the descriptors of buffer 0 (this warpgroup's first 64 rows of A; B): a buffer's is its offset / 16 more
    const uint64_t da0 = wgmma_desc(smem_s + S::A_OFF + wg * MT * 64 * 128), db0 = wgmma_desc(smem_s + S::B_OFF);
    float d[MT][64];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 64; i++) d[m][i] = 0.0f;
    for (int s = -3; s < steps; s++) {
        cp_async_wait<1>();  // this thread's copies of sub-steps up to s-2 (A of s, raw of s+1) landed
        fence_proxy_async();
        __syncthreads();
        if (s >= 0) {
            const uint64_t abuf = (uint64_t)((s & 3) * S::A_TILE) >> 4;
            const uint64_t bbuf = (uint64_t)((unsigned)s % S::B_SLOTS * S::B_TILE) >> 4;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
                for (int m = 0; m < MT; m++)
                    wgmma_m64n128k16(d[m], da0 + abuf + m * (64 * 128 >> 4) + 2 * kk, db0 + bbuf + 2 * kk);
            wgmma_commit();
            wgmma_wait<1>();  // s-1's batch is done: its buffers may be written after the next barrier
#pragma unroll
            for (int m = 0; m < MT; m++) fence_acc(d[m]);
        }
        issue(s);
        if (s + 1 >= 0 && s + 1 < steps) dequant(s + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < MT; m++) fence_acc(d[m]);

    // d[m][4j + i]: row 16·warp + lane/4 (+8 for i >= 2) of the warpgroup's m-th 64 rows, column
    // 8j + 2·(lane%4) (+1 for odd i)
    const int lane = tid & 31;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int row = 64 * (MT * wg + m) + 16 * ((tid >> 5) & 3) + (lane >> 2), c = f0 + 8 * j + 2 * (lane & 3);
            if (c >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (row + 8 * h < rows) out(row + 8 * h, c, make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]));
        }
}

// gemm_<t>: the block's tokens [t0, t0 + BM) (tokens fastest: consecutive blocks share a W tile).
template <class Dq, int MT>
__device__ __forceinline__ void qgemm_dense(const uint8_t* W, const __nv_bfloat16* x, float* y0, float* y1,
                                            float* y2, int n0, int n1, int T, int N, int K, int accumulate) {
    constexpr int BM = QGemmShape<Dq, MT>::BM;
    const int m_tiles = (T + BM - 1) / BM;
    const int t0 = (blockIdx.x % m_tiles) * BM, f0 = (blockIdx.x / m_tiles) * GEMM_BN;
    // n0 and n1 are even, so columns c and c+1 go to one output
    auto out = [&](int i, int c, float2 v) {
        float* y = c < n0 ? y0 : c < n0 + n1 ? y1 : y2;
        const int ld = c < n0 ? n0 : c < n0 + n1 ? n1 : N - n0 - n1, oc = c < n0 ? c : c < n0 + n1 ? c - n0 : c - n0 - n1;
        float2* p = reinterpret_cast<float2*>(y + (size_t)(t0 + i) * ld + oc);
        if (accumulate) {
            const float2 o = *p;
            v.x += o.x;
            v.y += o.y;
        }
        *p = v;
    };
    qgemm_tile<Dq, MT>(qgemm_smem_base<QGemmShape<Dq, MT>>(), W, x + (size_t)t0 * K, min(BM, T - t0), f0, N, K, out);
}

// gemm_grouped_<t>: expert blockIdx.y's features [f0, f0 + BN), its rows BM at a time. A tile's first
// barrier comes after the last one's wgmma waits, so the buffers pass from one tile to the next.
template <class Dq, int MT>
__device__ __forceinline__ void qgemm_grouped(const uint8_t* W, int expert_bytes, const __nv_bfloat16* xs,
                                              const int* offsets, float* y, int N, int K) {
    constexpr int BM = QGemmShape<Dq, MT>::BM;
    const int e = blockIdx.y, f0 = blockIdx.x * GEMM_BN, end = offsets[e + 1];
    uint8_t* smem = qgemm_smem_base<QGemmShape<Dq, MT>>();
    for (int r0 = offsets[e]; r0 < end; r0 += BM) {
        auto out = [&](int i, int c, float2 v) { *reinterpret_cast<float2*>(y + (size_t)(r0 + i) * N + c) = v; };
        qgemm_tile<Dq, MT>(smem, W + (size_t)e * expert_bytes, xs + (size_t)r0 * K, min(BM, end - r0), f0, N, K, out);
    }
}

#define QGEMM(kernel, Dq, MT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) kernel(                                         \
        const void* W, const __nv_bfloat16* x, float* y0, float* y1, float* y2, int n0, int n1, int T, int N,    \
        int K, int accumulate) {                                                                                 \
        KERNEL_START();                                                                                          \
        qgemm_dense<Dq, MT>(static_cast<const uint8_t*>(W), x, y0, y1, y2, n0, n1, T, N, K, accumulate);         \
    }
#define QGEMM_GROUPED(kernel, Dq, MT)                                                                         \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) kernel(                                     \
        const void* W, int expert_bytes, const __nv_bfloat16* xs, const int* offsets, float* y, int N, int K) { \
        KERNEL_START();                                                                                      \
        qgemm_grouped<Dq, MT>(static_cast<const uint8_t*>(W), expert_bytes, xs, offsets, y, N, K);            \
    }
QGEMM(gemm_q4_0, DqQ4_0, 1)
QGEMM(gemm_q4_1, DqQ4_1, 1)
QGEMM(gemm_q5_0, DqQ5_0, 1)
QGEMM(gemm_q5_1, DqQ5_1, 1)
QGEMM(gemm_q8_0, DqQ8_0, 1)
QGEMM(gemm_q4_k, DqQ4_K, 1)
QGEMM(gemm_q5_k, DqQ5_K, 1)
QGEMM(gemm_q6_k, DqQ6_K, 1)
// 256 tokens a block: the types whose raw step (at most 176 bytes a row) fits beside 4 A buffers of 32 KB
QGEMM(gemm256_q4_0, DqQ4_0, 2)
QGEMM(gemm256_q4_1, DqQ4_1, 2)
QGEMM(gemm256_q5_0, DqQ5_0, 2)
QGEMM(gemm256_q4_k, DqQ4_K, 2)
QGEMM(gemm256_q5_k, DqQ5_K, 2)
QGEMM_GROUPED(gemm_grouped_q4_0, DqQ4_0, 1)
QGEMM_GROUPED(gemm_grouped_q4_1, DqQ4_1, 1)
QGEMM_GROUPED(gemm_grouped_q5_0, DqQ5_0, 1)
QGEMM_GROUPED(gemm_grouped_q5_1, DqQ5_1, 1)
QGEMM_GROUPED(gemm_grouped_q8_0, DqQ8_0, 1)
QGEMM_GROUPED(gemm_grouped_q4_k, DqQ4_K, 1)
QGEMM_GROUPED(gemm_grouped_q5_k, DqQ5_K, 1)
QGEMM_GROUPED(gemm_grouped_q6_k, DqQ6_K, 1)
