// printf_kernel: device printf of ints, floats, strings, a char and a 64-bit
// value. Only thread 0 of each of two blocks prints, so the lines are
// deterministic (their order between blocks is not). Output is checked by the
// test harness; the program itself checks the launch succeeded.
#include <cstdio>
#include <cstdlib>

#include "check.h"

__global__ void printf_kernel(int base, float scale)
{
    if (threadIdx.x == 0) {
        int value = base + 10 * blockIdx.x;
        printf("block %d: int=%d float=%.3f str=%s char=%c big=%llu\n", blockIdx.x, value,
               scale * (float)(blockIdx.x + 1), blockIdx.x == 0 ? "first" : "second",
               'A' + blockIdx.x, 1ull << (40 + blockIdx.x));
    }
}

int main()
{
    printf_kernel<<<2, 64>>>(7, 1.25f);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    printf("printf_kernel: PASS (2 device lines)\n");
    return 0;
}
