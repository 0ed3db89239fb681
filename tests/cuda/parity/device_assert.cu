// device_assert: a device-side assert that fails in one thread. The launch
// itself succeeds; cudaDeviceSynchronize must report cudaErrorAssert (710),
// sticky for the context, and the assertion line is printed as a GPU prints it.
#include <cassert>
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

__global__ void checked(int* data)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    data[i] = i;
    assert(!(blockIdx.x == 1 && threadIdx.x == 5));
}

int main()
{
    int* d_data;
    CHECK(cudaMalloc(&d_data, 64 * sizeof(int)));
    checked<<<2, 32>>>(d_data);
    CHECK(cudaGetLastError()); // the launch itself is valid
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaErrorAssert) {
        printf("device_assert: FAIL (cudaDeviceSynchronize returned %s (%d), expected "
               "cudaErrorAssert (710))\n", cudaGetErrorName(err), (int)err);
        return 1;
    }
    cudaError_t again = cudaMemset(d_data, 0, sizeof(int));
    if (again == cudaSuccess) {
        printf("device_assert: FAIL (context still usable after a failed assert)\n");
        return 1;
    }
    printf("device_assert: PASS (got %s)\n", cudaGetErrorName(err));
    return 0;
}
