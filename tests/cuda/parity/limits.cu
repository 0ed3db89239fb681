// limits: every cudaLimit a program may set reads back what was set (the
// stack size, the printf FIFO, the malloc heap), and a device printf still
// works after the FIFO was resized.
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

__global__ void hello(int v) { printf("limits kernel %d\n", v); }

static int check_limit(cudaLimit limit, const char* name, size_t value)
{
    CHECK(cudaDeviceSetLimit(limit, value));
    size_t got = 0;
    CHECK(cudaDeviceGetLimit(&got, limit));
    if (got != value) {
        printf("limits: FAIL (%s set to %zu reads back %zu)\n", name, value, got);
        return 1;
    }
    return 0;
}

int main()
{
    int failed = 0;
    failed += check_limit(cudaLimitStackSize, "cudaLimitStackSize", 4096);
    failed += check_limit(cudaLimitPrintfFifoSize, "cudaLimitPrintfFifoSize", 4 << 20);
    failed += check_limit(cudaLimitMallocHeapSize, "cudaLimitMallocHeapSize", 32 << 20);
    failed += check_limit(cudaLimitDevRuntimePendingLaunchCount,
                          "cudaLimitDevRuntimePendingLaunchCount", 4096);
    failed += check_limit(cudaLimitMaxL2FetchGranularity, "cudaLimitMaxL2FetchGranularity", 64);
    hello<<<1, 1>>>(42);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    if (failed) return 1;
    printf("limits: PASS\n");
    return 0;
}
