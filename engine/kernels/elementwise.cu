// Elementwise ops on fp32 activations: gated activations, residual add,
// scaling, soft-capping, bf16 conversion, bias rows, column copies.
//
// All memory bound: grid-stride loops, float4 when every pointer is 16-byte
// aligned (device allocations are; row views of n%4==0 rows stay so), with a
// scalar tail. launchers/elementwise.py launches ~n/1024 blocks of 256 threads (each thread
// one float4 per pass), capped at a few waves.
//
// Expression shapes follow llama.cpp's unary.cu (architectures.md §0.5, §8):
// --use_fast_math turns expf into __expf, tanhf into the fast tanh, and '/'
// into an approximate division, as in llama.cpp's build.
#include "common.cuh"

__device__ __forceinline__ bool aligned16(const void* a, const void* b, const void* c) {
    return ((reinterpret_cast<size_t>(a) | reinterpret_cast<size_t>(b) | reinterpret_cast<size_t>(c)) & 15) == 0;
}

// y[i] = f(a[i], b[i]) over n elements (a, b, y may alias each other); where
// yb is not NULL, also y rounded to bf16 (nearest even, as f32_to_bf16 rounds:
// a prefill GEMM's input, with no conversion launch).
template <typename F>
__device__ __forceinline__ void map2(const float* a, const float* b, float* y, int n, F f,
                                     __nv_bfloat16* yb = nullptr) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if (aligned16(a, b, y)) {  // yb: 8-byte aligned (launchers/elementwise.py)
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int i = tid; i < n / 4; i += stride) {
            const float4 u = a4[i], v = b4[i];
            const float4 r = make_float4(f(u.x, v.x), f(u.y, v.y), f(u.z, v.z), f(u.w, v.w));
            y4[i] = r;
            if (yb) store_bf16x4(yb + 4 * i, r);
        }
        done = n / 4 * 4;
    }
    for (int i = done + tid; i < n; i += stride) {
        const float r = f(a[i], b[i]);
        y[i] = r;
        if (yb) yb[i] = __float2bfloat16_rn(r);
    }
}

// x[i] = f(x[i]) in place.
template <typename F>
__device__ __forceinline__ void map1_inplace(float* x, int n, F f) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    if ((reinterpret_cast<size_t>(x) & 15) == 0) {
        float4* x4 = reinterpret_cast<float4*>(x);
        for (int i = tid; i < n / 4; i += stride) {
            const float4 u = x4[i];
            x4[i] = make_float4(f(u.x), f(u.y), f(u.z), f(u.w));
        }
        done = n / 4 * 4;
    }
    for (int i = done + tid; i < n; i += stride) x[i] = f(x[i]);
}

struct Add {
    __device__ float operator()(float a, float b) const { return a + b; }
};

struct SigmoidMul {  // the gated attention's output gate: a * sigmoid(g), sigmoid as llama.cpp's 1/(1+expf(-g))
    __device__ float operator()(float a, float g) const { return a * (1.0f / (1.0f + __expf(-g))); }
};

extern "C" __global__ void sigmoid_mul(const float* a, const float* g, float* y, int n) {
    KERNEL_START();
    map2(a, g, y, n, SigmoidMul());
}

extern "C" __global__ void silu_mul(const float* g, const float* u, float* y, __nv_bfloat16* yb, int n) {
    KERNEL_START();
    map2(g, u, y, n, SiluMul(), yb);
}

extern "C" __global__ void gelu_tanh_mul(const float* g, const float* u, float* y, __nv_bfloat16* yb, int n) {
    KERNEL_START();
    map2(g, u, y, n, GeluTanhMul(), yb);
}

extern "C" __global__ void add(const float* a, const float* b, float* y, int n) {
    KERNEL_START();
    map2(a, b, y, n, Add());
}

// x *= s, in place.
struct Scale {
    float s;
    __device__ float operator()(float x) const { return x * s; }
};

extern "C" __global__ void scale(float* x, float s, int n) {
    KERNEL_START();
    map1_inplace(x, n, Scale{s});
}

// x = cap * tanh(x / cap), in place (gemma-style logit soft-capping). llama.cpp
// builds it as scale(1/cap) -> tanh -> scale(cap); same shape here, with an
// accurate tanh (common.cuh tanh_exp): the approximate one moved logits of ~30
// by ~1e-2.
struct Softcap {
    float cap, inv_cap;
    __device__ float operator()(float x) const { return tanh_exp(x * inv_cap) * cap; }
};

extern "C" __global__ void softcap(float* x, float cap, int n) {
    KERNEL_START();
    map1_inplace(x, n, Softcap{cap, 1.0f / cap});
}

// Round-to-nearest-even fp32 -> bf16 / f16 (inputs of 16-bit tensor-core GEMMs).
struct ToBf16 {
    typedef __nv_bfloat16 T;
    typedef __nv_bfloat162 T2;
    static __device__ T2 two(float a, float b) { return __floats2bfloat162_rn(a, b); }
    static __device__ T one(float a) { return __float2bfloat16_rn(a); }
};
struct ToF16 {
    typedef __half T;
    typedef __half2 T2;
    static __device__ T2 two(float a, float b) { return __floats2half2_rn(a, b); }
    static __device__ T one(float a) { return __float2half_rn(a); }
};

template <typename To>
__device__ void f32_to_16bit(const float* x, typename To::T* y, int n) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const int stride = gridDim.x * blockDim.x;
    int done = 0;
    // float4 in, 4 16-bit values (8 bytes) out: needs x 16-byte and y 8-byte aligned.
    if (((reinterpret_cast<size_t>(x) & 15) | (reinterpret_cast<size_t>(y) & 7)) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        typename To::T2* y2 = reinterpret_cast<typename To::T2*>(y);
        for (int i = tid; i < n / 4; i += stride) {
            const float4 v = x4[i];
            y2[2 * i] = To::two(v.x, v.y);
            y2[2 * i + 1] = To::two(v.z, v.w);
        }
        done = n / 4 * 4;
    }
    for (int i = done + tid; i < n; i += stride) y[i] = To::one(x[i]);
}

extern "C" __global__ void f32_to_bf16(const float* x, __nv_bfloat16* y, int n) {
    KERNEL_START();
    f32_to_16bit<ToBf16>(x, y, n);
}

extern "C" __global__ void f32_to_f16(const float* x, __half* y, int n) {
    KERNEL_START();
    f32_to_16bit<ToF16>(x, y, n);
}

// y[r, :] += b for each of `rows` rows of length n. grid (ceil(n/1024), rows)
// is what launchers/elementwise.py uses; any grid works (the loops stride by it).
extern "C" __global__ void bias_add_rows(float* y, const float* b, int rows, int n) {
    KERNEL_START();
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        float* yr = y + (size_t)r * n;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) yr[i] += b[i];
    }
}

// y[r, i] = a[r, i] * sigmoid(g[r]): one gate per row (qwen35moe's shared
// expert). grid (ceil(n/256) capped, rows capped); the loops stride by it.
extern "C" __global__ void sigmoid_mul_rows(const float* a, const float* g, float* y, int rows, int n) {
    KERNEL_START();
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float s = 1.0f / (1.0f + __expf(-g[r]));
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
            y[(size_t)r * n + i] = a[(size_t)r * n + i] * s;
    }
}

// y[r, c] = x[r * x_stride + x_off + c] for r < rows, c < cols: a column range
// of each row (split, and the per-head [q | gate] layout of gated attention).
// grid (ceil(cols/256) capped, rows capped); the loops stride by the grid.
extern "C" __global__ void copy_cols(const float* x, float* y, int rows, int cols, int x_stride, int x_off) {
    KERNEL_START();
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float* xr = x + (size_t)r * x_stride + x_off;
        float* yr = y + (size_t)r * cols;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) yr[c] = xr[c];
    }
}

// y[r, i] = x[r, i] * w[i % n_w]: a weight row broadcast over the rows
// (n_w = n), or one scalar (n_w = 1: gemma4's layer_output_scale). grid
// (ceil(n/256) capped, rows capped); the loops stride by it.
extern "C" __global__ void mul_rows(const float* x, const float* w, float* y, int rows, int n, int n_w) {
    KERNEL_START();
    for (int r = blockIdx.y; r < rows; r += gridDim.y)
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
            y[(size_t)r * n + i] = x[(size_t)r * n + i] * w[n_w == 1 ? 0 : i];
}

// y[i] = w[i] * s[ids[i]]: each routing weight times its expert's scale
// (gemma4's ffn_down_exps.scale; llama.cpp scales the expert's output, the
// same product in another order).
extern "C" __global__ void mul_gather(const float* w, const int* ids, const float* s, float* y, int n) {
    KERNEL_START();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = w[i] * s[ids[i]];
}
