// out_of_bounds: a kernel stores 1 TiB past its allocation, far enough that a
// real GPU faults too. The launch itself succeeds; cudaDeviceSynchronize must
// report cudaErrorIllegalAddress (700), which is sticky for the context.
#include <cstdio>
#include <cstdlib>

#include "check.h"

__global__ void out_of_bounds(int* data, unsigned long long byte_offset)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        int* far = (int*)((char*)data + byte_offset);
        *far = 42;
    }
    data[threadIdx.x] = threadIdx.x;
}

int main()
{
    int* d_data;
    CHECK(cudaMalloc(&d_data, 256 * sizeof(int)));
    out_of_bounds<<<1, 32>>>(d_data, 1ull << 40);
    CHECK(cudaGetLastError()); // the launch itself is valid
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaErrorIllegalAddress) {
        printf("out_of_bounds: FAIL (cudaDeviceSynchronize returned %s (%d), expected "
               "cudaErrorIllegalAddress (700))\n", cudaGetErrorName(err), (int)err);
        return 1;
    }
    // The error is sticky: later calls in this context keep failing with it.
    cudaError_t again = cudaMemset(d_data, 0, sizeof(int));
    if (again == cudaSuccess) {
        printf("out_of_bounds: FAIL (context still usable after an illegal address)\n");
        return 1;
    }
    printf("out_of_bounds: PASS (got %s)\n", cudaGetErrorName(err));
    return 0;
}
