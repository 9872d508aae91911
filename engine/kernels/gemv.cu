// Dense decode matrix-vector product for every GGUF weight type:
//
//   gemv_<t>(W, x, y, add, n_in, n_out):  y[r] = sum_c W[r][c] * x[c]  (+ add[r] if add != NULL)
//
// y may alias add (bias or fused residual add: each y[r] is read, then
// written, by one thread); y must not alias x. The layout, the types and the
// per-warp machinery are gemv.cuh's.
//
// The streaming and the shared-memory reduction are gemv_impl's (gemv.cuh).
#include "gemv.cuh"

#define GEMV_CALL(Q) gemv_impl<Q>(static_cast<const uint8_t*>(W), x, y, add, n_in, n_out)
#define GEMV(name)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                 \
        gemv_##name(const void* W, const float* x, float* y, const float* add, int n_in, int n_out) { \
        WITH_LAYOUT_##name(n_in, GEMV_CALL)                                                           \
    }
FOR_EACH_WEIGHT_TYPE(GEMV)
