// Whole-matrix dequantisation to bf16 (prefill: the weight then goes through a
// cuBLAS bf16 GEMM) and embedding-row lookup to fp32, for every weight type.
//
//   dequant_<t>_bf16(W, out, n_rows, n_in)        out[r][c] = bf16_rne(W[r][c])
//   get_rows_<t>(W, ids, out, n_ids, n_in, scale)  out[i][c] = W[ids[i]][c] * scale
//
// Values are those of engine/quants.py bit for bit (quants.cuh); bf16 is
// round-to-nearest-even of that fp32 value; get_rows multiplies once in fp32.
//
// Both are memory bound and write-dominated (a Q4_K weight is 0.56 bytes per
// element in, 2 bytes of bf16 out), so each thread produces 8 consecutive
// elements and writes them with one 16-byte store (bf16) or two (fp32):
// consecutive threads write consecutive 16 B, i.e. fully coalesced. Rows are
// contiguous runs of whole blocks, so element e of the matrix is element
// e % QK of block e / QK. Grid-stride loops; launch any grid (launchers/dequant.py uses
// up to 16 blocks of 256 threads per SM).
//
// The 8-wide path needs the 8 elements inside one block, which always holds
// for block types (QK >= 32, n_in a multiple of QK) and for float types when
// n_in % 8 == 0 (get_rows) or the total count is a multiple of 8 (dequant;
// the rest then goes through a 1-element tail). Float-type bases must be
// 16-byte aligned (device allocations are 256-byte aligned).
#include "quants.cuh"

// Two fp32 values as bf16 (round to nearest even), lo in the low half: one cvt.rn.bf16x2.f32.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

template <class Q>
__device__ __forceinline__ void dequant_bf16_impl(const uint8_t* __restrict__ W, __nv_bfloat16* __restrict__ out,
                                                  int n_rows, int n_in) {
    const size_t n = (size_t)n_rows * n_in, n8 = n / 8;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n8; g += stride) {
        const size_t e = g * 8;
        float v[8];
        Q::deq8(W + e / Q::QK * Q::BYTES, (int)(e % Q::QK), v);
        uint4 o;
        o.x = pack_bf16x2(v[0], v[1]);
        o.y = pack_bf16x2(v[2], v[3]);
        o.z = pack_bf16x2(v[4], v[5]);
        o.w = pack_bf16x2(v[6], v[7]);
        *reinterpret_cast<uint4*>(out + e) = o;
    }
    if constexpr (Q::QK == 1) {  // float types: fewer than 8 elements left over
        for (size_t e = n8 * 8 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
            out[e] = __float2bfloat16_rn(Q::deq1(W + e * Q::BYTES));
    }
}

template <class Q>
__device__ __forceinline__ void get_rows_impl(const uint8_t* __restrict__ W, const int* __restrict__ ids,
                                              float* __restrict__ out, int n_ids, int n_in, float scale) {
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t start = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (Q::QK > 1 || n_in % 8 == 0) {
        const int gpr = n_in / 8;  // 8-element groups per row
        const size_t total = (size_t)n_ids * gpr;
        for (size_t g = start; g < total; g += stride) {
            const int i = (int)(g / gpr), c = (int)(g % gpr) * 8;
            const uint8_t* row = W + (size_t)ids[i] * row_bytes;
            float v[8];
            Q::deq8(row + c / Q::QK * Q::BYTES, c % Q::QK, v);
            float4* o = reinterpret_cast<float4*>(out + (size_t)i * n_in + c);
            o[0] = make_float4(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale);
            o[1] = make_float4(v[4] * scale, v[5] * scale, v[6] * scale, v[7] * scale);
        }
    } else if constexpr (Q::QK == 1) {  // float rows of odd length: one element per thread
        const size_t total = (size_t)n_ids * n_in;
        for (size_t e = start; e < total; e += stride) {
            const int i = (int)(e / n_in), c = (int)(e % n_in);
            out[e] = Q::deq1(W + (size_t)ids[i] * row_bytes + (size_t)c * Q::BYTES) * scale;
        }
    }
}

#define DEQUANT_KERNELS(name, Q)                                                                          \
    extern "C" __global__ void dequant_##name##_bf16(const void* W, __nv_bfloat16* out, int n_rows,      \
                                                     int n_in) {                                         \
        KERNEL_START();                                                                                   \
        dequant_bf16_impl<Q>(static_cast<const uint8_t*>(W), out, n_rows, n_in);                         \
    }                                                                                                     \
    extern "C" __global__ void get_rows_##name(const void* W, const int* ids, float* out, int n_ids,      \
                                               int n_in, float scale) {                                   \
        KERNEL_START();                                                                                   \
        get_rows_impl<Q>(static_cast<const uint8_t*>(W), ids, out, n_ids, n_in, scale);                  \
    }

DEQUANT_KERNELS(f32, DqF32)
DEQUANT_KERNELS(f16, DqF16)
DEQUANT_KERNELS(bf16, DqBF16)
DEQUANT_KERNELS(q4_0, DqQ4_0)
DEQUANT_KERNELS(q4_1, DqQ4_1)
DEQUANT_KERNELS(q5_0, DqQ5_0)
DEQUANT_KERNELS(q5_1, DqQ5_1)
DEQUANT_KERNELS(q8_0, DqQ8_0)
DEQUANT_KERNELS(q4_k, DqQ4_K)
DEQUANT_KERNELS(q5_k, DqQ5_K)
DEQUANT_KERNELS(q6_k, DqQ6_K)
