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
// NULL (no weight). rms_norm's yb, where not NULL, gets y rounded to bf16.
#include "common.cuh"

// float4 path when the row is a whole number of 16-byte-aligned float4s
// (n % 4 == 0 and the base pointers aligned, which device allocations are).
__device__ __forceinline__ bool vec4_ok(const void* a, const void* b, const void* c, int n) {
    return (n & 3) == 0 && ((reinterpret_cast<size_t>(a) | reinterpret_cast<size_t>(b) |
                             reinterpret_cast<size_t>(c)) & 15) == 0;
}

// Second pass shared by both kernels: y = (scale*x)*w, and where yb is not
// NULL the same values rounded to bf16 (nearest even, as f32_to_bf16 rounds
// them: a prefill GEMM's input, with no conversion launch).
__device__ __forceinline__ void write_scaled(const float* xr, const float* w, float* yr, __nv_bfloat16* yb,
                                             int n, float scale, bool vec) {
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
            if (yb) store_bf16x4(yb + 4 * i, v);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = scale * xr[i], r = w ? v * w[i] : v;
            yr[i] = r;
            if (yb) yb[i] = __float2bfloat16_rn(r);
        }
    }
}

// The sum of squares of a row, per thread (block_sum adds the threads'):
// shared by both kernels, so a norm computed by either rounds the same.
__device__ __forceinline__ float sum_sq(const float* r, int n, bool vec) {
    float ss = 0.0f;
    if (vec) {
        const float4* r4 = reinterpret_cast<const float4*>(r);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            const float4 v = r4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += r[i] * r[i];
    }
    return ss;
}

extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, __nv_bfloat16* yb, int n, float eps) {
    KERNEL_START();
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    __nv_bfloat16* ybr = yb ? yb + (size_t)blockIdx.x * n : nullptr;  // 8-byte aligned (launchers/norm.py)
    const bool vec = vec4_ok(x, w, y, n);

    const float scale = rsqrtf(block_sum(sum_sq(xr, n, vec), scratch) / (float)n + eps);
    write_scaled(xr, w, yr, ybr, n, scale, vec);
}

// The residual add, with the norms on either side of it (one launch, one
// block per row; x is the residual stream, updated in place):
//   a' = RMSNorm(a)·wa, or a if wa == NULL (a post-norm: gemma's
//                                          post-attention and post-FFN norms)
//   x' = RMSNorm(x)·wx, or x if wx == NULL (gemma4's MoE layers: the dense
//                                          branch's own post-norm)
//   x  = (x' + a')·s                      (s = *scale, when scale != NULL:
//                                          gemma4's layer_output_scale)
//   y0 = RMSNorm(x)·w0                    (the next sublayer's norm; skipped when
//                                          y0 == NULL; w0 may be NULL)
//   y1 = RMSNorm(x)·w1, y2 = ...·w2       (more norms of the same x, where y1, y2
//                                          are not NULL: gemma4's router and
//                                          expert inputs)
//   yb0 = y0 in bf16                      (where not NULL: a prefill GEMM's input,
//                                          rounded as f32_to_bf16 rounds it)
// Each step rounds as the separate kernels do (rms_norm's reduction, then an
// add, then a multiply: no fused multiply-add across them), so fusing changes
// no bit. No y may alias x or a.
extern "C" __global__ void add_rms_norm(float* x, const float* a, const float* wa, const float* wx,
                                        const float* scale, const float* w0, float* y0, const float* w1, float* y1,
                                        const float* w2, float* y2, __nv_bfloat16* yb0, int n, float eps) {
    KERNEL_START();
    __shared__ float scratch[32];
    float* xr = x + (size_t)blockIdx.x * n;
    const float* ar = a + (size_t)blockIdx.x * n;
    const size_t ptrs = reinterpret_cast<size_t>(w0) | reinterpret_cast<size_t>(wa) | reinterpret_cast<size_t>(wx) |
                        reinterpret_cast<size_t>(w1) | reinterpret_cast<size_t>(w2) | reinterpret_cast<size_t>(y1) |
                        reinterpret_cast<size_t>(y2);
    const bool vec = vec4_ok(x, a, y0, n) && (ptrs & 15) == 0;
    const float sa = wa ? rsqrtf(block_sum(sum_sq(ar, n, vec), scratch) / (float)n + eps) : 1.0f;
    const float sx = wx ? rsqrtf(block_sum(sum_sq(xr, n, vec), scratch) / (float)n + eps) : 1.0f;
    const float s = scale ? *scale : 1.0f;
    // a's and x's terms as rms_norm writes them: (s*v)*w, each product rounded
    auto term = [&](float v, int i) {
        return wa ? __fmul_rn(__fmul_rn(sa, v), wa[i]) : v;
    };
    auto own = [&](float v, int i) { return wx ? __fmul_rn(__fmul_rn(sx, v), wx[i]) : v; };
    auto step = [&](float xv, float av, int i) {
        const float v = __fadd_rn(own(xv, i), term(av, i));
        return scale ? __fmul_rn(v, s) : v;
    };
    float ss = 0.0f;
    if (vec) {
        float4* x4 = reinterpret_cast<float4*>(xr);
        const float4* a4 = reinterpret_cast<const float4*>(ar);
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            float4 v = x4[i];
            const float4 d = a4[i];
            v.x = step(v.x, d.x, 4 * i);
            v.y = step(v.y, d.y, 4 * i + 1);
            v.z = step(v.z, d.z, 4 * i + 2);
            v.w = step(v.w, d.w, 4 * i + 3);
            x4[i] = v;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = step(xr[i], ar[i], i);
            xr[i] = v;
            ss += v * v;
        }
    }
    if (!y0) return;
    // block_sum's __syncthreads also orders each thread's x writes before its
    // own re-reads below (same thread, same indices: no cross-thread hazard).
    const float scale_y = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    const size_t row = (size_t)blockIdx.x * n;
    write_scaled(xr, w0, y0 + row, yb0 ? yb0 + row : nullptr, n, scale_y, vec);
    if (y1) write_scaled(xr, w1, y1 + row, nullptr, n, scale_y, vec);
    if (y2) write_scaled(xr, w2, y2 + row, nullptr, n, scale_y, vec);
}
