// The device-side heap (issue 22, item 5: malloc, free, new and delete were
// missing on the CPU device). Allocations outlive their kernel: one launch
// allocates (16-byte aligned, never overlapping another thread's) and keeps
// the pointers in a __device__ array, a later one checks and frees them;
// new[] and delete[] run constructors and destructors; a heap of the size
// cudaLimitMallocHeapSize set runs out (malloc returns NULL) and takes
// allocations again once freed. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

constexpr int BLOCKS = 4, THREADS = 64, N = BLOCKS * THREADS;

__device__ unsigned char *kept[N];
__device__ int constructed, destroyed;

struct Counted {
    int value;
    __device__ Counted() : value(7) { atomicAdd(&constructed, 1); }
    __device__ ~Counted() { atomicAdd(&destroyed, 1); }
};

__device__ int bytes_for(int i) { return 16 + (i % 5) * 24; }

__global__ void allocate(int *misaligned)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned char *p = (unsigned char *)malloc(bytes_for(i));
    kept[i] = p;
    if (p == nullptr || ((size_t)p & 15) != 0) {
        atomicAdd(misaligned, 1);
        return;
    }
    for (int k = 0; k < bytes_for(i); ++k) p[k] = (unsigned char)(i * 7 + k);
}

__global__ void check_and_free(int *wrong)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned char *p = kept[i];
    if (p == nullptr) return;
    for (int k = 0; k < bytes_for(i); ++k)
        if (p[k] != (unsigned char)(i * 7 + k)) {
            atomicAdd(wrong, 1);
            break;
        }
    free(p);
}

__global__ void objects(int *sums)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int count = 1 + i % 4;
    Counted *arr = new Counted[count];
    int sum = 0;
    for (int k = 0; k < count; ++k) sum += arr[k].value;
    delete[] arr;
    Counted *one = new Counted;
    sum += one->value * 100;
    delete one;
    sums[i] = sum;
}

// how many 256 KiB blocks fit before malloc returns NULL, then whether one
// fits again after all were freed
__global__ void exhaust(int *fitted, int *again)
{
    void *held[64];
    int k = 0;
    while (k < 64) {
        void *p = malloc(256 << 10);
        if (p == nullptr) break;
        held[k++] = p;
    }
    *fitted = k;
    for (int j = 0; j < k; ++j) free(held[j]);
    void *p = malloc(256 << 10);
    *again = p != nullptr;
    free(p);
}

int main()
{
    const size_t heap = 4 << 20;
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap));
    size_t got = 0;
    CHECK(cudaDeviceGetLimit(&got, cudaLimitMallocHeapSize));
    REQUIRE(got == heap, "heap limit reads %zu after setting %zu", got, heap);
    int *d_counts, *d_sums;
    CHECK(cudaMalloc(&d_counts, 4 * sizeof(int)));
    CHECK(cudaMemset(d_counts, 0, 4 * sizeof(int)));
    CHECK(cudaMalloc(&d_sums, N * sizeof(int)));

    allocate<<<BLOCKS, THREADS>>>(d_counts);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    check_and_free<<<BLOCKS, THREADS>>>(d_counts + 1);
    CHECK(cudaGetLastError());
    objects<<<BLOCKS, THREADS>>>(d_sums);
    CHECK(cudaGetLastError());
    exhaust<<<1, 1>>>(d_counts + 2, d_counts + 3);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());

    int counts[4], sums[N], made = 0, gone = 0;
    CHECK(cudaMemcpy(counts, d_counts, sizeof(counts), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(sums, d_sums, sizeof(sums), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpyFromSymbol(&made, constructed, sizeof(int)));
    CHECK(cudaMemcpyFromSymbol(&gone, destroyed, sizeof(int)));
    REQUIRE(counts[0] == 0, "%d allocations NULL or not 16-byte aligned", counts[0]);
    REQUIRE(counts[1] == 0, "%d allocations overwritten before the next kernel", counts[1]);
    int want_made = 0;
    for (int i = 0; i < N; ++i) {
        int count = 1 + i % 4;
        want_made += count + 1;
        REQUIRE(sums[i] == count * 7 + 700, "thread %d: objects summed %d, want %d", i, sums[i],
                count * 7 + 700);
    }
    REQUIRE(made == want_made && gone == want_made, "%d constructed, %d destroyed, want %d",
            made, gone, want_made);
    // 4 MiB hold at least 8 blocks of 256 KiB, and never the 64 asked for
    REQUIRE(counts[2] >= 8 && counts[2] < 64, "%d blocks of 256 KiB in a 4 MiB heap", counts[2]);
    REQUIRE(counts[3] == 1, "nothing fitted again after freeing the heap");
    printf("%d blocks of 256 KiB fitted the 4 MiB heap\n", counts[2]);
    printf("PASS\n");
    return 0;
}
