// bitonic_sort: sorts 4096 unsigned keys ascending. Chunks of 1024 keys are
// sorted in shared memory; larger merge stages use one global launch per
// compare distance and finish in shared memory once the distance fits a chunk.
// Exact compare with std::sort.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define CHUNK 1024 // keys per block in the shared-memory kernels (2 per thread)

__device__ __forceinline__ void compare_swap(unsigned& a, unsigned& b, bool ascending)
{
    if ((a > b) == ascending) {
        unsigned t = a;
        a = b;
        b = t;
    }
}

// Runs every stage (size, stride) with size in [first_size, last_size] and stride
// < CHUNK on the block's chunk in shared memory. With first_size == last_size it
// finishes one merge of a size larger than a chunk.
__global__ void bitonic_shared(unsigned* keys, unsigned first_size, unsigned last_size)
{
    __shared__ unsigned s[CHUNK];
    unsigned base = blockIdx.x * CHUNK;
    s[threadIdx.x] = keys[base + threadIdx.x];
    s[threadIdx.x + CHUNK / 2] = keys[base + threadIdx.x + CHUNK / 2];
    __syncthreads();

    for (unsigned size = first_size; size <= last_size; size *= 2) {
        unsigned stride = size / 2 < CHUNK / 2 ? size / 2 : CHUNK / 2;
        for (; stride > 0; stride /= 2) {
            // Thread t handles the pair (lo, lo + stride).
            unsigned lo = 2 * threadIdx.x - (threadIdx.x & (stride - 1));
            bool ascending = ((base + lo) & size) == 0;
            compare_swap(s[lo], s[lo + stride], ascending);
            __syncthreads();
        }
    }

    keys[base + threadIdx.x] = s[threadIdx.x];
    keys[base + threadIdx.x + CHUNK / 2] = s[threadIdx.x + CHUNK / 2];
}

// One global compare-exchange stage: every i with partner i ^ stride > i.
__global__ void bitonic_global(unsigned* keys, unsigned size, unsigned stride)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned partner = i ^ stride;
    if (partner > i) {
        bool ascending = (i & size) == 0;
        unsigned a = keys[i], b = keys[partner];
        if ((a > b) == ascending) {
            keys[i] = b;
            keys[partner] = a;
        }
    }
}

int main()
{
    const unsigned n = 4096;
    std::vector<unsigned> keys(n), sorted(n);
    unsigned state = 4242u;
    for (unsigned i = 0; i < n; ++i) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        keys[i] = state % 100000u; // duplicates are likely
    }

    unsigned* d_keys;
    CHECK(cudaMalloc(&d_keys, n * sizeof(unsigned)));
    CHECK(cudaMemcpy(d_keys, keys.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));

    const unsigned chunks = n / CHUNK;
    bitonic_shared<<<chunks, CHUNK / 2>>>(d_keys, 2, CHUNK);
    CHECK(cudaGetLastError());
    for (unsigned size = 2 * CHUNK; size <= n; size *= 2) {
        for (unsigned stride = size / 2; stride >= CHUNK; stride /= 2) {
            bitonic_global<<<n / 256, 256>>>(d_keys, size, stride);
            CHECK(cudaGetLastError());
        }
        bitonic_shared<<<chunks, CHUNK / 2>>>(d_keys, size, size);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(sorted.data(), d_keys, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_keys));

    std::vector<unsigned> expected = keys;
    std::sort(expected.begin(), expected.end());
    int errors = 0;
    for (unsigned i = 0; i < n; ++i) {
        if (sorted[i] != expected[i]) {
            if (errors < 10) printf("bitonic_sort: position %u: got %u expected %u\n", i, sorted[i], expected[i]);
            ++errors;
        }
    }
    if (errors) {
        printf("bitonic_sort: FAIL (%d of %u wrong)\n", errors, n);
        return 1;
    }
    printf("bitonic_sort: PASS (n=%u)\n", n);
    return 0;
}
