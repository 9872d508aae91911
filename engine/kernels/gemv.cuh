// Matrix-vector products over raw GGUF weight rows, for every weight type: the
// machinery shared by gemv.cu (dense decode projections) and moe.cu (the
// routed experts). A warp computes GEMV_ROWS rows' dot products with one fp32
// vector x (stage_rows + dot_rows, at the end of this file); the kernels
// choose the rows and what to do with the sums.
//
// W is the raw GGUF tensor (row r at byte r*row_bytes), x fp32. W must be
// 16-byte aligned (device allocations are 256-byte aligned; GGUF tensor data
// 32-byte aligned).
//
// Activations: block-type weights meet int8 x in dp4a (GEMV_XQ=1, the
// launchers' default; the *8 structs below). Each lane rounds its own unit's x
// in registers, 16 consecutive elements per scale (8 for Q6_K: its units' runs),
// q = rint(x * 127/amax) (quants.quantize_x is the same in NumPy): no extra
// kernel and no extra traffic, finer groups than llama.cpp's q8_1 (32). Why:
// decoding a weight to fp32 and an FFMA per element (PRMT trick below, ~3.7
// instructions per element counted in the SASS) left the kernel bound by its
// issue rate, not by memory: on the H200, [12288 x 4096] Q4_K took 16.2 us
// with fp32 x and 12.1 with int8 x; the 151936 x 4096 head 185 -> 120 us
// (reports/notes/gemv-int8-2026-12-01.md). The fp32-x structs (GEMV_XQ=0)
// remain for float weights, and as the exact-arithmetic path tests compare.
//
// Layout (gemv.cu; moe.cu gives each warp its own rows). A block of NT threads (a multiple of 32, <= 256; launchers/gemv.py picks it
// so the row's work units divide evenly) computes GEMV_ROWS consecutive rows. A
// row is cut into work units (16-32 elements: a 16-byte piece of a block, or a
// 16-byte vector of a float row). Warp w takes units [32w, 32w+32) of every row,
// then [32w+NT, ...), ...; lane l of a step does unit base+l of ALL GEMV_ROWS
// rows, so the unit's x values are loaded once into registers (through L1:
// every block on the SM reads the same x) and reused GEMV_ROWS times. That
// reuse is what keeps x's L1 traffic (4 bytes per element) below the weights'.
// Per-thread fp32 partial sums -> warp_sum -> shared memory across warps.
//
// Weight loads: each warp step copies the byte span of its 32 units, for each
// of the GEMV_ROWS rows, into the warp's own shared-memory buffer with 16-byte
// cp.async (coalesced, L1 bypassed; from the 16-byte-aligned floor of the span,
// so any block alignment works), waits, then decodes from shared memory. The
// copies of all rows are in flight at once without holding registers (direct
// 16-byte loads were sunk next to their use by ptxas: ~2 rows in flight per
// thread), and 2-byte-aligned layouts (Q4_0 18 B, Q5_0 22 B, Q8_0 34 B, Q6_K
// 210 B) need no 2-byte global loads: a 2-aligned word in shared memory costs
// two aligned loads and a funnel shift (lds_a2). Q4_K/Q5_K blocks (144/176 B)
// and float vectors stay 16-byte aligned there and are read with LDS.128.
//
// Integer to float in 2 instructions (fq): for a byte v < 128, PRMT builds the
// bits 0x3F00_0000 | v << 16, i.e. the float 0.5 + v/256 exactly, and one FFMA
// accumulates S = sum (0.5 + v/256) x. With X = sum x over the same elements
// (computed once per unit, shared by all rows), sum v*x = 256*(S - X/2) in
// exact arithmetic; in fp32 the 0.5*x terms cost ~4-5 of the 24 bits (relative
// error ~2^-19 per unit), far below anything a test or a model can see.
// (I2F runs at 1/8 of the FFMA rate: too slow at one conversion per element.)
#pragma once
#include "quants.cuh"

#ifndef GEMV_ROWS
#define GEMV_ROWS 4  // rows per block; launchers/gemv.py compiles 1, 2, 4, 8 and 16
#endif
#ifndef GEMV_NORM
#define GEMV_NORM 0  // x RMS-normed as the GEMV reads it (XNormed; launchers/gemv.py norm=)
#endif
#ifndef GEMV_LATE_WAIT
// 1: the kernel before this one writes nothing this one reads (another GEMV of
// the same input, launchers/gemv.py overlap=): this one starts its work at
// once, beside it, and waits for it only at its end, so that the kernel after
// this one still finds both done (its wait is on this one). x is complete
// already: this kernel is launched only once the one before it has passed
// its own wait, which is on the kernel that wrote x.
#define GEMV_LATE_WAIT 0
#endif
#ifndef GEMV_XQ
#define GEMV_XQ 1  // int8 activations for block-type weights (0: fp32, the *8-less structs)
#endif
#define GEMV_MAX_THREADS 256  // __launch_bounds__(256, 2): <= 128 registers (GEMV_ROWS=16 spills a few bytes on Q5_*)
#define GEMV_MAX_WARPS (GEMV_MAX_THREADS / 32)

#define U4(v, j) ((j) == 0 ? (v).x : (j) == 1 ? (v).y : (j) == 2 ? (v).z : (v).w)

// The launcher's dynamic shared memory covers the staging buffers, or the kernel stops.
__device__ __forceinline__ void check_stage_smem(int need) {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (uint32_t)need) __trap();  // launcher passed too little shared memory
}

// ---- loads -------------------------------------------------------------------
__device__ __forceinline__ float4 ld_x4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float ld_x1(const float* p) { return __ldg(p); }

// x RMS-normed as it is read (GEMV_NORM=1): the GEMVs read x through a pointer
// type, a plain one or this one, which hands out x[i] * w[i] (w: the norm's
// weight) and adds x[i]^2 to the lane's sum of squares; the 1/rms factor
// multiplies the row sums at the end (gemv_impl, gemv_bulk_impl). Rounding
// x*w to int8 instead of x*w/rms gives the same integers but at ties.
struct XNormed {
    const float* x;
    const float* w;
    float* ss;  // the lane's sum of squares (a register once inlined)
};
__device__ __forceinline__ XNormed operator+(XNormed p, int i) { return {p.x + i, p.w + i, p.ss}; }
__device__ __forceinline__ float4 ld_x4(XNormed p) {
    const float4 v = ld_x4(p.x), g = ld_x4(p.w);
    *p.ss = fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, *p.ss))));
    return make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
}
__device__ __forceinline__ float ld_x1(XNormed p) {
    const float v = __ldg(p.x);
    *p.ss = fmaf(v, v, *p.ss);
    return v * __ldg(p.w);
}
__device__ __forceinline__ float sum4(float4 a) { return (a.x + a.y) + (a.z + a.w); }

// Copy bytes [src, src+len) (any alignment) to dst as whole 16-byte chunks from
// the aligned floor of src; returns where src's first byte landed in dst. The
// chunks past either end hold bytes of the same 16-byte granule as a wanted
// byte, so they never touch another page. The warp's lanes share the chunks.
__device__ __forceinline__ int stage_span(uint8_t* dst, const uint8_t* src, int len, int lane) {
    const size_t s = reinterpret_cast<size_t>(src), a0 = s & ~(size_t)15;
    const int n = (int)((s + len + 15 - a0) >> 4);
    for (int i = lane; i < n; i += 32) cp_async16(dst + 16 * i, reinterpret_cast<const void*>(a0 + 16 * (size_t)i));
    return (int)(s & 15);
}

// The copies of a GEMM tile's BN weight rows, one step of RAW bytes each, into
// shared memory at SPAN bytes a row: each row's bytes as 16-byte chunks from
// its aligned floor (the slack chunks stay inside the granules of wanted
// bytes, so they never touch another page). A thread's chunks are the same
// every step but for the column: their addresses are worked out once (init),
// a step adds its offset (issue). A row's first byte lands at
// (its address + the step's offset) & 15 within its SPAN.
template <int BN, int SPAN, int NT>
struct WeightSteps {
    static constexpr int CPR = SPAN / 16, WCH = (BN * CPR + NT - 1) / NT;  // chunks per row, per thread
    const uint8_t* src[WCH];
    int dst[WCH], at[WCH];
    template <class Row>
    __device__ __forceinline__ void init(Row w_row, int tid) {
#pragma unroll
        for (int j = 0; j < WCH; j++) {
            const int c = tid + j * NT, r = min(c / CPR, BN - 1);
            src[j] = w_row(r);
            dst[j] = r * SPAN + 16 * (c % CPR);
            at[j] = c < BN * CPR ? c % CPR : CPR;  // CPR: no chunk
        }
    }
    // the step whose bytes start ``skip`` bytes into each row, ``len`` of them, into buf
    __device__ __forceinline__ void issue(uint8_t* buf, int skip, int len) const {
#pragma unroll
        for (int j = 0; j < WCH; j++) {
            const size_t s = reinterpret_cast<size_t>(src[j] + skip), a0 = s & ~(size_t)15;
            if (at[j] < CPR && a0 + 16 * (size_t)at[j] < s + len)
                cp_async16(buf + dst[j], reinterpret_cast<const void*>(a0 + 16 * (size_t)at[j]));
        }
    }
};

// N little-endian words starting at byte `off` (2-byte aligned) of a 16-byte
// aligned shared buffer: N+1 aligned loads and funnel shifts.
template <int N>
__device__ __forceinline__ void lds_a2(const uint8_t* buf, int off, uint32_t* out) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(buf) + (off >> 2);
    const uint32_t sh = (off & 2) * 8;
    uint32_t prev = w[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t next = w[i + 1];
        out[i] = __funnelshift_r(prev, next, sh);
        prev = next;
    }
}
__device__ __forceinline__ uint4 lds16(const uint8_t* buf, int off) {  // off % 16 == 0
    return *reinterpret_cast<const uint4*>(buf + off);
}
__device__ __forceinline__ float lds_half(const uint8_t* buf, int off) {  // off even
    return __half2float(reinterpret_cast<const __half*>(buf)[off >> 1]);
}
__device__ __forceinline__ float half_lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu))); }
__device__ __forceinline__ float half_hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }

// ---- integer -> float ----------------------------------------------------------
// 0.5 + v/256 for byte K of w (v < 128): PRMT puts v in bits 16..22 under the
// exponent of 0.5 (bytes 0,1 = 0x00 from y, byte 3 = 0x3F; bit 23 = v's bit 7 = 0).
template <int K>
__device__ __forceinline__ float fq(uint32_t w) {
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | (K << 8)));
}
// s + sum_k (0.5 + v_k/256) * x_k over the 4 bytes of w
__device__ __forceinline__ float dot4q(uint32_t w, float4 x, float s) {
    s = fmaf(fq<0>(w), x.x, s);
    s = fmaf(fq<1>(w), x.y, s);
    s = fmaf(fq<2>(w), x.z, s);
    return fmaf(fq<3>(w), x.w, s);
}
// Signed byte K of w, exactly: u = w ^ 0x80808080 holds q+128 in 0..255; the
// float 2^23 + (q+128) minus (2^23 + 128) is q. 3 instructions (Q8_0 has the budget).
template <int K>
__device__ __forceinline__ float fi8(uint32_t u) {
    return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650u | K)) - 8388736.0f;
}
__device__ __forceinline__ float dot4i8(uint32_t w, float4 x, float s) {
    const uint32_t u = w ^ 0x80808080u;
    s = fmaf(fi8<0>(u), x.x, s);
    s = fmaf(fi8<1>(u), x.y, s);
    s = fmaf(fi8<2>(u), x.z, s);
    return fmaf(fi8<3>(u), x.w, s);
}
// 4 bits -> bit 4 of each byte: bit i of t moves to bit 8i (t * 0x204081 puts
// copies at shifts 0, 7, 14, 21, which never overlap for t < 16), then << 4.
__device__ __forceinline__ uint32_t spread4(uint32_t t) { return (((t & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }

// ---- weight types ---------------------------------------------------------------
// Each type: QK elements and BYTES bytes per block (a float "block" is one
// 16-byte vector, or one element on the odd-length path), UPB work units per
// block, SPAN = per-row staging bytes of one warp step (32 units' bytes + up to
// 15 of alignment slack, in whole 16-byte chunks; launchers/gemv.py computes the same),
// Xs = the unit's x values, and dot(buf, off, sub, xs) = the unit's partial dot
// product for the block staged at byte `off` of buf.
template <int UPB_, int QK_, int BYTES_>
struct Layout {
    static constexpr int UPB = UPB_, QK = QK_, BYTES = BYTES_;
    static constexpr int SPAN = ((32 / UPB) * BYTES + 15 + 15) / 16 * 16;
};

// F32/F16/BF16 rows of whole 16-byte vectors (n_in % (16/esize) == 0).
template <int KIND>  // 0 f32, 1 f16, 2 bf16
struct FVec : Layout<1, KIND == 0 ? 4 : 8, 16> {
    struct Xs { float4 a, b; };
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) {
        if constexpr (KIND == 0) {
            xs.a = ld_x4(x + 4 * u);
        } else {
            xs.a = ld_x4(x + 8 * u);
            xs.b = ld_x4(x + 8 * u + 4);
        }
    }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        const uint4 w = lds16(buf, off);
        if constexpr (KIND == 0) {
            float s = __uint_as_float(w.x) * xs.a.x;
            s = fmaf(__uint_as_float(w.y), xs.a.y, s);
            s = fmaf(__uint_as_float(w.z), xs.a.z, s);
            return fmaf(__uint_as_float(w.w), xs.a.w, s);
        } else {
            float f[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t v = U4(w, i);
                f[2 * i] = KIND == 1 ? half_lo(v) : __uint_as_float(v << 16);
                f[2 * i + 1] = KIND == 1 ? half_hi(v) : __uint_as_float(v & 0xFFFF0000u);
            }
            float s = f[0] * xs.a.x;
            s = fmaf(f[1], xs.a.y, s);
            s = fmaf(f[2], xs.a.z, s);
            s = fmaf(f[3], xs.a.w, s);
            s = fmaf(f[4], xs.b.x, s);
            s = fmaf(f[5], xs.b.y, s);
            s = fmaf(f[6], xs.b.z, s);
            return fmaf(f[7], xs.b.w, s);
        }
    }
};

// Float rows of any length: unit = one element (slow path, odd n_in only).
template <int KIND>
struct FOne : Layout<1, 1, KIND == 0 ? 4 : 2> {
    struct Xs { float a; };
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { xs.a = ld_x1(x + u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        if constexpr (KIND == 0) return *reinterpret_cast<const float*>(buf + off) * xs.a;
        const uint32_t v = *reinterpret_cast<const uint16_t*>(buf + off);
        return (KIND == 1 ? half_lo(v) : __uint_as_float(v << 16)) * xs.a;
    }
};

// Q4_K / Q5_K: unit k (0..7) = qs bytes [16k, 16k+16) = sub-blocks 2c (low
// nibbles) and 2c+1 (high nibbles), c = k/2, element l = 16(k&1) + i of each.
struct XsK {
    float4 lo[4], hi[4];  // x of the 16 low-nibble / high-nibble elements
    float slo, shi;       // their sums
};
template <class XP>
__device__ __forceinline__ void load_x_k(XsK& xs, XP x, int u) {
    const int k = u & 7;
    const XP p = x + (u >> 3) * 256 + 64 * (k >> 1) + 16 * (k & 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        xs.lo[i] = ld_x4(p + 4 * i);
        xs.hi[i] = ld_x4(p + 32 + 4 * i);
    }
    xs.slo = (sum4(xs.lo[0]) + sum4(xs.lo[1])) + (sum4(xs.lo[2]) + sum4(xs.lo[3]));
    xs.shi = (sum4(xs.hi[0]) + sum4(xs.hi[1])) + (sum4(xs.hi[2]) + sum4(xs.hi[3]));
}
// sum over the unit of (d*sc*q - dmin*mn) * x, from S = sum (0.5 + q/256) x of
// each sub-block. The scales of sub-blocks 2c, 2c+1 as byte pairs, as in
// llama.cpp's vec_dot_q4_K: for c < 2 the low 6 bits of scales[2c..2c+1] (mins
// [2c+4..2c+5]); for c >= 2 a nibble of scales[2c+4..2c+5] plus the top 2 bits
// of scales[2c-4..2c-3] (mins: of scales[2c..2c+1]).
__device__ __forceinline__ float k_affine(uint4 h, int c, float s_lo, float s_hi, float x_lo, float x_hi) {
    const int sh = (c & 1) * 16;
    const uint32_t a = h.y >> sh, b = h.z >> sh, e = h.w >> sh;  // scales bytes 0-3, 4-7, 8-11
    const bool high = c >= 2;
    const uint32_t sc = high ? ((e & 0x0F0Fu) | ((a >> 2) & 0x3030u)) : (a & 0x3F3Fu);
    const uint32_t mn = high ? (((e >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u)) : (b & 0x3F3Fu);
    const float d256 = 256.0f * half_lo(h.x), dmin = half_hi(h.x);
    float r = (d256 * (float)(sc & 0xFFu)) * fmaf(-0.5f, x_lo, s_lo);
    r = fmaf(d256 * (float)(sc >> 8), fmaf(-0.5f, x_hi, s_hi), r);
    r = fmaf(-dmin * (float)(mn & 0xFFu), x_lo, r);
    return fmaf(-dmin * (float)(mn >> 8), x_hi, r);
}

struct Q4K : Layout<8, 256, 144> {  // d, dmin, scales[12] (16 B), qs[128]
    using Xs = XsK;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_k(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int k, const Xs& xs) {
        const uint4 h = lds16(buf, off), q = lds16(buf, off + 16 + 16 * k);
        float s_lo = 0.0f, s_hi = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t w = U4(q, j);
            s_lo = dot4q(w & 0x0F0F0F0Fu, xs.lo[j], s_lo);
            s_hi = dot4q((w >> 4) & 0x0F0F0F0Fu, xs.hi[j], s_hi);
        }
        return k_affine(h, k >> 1, s_lo, s_hi, xs.slo, xs.shi);
    }
};

// Q5_K: as Q4_K; the 5th bit of element l of sub-block s is bit s of qh[l], and
// the unit's l range 16(k&1)..+15 is the 16 qh bytes at 16 + 16(k&1).
// q5k_values: the 4 low- and 4 high-half 5-bit values of qs word w, with their
// 5th bits from qh word hb (sub-blocks c2 and c2 + 1).
__device__ __forceinline__ void q5k_values(uint32_t w, uint32_t hb, int c2, uint32_t& lo, uint32_t& hi) {
    lo = (w & 0x0F0F0F0Fu) | (((hb >> c2) & 0x01010101u) << 4);
    hi = ((w >> 4) & 0x0F0F0F0Fu) | (((hb >> (c2 + 1)) & 0x01010101u) << 4);
}
struct Q5K : Layout<8, 256, 176> {  // d, dmin, scales[12], qh[32], qs[128]
    using Xs = XsK;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_k(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int k, const Xs& xs) {
        const uint4 h = lds16(buf, off), qh = lds16(buf, off + 16 + 16 * (k & 1)), q = lds16(buf, off + 48 + 16 * k);
        const int c2 = 2 * (k >> 1);
        float s_lo = 0.0f, s_hi = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t lo, hi;
            q5k_values(U4(q, j), U4(qh, j), c2, lo, hi);
            s_lo = dot4q(lo, xs.lo[j], s_lo);
            s_hi = dot4q(hi, xs.hi[j], s_hi);
        }
        return k_affine(h, k >> 1, s_lo, s_hi, xs.slo, xs.shi);
    }
};

// ---- int8 activations (GEMV_XQ=1) ------------------------------------------------
// x is rounded to int8 in groups of 16 consecutive elements (scale amax/127,
// q = rint(x * 127/amax), as quants.quantize_x in NumPy): each lane quantises
// its own unit's x in registers (no extra kernel, no extra memory traffic), and
// the weights' integers meet it in dp4a (4 multiply-adds per instruction).
__device__ __forceinline__ float i2f(int v) {  // exact for |v| < 2^22, 2 full-rate instructions
    return __int_as_float(v + 0x4B400000) - 12582912.0f;
}
// rint(v * inv) of each lane of v, packed as 4 signed bytes: v*inv + 1.5*2^23
// rounds once, to nearest even, and leaves the integer in the float's low byte.
__device__ __forceinline__ uint32_t pack_i8(float4 v, float inv) {
    const float M = 12582912.0f;
    const uint32_t a = __float_as_uint(fmaf(v.x, inv, M)), b = __float_as_uint(fmaf(v.y, inv, M));
    const uint32_t c = __float_as_uint(fmaf(v.z, inv, M)), e = __float_as_uint(fmaf(v.w, inv, M));
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, e, 0x0040), 0x5410);
}
__device__ __forceinline__ float amax4(float4 v, float m) {
    return fmaxf(fmaxf(fmaxf(m, fabsf(v.x)), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}
// 16 consecutive x at p -> 4 words of int8, their scale and the sum of the int8s
struct X16 {
    uint32_t q[4];
    float d;
    int s;
};
template <class XP>
__device__ __forceinline__ void quant16(X16& o, XP p) {
    float4 v[4];
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = ld_x4(p + 4 * i);
        m = amax4(v[i], m);
    }
    o.d = __fdiv_rn(m, 127.0f);
    const float inv = m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f;
    o.s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o.q[i] = pack_i8(v[i], inv);
        o.s = __dp4a((int)o.q[i], 0x01010101, o.s);
    }
}

// A K-quant unit's sum: d*sc*xd*sum(q*xq) - dmin*mn*xd*sum(xq) for its low and
// high half sub-blocks, from the exact integer sums (|sc*sum(q*xq)| <= 63*16*31*127
// and |mn*sum(xq)| < 2^22: i2f is exact). The scale bytes as in k_affine.
__device__ __forceinline__ float k_affine8(uint4 h, int k, int ilo, int ihi, const X16& lo, const X16& hi) {
    const int sh = ((k >> 1) & 1) * 16;
    const uint32_t a = h.y >> sh, b = h.z >> sh, e = h.w >> sh;
    const bool high = k >= 4;
    const uint32_t sc = high ? ((e & 0x0F0Fu) | ((a >> 2) & 0x3030u)) : (a & 0x3F3Fu);
    const uint32_t mn = high ? (((e >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u)) : (b & 0x3F3Fu);
    const float plo = i2f((int)(sc & 0xFFu) * ilo), phi = i2f((int)(sc >> 8) * ihi);
    const float mlo = i2f((int)(mn & 0xFFu) * lo.s), mhi = i2f((int)(mn >> 8) * hi.s);
    return fmaf(half_lo(h.x), fmaf(lo.d, plo, hi.d * phi), -half_hi(h.x) * fmaf(lo.d, mlo, hi.d * mhi));
}
struct XsK8 { X16 lo, hi; };
template <class XP>
__device__ __forceinline__ void load_x_k8(XsK8& xs, XP x, int u) {
    const int k = u & 7;
    const XP p = x + (u >> 3) * 256 + 64 * (k >> 1) + 16 * (k & 1);
    quant16(xs.lo, p);
    quant16(xs.hi, p + 32);
}
// Q5_K with int8 x: as Q4K8, the 5th bits from qh as in Q5K.
struct Q5K8 : Layout<8, 256, 176> {
    using Xs = XsK8;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_k8(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int k, const Xs& xs) {
        const uint4 h = lds16(buf, off), qh = lds16(buf, off + 16 + 16 * (k & 1)), q = lds16(buf, off + 48 + 16 * k);
        const int c2 = 2 * (k >> 1);
        int ilo = 0, ihi = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t lo, hi;
            q5k_values(U4(q, j), U4(qh, j), c2, lo, hi);
            ilo = __dp4a((int)lo, (int)xs.lo.q[j], ilo);
            ihi = __dp4a((int)hi, (int)xs.hi.q[j], ihi);
        }
        return k_affine8(h, k, ilo, ihi, xs.lo, xs.hi);
    }
};

// Q4_K with int8 x: per sub-block half, sum q*xq in dp4a; d*sc*xd*that - dmin*mn*xd*sum(xq).
struct Q4K8 : Layout<8, 256, 144> {
    using Xs = XsK8;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_k8(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int k, const Xs& xs) {
        const uint4 h = lds16(buf, off), q = lds16(buf, off + 16 + 16 * k);
        int ilo = 0, ihi = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t w = U4(q, j);
            ilo = __dp4a((int)(w & 0x0F0F0F0Fu), (int)xs.lo.q[j], ilo);
            ihi = __dp4a((int)((w >> 4) & 0x0F0F0F0Fu), (int)xs.hi.q[j], ihi);
        }
        return k_affine8(h, k, ilo, ihi, xs.lo, xs.hi);
    }
};

// Q6_K: unit (n, q) = half n (0/1), positions l = 8q..8q+7 of its 32; for each
// group g it gives element 128n + 32g + l from ql[64n + 32(g&1) + l] (high nibble
// if g >= 2) and bits 2g..2g+1 of qh[32n + l], scale scales[8n + 2g + q/2];
// value (d*scale) * (q6 - 32).
struct Q6K : Layout<8, 256, 210> {  // ql[128], qh[64], scales[16], d
    struct Xs {
        float4 x[4][2];
        float s[4];
    };
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) {
        const XP p = x + (u >> 3) * 256 + 128 * ((u >> 2) & 1) + 8 * (u & 3);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            xs.x[g][0] = ld_x4(p + 32 * g);
            xs.x[g][1] = ld_x4(p + 32 * g + 4);
            xs.s[g] = sum4(xs.x[g][0]) + sum4(xs.x[g][1]);
        }
    }
    __device__ static float dot(const uint8_t* buf, int off, int sub, const Xs& xs) {
        const int n = sub >> 2, q = sub & 3;
        uint32_t a[2], b[2], h[2];
        lds_a2<2>(buf, off + 64 * n + 8 * q, a);
        lds_a2<2>(buf, off + 64 * n + 32 + 8 * q, b);
        lds_a2<2>(buf, off + 128 + 32 * n + 8 * q, h);
        float S[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 2; j++) {
            S[0] = dot4q((a[j] & 0x0F0F0F0Fu) | ((h[j] << 4) & 0x30303030u), xs.x[0][j], S[0]);
            S[1] = dot4q((b[j] & 0x0F0F0F0Fu) | ((h[j] << 2) & 0x30303030u), xs.x[1][j], S[1]);
            S[2] = dot4q(((a[j] >> 4) & 0x0F0F0F0Fu) | (h[j] & 0x30303030u), xs.x[2][j], S[2]);
            S[3] = dot4q(((b[j] >> 4) & 0x0F0F0F0Fu) | ((h[j] >> 2) & 0x30303030u), xs.x[3][j], S[3]);
        }
        // sum (q6 - 32) x = 256 (S - X/2) - 32 X = 256 (S - 0.625 X)
        const int8_t* sc = reinterpret_cast<const int8_t*>(buf) + off + 192 + 8 * n + (q >> 1);
        float r = (float)sc[0] * fmaf(-0.625f, xs.s[0], S[0]);
        r = fmaf((float)sc[2], fmaf(-0.625f, xs.s[1], S[1]), r);
        r = fmaf((float)sc[4], fmaf(-0.625f, xs.s[2], S[2]), r);
        r = fmaf((float)sc[6], fmaf(-0.625f, xs.s[3], S[3]), r);
        return (256.0f * lds_half(buf, off + 208)) * r;
    }
};

// Q8_0: unit = half a block, 16 signed bytes at 2 + 16h.
struct Q8_0 : Layout<2, 32, 34> {  // d, qs[32]
    struct Xs { float4 x[4]; };
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) {
        const XP p = x + 16 * u;  // = 32*(u/2) + 16*(u%2)
#pragma unroll
        for (int i = 0; i < 4; i++) xs.x[i] = ld_x4(p + 4 * i);
    }
    __device__ static float dot(const uint8_t* buf, int off, int h, const Xs& xs) {
        uint32_t w[4];
        lds_a2<4>(buf, off + 2 + 16 * h, w);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) s = dot4i8(w[j], xs.x[j], s);
        return lds_half(buf, off) * s;
    }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1: unit = one block; byte j of qs gives element j
// (low nibble) and j+16 (high nibble).
struct Xs32 {
    float4 lo[4], hi[4];
    float s;  // sum of all 32
};
template <class XP>
__device__ __forceinline__ void load_x_32(Xs32& xs, XP x, int u) {
    const XP p = x + 32 * u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        xs.lo[i] = ld_x4(p + 4 * i);
        xs.hi[i] = ld_x4(p + 16 + 4 * i);
    }
    xs.s = ((sum4(xs.lo[0]) + sum4(xs.lo[1])) + (sum4(xs.lo[2]) + sum4(xs.lo[3]))) +
           ((sum4(xs.hi[0]) + sum4(xs.hi[1])) + (sum4(xs.hi[2]) + sum4(xs.hi[3])));
}
// S = sum (0.5 + v/256) x over the block's 32 values v; qh holds the fifth bits
// (bit e for element e), 0 for the 4-bit types.
__device__ __forceinline__ float s32(const uint32_t* w, uint32_t qh, const Xs32& xs) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        s = dot4q((w[j] & 0x0F0F0F0Fu) | spread4(qh >> (4 * j)), xs.lo[j], s);
        s = dot4q(((w[j] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * j)), xs.hi[j], s);
    }
    return s;
}

struct Q4_0 : Layout<1, 32, 18> {  // d, qs[16]; (v - 8) d: 256 d (S - X/2) - 8 d X
    using Xs = Xs32;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_32(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        uint32_t w[4];
        lds_a2<4>(buf, off + 2, w);
        return (256.0f * lds_half(buf, off)) * fmaf(-0.53125f, xs.s, s32(w, 0u, xs));
    }
};
struct Q4_1 : Layout<1, 32, 20> {  // d, m, qs[16]; v d + m: 256 d (S - X/2) + m X
    using Xs = Xs32;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_32(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        uint32_t w[4];
        lds_a2<4>(buf, off + 4, w);
        const float r = (256.0f * lds_half(buf, off)) * fmaf(-0.5f, xs.s, s32(w, 0u, xs));
        return fmaf(lds_half(buf, off + 2), xs.s, r);
    }
};
struct Q5_0 : Layout<1, 32, 22> {  // d, qh[4], qs[16]; (v - 16) d: 256 d (S - X/2) - 16 d X
    using Xs = Xs32;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_32(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        uint32_t w[4], qh[1];
        lds_a2<1>(buf, off + 2, qh);
        lds_a2<4>(buf, off + 6, w);
        return (256.0f * lds_half(buf, off)) * fmaf(-0.5625f, xs.s, s32(w, qh[0], xs));
    }
};
struct Q5_1 : Layout<1, 32, 24> {  // d, m, qh[4], qs[16]; v d + m
    using Xs = Xs32;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_32(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        uint32_t w[4], qh[1];
        lds_a2<1>(buf, off + 4, qh);
        lds_a2<4>(buf, off + 8, w);
        const float r = (256.0f * lds_half(buf, off)) * fmaf(-0.5f, xs.s, s32(w, qh[0], xs));
        return fmaf(lds_half(buf, off + 2), xs.s, r);
    }
};


// Q6_K with int8 x (groups of 8: a unit's 4 runs of 8 elements): per run,
// sum (q6 - 32) xq = dp4a(q6, xq) - 32 sum(xq), exact in int.
struct X8 {
    uint32_t q[2];
    float d;
};
struct Q6K8 : Layout<8, 256, 210> {
    struct Xs { X8 g[4]; int s[4]; };
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) {
        const XP p = x + (u >> 3) * 256 + 128 * ((u >> 2) & 1) + 8 * (u & 3);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const float4 a = ld_x4(p + 32 * g), b = ld_x4(p + 32 * g + 4);
            const float m = amax4(b, amax4(a, 0.0f));
            xs.g[g].d = __fdiv_rn(m, 127.0f);
            const float inv = m > 0.0f ? __fdiv_rn(127.0f, m) : 0.0f;
            xs.g[g].q[0] = pack_i8(a, inv);
            xs.g[g].q[1] = pack_i8(b, inv);
            xs.s[g] = 32 * __dp4a((int)xs.g[g].q[1], 0x01010101, __dp4a((int)xs.g[g].q[0], 0x01010101, 0));
        }
    }
    __device__ static float dot(const uint8_t* buf, int off, int sub, const Xs& xs) {
        const int n = sub >> 2, q = sub & 3;
        uint32_t a[2], b[2], h[2];
        lds_a2<2>(buf, off + 64 * n + 8 * q, a);
        lds_a2<2>(buf, off + 128 + 32 * n + 8 * q, h);
        lds_a2<2>(buf, off + 64 * n + 32 + 8 * q, b);
        int S[4];
#pragma unroll
        for (int g = 0; g < 4; g++) S[g] = -xs.s[g];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            S[0] = __dp4a((int)((a[j] & 0x0F0F0F0Fu) | ((h[j] << 4) & 0x30303030u)), (int)xs.g[0].q[j], S[0]);
            S[1] = __dp4a((int)((b[j] & 0x0F0F0F0Fu) | ((h[j] << 2) & 0x30303030u)), (int)xs.g[1].q[j], S[1]);
            S[2] = __dp4a((int)(((a[j] >> 4) & 0x0F0F0F0Fu) | (h[j] & 0x30303030u)), (int)xs.g[2].q[j], S[2]);
            S[3] = __dp4a((int)(((b[j] >> 4) & 0x0F0F0F0Fu) | ((h[j] >> 2) & 0x30303030u)), (int)xs.g[3].q[j], S[3]);
        }
        const int8_t* sc = reinterpret_cast<const int8_t*>(buf) + off + 192 + 8 * n + (q >> 1);
        float r = ((float)sc[0] * xs.g[0].d) * i2f(S[0]);
        r = fmaf((float)sc[2] * xs.g[1].d, i2f(S[1]), r);
        r = fmaf((float)sc[4] * xs.g[2].d, i2f(S[2]), r);
        r = fmaf((float)sc[6] * xs.g[3].d, i2f(S[3]), r);
        return lds_half(buf, off + 208) * r;
    }
};

// Q8_0 with int8 x: unit = half a block (16 signed bytes), one dp4a chain.
struct Q8_08 : Layout<2, 32, 34> {
    using Xs = X16;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { quant16(xs, x + 16 * u); }
    __device__ static float dot(const uint8_t* buf, int off, int h, const Xs& xs) {
        uint32_t w[4];
        lds_a2<4>(buf, off + 2 + 16 * h, w);
        int s = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) s = __dp4a((int)w[j], (int)xs.q[j], s);
        return (lds_half(buf, off) * xs.d) * i2f(s);
    }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1 with int8 x: unit = one block; lo = its first 16
// elements (low nibbles), hi = the last 16 (high nibbles). v*d - off*d (_0) or v*d + m (_1).
struct Xs32q { X16 lo, hi; };
template <class XP>
__device__ __forceinline__ void load_x_32q(Xs32q& xs, XP x, int u) {
    quant16(xs.lo, x + 32 * u);
    quant16(xs.hi, x + 32 * u + 16);
}
// xd-weighted sums: sum v*x^ (P) and sum x^ (X) over the block
__device__ __forceinline__ void p32q(const uint32_t* w, uint32_t qh, const Xs32q& xs, float& P, float& X) {
    int ilo = 0, ihi = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        ilo = __dp4a((int)((w[j] & 0x0F0F0F0Fu) | spread4(qh >> (4 * j))), (int)xs.lo.q[j], ilo);
        ihi = __dp4a((int)(((w[j] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * j))), (int)xs.hi.q[j], ihi);
    }
    P = fmaf(xs.lo.d, i2f(ilo), xs.hi.d * i2f(ihi));
    X = fmaf(xs.lo.d, i2f(xs.lo.s), xs.hi.d * i2f(xs.hi.s));
}
template <int HOFF, int QOFF, int ZERO, bool MIN>  // qh at HOFF (none: -1), qs at QOFF, v - ZERO, + m at byte 2
struct Q32q : Layout<1, 32, QOFF + 16> {
    using Xs = Xs32q;
    template <class XP>
    __device__ static void load_x(Xs& xs, XP x, int u) { load_x_32q(xs, x, u); }
    __device__ static float dot(const uint8_t* buf, int off, int, const Xs& xs) {
        uint32_t w[4], qh[1] = {0u};
        if constexpr (HOFF >= 0) lds_a2<1>(buf, off + HOFF, qh);
        lds_a2<4>(buf, off + QOFF, w);
        float P, X;
        p32q(w, qh[0], xs, P, X);
        if constexpr (MIN) return fmaf(lds_half(buf, off), P, lds_half(buf, off + 2) * X);
        return lds_half(buf, off) * fmaf(-(float)ZERO, X, P);
    }
};
using Q4_08 = Q32q<-1, 2, 8, false>;
using Q4_18 = Q32q<-1, 4, 0, true>;
using Q5_08 = Q32q<2, 6, 16, false>;
using Q5_18 = Q32q<4, 8, 0, true>;

// ---- one warp, GEMV_ROWS rows ------------------------------------------------------
// row(r) is the first byte of local row r (0 <= r < GEMV_ROWS), a valid row
// (callers clamp past the matrix's end); it is called again where needed
// rather than kept, saving registers. buf is the warp's staging buffer of
// GEMV_ROWS * Q::SPAN bytes; row r's span lands at buf + r * Q::SPAN, from the
// 16-byte-aligned floor of its first byte (span_off gives where that byte is).

// Copy the weight spans of the step starting at unit `base` (U units per row)
// into buf (every lane of the warp takes part), as one cp.async group.
template <class Q, class RowFn>
__device__ __forceinline__ void stage_rows(uint8_t* buf, RowFn row, int base, int U, int lane) {
    const int nu = min(32, U - base);  // a multiple of UPB, as U and base are
    const size_t skip = (size_t)(base / Q::UPB) * Q::BYTES;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) stage_span(buf + r * Q::SPAN, row(r) + skip, nu / Q::UPB * Q::BYTES, lane);
    cp_async_commit();
}

// acc[r] += row r's units [base, base+32) (lane l: unit base+l, whose x values
// xs holds) from the spans staged in buf for that step.
template <class Q, class RowFn>
__device__ __forceinline__ void dot_staged(const uint8_t* buf, RowFn row, const typename Q::Xs& xs, int base, int U,
                                           int lane, float* acc) {
    if (base + lane >= U) return;
    const size_t skip = (size_t)(base / Q::UPB) * Q::BYTES;
    const int boff = lane / Q::UPB * Q::BYTES, sub = lane % Q::UPB;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
        const int off = (int)(reinterpret_cast<size_t>(row(r) + skip) & 15);
        acc[r] += Q::dot(buf + r * Q::SPAN, off + boff, sub, xs);
    }
}

// acc[r] += the dot product of row r with x over units [first, U), in steps
// of `stride` units, one staging buffer: each step's copies are waited for
// before its decode (the overlap comes from the other warps and blocks on the
// SM). The first step's spans must already be staged: callers issue
// stage_rows(first) early, before pdl_wait() where the rows do not depend on
// the previous kernel.
template <class Q, class RowFn>
__device__ __forceinline__ void dot_rows(uint8_t* buf, RowFn row, const float* __restrict__ x, int first, int stride,
                                         int U, int lane, float* acc) {
    for (int base = first; base < U; base += stride) {
        if (base != first) stage_rows<Q>(buf, row, base, U, lane);
        typename Q::Xs xs;
        if (base + lane < U) Q::load_x(xs, x, base + lane);  // overlaps the copies
        cp_async_wait_all();
        __syncwarp();
        dot_staged<Q>(buf, row, xs, base, U, lane, acc);
        __syncwarp();  // the next step overwrites the buffer
    }
}

// WITH_LAYOUT_<type>(n_in, CALL) expands CALL(Q) with the type's layout for
// this n_in: float rows are 16-byte vectors when every row is a whole number of
// them, else single elements. (Macros, not a generic lambda: NVRTC versions
// differ on lambdas in kernel bodies.)
#define WITH_LAYOUT_f32(n_in, CALL) if ((n_in) % 4 == 0) { CALL(FVec<0>); } else { CALL(FOne<0>); }
#define WITH_LAYOUT_f16(n_in, CALL) if ((n_in) % 8 == 0) { CALL(FVec<1>); } else { CALL(FOne<1>); }
#define WITH_LAYOUT_bf16(n_in, CALL) if ((n_in) % 8 == 0) { CALL(FVec<2>); } else { CALL(FOne<2>); }
#if GEMV_XQ
#define WITH_LAYOUT_q4_0(n_in, CALL) CALL(Q4_08);
#define WITH_LAYOUT_q4_1(n_in, CALL) CALL(Q4_18);
#define WITH_LAYOUT_q5_0(n_in, CALL) CALL(Q5_08);
#define WITH_LAYOUT_q5_1(n_in, CALL) CALL(Q5_18);
#define WITH_LAYOUT_q8_0(n_in, CALL) CALL(Q8_08);
#define WITH_LAYOUT_q4_k(n_in, CALL) CALL(Q4K8);
#define WITH_LAYOUT_q5_k(n_in, CALL) CALL(Q5K8);
#define WITH_LAYOUT_q6_k(n_in, CALL) CALL(Q6K8);
#else
#define WITH_LAYOUT_q4_0(n_in, CALL) CALL(Q4_0);
#define WITH_LAYOUT_q4_1(n_in, CALL) CALL(Q4_1);
#define WITH_LAYOUT_q5_0(n_in, CALL) CALL(Q5_0);
#define WITH_LAYOUT_q5_1(n_in, CALL) CALL(Q5_1);
#define WITH_LAYOUT_q8_0(n_in, CALL) CALL(Q8_0);
#define WITH_LAYOUT_q4_k(n_in, CALL) CALL(Q4K);
#define WITH_LAYOUT_q5_k(n_in, CALL) CALL(Q5K);
#define WITH_LAYOUT_q6_k(n_in, CALL) CALL(Q6K);
#endif

// X(name) for every weight type the kernels read (launch.py TYPE_SUFFIX).
#define FOR_EACH_WEIGHT_TYPE(X) X(f32) X(f16) X(bf16) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q4_k) X(q5_k) X(q6_k)

// ---- the dense matrix-vector product (gemv.cu; moe.cu's router) ----------------------
//
// Streaming: the rows come in groups of GEMV_ROWS; block b takes groups b,
// b + gridDim.x, ... (the launcher sizes the grid to what stays resident, so
// no block waits for a second wave and a block's next group is requested as
// soon as its warps have decoded the current one), and each warp walks its
// steps: a group's units [32w, 32w+32), [32w+NT, ...), then the next group's.
// Where a row is one step per warp (most decode shapes), the warp's x stays in
// registers for every group. A group's sums meet across the block's warps in
// shared memory (double-buffered by group parity: one __syncthreads per group).
// (A second staging buffer per warp, the next step's copies in flight during
// this one's decode, measured slower on the H200: the shared memory it takes
// costs more resident blocks than the overlap gains.)
// Dynamic shared memory: NT/32 * GEMV_ROWS * Q::SPAN bytes (launchers/gemv.py).
// Every warp has units (32 * (NT/32 - 1) < U).
//
// GLU (Act SiluMul or GeluTanhMul, GEMV_ROWS >= 2): W holds 2*n_out rows, the
// gate's n_out then the up projection's (a stacked gate/up group), and
// y[r] = Act(gate_r·x, up_r·x): a group's first R/2 rows are gate rows, its
// last R/2 the matching up rows, so the pair meets in one block's reduction
// (the separate silu_mul/gelu_tanh_mul launch and its round trip are gone).
struct NoAct {  // a plain GEMV (never called: GLU is false)
    __device__ float operator()(float g, float) const { return g; }
};
template <class A> struct is_no_act { static constexpr bool value = false; };
template <> struct is_no_act<NoAct> { static constexpr bool value = true; };

// The end of a group (both streamings): each warp's per-row sums into red
// [warps][R] (acc cleared), then, after the caller's __syncthreads, thread tid
// < H writes row g*H + tid: the sum over the warps in warp order (GLU: Act of
// the gate row's and the up row's sums), plus add[row] where given.
template <int R>
__device__ __forceinline__ void group_sums(float (*red)[R], float* acc, int warp, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
        acc[r] = 0.0f;
    }
}
template <class Act, int R, int H>
__device__ __forceinline__ void group_out(const float (*red)[R], int g, int n_warps, float* y, const float* add,
                                          int n_out, float scale) {
    const int tid = threadIdx.x, row = g * H + tid;
    if (tid >= H || row >= n_out) return;
    float s = 0.0f;
    for (int w = 0; w < n_warps; w++) s += red[w][tid];
    if (GEMV_NORM) s *= scale;
    if constexpr (!is_no_act<Act>::value) {
        float u = 0.0f;
        for (int w = 0; w < n_warps; w++) u += red[w][tid + H];
        if (GEMV_NORM) u *= scale;
        s = Act()(s, u);
    } else if (add) {
        s += add[row];
    }
    y[row] = s;
}

// GEMV_NORM: the 1/rms of x from the lanes' sums of squares over the block's
// first group (every unit of x loaded once), as norm.cu's rms_norm forms it:
// rsqrt(sum / n_in + eps). Each warp's sum goes in before the group's barrier,
// every thread reads the total after it.
__device__ __forceinline__ void norm_partial(float ss, float* red_ss, int warp, int lane) {
    ss = warp_sum(ss);
    if (lane == 0) red_ss[warp] = ss;
}
__device__ __forceinline__ float norm_total(const float* red_ss, int n_warps, int n_in, float eps) {
    float t = 0.0f;
    for (int w = 0; w < n_warps; w++) t += red_ss[w];
    return rsqrtf(t / (float)n_in + eps);
}

// GEMV_LATE_WAIT: the block's work is done; the next kernel may launch, and this
// one ends only after the kernel before it (so the next one's wait covers both).
__device__ __forceinline__ void late_wait() {
    if (GEMV_LATE_WAIT) {
        pdl_launch_next();
        pdl_wait();
    }
}

template <class Q, class Act = NoAct>
__device__ __forceinline__ void gemv_impl(const uint8_t* __restrict__ W, const float* __restrict__ x, float* y,
                                          const float* add, int n_in, int n_out, const float* __restrict__ nw,
                                          float eps) {
    constexpr int R = GEMV_ROWS;
    constexpr bool GLU = !is_no_act<Act>::value;
    constexpr int H = GLU ? R / 2 : R;  // output rows per group
    static_assert(!GLU || (R >= 2 && R % 2 == 0), "GLU GEMV needs an even GEMV_ROWS");
    extern __shared__ __align__(16) uint8_t gemv_stage[];
    __shared__ float red[2][GEMV_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = blockDim.x;
    check_stage_smem((NT / 32) * R * Q::SPAN);
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;  // work units per row
    const int groups = (n_out + H - 1) / H;
    uint8_t* buf = gemv_stage + warp * (R * Q::SPAN);
    // group g's local row r; rows past n_out (last group) redo row n_out-1
    auto rows = [=](int g) {
        return [=](int r) {
            if (GLU) return W + (size_t)((r < H ? 0 : n_out) + min(g * H + r % H, n_out - 1)) * row_bytes;
            return W + (size_t)min(g * R + r, n_out - 1) * row_bytes;
        };
    };
    const int first = warp * 32;
    int g = blockIdx.x, base = first, parity = 0, x_base = -1;
    // The first step's weights are requested before waiting for the previous
    // kernel (common.cuh, PDL).
    if (g < groups) stage_rows<Q>(buf, rows(g), first, U, lane);
    if (!GEMV_LATE_WAIT) {
        pdl_wait();
        pdl_launch_next();
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    typename Q::Xs xs;
    float ss = 0.0f, scale = 1.0f;  // GEMV_NORM: the lane's sum of squares of x, then the block's 1/rms
    __shared__ float red_ss[GEMV_MAX_WARPS];
    bool first_group = true;
    while (g < groups) {
        if (base != x_base) {  // overlaps the copies
            if (base + lane < U) {
                if constexpr (GEMV_NORM) Q::load_x(xs, XNormed{x, nw, &ss}, base + lane);
                else Q::load_x(xs, x, base + lane);
            }
            x_base = base;
        }
        cp_async_wait_all();
        __syncwarp();
        dot_staged<Q>(buf, rows(g), xs, base, U, lane, acc);
        __syncwarp();  // the buffer is free again
        // the warp's next step: more units of this group's rows, else the next group's first
        int nb = base + NT, ng = g;
        if (nb >= U) {
            nb = first;
            ng = g + gridDim.x;
        }
        if (ng < groups) stage_rows<Q>(buf, rows(ng), nb, U, lane);
        if (nb == first) {  // group g is done: sum it across the block's warps
            group_sums<R>(red[parity], acc, warp, lane);
            if (GEMV_NORM && first_group) norm_partial(ss, red_ss, warp, lane);
            __syncthreads();
            if (GEMV_NORM && first_group) scale = norm_total(red_ss, NT / 32, n_in, eps);
            first_group = false;
            group_out<Act, R, H>(red[parity], g, NT / 32, y, add, n_out, scale);
            parity ^= 1;
        }
        g = ng;
        base = nb;
    }
    late_wait();
}

// ---- the dense product streamed through bulk copies (sm_90; GEMV_BULK=1) -------------
//
// The same work split as gemv_impl (lane = unit of every row of a group, x in
// registers, the group's sums meet across warps in shared memory), but the
// weights of a group -- R consecutive rows, i.e. one contiguous byte range (for
// GLU: the H gate rows and the H up rows, two ranges) -- arrive in one bulk
// copy (cp.async.bulk, the copy engine of sm_90: one thread issues it and an
// mbarrier counts its bytes in) into a ring of stages in dynamic shared memory,
// as many as fit (S = dynamic_smem / stage bytes, at most GEMV_MAX_STAGES).
// Block b takes groups b, b + gridDim.x, ...; its first S groups are requested
// before pdl_wait() (the previous kernel still running), and a stage is
// refilled with the group S further on as soon as the block has summed the
// group it held. So each block keeps S groups in flight with no warp waiting on
// its own copies, where gemv_impl's warps each stage, wait, then decode.
// A row past x's reach (n_in > GEMV_PASSES * blockDim.x units) is not supported
// here: the launcher picks gemv_impl then.
#ifndef GEMV_PASSES
#define GEMV_PASSES 1  // units per lane and row: U <= GEMV_PASSES * blockDim.x
#endif
#define GEMV_MAX_STAGES 8
#ifndef GEMV_PRE_HALVES
// Half stages a block requests before its wait; the rest right after x's
// loads (launchers/gemv.py PRE_STAGES, in halves). x's loads after the wait
// are on the kernel's critical path, and their responses reach the SM behind
// the weights still arriving for what was requested before: less requested
// early, fewer bytes ahead of x (in the decode graph on the H200,
// reports/notes/decode-pre-stages-2026-12-04.md). A stage's halves: GLU's
// gate rows and up rows; else its bytes cut at a 16-byte boundary.
#define GEMV_PRE_HALVES (2 * GEMV_MAX_STAGES)
#endif

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// the barrier expects `bytes` more from bulk copies, and this thread arrives
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT;\n}\n" ::"r"(
            smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// bytes [src, src + bytes) of global memory to dst (both 16-byte aligned, bytes a
// multiple of 16), completing on bar
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
// Bytes of a stage part holding `len` bytes that start anywhere: the copy runs
// from the 16-byte floor of the start to the 16-byte ceiling of the end (the
// extra bytes share a 16-byte granule with wanted ones, so never leave the
// allocation). launchers/gemv.py bulk_part computes the same.
__host__ __device__ constexpr size_t bulk_part(size_t len) { return (len + 30) / 16 * 16; }
// The bytes the copy of [src, src + len) moves: from the 16-byte floor of src
// to the 16-byte ceiling of its end.
__device__ __forceinline__ uint32_t bulk_bytes(const uint8_t* src, size_t len) {
    const size_t s = reinterpret_cast<size_t>(src);
    return (uint32_t)(((s + len + 15) & ~(size_t)15) - (s & ~(size_t)15));
}
// Issue that copy into part, counting its bytes on bar: all of it (half 0), or
// its first or second half (1, 2), cut at a 16-byte boundary (a copy of one
// granule is all first half).
__device__ __forceinline__ void bulk_span(uint8_t* part, const uint8_t* src, size_t len, uint64_t* bar,
                                          int half = 0) {
    const uint8_t* a0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<size_t>(src) & ~(size_t)15);
    const uint32_t n = bulk_bytes(src, len), cut = half ? n / 32 * 16 : n;
    if (half == 2) {
        if (cut < n && cut > 0) bulk_copy(part + cut, a0 + cut, n - cut, bar);
    } else {
        bulk_copy(part, a0, cut > 0 ? cut : n, bar);
    }
}

template <class Q, class Act = NoAct>
__device__ __forceinline__ void gemv_bulk_impl(const uint8_t* __restrict__ W, const float* __restrict__ x, float* y,
                                               const float* add, int n_in, int n_out, const float* __restrict__ nw,
                                               float eps) {
    constexpr int R = GEMV_ROWS, P = GEMV_PASSES;
    constexpr bool GLU = !is_no_act<Act>::value;
    constexpr int H = GLU ? R / 2 : R;  // output rows per group; a part holds H rows
    constexpr int PARTS = GLU ? 2 : 1;
    static_assert(!GLU || (R >= 2 && R % 2 == 0), "GLU GEMV needs an even GEMV_ROWS");
    extern __shared__ __align__(128) uint8_t gemv_ring[];
    __shared__ __align__(8) uint64_t full[GEMV_MAX_STAGES];
    __shared__ float red[2][GEMV_MAX_WARPS][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, NT = blockDim.x;
    const size_t row_bytes = (size_t)(n_in / Q::QK) * Q::BYTES;
    const int U = n_in / Q::QK * Q::UPB;
    const int groups = (n_out + H - 1) / H;
    const int part = (int)bulk_part((size_t)H * row_bytes), stage = PARTS * part;
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const int S = min((int)(dyn / (uint32_t)stage), GEMV_MAX_STAGES);
    if (S < 1 || U > P * NT) __trap();  // the launcher sized this launch wrongly
    // part p of group g: its first row, and how many of its rows exist
    auto part_src = [=](int g, int p) { return W + (size_t)((GLU && p ? n_out : 0) + g * H) * row_bytes; };
    // group k of this block into stage k % S (one thread): all of it (half 0), or its first or second half
    // (1, 2; GEMV_PRE_HALVES); the barrier expects the whole stage's bytes before the first copy starts
    const auto issue = [&](int k, int half = 0) {
        const int g = blockIdx.x + k * gridDim.x;
        const size_t len = (size_t)min(H, n_out - g * H) * row_bytes;
        uint8_t* st = gemv_ring + (k % S) * stage;
        uint64_t* bar = &full[k % S];
        if (half != 2) {
            uint32_t bytes = 0;
            for (int p = 0; p < PARTS; p++) bytes += bulk_bytes(part_src(g, p), len);
            mbar_expect_tx(bar, bytes);
        }
        for (int p = 0; p < PARTS; p++) {
            if (half == 0) bulk_span(st + p * part, part_src(g, p), len, bar);
            else if (!GLU) bulk_span(st, part_src(g, p), len, bar, half);
            else if (p == half - 1) bulk_span(st + p * part, part_src(g, p), len, bar);  // GLU: gate, then up
        }
    };
    const int mine = groups > (int)blockIdx.x ? (groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
#if GEMV_PRE_HALVES < 2 * GEMV_MAX_STAGES
    const int pre = min(2 * min(S, mine), GEMV_PRE_HALVES);  // the halves requested before the wait
#endif
    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(&full[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        // weights only: before the previous kernel ends
#if GEMV_PRE_HALVES < 2 * GEMV_MAX_STAGES
        for (int k = 0; k < pre / 2; k++) issue(k);
        if (pre & 1) issue(pre / 2, 1);
#else
        for (int k = 0; k < min(S, mine); k++) issue(k);
#endif
    }
    __syncthreads();  // the barriers are initialised
    if (!GEMV_LATE_WAIT) {
        pdl_wait();
        pdl_launch_next();
    }
    typename Q::Xs xs[P];
    const int first = warp * 32 + lane;  // this lane's unit in pass 0; pass p adds p*NT
    float ss = 0.0f, scale = 1.0f;       // GEMV_NORM: the lane's sum of squares of x, then the block's 1/rms
    __shared__ float red_ss[GEMV_MAX_WARPS];
#pragma unroll
    for (int p = 0; p < P; p++) {
        if (first + p * NT < U) {
            if constexpr (GEMV_NORM) Q::load_x(xs[p], XNormed{x, nw, &ss}, first + p * NT);
            else Q::load_x(xs[p], x, first + p * NT);
        }
    }
#if GEMV_PRE_HALVES < 2 * GEMV_MAX_STAGES
    if (tid == 0) {  // what was not requested before the wait, behind x's loads
        if (pre & 1) issue(pre / 2, 2);
        for (int k = (pre + 1) / 2; k < min(S, mine); k++) issue(k);
    }
#endif
    for (int k = 0; k < mine; k++) {
        const int g = blockIdx.x + k * gridDim.x, s = k % S;
        const uint8_t* st = gemv_ring + s * stage;
        mbar_wait(&full[s], (uint32_t)(k / S) & 1u);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int u = first + p * NT;
            if (u < U) {
                const int boff = u / Q::UPB * Q::BYTES, sub = u % Q::UPB;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int pp = GLU && r >= H ? 1 : 0, i = GLU ? r % H : r;
                    const int off = (int)(reinterpret_cast<size_t>(part_src(g, pp)) & 15) + i * (int)row_bytes;
                    acc[r] += Q::dot(st + pp * part, off + boff, sub, xs[p]);
                }
            }
        }
        const int parity = k & 1;
        group_sums<R>(red[parity], acc, warp, lane);
        if (GEMV_NORM && k == 0) norm_partial(ss, red_ss, warp, lane);
        __syncthreads();  // the stage is read (it may be refilled) and red[parity] is complete
        if (GEMV_NORM && k == 0) scale = norm_total(red_ss, NT / 32, n_in, eps);
        if (tid == 0 && k + S < mine) issue(k + S);
        group_out<Act, R, H>(red[parity], g, NT / 32, y, add, n_out, scale);
    }
    late_wait();
}
