// Greedy sampling: index of the largest of n fp32 logits, the LOWEST index
// winning ties (as llama.cpp's greedy sampler and np.argmax). A NaN or an
// infinity anywhere makes the answer NON_FINITE (-1): no token can be chosen
// from such logits, and the host turns it into an error naming the step
// (a NaN would otherwise lose every comparison and greedy would print token 0
// over and over). The check rides on the loads the scan does anyway.
//
// Napkin math: 152k logits = 608 KB. One block streams that at maybe
// 100-150 GB/s (one SM's worth of outstanding loads) = ~5 µs; spread over
// ~100 blocks it is a ~1 µs read. So launchers/argmax.py uses the single-block `argmax`
// for small n and `argmax_blocks` for large n: many blocks, one (value, index)
// per block into a scratch buffer, which the last block to finish reduces.
// Decode reads back only the int at `out`.
//
// Given `token` and `pos` (the decode step's inputs, in device memory), the
// kernel also feeds its choice back: token = out, pos += 1, so the captured
// step's next replay runs the next position with no host write and no kernel
// after this one. The separate one-thread launch that did it, and the second
// argmax pass, are gone: tg128 on qwen3-8b 1.016x on the H200
// (reports/notes/decode-qk-fold-2026-12-02.md).
#include "common.cuh"

#define NO_INDEX 0x7fffffff
#define NON_FINITE (-1)

// Is (v, i) better than (bv, bi)? Larger value, or equal value and lower index.
__device__ __forceinline__ void take_better(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// Reduce every thread's (bv, bi) to thread 0. blockDim.x a multiple of 32.
__device__ __forceinline__ void block_argmax(float& bv, int& bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1)
        take_better(bv, bi, __shfl_xor_sync(0xffffffff, bv, o), __shfl_xor_sync(0xffffffff, bi, o));
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x / WARP_SIZE;
        bv = lane < n_warps ? sv[lane] : -INFINITY;
        bi = lane < n_warps ? si[lane] : NO_INDEX;
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o >>= 1)
            take_better(bv, bi, __shfl_xor_sync(0xffffffff, bv, o), __shfl_xor_sync(0xffffffff, bi, o));
    }
}

// Best (value, index) of x[begin:end) for this thread (strided by blockDim,
// ascending, so a strict '>' keeps the thread's lowest index among equals);
// returns whether every value it read was finite.
__device__ __forceinline__ bool scan(const float* x, int begin, int end, float& bv, int& bi) {
    bv = -INFINITY;
    bi = NO_INDEX;
    bool finite = true;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float v = x[i];
        finite &= isfinite(v);
        take_better(bv, bi, v, i);
    }
    return finite;
}

// The answer of a block's reduced (bv, bi) with every read finite or not, into
// *out, fed back into the decode step's inputs when given (thread 0), and
// kept in history[pos] where given: steps replayed back to back without the
// host reading each answer (Backend.decode_greedy) leave their tokens there.
// A NON_FINITE answer feeds token 0, a row the next queued step can read;
// the host raises at the -1 it finds in out or history.
__device__ __forceinline__ void answer(bool finite, int bi, int* out, int* token, int* pos, int* history) {
    if (threadIdx.x != 0) return;
    const int a = !finite ? NON_FINITE : bi == NO_INDEX ? 0 : bi;
    *out = a;
    if (token != nullptr) {
        if (history != nullptr) history[*pos] = a;
        *token = a < 0 ? 0 : a;
        *pos += 1;
    }
}

extern "C" __global__ void argmax(const float* x, int n, int* out, int* token, int* pos, int* history) {
    KERNEL_START();
    float bv;
    int bi;
    const bool finite = __syncthreads_and(scan(x, 0, n, bv, bi));
    block_argmax(bv, bi);
    answer(finite, bi, out, token, pos, history);
}

// Block b takes the contiguous slice [b*chunk, (b+1)*chunk) into its partial;
// the last block to finish (common.cuh last_block, with `ticket`) reduces the
// gridDim.x partials (indices compared explicitly, so their order does not
// matter) and returns the ticket to 0.
extern "C" __global__ void argmax_blocks(const float* x, int n, float* part_val, int* part_idx, unsigned* ticket,
                                         int* out, int* token, int* pos, int* history) {
    KERNEL_START();
    const int chunk = (n + gridDim.x - 1) / gridDim.x;
    const int begin = blockIdx.x * chunk;
    const int end = min(n, begin + chunk);
    float bv;
    int bi;
    const bool finite = __syncthreads_and(scan(x, begin, end, bv, bi));
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
        part_val[blockIdx.x] = bv;
        part_idx[blockIdx.x] = finite ? bi : NON_FINITE;
    }
    if (!last_block(ticket, gridDim.x)) return;
    bv = -INFINITY;
    bi = NO_INDEX;
    bool all_finite = true;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) {
        const int idx = __ldcg(part_idx + i);
        all_finite &= idx != NON_FINITE;
        take_better(bv, bi, __ldcg(part_val + i), idx);
    }
    all_finite = __syncthreads_and(all_finite);
    block_argmax(bv, bi);
    answer(all_finite, bi, out, token, pos, history);
    if (threadIdx.x == 0) *ticket = 0;  // for the next launch
}
