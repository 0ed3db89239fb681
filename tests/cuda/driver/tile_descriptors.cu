// Ordered 16-byte accesses are whole, as CUB takes its tile descriptors
// (status and value in one st/ld.relaxed.gpu.v2.u64) to be: block 0
// publishes {k, k} for k = 1..ROUNDS while blocks 1..READERS read the pair
// back and count the reads whose halves differ. The other threads and blocks
// do nothing: they make the grid large enough (over 4,096 threads) that the
// CPU device spreads it over its threads. Needs READERS + 1 blocks running
// at once (a CPU device of 3 threads or more).
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

#define READERS 2
#define ROUNDS 10000000ull

__device__ void put(unsigned long long *slot, unsigned long long k) {
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %1};" ::"l"(slot), "l"(k) : "memory");
}

__device__ void get(const unsigned long long *slot, unsigned long long &a, unsigned long long &b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(a), "=l"(b)
                 : "l"(slot)
                 : "memory");
}

__global__ void race(unsigned long long *slot, unsigned *counts, unsigned *started) {
    if (threadIdx.x != 0 || blockIdx.x > READERS) return;
    if (blockIdx.x == 0) {
        while (*(volatile unsigned *)started < READERS) {
        }
        for (unsigned long long k = 1; k <= ROUNDS; ++k) put(slot, k);
        return;
    }
    atomicAdd(started, 1);
    unsigned torn = 0, seen = 0;
    for (;;) {
        unsigned long long a, b;
        get(slot, a, b);
        if (a != b) {
            ++torn;
        } else if (a == ROUNDS) {
            break;
        } else if (a != 0) {
            ++seen;
        }
    }
    counts[2 * blockIdx.x] = torn;
    counts[2 * blockIdx.x + 1] = seen;
}

int main() {
    unsigned long long *slot;
    unsigned *counts, *started;
    CHECK(cudaMalloc(&slot, 16));
    CHECK(cudaMalloc(&counts, 8 * (READERS + 1)));
    CHECK(cudaMalloc(&started, 4));
    CHECK(cudaMemset(slot, 0, 16));
    CHECK(cudaMemset(counts, 0, 8 * (READERS + 1)));
    CHECK(cudaMemset(started, 0, 4));
    race<<<READERS + 3, 1024>>>(slot, counts, started);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    unsigned host[2 * (READERS + 1)];
    CHECK(cudaMemcpy(host, counts, sizeof host, cudaMemcpyDeviceToHost));
    unsigned torn = 0, seen = 0;
    for (int b = 1; b <= READERS; ++b) {
        torn += host[2 * b];
        seen += host[2 * b + 1];
    }
    printf("tile_descriptors: %u torn reads, %u reads of a pair in the race\n", torn, seen);
    if (torn != 0 || seen == 0) {
        printf("FAIL %s\n", torn != 0 ? "torn reads" : "no read of a pair in the race");
        return 1;
    }
    printf("PASS\n");
    return 0;
}
