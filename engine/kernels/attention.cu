// Causal attention over the KV cache, with GQA and an optional sliding window.
//
// Cache layout per layer: [n_ctx, n_head_kv, HEAD_DIM] of kv_t (f16 or f32,
// KV_F16). Query t sits at position pos[t] and sees cache rows p with
// p <= pos[t] and (window == 0 || pos[t] - p < window). Query head h reads KV
// head h / GQA. Scores (q.k)*scale and the softmax are fp32; exps are __expf
// (what llama.cpp's fast-math build runs). Output [T, n_head*HEAD_DIM].
// Rows past the visible range are never read (they may hold garbage or NaN).
//
// Compile-time: KV_F16 (0/1), HEAD_DIM (64, 128, 256 or 512: gemma4's full layers), GQA
// (n_head / n_head_kv). launchers/attention.py compiles one module per model shape.
//
// Kernels:
//   kv_store            K/V rows of this step -> cache rows pos[t] (f16: round to nearest)
//   attention_decode    split-K "flash decoding" for few queries (decode, T=1); the last
//                       split block of a KV head merges the splits' partial softmaxes; at
//                       T=1 it also stores the step's K/V rows (no kv_store launch)
//   attention_prefill   tiled online-softmax (flash-attention style), fp32 CUDA cores
#include "common.cuh"

#ifndef KV_F16
#define KV_F16 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef GQA
#define GQA 1
#endif

#if KV_F16
typedef __half kv_t;
#else
typedef float kv_t;
#endif

constexpr int D = HEAD_DIM;
constexpr int G = GQA;
static_assert(D == 64 || D == 128 || D == 256 || D == 512, "HEAD_DIM must be 64, 128, 256 or 512");
static_assert(G >= 1 && G <= 16, "GQA ratio out of range");

// Elements of a cache row per 16-byte load.
constexpr int KCH = 16 / (int)sizeof(kv_t);

// N consecutive cache elements -> floats, with the widest aligned loads.
// Callers keep p aligned to N*sizeof(kv_t) (row starts are, D being a multiple of 64).
template <int N>
__device__ __forceinline__ void load_kv(const kv_t* p, float* out) {
#if KV_F16
    if constexpr (N % 8 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 8) {
            const uint4 u = *reinterpret_cast<const uint4*>(p + i);
            const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 f = __half22float2(h[k]);
                out[i + 2 * k] = f.x;
                out[i + 2 * k + 1] = f.y;
            }
        }
    } else if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const uint2 u = *reinterpret_cast<const uint2*>(p + i);
            const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float2 f = __half22float2(h[k]);
                out[i + 2 * k] = f.x;
                out[i + 2 * k + 1] = f.y;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(p + i));
            out[i] = f.x;
            out[i + 1] = f.y;
        }
    }
#else
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 f = *reinterpret_cast<const float4*>(p + i);
            out[i] = f.x; out[i + 1] = f.y; out[i + 2] = f.z; out[i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const float2 f = *reinterpret_cast<const float2*>(p + i);
            out[i] = f.x; out[i + 1] = f.y;
        }
    }
#endif
}

__device__ __forceinline__ kv_t to_kv(float x) {
#if KV_F16
    return __float2half_rn(x);
#else
    return x;
#endif
}

// ---------------------------------------------------------------------------
// kv_store: k, v [T, kv_dim] fp32 -> cache row pos[t]. grid (T, ceil(kv_dim / KV_STORE_SPAN)),
// block KV_STORE_THREADS, KV_STORE_EACH elements per thread. __restrict__ and a
// block per span: with one block per row, each thread's stores could alias its
// next loads, so its 2*kv_dim/256 load-store pairs ran as serial memory round
// trips (12.5 us for a 4096-wide row on the H200, against ~2 us for a copy).
#define KV_STORE_THREADS 256
#define KV_STORE_EACH 4
#define KV_STORE_SPAN (KV_STORE_THREADS * KV_STORE_EACH)
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                    kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache,
                                    const int* __restrict__ pos, int T, int kv_dim) {
    KERNEL_START();
    const int t = blockIdx.x;
    const int i0 = blockIdx.y * KV_STORE_SPAN + threadIdx.x;
    if (t >= T) return;
    const size_t src = (size_t)t * kv_dim, dst = (size_t)pos[t] * kv_dim;
    float kr[KV_STORE_EACH], vr[KV_STORE_EACH];
#pragma unroll
    for (int c = 0; c < KV_STORE_EACH; c++) {  // all loads in flight before any store
        const int i = i0 + c * KV_STORE_THREADS;
        kr[c] = i < kv_dim ? k[src + i] : 0.0f;
        vr[c] = i < kv_dim ? v[src + i] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < KV_STORE_EACH; c++) {
        const int i = i0 + c * KV_STORE_THREADS;
        if (i < kv_dim) {
            k_cache[dst + i] = to_kv(kr[c]);
            v_cache[dst + i] = to_kv(vr[c]);
        }
    }
}

// ---------------------------------------------------------------------------
// Decode: split-K over the visible keys ("flash decoding").
//
// grid (n_splits, n_head_kv, T), block DEC_WARPS*32. A block owns one KV
// head and the G query heads that read it. The grid is fixed when a decode
// graph is captured, but the context grows every step, so each block derives
// its key chunk from pos[t] on the device: chunk = ceil(n_keys / n_splits)
// rounded up to 32, at least DEC_MIN_CHUNK; splits past the end exit at once.
//
// Warps are spread over the query heads first: warp w takes heads
// HPW*(w % NHG) .. +HPW-1 and the 32-key tiles w / NHG, + DEC_WT, ... of the
// chunk, 8 warps a block where the heads allow. HPW is 2 from GQA 4 (1
// below): each K/V row a warp loads serves two heads, and the NHG
// warps of a tile read it again through L1. One warp scoring all G heads
// (G*D FMAs per lane, then G*32/RPW*EPL for PV) is a long dependent chain
// that short contexts (a few tiles, tg128) wait on; one head a warp reads
// every row G times, which at depth the L1/L2 path could not feed. On the
// H200 (scripts/gpu/attention_decode_sweep.py, reports/notes/
// decode-attention-depth-2026-12-01.md), against one head a warp and 4
// warps: 3.0x at 4096 keys (qwen3-8b's layer), 2.1x (qwen3moe-30b's); at
// 128 keys no slower there, but the whole decode step at depth 0 was 0.981x.
//
// Per warp and 32-key tile, with its own online softmax (m, l, o) per head:
//   scores: K is read as V is (below): each lane multiplies its EPL dims of
//           every row it loads by its slice of q (in registers), and a
//           halving butterfly over a row's LPR lanes (LPR-1 shuffles a head)
//           leaves each lane the whole score of one key. (Lane j reading all
//           of key j's row made each 16-byte load touch 32 rows: the decode
//           at depth waited on L1 for that, not on HBM.)
//   PV:     one 16-byte load per lane per V row: a row spans LPR lanes and
//           the warp reads RPW = 32/LPR rows at once (f16 D=128: 16 lanes,
//           2 rows), all 32/RPW loads of the tile issued together; the RPW
//           row groups are summed with shuffles once per split, not per tile.
// The DEC_WT warps of a head are merged through shared memory at the end;
// a split that is the only one with keys (one split, or a context of at most
// a chunk: every split past it exits at once) writes the normalised output, else unnormalised
// partial O plus (max, sum), and the last of the KV head's active split
// blocks to finish (a device ticket per (token, KV head), returned to 0 for
// the next launch and graph replay) merges them: out = sum_s O_s e^(M_s-M) /
// sum_s L_s e^(M_s-M). (A separate combine kernel was a launch per layer.)
#ifdef DEC_HPW                                      // launchers/attention.py HEADS_PER_WARP (a sweep's)
constexpr int HPW = DEC_HPW < G ? DEC_HPW : G;
#else
constexpr int HPW = G < 4 ? 1 : (G + 7) / 8 > 2 ? (G + 7) / 8 : 2;  // query heads per warp
#endif
constexpr int NHG = (G + HPW - 1) / HPW;            // warps across the heads
#ifdef DEC_TILE_WARPS                               // launchers/attention.py TILE_WARPS (a sweep's)
constexpr int DEC_WT = DEC_TILE_WARPS;
#else
constexpr int DEC_WT = NHG >= 8 ? 1 : 8 / NHG;      // warps across the tiles of a head
#endif
constexpr int DEC_WARPS = NHG * DEC_WT;             // launchers/attention.py decode_layout()
#ifdef DEC_CHUNK                                    // launchers/attention.py MIN_CHUNK (a sweep's)
constexpr int DEC_MIN_CHUNK = DEC_CHUNK > 32 * DEC_WT ? DEC_CHUNK : 32 * DEC_WT;
#else
constexpr int DEC_MIN_CHUNK = 32 * DEC_WT;          // below that some warps idle anyway
#endif
constexpr int EPL = KCH > D / 32 ? KCH : D / 32;    // K/V elements per lane per row (16 B, or 32 B for f32 D=256)
constexpr int LPR = D / EPL;                        // lanes per K/V row
constexpr int RPW = 32 / LPR;                       // K/V rows per warp step
static_assert(DEC_WARPS <= 8 && NHG * HPW >= G, "decode warp layout");

// A tile's V rows are requested with its K rows, not after the scores (V
// does not wait on them): twice the bytes in flight, where a lane's V rows of
// a tile fit 64 registers (f16 heads up to 128, f32 up to 64). At 4096 keys
// this alone was 1.7x on qwen3-8b's layer. DEC_V_EARLY=0 (launchers/
// attention.py V_EARLY, a sweep's) requests V after the scores.
#ifndef DEC_V_EARLY
#define DEC_V_EARLY 1
#endif
struct __align__(16) RawRow { uint4 u[EPL * (int)sizeof(kv_t) / 16]; };  // a lane's EPL elements of a row, as stored
constexpr bool V_EARLY = DEC_V_EARLY && (32 / RPW) * (int)sizeof(RawRow) <= 256;
__device__ __forceinline__ void raw_to_float(const RawRow& r, float* out) {
    const kv_t* e = reinterpret_cast<const kv_t*>(&r);
#pragma unroll
    for (int i = 0; i < EPL; i += 2) {
#if KV_F16
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(e + i));
#else
        const float2 f = make_float2(e[i], e[i + 1]);
#endif
        out[i] = f.x;
        out[i + 1] = f.y;
    }
}

// Visible keys of query position qp and split s's share [c0, c1).
__device__ __forceinline__ void split_range(int qp, int window, int n_splits, int s, int& c0, int& c1,
                                            int& n_active) {
    const int lo = window > 0 ? max(0, qp - window + 1) : 0;
    const int n_keys = qp - lo + 1;
    int chunk = max((n_keys + n_splits - 1) / n_splits, DEC_MIN_CHUNK);
    chunk = (chunk + 31) & ~31;
    n_active = (n_keys + chunk - 1) / chunk;
    c0 = lo + s * chunk;
    c1 = min(c0 + chunk, qp + 1);
}

// The last split block's merge of the KV head's G query heads (hq0 = the
// first one's (token, head) index): out = sum_s O_s e_s / sum_s L_s e_s with
// e_s = exp(M_s - M), M = max_s M_s, over the n_active splits that had keys.
// The other blocks' partials are read from L2 (__ldcg). Latency, not work, is
// its cost (the whole layer waits on it, after the slowest split), so the
// loads are issued together: every thread first requests its MERGE_PER
// outputs' O_s of the first MERGE_BATCH splits (they do not wait on M), then
// a warp per head, a lane per split, loads the splits' (M_s, L_s) at once and
// forms M, e_s and L with warp reductions, keeping e_s of the first
// MERGE_KEEP splits in shared memory (the block's, free by now: all of them
// in every decode shape the catalog has). A serial loop over the splits, or
// a shared-memory chain per output, cost microseconds a layer at depth.
// O sums run in split order (fma chains); L is a warp tree over the lanes'
// split-ordered sums: neither depends on the block's layout.
constexpr int MERGE_PER = (G * D + DEC_WARPS * 32 - 1) / (DEC_WARPS * 32);  // outputs per thread
constexpr int DEC_SMEM = DEC_WARPS * HPW * (D + 32 + 2);                     // floats (launchers/attention.py decode_shared)
constexpr int MERGE_KEEP = (DEC_SMEM - 2 * G) / G < 256 ? (DEC_SMEM - 2 * G) / G / 32 * 32 : 256;
// launchers/attention.py decode_plan's wide kernel sets DEC_MERGE_REGS 80: the kernel takes 184 registers at GQA 4
// (a block an SM), and ptxas then keeps more of a tile's loads in flight in the main loop too.
#ifdef DEC_MERGE_REGS                               // launchers/attention.py MERGE_REGS (a sweep's)
constexpr int MERGE_REGS = DEC_MERGE_REGS;
#else
constexpr int MERGE_REGS = 32;                      // registers a thread holds O_s in (more: fewer blocks an SM)
#endif
// the splits whose O_s are loaded before M is known
constexpr int MERGE_BATCH = MERGE_REGS / MERGE_PER >= MERGE_KEEP ? MERGE_KEEP
                            : MERGE_REGS / MERGE_PER > 1         ? MERGE_REGS / MERGE_PER
                                                                 : 1;
constexpr int MERGE_STEP = MERGE_PER <= 4 ? 8 : 2;  // splits a step after the batch: at most 32 loads a thread
static_assert(MERGE_KEEP >= 32, "merge: room for 32 splits' weights");
// A short context has few splits (tg128: at most 5). Up to MERGE_FEW of them
// (16 loads a thread; 32 spilled at GQA 8), each thread loads (M_s, L_s) and
// O_s of every split for all its outputs at once, one L2 round trip instead
// of two (its L sums in split order, so its rounding differs from below).
constexpr int MERGE_FEW = 16 / MERGE_PER < 8 ? (16 / MERGE_PER < 2 ? 2 : 16 / MERGE_PER) : 8;
__device__ __forceinline__ void merge_few(const float* part_o, const float* part_ml, float* out, size_t hq0,
                                          int n_splits, int n_active) {
    float2 ml[MERGE_PER][MERGE_FEW];
    float o[MERGE_PER][MERGE_FEW];
#pragma unroll
    for (int j = 0; j < MERGE_PER; ++j) {
        const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D, d = i % D;
#pragma unroll
        for (int u = 0; u < MERGE_FEW; ++u) {
            const bool live = u < n_active && (G * D % (DEC_WARPS * 32) == 0 || i < G * D);
            const size_t ps = (hq0 + h) * n_splits + u;
            ml[j][u] = live ? __ldcg(reinterpret_cast<const float2*>(part_ml) + ps) : make_float2(-INFINITY, 0.0f);
            o[j][u] = live ? __ldcg(part_o + ps * D + d) : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < MERGE_PER; ++j) {
        const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D, d = i % D;
        float M = -INFINITY;
#pragma unroll
        for (int u = 0; u < MERGE_FEW; ++u) M = fmaxf(M, ml[j][u].x);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int u = 0; u < MERGE_FEW; ++u) {
            if (u < n_active) {
                const float e = __expf(ml[j][u].x - M);
                L += ml[j][u].y * e;
                O += o[j][u] * e;
            }
        }
        if (G * D % (DEC_WARPS * 32) == 0 || i < G * D) out[(hq0 + h) * D + d] = O / L;
    }
}

__device__ __forceinline__ void merge_splits(const float* part_o, const float* part_ml, float* out, float* smem,
                                             size_t hq0, int n_splits, int n_active) {
    if (n_active <= MERGE_FEW) return merge_few(part_o, part_ml, out, hq0, n_splits, n_active);
    constexpr bool EVEN = G * D % (DEC_WARPS * 32) == 0;  // every thread has MERGE_PER outputs
    const float2* ml2 = reinterpret_cast<const float2*>(part_ml);
    float* e_s = smem;                   // [G][MERGE_KEEP]: e_s of the first splits
    float* hl = smem + G * MERGE_KEEP;   // [G][2]: M, L of each head
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    // smem (o_s) is no longer read by this block's own pass: last_block()'s barriers came after its reads
    float ob[MERGE_PER][MERGE_BATCH];
#pragma unroll
    for (int j = 0; j < MERGE_PER; ++j) {
        const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D, d = i % D;
#pragma unroll
        for (int u = 0; u < MERGE_BATCH; ++u)
            ob[j][u] = u < n_active && (EVEN || i < G * D) ? __ldcg(part_o + ((hq0 + h) * n_splits + u) * D + d) : 0.0f;
    }
    // A warp per head, a lane per split: M, e_s and L = sum_s L_s e_s (a warp sum) of the head
    for (int h = w; h < G; h += DEC_WARPS) {
        const float2* ml = ml2 + (hq0 + h) * n_splits;
        float2 v[MERGE_KEEP / 32];
        float M = -INFINITY;
#pragma unroll
        for (int k = 0; k < MERGE_KEEP / 32; ++k) {
            const int u = lane + 32 * k;
            v[k] = u < n_active ? __ldcg(ml + u) : make_float2(-INFINITY, 0.0f);
            M = fmaxf(M, v[k].x);
        }
        for (int u = MERGE_KEEP + lane; u < n_active; u += 32) M = fmaxf(M, __ldcg(ml + u).x);
        M = warp_max(M);
        float L = 0.0f;
#pragma unroll
        for (int k = 0; k < MERGE_KEEP / 32; ++k) {
            const int u = lane + 32 * k;
            if (u < n_active) {  // e_s of the splits that had keys
                const float e = __expf(v[k].x - M);
                e_s[h * MERGE_KEEP + u] = e;
                L += v[k].y * e;
            }
        }
        for (int u = MERGE_KEEP + lane; u < n_active; u += 32) {
            const float2 f = __ldcg(ml + u);
            L += f.y * __expf(f.x - M);
        }
        L = warp_sum(L);
        if (lane == 0) {
            hl[2 * h] = M;
            hl[2 * h + 1] = L;
        }
    }
    __syncthreads();
    float O[MERGE_PER];
#pragma unroll
    for (int j = 0; j < MERGE_PER; ++j) {
        const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D;
        O[j] = 0.0f;
#pragma unroll
        for (int u = 0; u < MERGE_BATCH; ++u)
            if (u < n_active && (EVEN || i < G * D)) O[j] += ob[j][u] * e_s[h * MERGE_KEEP + u];
    }
    // splits past the first batch (none at depth 4096 on qwen3-8b): the loads of MERGE_STEP splits for all
    // the thread's outputs in flight at a time
#pragma unroll MERGE_STEP
    for (int u = MERGE_BATCH; u < n_active; ++u) {
#pragma unroll
        for (int j = 0; j < MERGE_PER; ++j) {
            const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D, d = i % D;
            if (EVEN || i < G * D) {
                const float e = u < MERGE_KEEP ? e_s[h * MERGE_KEEP + u]
                                               : __expf(__ldcg(ml2 + (hq0 + h) * n_splits + u).x - hl[2 * h]);
                O[j] += __ldcg(part_o + ((hq0 + h) * n_splits + u) * D + d) * e;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MERGE_PER; ++j) {
        const int i = threadIdx.x + j * DEC_WARPS * 32, h = i / D, d = i % D;
        if (EVEN || i < G * D) out[(hq0 + h) * D + d] = O[j] / hl[2 * h + 1];
    }
}

// Shared memory (floats): o_s [DEC_WARPS][HPW][D], p_s [DEC_WARPS][HPW][32],
// ml_s [DEC_WARPS][HPW][2].
// DEC_MAX_REGS (launchers/attention.py MAX_REGS, a sweep's): the registers a
// thread may take, so that two blocks of the long-cache kernel leave an SM
// room for a block of the GEMV after it (resident, its weights requested,
// while the attention runs).
#ifdef DEC_MAX_REGS
#define DEC_BOUNDS __maxnreg__(DEC_MAX_REGS)
#else
#define DEC_BOUNDS __launch_bounds__(DEC_WARPS * 32)
#endif
extern "C" __global__ void DEC_BOUNDS
attention_decode(const float* q, kv_t* k_cache, kv_t* v_cache, float* out, float* part_o,
                 float* part_ml, unsigned* tickets, const int* pos, int n_head, int n_head_kv, float scale,
                 int window, const float* __restrict__ k_new, const float* __restrict__ v_new) {
    KERNEL_START();
    const int s = blockIdx.x, g = blockIdx.y, t = blockIdx.z, n_splits = gridDim.x;
    const int qp = pos[t];
    int c0, c1, n_active;
    split_range(qp, window, n_splits, s, c0, c1, n_active);
    if (s >= n_active) return;  // whole block: no barrier skipped

    // With k_new/v_new (one query, launchers/attention.py): this step's own K
    // and V rows [n_head_kv * D], stored here instead of by a kv_store launch.
    // Only the last active split sees position qp; it writes KV head g's row,
    // rounded as kv_store rounds, before any of its warps reads it (global
    // writes are visible to the block after the barrier).
    if (k_new != nullptr && s == n_active - 1) {
        const size_t dst = ((size_t)qp * n_head_kv + g) * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            k_cache[dst + i] = to_kv(k_new[g * D + i]);
            v_cache[dst + i] = to_kv(v_new[g * D + i]);
        }
        __syncthreads();
    }

    extern __shared__ __align__(16) float smem[];
    float* o_s = smem;
    float* p_s = smem + DEC_WARPS * HPW * D;
    float* ml_s = p_s + DEC_WARPS * HPW * 32;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int h0 = (w % NHG) * HPW, wt = w / NHG;  // this warp's first head (of G) and tile lane
    constexpr bool RAGGED = NHG * HPW != G;        // the last head group is short (G = 9, 11, ...)
    const int rl = lane / LPR, dl = (lane % LPR) * EPL;  // this lane's row (of RPW) and first dim, K and V alike
    const int kj = rl + RPW * (lane % LPR);              // the tile key whose score this lane ends with

    // This lane's dims of its heads' queries, in registers (the G query heads of
    // KV head g are contiguous in q[t]).
    const float* qt = q + ((size_t)t * n_head + (size_t)g * G) * D;
    float qr[HPW][EPL];
#pragma unroll
    for (int h = 0; h < HPW; ++h)
#pragma unroll
        for (int c = 0; c < EPL; ++c) qr[h][c] = (RAGGED && h0 + h >= G) ? 0.0f : qt[(h0 + h) * D + dl + c];

    float m[HPW], l[HPW], o[HPW][EPL];
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;  // per-lane partial sum, reduced over the warp at the end
#pragma unroll
        for (int c = 0; c < EPL; ++c) o[h][c] = 0.0f;
    }

    const size_t row = (size_t)n_head_kv * D;  // elements between consecutive positions
    const kv_t* kg = k_cache + (size_t)g * D + dl;
    float* pw = p_s + w * HPW * 32;

    for (int kb = c0 + wt * 32; kb < c1; kb += DEC_WT * 32) {
        const int nv = min(32, c1 - kb);  // >= 1: key 0 (lane 0's) always exists
        RawRow vraw[V_EARLY ? 32 / RPW : 1];
        if constexpr (V_EARLY) {
            const kv_t* v0 = v_cache + (size_t)kb * row + (size_t)g * D + dl;
#pragma unroll
            for (int k = 0; k < 32 / RPW; ++k) {
                const int j = rl + RPW * k;
                vraw[k] = j < nv ? *reinterpret_cast<const RawRow*>(v0 + (size_t)j * row) : RawRow{};
            }
        }
        // Scores, with K read as V is: LPR lanes per row, RPW rows per load,
        // every load of the tile in flight at once (rows past nv: zeros). Each
        // lane's partial dot products over its EPL dims, one per row it read,
        // are summed over the row's LPR lanes by a halving butterfly: LPR-1
        // shuffles per head leave lane l with the whole score of key kj.
        float part[HPW][LPR];
#pragma unroll
        for (int i = 0; i < LPR; ++i) {  // 32 / RPW == LPR loads
            const int j = rl + RPW * i;
            float kf[EPL];
            if (j < nv) {
                load_kv<EPL>(kg + (size_t)(kb + j) * row, kf);
            } else {
#pragma unroll
                for (int c = 0; c < EPL; ++c) kf[c] = 0.0f;
            }
#pragma unroll
            for (int h = 0; h < HPW; ++h) {
                float sdot = 0.0f;
#pragma unroll
                for (int c = 0; c < EPL; ++c) sdot += qr[h][c] * kf[c];
                part[h][i] = sdot;
            }
        }
        float sc[HPW];
#pragma unroll
        for (int h = 0; h < HPW; ++h) {
#pragma unroll
            for (int k = LPR / 2; k >= 1; k >>= 1) {
                const bool upper = lane & k;  // keeps rows i + k of the pair (i, i + k); lower lanes keep i
#pragma unroll
                for (int i = 0; i < k; ++i) {
                    const float send = upper ? part[h][i] : part[h][i + k];
                    const float keep = upper ? part[h][i + k] : part[h][i];
                    part[h][i] = keep + __shfl_xor_sync(0xffffffff, send, k);
                }
            }
            sc[h] = part[h][0];
        }
#pragma unroll
        for (int h = 0; h < HPW; ++h) {
            const float sv = kj < nv ? sc[h] * scale : -INFINITY;
            const float m_new = fmaxf(m[h], warp_max(sv));  // finite: key 0 is valid
            const float corr = __expf(m[h] - m_new);        // first tile: exp(-inf) = 0
            const float p = __expf(sv - m_new);             // invalid keys: 0
            l[h] = l[h] * corr + p;
#pragma unroll
            for (int c = 0; c < EPL; ++c) o[h][c] *= corr;
            m[h] = m_new;
            pw[h * 32 + kj] = p;
        }
        __syncwarp();
        const kv_t* vr = v_cache + (size_t)kb * row + (size_t)g * D + dl;  // + j*row: V row kb+j, this lane's dims
        // Predicated loads, unconditional FMAs (rows past nv: p = 0, v = 0),
        // so every V load of the tile can be in flight at once.
#pragma unroll
        for (int k = 0; k < 32 / RPW; ++k) {
            const int j = rl + RPW * k;
            float vf[EPL];
            if constexpr (V_EARLY) {
                raw_to_float(vraw[k], vf);
            } else if (j < nv) {
                load_kv<EPL>(vr + (size_t)j * row, vf);
            } else {
#pragma unroll
                for (int c = 0; c < EPL; ++c) vf[c] = 0.0f;
            }
#pragma unroll
            for (int h = 0; h < HPW; ++h) {
                const float pj = pw[h * 32 + j];
#pragma unroll
                for (int c = 0; c < EPL; ++c) o[h][c] += pj * vf[c];
            }
        }
        __syncwarp();  // p_s is rewritten by the next tile
    }

    // Merge the tile warps of each head.
    __syncthreads();
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
        const float lw = warp_sum(l[h]);
        if (lane == 0) {
            ml_s[(w * HPW + h) * 2] = m[h];  // -inf for a warp that got no tile
            ml_s[(w * HPW + h) * 2 + 1] = lw;
        }
#pragma unroll
        for (int c = 0; c < EPL; ++c) {
            float v = o[h][c];
#pragma unroll
            for (int off = LPR; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffff, v, off);  // sum the row groups
            if (lane < LPR) o_s[(w * HPW + h) * D + dl + c] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        const int hw = h / HPW, hh = h % HPW;  // warps hw + NHG * wt hold head h as their local head hh
        float M = -INFINITY;
#pragma unroll
        for (int u = 0; u < DEC_WT; ++u) M = fmaxf(M, ml_s[((hw + NHG * u) * HPW + hh) * 2]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int u = 0; u < DEC_WT; ++u) {
            const int k = (hw + NHG * u) * HPW + hh;
            const float mw = ml_s[k * 2];
            if (mw == -INFINITY) continue;
            const float e = __expf(mw - M);
            L += ml_s[k * 2 + 1] * e;
            O += o_s[k * D + d] * e;
        }
        const size_t hq = (size_t)t * n_head + (size_t)g * G + h;  // (token, query head)
        if (n_active == 1) {  // the only split with keys (one split, or a short context): no merge
            out[hq * D + d] = O / L;
        } else {
            const size_t ps = hq * n_splits + s;
            part_o[ps * D + d] = O;
            if (d == 0) {
                part_ml[ps * 2] = M;
                part_ml[ps * 2 + 1] = L;
            }
        }
    }
    if (n_active == 1) return;
    unsigned* ticket = tickets + (size_t)t * n_head_kv + g;
    if (!last_block(ticket, n_active)) return;
    merge_splits(part_o, part_ml, out, smem, (size_t)t * n_head + (size_t)g * G, n_splits, n_active);
    if (threadIdx.x == 0) *ticket = 0u;
}

// ---------------------------------------------------------------------------
// Prefill: flash-attention-style tiles in fp32 on CUDA cores.
//
// grid (ceil(T/PF_BQ), n_head), block 128 threads. A block holds 32 queries
// of one head in shared memory and walks the key tiles [klo, khi] its rows
// can see (klo from the smallest position and the window, khi the largest
// position), 32 keys at a time:
//   S  = Q K^T: thread (rg = tid/16, kg = tid%16) computes rows 4rg..4rg+3
//        x keys kg, kg+16 from float4 shared-memory reads;
//   online softmax per row (the 16 threads of a row group are one half-warp:
//        xor-shuffle reductions), P stored transposed so 4 rows are 1 float4;
//   O += P V: the same thread owns rows 4rg..4rg+3 x dims kg*4 + 64c (float4s).
// Shared memory rows are padded to D+4 floats so the 8 threads of a
// 128-bit access phase hit distinct bank groups. D=128: 54 KB (4 blocks/SM),
// D=256: 102 KB (2 blocks/SM), D=512: 198 KB (1 block/SM, 128 accumulators a
// thread); launch.function raises the dynamic smem limit.
// Napkin math, per 32-key tile and thread: S is 8*D FMAs from D/4*6 float4
// shared loads, PV is 8*D FMAs from 32*(1+D/64) float4 loads. D=128: 2048
// FMAs vs 288 LDS.128 (4 smem cycles each per warp): with 4 warps per SM
// partition, shared-memory bandwidth (not FMA) bounds it at roughly 40% of
// fp32 peak. Tensor cores (f16/tf32 MMA) would be the next step.
constexpr int PF_BQ = 32, PF_BK = 32, PF_THREADS = 128;
constexpr int LDS = D + 4;      // padded row of Q/K/V tiles (floats)
constexpr int LDP = PF_BQ + 4;  // padded row of the transposed P tile
constexpr int DC = D / 64;      // float4 output chunks per thread

extern "C" __global__ void __launch_bounds__(PF_THREADS)
attention_prefill(const float* q, const kv_t* k_cache, const kv_t* v_cache, float* out, const int* pos,
                  int T, int n_head, int n_head_kv, float scale, int window) {
    KERNEL_START();
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;                   // [PF_BQ][LDS]
    float* Ks = Qs + PF_BQ * LDS;       // [PF_BK][LDS]
    float* Vs = Ks + PF_BK * LDS;       // [PF_BK][LDS]
    float* Pt = Vs + PF_BK * LDS;       // [PF_BK][LDP], P transposed: Pt[key][row]
    __shared__ int qpos_s[PF_BQ];
    __shared__ int range_s[2];

    const int h = blockIdx.y, g = h / G, t0 = blockIdx.x * PF_BQ;
    const int tid = threadIdx.x, rg = tid / 16, kg = tid % 16;

    // Positions of this tile's queries (-1 marks padding rows past T) and the
    // key range they need.
    if (tid < 32) {
        const bool valid = t0 + tid < T;
        const int qp = valid ? pos[t0 + tid] : -1;
        qpos_s[tid] = qp;
        const int hi = __reduce_max_sync(0xffffffff, qp);
        const int lo = __reduce_min_sync(0xffffffff, valid ? qp : 0x7fffffff);
        if (tid == 0) {
            range_s[0] = window > 0 ? max(0, lo - window + 1) : 0;
            range_s[1] = hi;
        }
    }
    // Q tile (zeros for padding rows).
    for (int i = tid; i < PF_BQ * D / 4; i += PF_THREADS) {
        const int r = i / (D / 4), c = i % (D / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t0 + r < T) v = reinterpret_cast<const float4*>(q + ((size_t)(t0 + r) * n_head + h) * D)[c];
        *reinterpret_cast<float4*>(Qs + r * LDS + 4 * c) = v;
    }
    __syncthreads();
    const int klo = range_s[0], khi = range_s[1];
    int qp[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) qp[r] = qpos_s[4 * rg + r];

    float m[4], l[4], o[4][4 * DC];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;  // partial over this thread's keys; summed over the half-warp at the end
#pragma unroll
        for (int c = 0; c < 4 * DC; ++c) o[r][c] = 0.0f;
    }
    const size_t row = (size_t)n_head_kv * D;

    for (int kb = klo; kb <= khi; kb += PF_BK) {
        __syncthreads();  // the previous tile's K, V, P are no longer read
        // K and V rows kb..kb+31 (rows past khi: zeros, and masked below).
        for (int i = tid; i < PF_BK * (D / KCH); i += PF_THREADS) {
            const int j = i / (D / KCH), c = (i % (D / KCH)) * KCH;
            float kf[KCH], vf[KCH];
            if (kb + j <= khi) {
                const size_t off = (size_t)(kb + j) * row + (size_t)g * D + c;
                load_kv<KCH>(k_cache + off, kf);
                load_kv<KCH>(v_cache + off, vf);
            } else {
#pragma unroll
                for (int e = 0; e < KCH; ++e) kf[e] = vf[e] = 0.0f;
            }
#pragma unroll
            for (int e = 0; e < KCH; e += 4) {
                *reinterpret_cast<float4*>(Ks + j * LDS + c + e) = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
                *reinterpret_cast<float4*>(Vs + j * LDS + c + e) = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
            }
        }
        __syncthreads();

        // S for rows 4rg+r, keys kg and kg+16.
        float sc[4][2];
#pragma unroll
        for (int r = 0; r < 4; ++r) sc[r][0] = sc[r][1] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < D; d += 4) {
            float4 qv[4], kv[2];
#pragma unroll
            for (int r = 0; r < 4; ++r) qv[r] = *reinterpret_cast<const float4*>(Qs + (4 * rg + r) * LDS + d);
#pragma unroll
            for (int c = 0; c < 2; ++c) kv[c] = *reinterpret_cast<const float4*>(Ks + (kg + 16 * c) * LDS + d);
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    sc[r][c] += qv[r].x * kv[c].x + qv[r].y * kv[c].y + qv[r].z * kv[c].z + qv[r].w * kv[c].w;
        }

        // Mask, online softmax, P -> shared memory.
        float p[4][2];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int kp = kb + kg + 16 * c;
                const bool vis = kp <= qp[r] && (window == 0 || qp[r] - kp < window);  // padding rows: qp = -1
                sc[r][c] = vis ? sc[r][c] * scale : -INFINITY;
            }
            float tmax = fmaxf(sc[r][0], sc[r][1]);
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffff, tmax, off));
            const float m_new = fmaxf(m[r], tmax);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // row sees nothing yet: keep exps at 0, not NaN
            const float corr = __expf(m[r] - m_use);
            p[r][0] = __expf(sc[r][0] - m_use);
            p[r][1] = __expf(sc[r][1] - m_use);
            l[r] = l[r] * corr + p[r][0] + p[r][1];
#pragma unroll
            for (int c = 0; c < 4 * DC; ++c) o[r][c] *= corr;
            m[r] = m_new;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c)
            *reinterpret_cast<float4*>(Pt + (kg + 16 * c) * LDP + 4 * rg) = make_float4(p[0][c], p[1][c], p[2][c], p[3][c]);
        __syncthreads();

        // O += P V over the keys of this tile that exist.
        const int nk = min(PF_BK, khi - kb + 1);
#pragma unroll 2
        for (int j = 0; j < nk; ++j) {
            const float4 pj = *reinterpret_cast<const float4*>(Pt + j * LDP + 4 * rg);
#pragma unroll
            for (int cc = 0; cc < DC; ++cc) {
                const float4 v = *reinterpret_cast<const float4*>(Vs + j * LDS + 4 * kg + 64 * cc);
                const float pr[4] = {pj.x, pj.y, pj.z, pj.w};
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    o[r][4 * cc + 0] += pr[r] * v.x;
                    o[r][4 * cc + 1] += pr[r] * v.y;
                    o[r][4 * cc + 2] += pr[r] * v.z;
                    o[r][4 * cc + 3] += pr[r] * v.w;
                }
            }
        }
    }

    // Normalise and write the rows that exist (every real row sees at least
    // its own position, so its sum is > 0).
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        float lt = l[r];
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) lt += __shfl_xor_sync(0xffffffff, lt, off);
        const int t = t0 + 4 * rg + r;
        if (t >= T) continue;
        const float inv = 1.0f / lt;
        float* orow = out + ((size_t)t * n_head + h) * D;
#pragma unroll
        for (int cc = 0; cc < DC; ++cc)
            *reinterpret_cast<float4*>(orow + 4 * kg + 64 * cc) =
                make_float4(o[r][4 * cc] * inv, o[r][4 * cc + 1] * inv, o[r][4 * cc + 2] * inv, o[r][4 * cc + 3] * inv);
    }
}

// ---------------------------------------------------------------------------
// Prefill on the tensor cores (f16 K/V cache, HEAD_DIM 64, 128 or 256): flash
// attention 2's layout with mma.sync m16n8k16 (f16 in, fp32 accumulate).
//
// grid (n_head, ceil(T/TQ)), block TC_THREADS (4 warps), the last query tile
// in the first row of blocks; warp w owns query rows 16w..16w+15 of the
// block's TQ. Per TK-key tile of the visible range
// [klo, khi] (as attention_prefill finds it):
//   K, V tiles -> shared memory by cp.async into two buffers, the next tile's
//       copies in flight while this one is computed (rows past khi zero);
//   S = Q·Kᵀ: Q's A fragments (rounded to f16 and scaled, once) in registers, or with
//       heads of 256 read from shared memory per k-step (their 64 registers
//       would spill beside O's 128), K's B fragments by ldmatrix: TK/8
//       n-tiles, D/16 k-steps;
//   the mask, only on the tiles that cross a row's causal edge (or its
//       window's far edge): a tile every row of the warp sees whole skips it;
//   online softmax in fp32 on the accumulators (a row's values sit in
//       the 4 lanes of a quad: two xor shuffles), P rounded to f16 and reused
//       in registers as the A fragments of O += P·V (an m16n8 accumulator
//       pair is an m16k16 A fragment), V's B fragments by ldmatrix.trans.
// outb, where not NULL, gets the output rounded to bf16 too (the Wo GEMM's input).
// Q is rounded to f16 and multiplied by the scale in f16, and P rounded to
// f16, as llama.cpp's own tensor-core attention does (fattn-mma-f16.cuh);
// scores, the softmax and O stay fp32. Shared memory: (TQ + 4 TK) * LDH halves
// (D=128: 87 KB, D=256: 101 KB; launch.function raises the limit).
#if KV_F16 && (HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256)
constexpr int TQ = 64, TC_THREADS = 128;
constexpr int TK = D <= 128 ? 64 : 32;  // keys a tile (launchers/attention.py tc_keys): D=256 keeps S and P small
constexpr bool QA_REGS = D <= 128;      // Q's A fragments held in registers for the whole pass
constexpr int LDH = D + 8;   // f16 row pitch: rows 16 B apart mod 128 B, so ldmatrix hits every bank once
constexpr int NKS = D / 16;  // k-steps of S = Q·Kᵀ
constexpr int NDT = D / 8;   // 8-dim n-tiles of O
static_assert(TQ == 16 * (TC_THREADS / 32) && TK % 16 == 0 && NKS % 2 == 0 && NDT % 2 == 0, "tensor-core layout");

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const __half* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const __half* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// c (16x8, fp32) += a (16x16 f16, row-major fragment) · b (16x8 f16, column-major fragment)
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {  // lo: the lower column, in the low 16 bits
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
attention_prefill_tc(const float* q, const kv_t* k_cache, const kv_t* v_cache, float* out, __nv_bfloat16* outb,
                     const int* pos, int T, int n_head, int n_head_kv, float scale, int window) {
    KERNEL_START();
    extern __shared__ __align__(16) __half tc_smem[];
    __half* Qs = tc_smem;            // [TQ][LDH]
    __half* Kb = Qs + TQ * LDH;      // [2][TK][LDH]: tile i in buffer i % 2
    __half* Vb = Kb + 2 * TK * LDH;  // [2][TK][LDH]
    __shared__ int qpos_s[TQ];
    __shared__ int range_s[2];

    // The last query tiles first: under the causal mask a tile's work grows with
    // its index, and blocks start in launch order, so the longest ones start
    // first and the tail of the grid is short tiles.
    const int h = blockIdx.x, g = h / G, t0 = (gridDim.y - 1 - blockIdx.y) * TQ;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;  // an accumulator's row (and row + 8) and column pair

    // Positions of this tile's queries (-1: padding rows past T) and the keys they need.
    if (tid < TQ) qpos_s[tid] = t0 + tid < T ? pos[t0 + tid] : -1;
    __syncthreads();
    if (tid < 32) {
        const int a = qpos_s[tid], b = qpos_s[tid + 32];
        const int hi = __reduce_max_sync(0xffffffff, max(a, b));
        const int lo = __reduce_min_sync(0xffffffff, min(a < 0 ? 0x7fffffff : a, b < 0 ? 0x7fffffff : b));
        if (tid == 0) {
            range_s[0] = window > 0 ? max(0, lo - window + 1) : 0;  // row t0 exists: lo is a position
            range_s[1] = hi;
        }
    }
    // Q tile, rounded to f16 and scaled in f16 (zeros for padding rows): the scores come out scaled.
    const __half2 scale2 = __float2half2_rn(scale);
    for (int i = tid; i < TQ * D / 4; i += TC_THREADS) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t0 + r < T) v = *reinterpret_cast<const float4*>(q + ((size_t)(t0 + r) * n_head + h) * D + c);
        __half2* dst = reinterpret_cast<__half2*>(Qs + r * LDH + c);
        dst[0] = __hmul2(__floats2half2_rn(v.x, v.y), scale2);
        dst[1] = __hmul2(__floats2half2_rn(v.z, v.w), scale2);
    }
    __syncthreads();
    const int klo = range_s[0], khi = range_s[1];
    const int qp0 = qpos_s[warp * 16 + gid], qp1 = qpos_s[warp * 16 + gid + 8];
    // The warp's 16 rows' least and greatest positions (a padding row's -1: its warp masks every tile).
    const int wq_lo = __reduce_min_sync(0xffffffff, min(qp0, qp1));
    const int wq_hi = __reduce_max_sync(0xffffffff, max(qp0, qp1));

    // This warp's 16 query rows as A fragments, one per k-step: ldmatrix's four
    // 8x8 matrices are rows 0-7 / 8-15 by dims 0-7 / 8-15 of the step.
    const __half* qrow = Qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + (lane >> 4) * 8;
    unsigned qa[QA_REGS ? NKS : 1][4];
    if constexpr (QA_REGS) {
#pragma unroll
        for (int ks = 0; ks < NKS; ++ks) ldsm_x4(qa[ks], qrow + ks * 16);
    }

    float o[NDT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns only
#pragma unroll
    for (int dt = 0; dt < NDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    const size_t row = (size_t)n_head_kv * D;

    // The K and V rows of the tile from key kb into buffer b, as one cp.async group.
    auto load_tile = [&](int buf, int kb) {
        for (int i = tid; i < TK * D / 8; i += TC_THREADS) {
            const int j = i / (D / 8), c = (i % (D / 8)) * 8;
            const bool in = kb + j <= khi;
            const size_t off = in ? (size_t)(kb + j) * row + (size_t)g * D + c : 0;
            cp_async16_or_zero(Kb + (buf * TK + j) * LDH + c, k_cache + off, in);
            cp_async16_or_zero(Vb + (buf * TK + j) * LDH + c, v_cache + off, in);
        }
        cp_async_commit();
    };
    if (klo <= khi) load_tile(0, klo);
    for (int kb = klo, buf = 0; kb <= khi; kb += TK, buf ^= 1) {
        const __half* Ks = Kb + buf * TK * LDH;
        const __half* Vs = Vb + buf * TK * LDH;
        // The other buffer was last read by the previous tile, before the barrier that ended it.
        if (kb + TK <= khi) load_tile(buf ^ 1, kb + TK);
        else cp_async_commit();  // an empty group: the wait below counts the same
        cp_async_wait<1>();      // this tile's group has landed (the next one may still be in flight)
        __syncthreads();

        // S = Q·Kᵀ: per n-tile of 8 keys, one ldmatrix.x4 gives the B fragments of two k-steps
        // (keys by dims 0-7, 8-15, 16-23, 24-31 of the pair).
        float s[TK / 8][4];
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < NKS; ks += 2) {
            unsigned a0[4], a1[4];
            if constexpr (QA_REGS) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a0[i] = qa[ks][i];
                    a1[i] = qa[ks + 1][i];
                }
            } else {
                ldsm_x4(a0, qrow + ks * 16);
                ldsm_x4(a1, qrow + (ks + 1) * 16);
            }
#pragma unroll
            for (int nt = 0; nt < TK / 8; ++nt) {
                unsigned b[4];
                ldsm_x4(b, Ks + (nt * 8 + (lane & 7)) * LDH + ks * 16 + (lane >> 3) * 8);
                mma_16816(s[nt], a0, b[0], b[1]);
                mma_16816(s[nt], a1, b[2], b[3]);
            }
        }

        // Mask, online softmax (rows gid and gid + 8 of the warp's 16), P -> A fragments.
        // Every row of the warp sees the whole tile (the causal edge is past its
        // last key, the window's far edge before its first): no mask.
        const bool whole = kb + TK - 1 <= wq_lo && (window == 0 || wq_hi - kb < window);
        float mx0 = -INFINITY, mx1 = -INFINITY;
        if (whole) {
#pragma unroll
            for (int nt = 0; nt < TK / 8; ++nt) {
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < TK / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int kp = kb + nt * 8 + tig * 2 + e;  // padding rows: qp = -1 sees nothing
                    const bool v0 = kp <= qp0 && (window == 0 || qp0 - kp < window);
                    const bool v1 = kp <= qp1 && (window == 0 || qp1 - kp < window);
                    s[nt][e] = v0 ? s[nt][e] : -INFINITY;
                    s[nt][2 + e] = v1 ? s[nt][2 + e] : -INFINITY;
                    mx0 = fmaxf(mx0, s[nt][e]);
                    mx1 = fmaxf(mx1, s[nt][2 + e]);
                }
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, off));
        }
        const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
        const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;  // nothing seen: 0, not NaN
        const float corr0 = __expf(m[0] - mu0), corr1 = __expf(m[1] - mu1);
        m[0] = mn0;
        m[1] = mn1;
        unsigned pa[TK / 16][4];  // P's A fragment of k-step kk: n-tiles 2kk (a0, a1) and 2kk + 1 (a2, a3)
        float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
            const float p0 = __expf(s[nt][0] - mu0), p1 = __expf(s[nt][1] - mu0);
            const float p2 = __expf(s[nt][2] - mu1), p3 = __expf(s[nt][3] - mu1);
            ls0 += p0 + p1;
            ls1 += p2 + p3;
            pa[nt / 2][(nt % 2) * 2] = pack_half2(p0, p1);      // row gid
            pa[nt / 2][(nt % 2) * 2 + 1] = pack_half2(p2, p3);  // row gid + 8
        }
        l[0] = l[0] * corr0 + ls0;
        l[1] = l[1] * corr1 + ls1;
        // O rescaled only where a row's maximum rose (elsewhere corr is exp(0) = 1
        // exactly): past the first tiles of a row it seldom does.
        if (!__all_sync(0xffffffff, corr0 == 1.0f && corr1 == 1.0f)) {
#pragma unroll
            for (int dt = 0; dt < NDT; ++dt) {
                o[dt][0] *= corr0;
                o[dt][1] *= corr0;
                o[dt][2] *= corr1;
                o[dt][3] *= corr1;
            }
        }

        // O += P·V: per k-step of 16 keys and pair of 8-dim n-tiles, one ldmatrix.x4.trans
        // (keys 0-7 / 8-15 by dims 0-7 / 8-15 of the pair) gives both B fragments.
#pragma unroll
        for (int kk = 0; kk < TK / 16; ++kk) {
#pragma unroll
            for (int dt = 0; dt < NDT; dt += 2) {
                unsigned b[4];
                ldsm_x4_trans(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDH + dt * 8 + (lane >> 4) * 8);
                mma_16816(o[dt], pa[kk], b[0], b[1]);
                mma_16816(o[dt + 1], pa[kk], b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next tile's copies go to it
    }

    // Normalise and write the rows that exist (each sees at least its own position).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float lt = l[r];
        lt += __shfl_xor_sync(0xffffffff, lt, 1);
        lt += __shfl_xor_sync(0xffffffff, lt, 2);
        const int t = t0 + warp * 16 + gid + 8 * r;
        if (t >= T) continue;
        const float inv = 1.0f / lt;
        const size_t at = ((size_t)t * n_head + h) * D + tig * 2;
#pragma unroll
        for (int dt = 0; dt < NDT; ++dt) {
            const float2 v = make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
            *reinterpret_cast<float2*>(out + at + dt * 8) = v;
            if (outb) *reinterpret_cast<__nv_bfloat162*>(outb + at + dt * 8) = __floats2bfloat162_rn(v.x, v.y);
        }
    }
}
#endif
