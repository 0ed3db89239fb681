// histogram: 256-bin byte histogram. Each block counts into a shared-memory
// histogram with shared atomics, then merges it into the global histogram with
// global atomicAdd. Exact compare with a host count.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define BINS 256

__global__ void histogram(const unsigned char* data, int n, unsigned int* bins)
{
    __shared__ unsigned int local[BINS];
    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        local[b] = 0;
    }
    __syncthreads();

    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&local[data[i]], 1u);
    }
    __syncthreads();

    for (int b = threadIdx.x; b < BINS; b += blockDim.x) {
        if (local[b] != 0) {
            atomicAdd(&bins[b], local[b]);
        }
    }
}

int main()
{
    const int n = 300000;
    std::vector<unsigned char> data(n);
    unsigned state = 77u;
    for (int i = 0; i < n; ++i) {
        state = state * 1664525u + 1013904223u;
        // Skewed distribution: low bins much more frequent, so atomics collide.
        unsigned v = state >> 24;
        data[i] = (unsigned char)((v * v) >> 8);
    }
    std::vector<unsigned int> expected(BINS, 0), got(BINS, 0);
    for (int i = 0; i < n; ++i) expected[data[i]]++;

    unsigned char* d_data;
    unsigned int* d_bins;
    CHECK(cudaMalloc(&d_data, n));
    CHECK(cudaMalloc(&d_bins, BINS * sizeof(unsigned int)));
    CHECK(cudaMemcpy(d_data, data.data(), n, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_bins, 0, BINS * sizeof(unsigned int)));

    histogram<<<40, 192>>>(d_data, n, d_bins);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got.data(), d_bins, BINS * sizeof(unsigned int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_data));
    CHECK(cudaFree(d_bins));

    int errors = 0;
    for (int b = 0; b < BINS; ++b) {
        if (got[b] != expected[b]) {
            if (errors < 10) printf("histogram: bin %d: got %u expected %u\n", b, got[b], expected[b]);
            ++errors;
        }
    }
    if (errors) {
        printf("histogram: FAIL (%d of %d bins wrong)\n", errors, BINS);
        return 1;
    }
    printf("histogram: PASS (n=%d bins=%d)\n", n, BINS);
    return 0;
}
