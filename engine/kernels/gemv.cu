// Dense decode matrix-vector product for every GGUF weight type:
//
//   gemv_<t>(W, x, y, add, n_in, n_out):  y[r] = sum_c W[r][c] * x[c]  (+ add[r] if add != NULL)
//
// y may alias add (bias or fused residual add: each y[r] is read, then
// written, by one thread); y must not alias x. The layout, the types and the
// per-warp machinery are gemv.cuh's.
//
// Streaming: the rows come in groups of GEMV_ROWS; block b takes groups b,
// b + gridDim.x, ... (the launcher sizes the grid to what stays resident, so
// no block waits for a second wave and a block's next group is requested as
// soon as its warps have decoded the current one), and each warp walks its
// steps: a group's units [32w, 32w+32), [32w+NT, ...), then the next group's.
// Where a row is one step per warp (most decode shapes), the warp's x stays in
// registers for every group. A group's sums meet across the block's warps in
// shared memory (double-buffered by group parity: one __syncthreads per group).
// (A second staging buffer per warp, the next step's copies in flight during
// this one's decode, measured slower on the H200: the shared memory it takes
// costs more resident blocks than the overlap gains.)
#include "gemv.cuh"

// Dynamic shared memory: NT/32 * GEMV_ROWS * Q::SPAN bytes (launchers/gemv.py).
// Every warp has units (32 * (NT/32 - 1) < U).
template <class Q>
__device__ __forceinline__ void gemv_impl(const uint8_t* __restrict__ W, const float* __restrict__ x, float* y,
                                          const float* add, int n_in, int n_out) {
    constexpr int R = GEMV_ROWS;
    extern __shared__ __align__(16) uint8_t gemv_stage[];
    __shared__ float red[2][GEMV_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = blockDim.x;
    check_stage_smem((NT / 32) * R * Q::SPAN);
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;  // work units per row
    const int groups = (n_out + R - 1) / R;
    uint8_t* buf = gemv_stage + warp * (R * Q::SPAN);
    // group g's local row r; rows past n_out (last group) redo row n_out-1
    auto rows = [=](int g) { return [=](int r) { return W + (size_t)min(g * R + r, n_out - 1) * row_bytes; }; };
    const int first = warp * 32;
    int g = blockIdx.x, base = first, parity = 0, x_base = -1;
    // The first step's weights are requested before waiting for the previous
    // kernel (common.cuh, PDL).
    if (g < groups) stage_rows<Q>(buf, rows(g), first, U, lane);
    pdl_wait();
    pdl_launch_next();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    typename Q::Xs xs;
    while (g < groups) {
        if (base != x_base) {  // overlaps the copies
            if (base + lane < U) Q::load_x(xs, x, base + lane);
            x_base = base;
        }
        cp_async_wait_all();
        __syncwarp();
        dot_staged<Q>(buf, rows(g), xs, base, U, lane, acc);
        __syncwarp();  // the buffer is free again
        // the warp's next step: more units of this group's rows, else the next group's first
        int nb = base + NT, ng = g;
        if (nb >= U) {
            nb = first;
            ng = g + gridDim.x;
        }
        if (ng < groups) stage_rows<Q>(buf, rows(ng), nb, U, lane);
        if (nb == first) {  // group g is done: sum it across the block's warps
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float v = warp_sum(acc[r]);
                if (lane == 0) red[parity][warp][r] = v;
                acc[r] = 0.0f;
            }
            __syncthreads();
            const int row = g * R + tid;
            if (tid < R && row < n_out) {
                float s = 0.0f;
                for (int w = 0; w < NT / 32; w++) s += red[parity][w][tid];
                if (add) s += add[row];
                y[row] = s;
            }
            parity ^= 1;
        }
        g = ng;
        base = nb;
    }
}

#define GEMV_CALL(Q) gemv_impl<Q>(static_cast<const uint8_t*>(W), x, y, add, n_in, n_out)
#define GEMV(name)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                 \
        gemv_##name(const void* W, const float* x, float* y, const float* add, int n_in, int n_out) { \
        WITH_LAYOUT_##name(n_in, GEMV_CALL)                                                           \
    }
FOR_EACH_WEIGHT_TYPE(GEMV)
