// Dense decode matrix-vector product for every GGUF weight type:
//
//   gemv_<t>(W, x, y, add, n_in, n_out, nw, eps):  y[r] = sum_c W[r][c] * x[c]  (+ add[r] if add != NULL)
//
// With GEMV_GLU=1 the module holds the gated forms instead, over a stacked
// gate/up weight of 2*n_out rows (gemv_impl's GLU; GEMV_ROWS >= 2):
//
//   gemv_glu_silu_<t>(W, x, y, n_in, n_out, nw, eps):  y[r] = SiLU(gate_r·x) * (up_r·x)
//   gemv_glu_gelu_<t>(W, x, y, n_in, n_out, nw, eps):  y[r] = GELU_tanh(gate_r·x) * (up_r·x)
//
// With GEMV_NORM=1, x in all of these is RMSNorm(x)·nw (norm.cu's rms_norm
// with eps), formed as the GEMV reads x (gemv.cuh XNormed); else nw and eps
// are not read.
//
// With GEMV_LATE_WAIT=1 the kernel does not wait for the one before it until
// its end (gemv.cuh): for a GEMV launched right after another of the same x.
// With GEMV_HEADS=1 (NORM pairs) or 2 (NEOX) as well, the module holds
//
//   gemv_heads_<t>(W, x, y, add, n_in, n_out, nw, eps, QK_HEADS_PARAMS)
//
// instead: after that wait, the launch forms the Q/K heads of one token that
// the kernels before it wrote (rope.cuh qk_head: the per-head norm where
// q_w/k_w are given, then RoPE), global warp h taking head h, so that no launch
// of its own does (launchers/gemv.py heads=; V's GEMV after the Q/K GEMV's).
//
// y may alias add (bias or fused residual add: each y[r] is read, then
// written, by one thread); y must not alias x. The layout, the types and the
// per-warp machinery are gemv.cuh's.
//
// The streaming and the shared-memory reduction are gemv_impl's (gemv.cuh),
// or with GEMV_BULK=1 gemv_bulk_impl's (bulk copies into a ring of stages, sm_90).
#include "gemv.cuh"

#ifndef GEMV_GLU
#define GEMV_GLU 0
#endif
#ifndef GEMV_BULK
#define GEMV_BULK 0
#endif
#if GEMV_BULK
#define GEMV_IMPL gemv_bulk_impl
#else
#define GEMV_IMPL gemv_impl
#endif

#if GEMV_GLU
#define GLU_SILU_CALL(Q) GEMV_IMPL<Q, SiluMul>(static_cast<const uint8_t*>(W), x, y, nullptr, n_in, n_out, nw, eps)
#define GLU_GELU_CALL(Q) GEMV_IMPL<Q, GeluTanhMul>(static_cast<const uint8_t*>(W), x, y, nullptr, n_in, n_out, nw, eps)
#define GEMV_GLU_KERNELS(name)                                                                            \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                      \
        gemv_glu_silu_##name(const void* W, const float* x, float* y, int n_in, int n_out, const float* nw, \
                             float eps) {                                                                  \
        WITH_LAYOUT_##name(n_in, GLU_SILU_CALL)                                                            \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                      \
        gemv_glu_gelu_##name(const void* W, const float* x, float* y, int n_in, int n_out, const float* nw, \
                             float eps) {                                                                  \
        WITH_LAYOUT_##name(n_in, GLU_GELU_CALL)                                                            \
    }
FOR_EACH_WEIGHT_TYPE(GEMV_GLU_KERNELS)
#elif defined(GEMV_HEADS)
#include "rope.cuh"
#if !GEMV_LATE_WAIT
#error "GEMV_HEADS forms the heads after the late wait (GEMV_LATE_WAIT=1)"
#endif
#define GEMV_CALL(Q) GEMV_IMPL<Q>(static_cast<const uint8_t*>(W), x, y, add, n_in, n_out, nw, eps)
#define GEMV_HEADS_KERNEL(name)                                                                          \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                     \
        gemv_heads_##name(const void* W, const float* x, float* y, const float* add, int n_in, int n_out, \
                          const float* nw, float eps, QK_HEADS_PARAMS) {                                  \
        WITH_LAYOUT_##name(n_in, GEMV_CALL)                                                               \
        const int h = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                                \
        if (h < n_head + n_head_kv) qk_head<GEMV_HEADS == 2>(0, h, threadIdx.x & 31, QK_HEADS_ARGS);      \
    }
FOR_EACH_WEIGHT_TYPE(GEMV_HEADS_KERNEL)
#else
#define GEMV_CALL(Q) GEMV_IMPL<Q>(static_cast<const uint8_t*>(W), x, y, add, n_in, n_out, nw, eps)
#define GEMV(name)                                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_MAX_THREADS, 2)                                 \
        gemv_##name(const void* W, const float* x, float* y, const float* add, int n_in, int n_out,   \
                    const float* nw, float eps) {                                                     \
        WITH_LAYOUT_##name(n_in, GEMV_CALL)                                                           \
    }
FOR_EACH_WEIGHT_TYPE(GEMV)
#endif
