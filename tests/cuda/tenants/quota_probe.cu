// Probes the memory a tenant sees and may take, through the CUDA runtime:
// prints "total T" (device property and cudaMemGetInfo agree), "free F", then
// allocates 1 MiB blocks until an allocation fails and prints
// "blocks N error E" (E is the CUDA error number; 2 is out of memory).
// With argument "hold" it then prints "holding" and sleeps (argv[2] seconds,
// default 120) with everything still allocated, for clean-up tests.
// Exit: 0, or 3 when a call other than the last cudaMalloc failed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            printf("%s failed: %s (%d)\n", #call, cudaGetErrorString(e_), (int)e_); \
            return 3;                                                                \
        }                                                                            \
    } while (0)

__global__ void fill(unsigned char *p, size_t n, unsigned char v) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

int main(int argc, char **argv) {
    bool hold = argc > 1 && strcmp(argv[1], "hold") == 0;
    int seconds = argc > 2 ? atoi(argv[2]) : 120;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (prop.totalGlobalMem != total_bytes) {
        printf("property total %zu differs from cudaMemGetInfo total %zu\n",
               prop.totalGlobalMem, total_bytes);
        return 3;
    }
    printf("total %zu\nfree %zu\n", total_bytes, free_bytes);
    const size_t block = 1 << 20;
    int blocks = 0;
    cudaError_t err = cudaSuccess;
    // At most 64 blocks: the tests' quotas are smaller than that.
    while (blocks < 64) {
        unsigned char *p = nullptr;
        err = cudaMalloc(&p, block);
        if (err != cudaSuccess) break;
        // Touch the first page of every block, so the memory is really used.
        fill<<<16, 256>>>(p, 4096, (unsigned char)blocks);
        ++blocks;
    }
    (void)cudaGetLastError();  // clear the failed allocation's error
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("blocks %d error %d\nfree after %zu\n", blocks, (int)err, free_bytes);
    fflush(stdout);
    if (hold) {
        printf("holding\n");
        fflush(stdout);
        sleep(seconds);
    }
    return 0;
}
