// Shared helpers for Anvil's CUDA kernels (compiled by NVRTC, --use_fast_math).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// NVRTC ships no libc headers (no <stdint.h>, no <math.h> INFINITY): define what we use.
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#define WARP_SIZE 32

// ---- programmatic dependent launch (sm_90+) -----------------------------------
// The launcher lets each kernel start while the one before it is still running
// (engine/backends/cuda/device.py, PDL). A kernel so launched must call
// pdl_wait() before it touches memory an earlier kernel writes or reads; what
// it does before that must only read data no kernel writes (the weights: the
// decode GEMVs fetch theirs there, overlapping the previous kernel's tail and
// the launch latency). pdl_launch_next() lets the next kernel start; called
// after pdl_wait(), so at most two kernels are resident at once. Both are
// no-ops when the kernel was launched without the attribute.
// KERNEL_START() is the first statement of every kernel (a CPU test checks).
#ifdef ANVIL_TRACE
// The in-graph timeline (compile.py TRACE, scripts/gpu/decode_trace.py): the
// last thread of each launch's block 0 records when its wait returned, which
// under PDL is when the kernel before it ended, and the grid. The host points
// each module's anvil_trace at one buffer (device.py): word 0 counts the
// records, word 1 is the capacity, records are 2 words from word 2.
extern "C" {
__device__ unsigned long long* anvil_trace;
}
__device__ __forceinline__ void trace_mark() {
    if (anvil_trace != nullptr && blockIdx.x + blockIdx.y + blockIdx.z == 0 && threadIdx.x == blockDim.x - 1 &&
        threadIdx.y == blockDim.y - 1 && threadIdx.z == blockDim.z - 1) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        const unsigned long long i = atomicAdd(anvil_trace, 1ull);
        if (i < anvil_trace[1]) {
            anvil_trace[2 + 2 * i] = t;
            anvil_trace[3 + 2 * i] = gridDim.x | (unsigned long long)gridDim.y << 24 | (unsigned long long)gridDim.z << 48;
        }
    }
}
#endif
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef ANVIL_TRACE
    trace_mark();
#endif
}
__device__ __forceinline__ void pdl_launch_next() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
#define KERNEL_START() \
    do {                 \
        pdl_wait();      \
        pdl_launch_next(); \
    } while (0)

// ---- asynchronous copies global -> shared (cp.async, sm_80+) --------------------
// 16 bytes a copy, L1 bypassed; a group is what one thread committed since its
// last commit. cp_async16_or_zero writes zeros instead where !valid (nothing is
// read then). cp_async_wait<N>: all but this thread's N newest groups landed
// (a __syncthreads after it publishes every thread's copies).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async16_or_zero(void* smem, const void* gmem, bool valid) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
// ---- bf16 copies of fp32 results (a prefill GEMM's input) ---------------------
// Four floats to bf16, round to nearest even (as f32_to_bf16): 8 bytes at p, 8-byte aligned.
__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* p, float4 v) {
    __nv_bfloat162* p2 = reinterpret_cast<__nv_bfloat162*>(p);
    p2[0] = __floats2bfloat162_rn(v.x, v.y);
    p2[1] = __floats2bfloat162_rn(v.z, v.w);
}

// ---- gated activations: act(g) * u (elementwise.cu's GLU kernels, gemv.cu's GLU GEMVs) ----
struct SiluMul {  // llama.cpp: silu(g) = g/(1+expf(-g)), then * u
    __device__ float operator()(float g, float u) const { return g / (1.0f + __expf(-g)) * u; }
};

// GELU's tanh approximation (llama.cpp op_gelu, not erf), then * u, written as
// 0.5·g·(1 + tanh(a)) = g·sigmoid(2a) = g / (1 + e^(-2a)): the same function,
// but fast-math's tanhf is the hardware tanh.approx (relative error ~2^-11,
// which NumPy cannot reproduce: ~5e-3 on a gemma model's logits), and
// __expf is good to a few ulp.
struct GeluTanhMul {
    __device__ float operator()(float g, float u) const {
        const float GELU_COEF_A = 0.044715f;
        const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
        const float a = SQRT_2_OVER_PI * g * (1.0f + GELU_COEF_A * g * g);
        return g / (1.0f + __expf(-2.0f * a)) * u;
    }
};

// tanh(x) to a few ulp from __expf (fast-math's tanhf is tanh.approx, ~2^-11
// relative): 1 - 2/(e^(2|x|) + 1), its sign restored. Below |x| = 1/16 that
// difference cancels (relative error ~6e-8/|x|), so there the odd series
// x(1 - x²/3 + 2x⁴/15), whose next term is 17x⁶/315 < 4e-9 of it.
__device__ __forceinline__ float tanh_exp(float x) {
    const float a = fabsf(x);
    if (a < 0.0625f) {
        const float x2 = x * x;
        return x * fmaf(x2, fmaf(x2, 2.0f / 15.0f, -1.0f / 3.0f), 1.0f);
    }
    return copysignf(1.0f - 2.0f / (__expf(2.0f * a) + 1.0f), x);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// ---- the last of n blocks -------------------------------------------------------
// True in every thread of the block that is the last of the n blocks calling
// it with this ticket (a device counter at 0; that block returns it to 0 when
// done, for the next launch and graph replay). What every block wrote before
// the call is visible to the last one after it: the barrier orders a block's
// writes before thread 0's atomic, whose release (gpu scope, cumulative)
// publishes them and whose acquire, followed by the barrier, makes the other
// blocks' writes visible to all the last block's threads. One thread's
// acq_rel atomic, where a fence.sc in every thread (__threadfence) before it
// and another after were slower.
__device__ __forceinline__ bool last_block(unsigned* ticket, unsigned n) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(ticket) : "memory");
        last = old == n - 1;
    }
    __syncthreads();
    return last;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be in use by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / WARP_SIZE;
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x / WARP_SIZE;
    v = lane < n_warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}
