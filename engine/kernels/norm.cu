// RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, one block per row.
//
// Arithmetic as llama.cpp's rms_norm_f32 (architectures.md §0.2): fp32 sum of
// squares per thread, block reduction, mean = sum/n, scale = rsqrtf(mean+eps),
// y = (scale*x)*w. Memory bound: a row is read twice (the second read hits
// L1/L2: 8192 floats = 32 KB) and written once.
//
// Launch: grid = rows, block = a multiple of 32 up to 1024 (launchers/norm.py picks
// ~n/4 threads, so each thread owns about one float4: 32 threads for a
// 128-wide head norm, 1024 for n_embd 4096..8192).
// y may alias x (each thread rewrites only the elements it read). w may be
// NULL (no weight).
#include "common.cuh"

// float4 path when the row is a whole number of 16-byte-aligned float4s
// (n % 4 == 0 and the base pointers aligned, which device allocations are).
__device__ __forceinline__ bool vec4_ok(const void* a, const void* b, const void* c, int n) {
    return (n & 3) == 0 && ((reinterpret_cast<size_t>(a) | reinterpret_cast<size_t>(b) |
                             reinterpret_cast<size_t>(c)) & 15) == 0;
}

// Second pass shared by both kernels: y = (scale*x)*w.
__device__ __forceinline__ void write_scaled(const float* xr, const float* w, float* yr, int n,
                                             float scale, bool vec) {
    if (vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4* y4 = reinterpret_cast<float4*>(yr);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            float4 v = x4[i];
            v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
            if (w) {
                const float4 g = w4[i];
                v.x *= g.x; v.y *= g.y; v.z *= g.z; v.w *= g.w;
            }
            y4[i] = v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = scale * xr[i];
            yr[i] = w ? v * w[i] : v;
        }
    }
}

extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    KERNEL_START();
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    const bool vec = vec4_ok(x, w, y, n);

    float ss = 0.0f;
    if (vec) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    }
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / (float)n + eps);
    write_scaled(xr, w, yr, n, scale, vec);
}

// Residual add fused with the next norm: x += a (written back: x is the
// residual stream), then y = rmsnorm(x)*w. Saves one launch and one pass
// over x per sublayer. y must not alias x or a.
extern "C" __global__ void add_rms_norm(float* x, const float* a, const float* w, float* y, int n,
                                        float eps) {
    KERNEL_START();
    __shared__ float scratch[32];
    float* xr = x + (size_t)blockIdx.x * n;
    const float* ar = a + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    const bool vec = vec4_ok(x, a, y, n) && ((reinterpret_cast<size_t>(w) & 15) == 0);

    float ss = 0.0f;
    if (vec) {
        float4* x4 = reinterpret_cast<float4*>(xr);
        const float4* a4 = reinterpret_cast<const float4*>(ar);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            float4 v = x4[i];
            const float4 d = a4[i];
            v.x += d.x; v.y += d.y; v.z += d.z; v.w += d.w;
            x4[i] = v;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = xr[i] + ar[i];
            xr[i] = v;
            ss += v * v;
        }
    }
    // block_sum's __syncthreads also orders each thread's x writes before its
    // own re-reads below (same thread, same indices: no cross-thread hazard).
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / (float)n + eps);
    write_scaled(xr, w, yr, n, scale, vec);
}
