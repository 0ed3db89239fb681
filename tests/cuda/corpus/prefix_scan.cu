// prefix_scan: inclusive prefix sum of n ints over many blocks. Pass 1 scans
// each block's chunk in shared memory (Hillis-Steele, double-buffered) and
// records the block total; pass 2 scans the block totals in one block; pass 3
// adds each block's offset. Exact compare with a host scan.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define BLOCK 256

// Inclusive scan of one chunk of blockDim.x elements; writes the chunk total
// to block_sums[blockIdx.x] when block_sums is not null.
__global__ void scan_blocks(const int* in, int* out, int* block_sums, int n)
{
    __shared__ int buffer[2][BLOCK];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int current = 0;
    buffer[current][threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();

    for (int offset = 1; offset < blockDim.x; offset *= 2) {
        int next = 1 - current;
        int value = buffer[current][threadIdx.x];
        if (threadIdx.x >= offset) {
            value += buffer[current][threadIdx.x - offset];
        }
        buffer[next][threadIdx.x] = value;
        current = next;
        __syncthreads();
    }

    if (i < n) {
        out[i] = buffer[current][threadIdx.x];
    }
    if (block_sums != nullptr && threadIdx.x == blockDim.x - 1) {
        block_sums[blockIdx.x] = buffer[current][threadIdx.x];
    }
}

// Adds the inclusive scan of the previous blocks' totals to every element.
__global__ void add_block_offsets(int* out, const int* scanned_sums, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x > 0 && i < n) {
        out[i] += scanned_sums[blockIdx.x - 1];
    }
}

int main()
{
    const int n = 50000;
    const int blocks = (n + BLOCK - 1) / BLOCK; // 196, fits in one block's scan below
    std::vector<int> in(n), out(n);
    for (int i = 0; i < n; ++i) in[i] = (i * 37 + 11) % 19 - 9;

    int *d_in, *d_out, *d_sums, *d_sums_scanned;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_out, n * sizeof(int)));
    CHECK(cudaMalloc(&d_sums, blocks * sizeof(int)));
    CHECK(cudaMalloc(&d_sums_scanned, blocks * sizeof(int)));
    CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    scan_blocks<<<blocks, BLOCK>>>(d_in, d_out, d_sums, n);
    CHECK(cudaGetLastError());
    scan_blocks<<<1, BLOCK>>>(d_sums, d_sums_scanned, nullptr, blocks);
    CHECK(cudaGetLastError());
    add_block_offsets<<<blocks, BLOCK>>>(d_out, d_sums_scanned, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));

    int errors = 0;
    int running = 0;
    for (int i = 0; i < n; ++i) {
        running += in[i];
        if (out[i] != running) {
            if (errors < 10) printf("prefix_scan: mismatch at %d: got %d expected %d\n", i, out[i], running);
            ++errors;
        }
    }
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_sums));
    CHECK(cudaFree(d_sums_scanned));
    if (errors) {
        printf("prefix_scan: FAIL (%d of %d wrong)\n", errors, n);
        return 1;
    }
    printf("prefix_scan: PASS (n=%d blocks=%d)\n", n, blocks);
    return 0;
}
