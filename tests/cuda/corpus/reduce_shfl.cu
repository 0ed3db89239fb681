// reduce_shfl: sum of n ints. Each thread accumulates a grid-stride slice,
// warps reduce with __shfl_down_sync, warp sums meet in shared memory, and the
// first warp's result is added to the total with a 64-bit atomicAdd. Exact.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__inline__ __device__ long long warp_reduce_sum(long long value)
{
    for (int offset = warpSize / 2; offset > 0; offset /= 2) {
        value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    return value;
}

__global__ void reduce_shfl(const int* in, unsigned long long* total, int n)
{
    __shared__ long long warp_sums[32];
    long long sum = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        sum += in[i];
    }
    int lane = threadIdx.x % warpSize;
    int warp = threadIdx.x / warpSize;
    sum = warp_reduce_sum(sum);
    if (lane == 0) {
        warp_sums[warp] = sum;
    }
    __syncthreads();

    int warps = (blockDim.x + warpSize - 1) / warpSize;
    if (warp == 0) {
        sum = lane < warps ? warp_sums[lane] : 0;
        sum = warp_reduce_sum(sum);
        if (lane == 0) {
            atomicAdd(total, (unsigned long long)sum);
        }
    }
}

int main()
{
    const int n = (1 << 18) + 77;
    std::vector<int> data(n);
    unsigned state = 2024u;
    long long expected = 0;
    for (int i = 0; i < n; ++i) {
        state = state * 1103515245u + 12345u;
        data[i] = (int)(state >> 16) % 2001 - 1000;
        expected += data[i];
    }

    int* d_in;
    unsigned long long* d_total;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_total, sizeof(unsigned long long)));
    CHECK(cudaMemcpy(d_in, data.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_total, 0, sizeof(unsigned long long)));

    reduce_shfl<<<48, 256>>>(d_in, d_total, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    unsigned long long raw = 0;
    CHECK(cudaMemcpy(&raw, d_total, sizeof(raw), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_total));
    long long got = (long long)raw;
    if (got != expected) {
        printf("reduce_shfl: FAIL (got %lld expected %lld)\n", got, expected);
        return 1;
    }
    printf("reduce_shfl: PASS (n=%d sum=%lld)\n", n, got);
    return 0;
}
