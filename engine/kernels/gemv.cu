// Dense decode matrix-vector product for every GGUF weight type:
//
//   gemv_<t>(W, x, y, add, n_in, n_out):  y[r] = sum_c W[r][c] * x[c]  (+ add[r] if add != NULL)
//
// y may alias add (bias or fused residual add: each y[r] is read, then
// written, by one thread); y must not alias x. The layout, the types and the
// per-warp machinery are gemv.cuh's.
#include "gemv.cuh"

// Dynamic shared memory: NT/32 * GEMV_ROWS * Q::SPAN bytes (launchers/gemv.py).
template <class Q>
__device__ __forceinline__ void gemv_impl(const uint8_t* __restrict__ W, const float* __restrict__ x, float* y,
                                          const float* add, int n_in, int n_out) {
    constexpr int R = GEMV_ROWS;
    extern __shared__ __align__(16) uint8_t gemv_stage[];
    __shared__ float red[GEMV_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = blockDim.x;
    check_stage_smem((NT / 32) * R * Q::SPAN);
    const int row0 = blockIdx.x * R;
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;  // work units per row
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    uint8_t* buf = gemv_stage + warp * (R * Q::SPAN);
    int off[R];
    // rows past n_out (last block) redo row n_out-1
    auto row = [&](int r) { return W + (size_t)min(row0 + r, n_out - 1) * row_bytes; };
    // Warp w takes units [32w, 32w+32) of every row, then [32w+NT, ...), ...
    // The first step's weights are requested before waiting for the previous
    // kernel (common.cuh, PDL): for most decode shapes that is the whole matrix.
    const int first = warp * 32;
    if (first < U) stage_rows<Q>(buf, off, row, first, U, lane);
    pdl_wait();
    pdl_launch_next();
    dot_rows<Q>(buf, off, row, x, first, NT, U, lane, acc);

#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
    if (tid < R && row0 + tid < n_out) {
        float s = 0.0f;
        for (int w = 0; w < NT / 32; w++) s += red[w][tid];
        if (add) s += add[row0 + tid];
        y[row0 + tid] = s;
    }
}

#define GEMV_CALL(Q) gemv_impl<Q>(static_cast<const uint8_t*>(W), x, y, add, n_in, n_out)
#define GEMV(name)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                 \
        gemv_##name(const void* W, const float* x, float* y, const float* add, int n_in, int n_out) { \
        WITH_LAYOUT_##name(n_in, GEMV_CALL)                                                           \
    }
FOR_EACH_WEIGHT_TYPE(GEMV)
