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
//   moe_router_f32  one token: the F32 router's logits and moe_route's routing, one launch
//   moe_glu_<t>     h[t, j] = act(gate[e]·x_t) ⊙ (up[e]·x_t),  e = ids[t, j]; act SiLU, or
//                   tanh-GELU compiled with MOE_GELU=1 (gemma4's experts)
//   moe_gemv_<t>    y[t, j] = W[e]·x_t    (gate and up of different types: then silu_mul)
//   moe_down_<t>    y[t] = add[t] + sum_j weights[t, j] · down[e]·h[t, j]
// gate/up: a block per (row group, slot, token), its warps splitting the rows'
// units as gemv.cu does, so the k experts of a token run in one launch; down:
// each warp of a block takes one slot and GEMV_ROWS rows of it (gemv.cuh's
// stage_rows/dot_rows), and the block sums the slots across its warps in
// selection order (llama.cpp's moe_weighted_reduction: e0·w0, then + e_j·w_j),
// fusing the weighted sum and the residual add into the down projection.
//
// Prefill (many tokens) groups the pairs by expert: moe_gemm.cu.
#include "gemv.cuh"

#ifndef MOE_GELU
#define MOE_GELU 0
#endif
#if MOE_GELU
typedef GeluTanhMul MoeAct;  // moe_glu's activation (common.cuh)
#else
typedef SiluMul MoeAct;
#endif

#ifndef MOE_MAX_WARPS
#define MOE_MAX_WARPS 8  // selected experts a block runs side by side; k > 8 loops
#endif

// ---- routing ------------------------------------------------------------------------
#define ROUTE_WARPS 4
#define ROUTE_PER_LANE 16           // experts per lane, in registers: n_expert <= 512 (launchers/moe.py)
#define NORM_CLAMP 6.103515625e-5f  // 2^-14: llama.cpp clamps the renormalising sum

// route_row: one token's routing by one warp; lane l holds experts l, l + 32,
// ... in registers. The k picks are k rounds of a warp-wide (probability,
// lowest id) maximum, two redux instructions each: probabilities are >= 0, so
// their bits + 1 order as unsigned integers (0 marks a taken or absent
// expert). Sums run per lane ascending, then over the warp. A non-finite
// logit makes the row's weights NaN (ids stay in range), so the step's logits
// turn NaN and the argmax reports it instead of a wrong token. Logits are
// read past L1 (__ldcg): moe_router's last block reads what other blocks wrote.
__device__ __forceinline__ void route_row(const float* l, int n_expert, int k, int norm, float scale, int* ids,
                                          float* weights, int lane) {
    float p[ROUTE_PER_LANE];
    float mx = -INFINITY;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? __ldcg(l + e) * scale : 0.0f;
        if (e < n_expert) {
            finite &= isfinite(p[i]);
            mx = fmaxf(mx, p[i]);
        }
    }
    mx = warp_max(mx);
    finite = __all_sync(0xffffffffu, finite);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++) {
        if (lane + 32 * i < n_expert) {
            p[i] = __expf(p[i] - mx);
            sum += p[i];
        }
    }
    const float inv = 1.0f / warp_sum(sum);  // softmax as llama.cpp: exp(x - max) * (1/sum)
    unsigned key[ROUTE_PER_LANE];
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++)
        key[i] = lane + 32 * i < n_expert ? (__float_as_uint(p[i] * inv) & 0x7fffffffu) + 1u : 0u;
    // this lane's best: ascending ids, '>' keeps the lowest among equals
    unsigned bk = 0u;
    int bi = 0x7fffffff;
    auto lane_best = [&]() {
        bk = 0u;
        bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTE_PER_LANE; i++) {
            if (key[i] > bk) {
                bk = key[i];
                bi = lane + 32 * i;
            }
        }
    };
    lane_best();
    int my_id = 0;
    float my_w = 0.0f, wsum = 0.0f;
    for (int j = 0; j < k; j++) {  // lane j keeps pick j
        const unsigned best = __reduce_max_sync(0xffffffffu, bk);
        int win = (int)__reduce_min_sync(0xffffffffu, (unsigned)(bk == best ? bi : 0x7fffffff));
        const float bv = best ? __uint_as_float(best - 1u) : -INFINITY;
        if (!best) win = j;  // only without a finite probability: the weights are NaN below
        if (best && lane == (win & 31)) {  // the winner leaves its lane's set
#pragma unroll
            for (int i = 0; i < ROUTE_PER_LANE; i++)
                if (i == (win >> 5)) key[i] = 0u;
            lane_best();
        }
        if (lane == j) {
            my_id = win;
            my_w = bv;
        }
        wsum += bv;
    }
    const float wscale = norm ? 1.0f / fmaxf(wsum, NORM_CLAMP) : 1.0f;
    if (lane < k) {
        ids[lane] = my_id;
        weights[lane] = finite ? my_w * wscale : __int_as_float(0x7fc00000);
    }
}

// One warp per token.
extern "C" __global__ void moe_route(const float* logits, int T, int n_expert, int k, int norm, int* ids,
                                     float* weights) {
    KERNEL_START();
    const int lane = threadIdx.x & 31, t = blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t < T) route_row(logits + (size_t)t * n_expert, n_expert, k, norm, 1.0f, ids + (size_t)t * k,
                         weights + (size_t)t * k, lane);
}

// moe_router_f32 (decode, one token): logits = W·x over the F32 router rows
// (gemv_impl, as gemv_f32) and, in the last block to finish, route_row of
// logits·scale: the router and the routing in one launch. ``done`` is a
// device counter at 0 that the last block returns to 0 (graph replays).
#define ROUTER_CALL(Q) gemv_impl<Q>(static_cast<const uint8_t*>(W), x, logits, nullptr, n_in, n_expert, nullptr, 0.0f)
extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)
moe_router_f32(const void* W, const float* x, float* logits, int n_in, int n_expert, float scale, int k, int norm,
               int* ids, float* weights, unsigned* done) {
    WITH_LAYOUT_f32(n_in, ROUTER_CALL)
    if (!last_block(done, gridDim.x)) return;
    if (threadIdx.x < 32) route_row(logits, n_expert, k, norm, scale, ids, weights, threadIdx.x);
    if (threadIdx.x == 0) *done = 0u;
}

// ---- decode: the selected experts as matrix-vector products ---------------------------
// moe_glu / moe_gemv: grid (row groups, k, T), block NT threads laid out as
// gemv.cu's (warp w takes units [32w, 32w+32) of every row, then +NT, ...):
// block (g, j, t) computes RH rows of slot j's expert for token t. With GLU
// its GEMV_ROWS rows are RH gate rows and the same RH up rows, and
// h = act(gate)·up; otherwise RH = GEMV_ROWS rows of W and h = W·x.
// (A warp per slot walking the whole row waited on one memory round trip per
// 32 units; here a row's units are spread over the block's warps, each warp
// has all its weights in flight at once, and the k·T·(row groups) blocks fill
// the GPU.) Dynamic shared memory: NT/32 * GEMV_ROWS * Q::SPAN bytes.
template <class Q, bool GLU>
__device__ __forceinline__ void moe_rows_impl(const uint8_t* Wg, const uint8_t* Wu, const int* ids, const float* x,
                                              float* h, int n_in, int n_out, int expert_bytes, int k) {
    constexpr int R = GEMV_ROWS, RH = GLU ? GEMV_ROWS / 2 : GEMV_ROWS;
    extern __shared__ __align__(16) uint8_t moe_stage[];
    __shared__ float red[GEMV_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = blockDim.x;
    const int j = blockIdx.y, t = blockIdx.z;
    check_stage_smem((NT / 32) * R * Q::SPAN);
    const int row0 = blockIdx.x * RH;
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;
    uint8_t* buf = moe_stage + warp * (R * Q::SPAN);
    pdl_wait();  // the ids come from the kernel just before
    pdl_launch_next();
    const size_t e = (size_t)ids[(size_t)t * k + j] * expert_bytes;
    auto row = [&](int r) {
        const bool up = GLU && r >= RH;
        return (up ? Wu : Wg) + e + (size_t)min(row0 + (up ? r - RH : r), n_out - 1) * row_bytes;
    };
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    const int first = warp * 32;
    if (first < U) stage_rows<Q>(buf, row, first, U, lane);
    dot_rows<Q>(buf, row, x + (size_t)t * n_in, first, NT, U, lane, acc);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (tid < RH && row0 + tid < n_out) {
        float a = 0.0f, u = 0.0f;
        for (int w = 0; w < NT / 32; w++) {
            a += red[w][tid];
            if constexpr (GLU) u += red[w][tid + RH];
        }
        h[((size_t)t * k + j) * n_out + row0 + tid] = GLU ? MoeAct()(a, u) : a;
    }
}

// moe_down: grid (row groups, 1, T); blockDim.x = 32 * min(k, MOE_MAX_WARPS),
// warp w runs slots w, w + nw, ... over the whole row (expert FFN widths are
// short rows). Dynamic shared memory: nw * GEMV_ROWS * Q::SPAN bytes.
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
    // The ids were written two kernels back (moe_route, then the gate/up kernel
    // waited for it before letting this one start: common.cuh), so the first
    // slot's weights are fetched before waiting; h and add only after.
    if (warp < k) stage_rows<Q>(buf, rows_of(warp), 0, U, lane);
    pdl_wait();
    pdl_launch_next();
    float total[R];
#pragma unroll
    for (int r = 0; r < R; r++) total[r] = 0.0f;
    for (int j = warp; j < k; j += nw) {
        const auto row = rows_of(j);
        if (j != warp) stage_rows<Q>(buf, row, 0, U, lane);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        dot_rows<Q>(buf, row, h + ((size_t)t * k + j) * n_in, 0, 32, U, lane, acc);
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
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                       \
        moe_glu_##name(const void* Wg, const void* Wu, const int* ids, const float* x, float* h, int n_in, \
                       int n_out, int expert_bytes, int k) {                                                \
        WITH_LAYOUT_##name(n_in, MOE_GLU_CALL)                                                              \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                       \
        moe_gemv_##name(const void* W, const int* ids, const float* x, float* y, int n_in, int n_out,      \
                        int expert_bytes, int k) {                                                          \
        WITH_LAYOUT_##name(n_in, MOE_GEMV_CALL)                                                             \
    }
#define MOE_DOWN(name)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * MOE_MAX_WARPS, 2)                                     \
        moe_down_##name(const void* W, const int* ids, const float* weights, const float* h, float* y,     \
                        const float* add, int n_in, int n_out, int expert_bytes, int k) {                   \
        WITH_LAYOUT_##name(n_in, MOE_DOWN_CALL)                                                             \
    }
FOR_EACH_WEIGHT_TYPE(MOE_DECODE)
// The down projection's rows are short (a warp per slot): at most 8 rows per
// warp (launchers/moe.py DOWN_MAX_ROWS), so a 16-row build leaves it out.
#if GEMV_ROWS <= 8
FOR_EACH_WEIGHT_TYPE(MOE_DOWN)
#endif
