// The last kernel of a captured decode step: feed the chosen token back in
// and move to the next position, on the device, so replaying the graph needs
// no host writes (the host only reads `next` to print or stop).
#include "common.cuh"

extern "C" __global__ void advance(const int* next, int* token, int* pos) {
    KERNEL_START();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        token[0] = next[0];
        pos[0] += 1;
    }
}
