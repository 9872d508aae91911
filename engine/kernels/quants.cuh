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
// deq32<T>(block, i0, out): 32 consecutive values (i0 a multiple of 32; for
// the float types 32 elements from `block`), the bulk path of the grouped
// GEMM: the common types decode their scales once per 32 values and read
// whole words, the others run deq8 four times. Same values as deq8.
//
// Small integers become floats without I2F (a quarter-rate instruction): the
// float with bits 0x4B000000 | v is 2^23 + v exactly, so one PRMT (or OR) and
// one FADD give v - bias exactly (u2f).
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

// v - B as a float, exactly, for 0 <= v < 2^23.
template <int B = 0>
__device__ __forceinline__ float u2f(uint32_t v) { return __uint_as_float(0x4B000000u | v) - (8388608.0f + B); }
// Byte K of w minus B, as a float (PRMT puts the byte under the exponent of 2^23).
template <int K, int B = 0>
__device__ __forceinline__ float byte2f(uint32_t w) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | K)) - (8388608.0f + B);
}
// N little-endian words from p (2-byte aligned, as every field read here):
// aligned loads and funnel shifts; never reads past the 4-byte word holding p[4N-1].
// GLOBAL: p is in global memory and read-only for the kernel, so the loads take
// the read-only path (deq8: the dequantisation and row lookups read the weights
// in place; deq32 may read a copy in shared memory, so it keeps generic loads).
// N little-endian words from p, which is 16-byte aligned: N/4 16-byte loads.
template <int N>
__device__ __forceinline__ void ld_words16(const uint8_t* p, uint32_t* w) {
    static_assert(N % 4 == 0, "whole 16-byte loads");
#pragma unroll
    for (int i = 0; i < N / 4; i++) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
}
template <int N, bool GLOBAL = false>
__device__ __forceinline__ void ld_words(const uint8_t* p, uint32_t* w) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(reinterpret_cast<size_t>(p) & ~(size_t)3);
    auto ld = [a](int i) { return GLOBAL ? __ldg(a + i) : a[i]; };
    if ((reinterpret_cast<size_t>(p) & 3) == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = ld(i);
    } else {
        uint32_t prev = ld(0);
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint32_t next = ld(i + 1);
            w[i] = __funnelshift_r(prev, next, 16);
            prev = next;
        }
    }
}

// deq32 of the types without a word-wise path: four deq8 calls.
template <class Dq>
__device__ __forceinline__ void deq32_by8(const uint8_t* p, int i0, float* y) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if constexpr (Dq::QK == 1) Dq::deq8(p + 8 * j * Dq::BYTES, 0, y + 8 * j);
        else Dq::deq8(p, i0 + 8 * j, y + 8 * j);
    }
}

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

// The same for the 12 scale bytes held as 3 little-endian words (no byte loads).
__device__ __forceinline__ void scale_min_k4(int j, const uint32_t (&s)[3], int& sc, int& m) {
    const int sh = 8 * (j & 3);
    const int b0 = (s[0] >> sh) & 0xFF, b1 = (s[1] >> sh) & 0xFF, b2 = (s[2] >> sh) & 0xFF;
    sc = j < 4 ? b0 & 63 : (b2 & 0xF) | ((b0 >> 6) << 4);
    m = j < 4 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
}

// ---- per-type dequantisers -------------------------------------------------
struct DqF32 {
    static constexpr int QK = 1, BYTES = 4;
    __device__ static float deq1(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }
    __device__ static void deq8(const uint8_t* p, int, float* y) {  // p 32-byte aligned
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        y[0] = a.x; y[1] = a.y; y[2] = a.z; y[3] = a.w; y[4] = b.x; y[5] = b.y; y[6] = b.z; y[7] = b.w;
    }
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqF32>(p, i0, y); }
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
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqF16>(p, i0, y); }
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
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqBF16>(p, i0, y); }
};

// Q4_0: y[j] = ((qs[j]&15) - 8)*d, y[j+16] = ((qs[j]>>4) - 8)*d
struct DqQ4_0 {
    static constexpr int QK = 32, BYTES = 18;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q4_0* b = reinterpret_cast<const block_q4_0*>(p);
        const float d = __half2float(b->d);
        const int j0 = i0 & 15, sh = i0 & 16 ? 4 : 0;
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = d * u2f<8>((b->qs[j0 + t] >> sh) & 15);
    }
    __device__ static void deq32(const uint8_t* p, int, float* y) {  // the whole block
        const float d = __half2float(reinterpret_cast<const block_q4_0*>(p)->d);
        uint32_t w[4];
        ld_words<4>(p + 2, w);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = w[i] & 0x0F0F0F0Fu, hi = (w[i] >> 4) & 0x0F0F0F0Fu;
            y[4 * i] = d * byte2f<0, 8>(lo);
            y[4 * i + 1] = d * byte2f<1, 8>(lo);
            y[4 * i + 2] = d * byte2f<2, 8>(lo);
            y[4 * i + 3] = d * byte2f<3, 8>(lo);
            y[16 + 4 * i] = d * byte2f<0, 8>(hi);
            y[16 + 4 * i + 1] = d * byte2f<1, 8>(hi);
            y[16 + 4 * i + 2] = d * byte2f<2, 8>(hi);
            y[16 + 4 * i + 3] = d * byte2f<3, 8>(hi);
        }
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
        for (int t = 0; t < 8; t++) y[t] = d * u2f((b->qs[j0 + t] >> sh) & 15) + m;
    }
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqQ4_1>(p, i0, y); }
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
            y[t] = d * u2f<16>(q);
        }
    }
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqQ5_0>(p, i0, y); }
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
            y[t] = d * u2f(q) + m;
        }
    }
    __device__ static void deq32(const uint8_t* p, int i0, float* y) { deq32_by8<DqQ5_1>(p, i0, y); }
};

// Q8_0: y = q*d
struct DqQ8_0 {
    static constexpr int QK = 32, BYTES = 34;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const block_q8_0* b = reinterpret_cast<const block_q8_0*>(p);
        const float d = __half2float(b->d);
#pragma unroll
        for (int t = 0; t < 8; t++) y[t] = u2f<128>((uint8_t)(b->qs[i0 + t] ^ 0x80)) * d;
    }
    __device__ static void deq32(const uint8_t* p, int, float* y) {  // the whole block
        const float d = __half2float(reinterpret_cast<const block_q8_0*>(p)->d);
        uint32_t w[8];
        ld_words<8>(p + 2, w);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t u = w[i] ^ 0x80808080u;  // q + 128
            y[4 * i] = byte2f<0, 128>(u) * d;
            y[4 * i + 1] = byte2f<1, 128>(u) * d;
            y[4 * i + 2] = byte2f<2, 128>(u) * d;
            y[4 * i + 3] = byte2f<3, 128>(u) * d;
        }
    }
};

// Q4_K: element e = 64c + 32h + l comes from qs[32c + l] (low nibble if h == 0),
// sub-block s = e/32; y = (d*sc_s)*q - dmin*mn_s.
struct DqQ4_K {
    static constexpr int QK = 256, BYTES = 144;
    // From global memory, p 16-byte aligned (the blocks of a 16-byte aligned
    // tensor: 144 = 9 * 16), in words, not bytes: d and dmin as one, the
    // scales as 3, the 8 quants as one 8-byte load. The whole matrix's
    // dequantisation was bound by its instruction count with byte loads (13
    // loads and ~157 PTX instructions per 8 values).
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {
        const uint32_t* bw = reinterpret_cast<const uint32_t*>(p);
        const int s = i0 >> 5, sh = (s & 1) * 4;
        const float2 dm = __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));  // d, dmin
        const uint32_t sw[3] = {__ldg(bw + 1), __ldg(bw + 2), __ldg(bw + 3)};
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(p + 16 + 32 * (s >> 1) + (i0 & 31)));
        const uint32_t w[2] = {q.x, q.y};
        int sc, mn;
        scale_min_k4(s, sw, sc, mn);
        const float d1 = dm.x * u2f(sc), m1 = dm.y * u2f(mn);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t v = (w[i] >> sh) & 0x0F0F0F0Fu;
            y[4 * i] = d1 * byte2f<0>(v) - m1;
            y[4 * i + 1] = d1 * byte2f<1>(v) - m1;
            y[4 * i + 2] = d1 * byte2f<2>(v) - m1;
            y[4 * i + 3] = d1 * byte2f<3>(v) - m1;
        }
    }
    // A16: the block is 16-byte aligned (144 = 9 * 16: every block of an aligned row), so the quants are two
    // 16-byte loads (the prefill GEMM's staged rows, gemm.cu)
    template <bool A16 = false>
    __device__ static void deq32(const uint8_t* p, int i0, float* y) {  // sub-block i0/32
        const block_q4_K* b = reinterpret_cast<const block_q4_K*>(p);
        const int s = i0 >> 5, sh = (s & 1) * 4;
        int sc, mn;
        scale_min_k4(s, b->scales, sc, mn);
        const float d1 = __half2float(b->d) * (float)sc, m1 = __half2float(b->dmin) * (float)mn;
        uint32_t w[8];
        if constexpr (A16)
            ld_words16<8>(b->qs + 32 * (s >> 1), w);
        else
            ld_words<8>(b->qs + 32 * (s >> 1), w);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t v = (w[i] >> sh) & 0x0F0F0F0Fu;
            y[4 * i] = d1 * byte2f<0>(v) - m1;
            y[4 * i + 1] = d1 * byte2f<1>(v) - m1;
            y[4 * i + 2] = d1 * byte2f<2>(v) - m1;
            y[4 * i + 3] = d1 * byte2f<3>(v) - m1;
        }
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
        for (int t = 0; t < 8; t++) y[t] = d1 * u2f(((q[t] >> sh) & 15) | (((h[t] >> s) & 1) << 4)) - m1;
    }
    template <bool A16 = false>  // as Q4_K's (176 = 11 * 16)
    __device__ static void deq32(const uint8_t* p, int i0, float* y) {  // sub-block i0/32
        const block_q5_K* b = reinterpret_cast<const block_q5_K*>(p);
        const int s = i0 >> 5, sh = (s & 1) * 4;
        int sc, mn;
        scale_min_k4(s, b->scales, sc, mn);
        const float d1 = __half2float(b->d) * (float)sc, m1 = __half2float(b->dmin) * (float)mn;
        uint32_t w[8], h[8];
        if constexpr (A16) {
            ld_words16<8>(b->qs + 32 * (s >> 1), w);
            ld_words16<8>(b->qh, h);
        } else {
            ld_words<8>(b->qs + 32 * (s >> 1), w);
            ld_words<8>(b->qh, h);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t v = ((w[i] >> sh) & 0x0F0F0F0Fu) | (((h[i] >> s) & 0x01010101u) << 4);
            y[4 * i] = d1 * byte2f<0>(v) - m1;
            y[4 * i + 1] = d1 * byte2f<1>(v) - m1;
            y[4 * i + 2] = d1 * byte2f<2>(v) - m1;
            y[4 * i + 3] = d1 * byte2f<3>(v) - m1;
        }
    }
};

// Q6_K: element e = 128n + 32g + l: low 4 bits from ql[64n + 32(g&1) + l]
// (high nibble if g >= 2), top 2 bits (qh[32n + l] >> 2g) & 3, minus 32;
// y = (d*scales[e/16]) * q.
struct DqQ6_K {
    static constexpr int QK = 256, BYTES = 210;
    __device__ static void deq8(const uint8_t* p, int i0, float* y) {  // words, as deq32 (blocks are 2-byte aligned)
        const block_q6_K* b = reinterpret_cast<const block_q6_K*>(p);
        const int n = i0 >> 7, g = (i0 >> 5) & 3, l0 = i0 & 31;
        const float ds = __half2float(b->d) * (float)b->scales[i0 >> 4];
        uint32_t ql[2], qh[2];
        ld_words<2, true>(b->ql + 64 * n + 32 * (g & 1) + l0, ql);
        ld_words<2, true>(b->qh + 32 * n + l0, qh);
        const int sl = (g >> 1) * 4, sh = 2 * g;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t v = ((ql[i] >> sl) & 0x0F0F0F0Fu) | (((qh[i] >> sh) & 0x03030303u) << 4);
            y[4 * i] = ds * byte2f<0, 32>(v);
            y[4 * i + 1] = ds * byte2f<1, 32>(v);
            y[4 * i + 2] = ds * byte2f<2, 32>(v);
            y[4 * i + 3] = ds * byte2f<3, 32>(v);
        }
    }
    __device__ static void deq32(const uint8_t* p, int i0, float* y) {  // elements i0..i0+31: two scales
        const block_q6_K* b = reinterpret_cast<const block_q6_K*>(p);
        const int n = i0 >> 7, g = (i0 >> 5) & 3;
        const float d = __half2float(b->d);
        const float ds0 = d * (float)b->scales[i0 >> 4], ds1 = d * (float)b->scales[(i0 >> 4) + 1];
        uint32_t ql[8], qh[8];
        ld_words<8>(b->ql + 64 * n + 32 * (g & 1), ql);
        ld_words<8>(b->qh + 32 * n, qh);
        const int sl = (g >> 1) * 4, sh = 2 * g;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t v = ((ql[i] >> sl) & 0x0F0F0F0Fu) | (((qh[i] >> sh) & 0x03030303u) << 4);
            const float ds = i < 4 ? ds0 : ds1;
            y[4 * i] = ds * byte2f<0, 32>(v);
            y[4 * i + 1] = ds * byte2f<1, 32>(v);
            y[4 * i + 2] = ds * byte2f<2, 32>(v);
            y[4 * i + 3] = ds * byte2f<3, 32>(v);
        }
    }
};
