// GGUF weight formats on the device: the block structs of ggml-common.h and
// exact per-element dequantisation (architectures.md §7, engine/quants.py).
//
// Every helper here reproduces engine/quants.py bit for bit: the same fp32
// products in the same order (d1 = d*sc first, then d1*q - m1). Contraction
// into an FMA (--use_fast_math) cannot change a result: every product except
// Q6_K's (d*sc)*q is exact in fp32 (an fp16 scale has 11 significant bits,
// the integer factors at most 6-8), so each output is rounded once, by its
// final operation, exactly as in the reference. fp16 scales (denormals too)
// become normal fp32 numbers, so flush-to-zero never touches them.
//
// deq8<T>(block, i0, out) writes the 8 consecutive values i0..i0+7 of one
// block (i0 a multiple of 8). For F32/F16/BF16 a "block" is one element and
// deq8 reads 8 consecutive elements starting at `block`; deq1 reads one.
#pragma once
#include "common.cuh"

// ---- block layouts (packed: __half has 2-byte alignment, so no padding) ----
struct block_q4_0 { __half d; uint8_t qs[16]; };                  // y = (q-8)*d
struct block_q4_1 { __half d, m; uint8_t qs[16]; };               // y = q*d + m
struct block_q5_0 { __half d; uint8_t qh[4]; uint8_t qs[16]; };   // bit j of qh = 5th bit of y[j]
struct block_q5_1 { __half d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct block_q8_0 { __half d; int8_t qs[32]; };
struct block_q4_K { __half d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct block_q5_K { __half d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct block_q6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; __half d; };  // d last

static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K");

__device__ __forceinline__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// get_scale_min_k4: 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// ---- per-type dequantisers -------------------------------------------------
struct DqF32 {
    static constexpr int QK = 1, BYTES = 4;
    __device__ static float deq1(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }
    __device__ static void deq8(const uint8_t* p, int, float* y) {  // p 32-byte aligned
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        y[0] = a.x; y[1] = a.y; y[2] = a.z; y[3] = a.w; y[4] = b.x; y[5] = b.y; y[6] = b.z; y[7] = b.w;
    }
};

struct DqF16 {
    static constexpr int QK = 1, BYTES = 2;
    __device__ static float deq1(const uint8_t* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }
    __device__ static void deq8(const uint8_t* p, int, float* y) {  // p 16-byte aligned
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
            y[2 * i] = f.x;
            y[2 * i + 1] = f.y;
        }
    }
};

struct DqBF16 {
    static constexpr int QK = 1, BYTES = 2;
    __device__ static float deq1(const uint8_t* p) { return bf16_bits_to_float(*reinterpret_cast<const uint16_t*>(p)); }
    __device__ static void deq8(const uint8_t* p, int, float* y) {  // p 16-byte aligned
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            y[2 * i] = __uint_as_float(w[i] << 16);
            y[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
};

// Q4_0: y[j] = ((qs[j]&15) - 8)*d, y[j+16] = ((qs[j]>>4) - 8)*d
struct DqQ4_0 {
    static constexpr int QK = 32, BYTES = 18;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q4_0* b = reinterpret_cast<const block_q4_0*>(p);
        const float d = __half2float(b->d);
        const int j0 = i0 & 15, sh = i0 & 16 ? 4 : 0;
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = d * (float)(((b->qs[j0 + t] >> sh) & 15) - 8);
    }
};

// Q4_1: y = q*d + m
struct DqQ4_1 {
    static constexpr int QK = 32, BYTES = 20;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q4_1* b = reinterpret_cast<const block_q4_1*>(p);
        const float d = __half2float(b->d), m = __half2float(b->m);
        const int j0 = i0 & 15, sh = i0 & 16 ? 4 : 0;
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = d * (float)((b->qs[j0 + t] >> sh) & 15) + m;
    }
};

__device__ __forceinline__ uint32_t qh_u32(const uint8_t* qh) {  // little-endian, any alignment
    return qh[0] | (qh[1] << 8) | (qh[2] << 16) | ((uint32_t)qh[3] << 24);
}

// Q5_0: element e's 5th bit is bit e of qh; y = (q5 - 16)*d
struct DqQ5_0 {
    static constexpr int QK = 32, BYTES = 22;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q5_0* b = reinterpret_cast<const block_q5_0*>(p);
        const float d = __half2float(b->d);
        const uint32_t h = qh_u32(b->qh);
        const int j0 = i0 & 15, sh = i0 & 16 ? 4 : 0;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int q = ((b->qs[j0 + t] >> sh) & 15) | (((h >> (i0 + t)) & 1) << 4);
            y[t] = d * (float)(q - 16);
        }
    }
};

// Q5_1: y = q5*d + m
struct DqQ5_1 {
    static constexpr int QK = 32, BYTES = 24;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q5_1* b = reinterpret_cast<const block_q5_1*>(p);
        const float d = __half2float(b->d), m = __half2float(b->m);
        const uint32_t h = qh_u32(b->qh);
        const int j0 = i0 & 15, sh = i0 & 16 ? 4 : 0;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int q = ((b->qs[j0 + t] >> sh) & 15) | (((h >> (i0 + t)) & 1) << 4);
            y[t] = d * (float)q + m;
        }
    }
};

// Q8_0: y = q*d
struct DqQ8_0 {
    static constexpr int QK = 32, BYTES = 34;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q8_0* b = reinterpret_cast<const block_q8_0*>(p);
        const float d = __half2float(b->d);
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = (float)b->qs[i0 + t] * d;
    }
};

// Q4_K: element e = 64c + 32h + l comes from qs[32c + l] (low nibble if h == 0),
// sub-block s = e/32; y = (d*sc_s)*q - dmin*mn_s.
struct DqQ4_K {
    static constexpr int QK = 256, BYTES = 144;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q4_K* b = reinterpret_cast<const block_q4_K*>(p);
        const int s = i0 >> 5, l0 = i0 & 31, sh = (s & 1) * 4;
        int sc, mn;
        scale_min_k4(s, b->scales, sc, mn);
        const float d1 = __half2float(b->d) * (float)sc, m1 = __half2float(b->dmin) * (float)mn;
        const uint8_t* q = b->qs + 32 * (s >> 1) + l0;
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = d1 * (float)((q[t] >> sh) & 15) - m1;
    }
};

// Q5_K: as Q4_K plus the 5th bit: bit s of qh[l] for element l of sub-block s.
struct DqQ5_K {
    static constexpr int QK = 256, BYTES = 176;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q5_K* b = reinterpret_cast<const block_q5_K*>(p);
        const int s = i0 >> 5, l0 = i0 & 31, sh = (s & 1) * 4;
        int sc, mn;
        scale_min_k4(s, b->scales, sc, mn);
        const float d1 = __half2float(b->d) * (float)sc, m1 = __half2float(b->dmin) * (float)mn;
        const uint8_t* q = b->qs + 32 * (s >> 1) + l0;
        const uint8_t* h = b->qh + l0;
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = d1 * (float)(((q[t] >> sh) & 15) | (((h[t] >> s) & 1) << 4)) - m1;
    }
};

// Q6_K: element e = 128n + 32g + l: low 4 bits from ql[64n + 32(g&1) + l]
// (high nibble if g >= 2), top 2 bits (qh[32n + l] >> 2g) & 3, minus 32;
// y = (d*scales[e/16]) * q.
struct DqQ6_K {
    static constexpr int QK = 256, BYTES = 210;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q6_K* b = reinterpret_cast<const block_q6_K*>(p);
        const int n = i0 >> 7, g = (i0 >> 5) & 3, l0 = i0 & 31;
        const float ds = __half2float(b->d) * (float)b->scales[i0 >> 4];
        const uint8_t* ql = b->ql + 64 * n + 32 * (g & 1) + l0;
        const uint8_t* qh = b->qh + 32 * n + l0;
        const int sl = (g >> 1) * 4, sh = 2 * g;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int q = (((ql[t] >> sl) & 15) | (((qh[t] >> sh) & 3) << 4)) - 32;
            y[t] = ds * (float)q;
        }
    }
};
