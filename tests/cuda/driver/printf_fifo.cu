// The printf FIFO's size is kept and used (issue 22, item 8: the CPU device
// did not store it). cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE) reads back what
// was set through cuCtxGetLimit and cudaDeviceGetLimit, a context created
// afterwards starts at the default, and a block that prints more than the
// default FIFO's megabyte of text, but less than the FIFO set holds, has every
// line reach stdout (captured here into a file). Linked with -lcuda.
// Prints PASS.
#include <cstdio>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include "check.h"

__global__ void chatter(int lines)
{
    for (int k = 0; k < lines; ++k)
        printf("fifo line %05d of thread %d .................................................\n",
               k, threadIdx.x);
}

int main()
{
    CHECK(cudaFree(0)); // the primary context, current
    CUcontext primary;
    CK(cuCtxGetCurrent(&primary));
    size_t initial = 0, got = 0;
    CK(cuCtxGetLimit(&initial, CU_LIMIT_PRINTF_FIFO_SIZE));
    REQUIRE(initial > 0, "the printf FIFO reads 0 before it was set");
    const size_t fifo = 6 << 20;
    CK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, fifo));
    CK(cuCtxGetLimit(&got, CU_LIMIT_PRINTF_FIFO_SIZE));
    REQUIRE(got == fifo, "cuCtxGetLimit reads %zu after setting %zu", got, fifo);
    CHECK(cudaDeviceGetLimit(&got, cudaLimitPrintfFifoSize));
    REQUIRE(got == fifo, "cudaDeviceGetLimit reads %zu after setting %zu", got, fifo);

    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    CUcontext other;
    CK(cuCtxCreate(&other, NULL, 0, dev));
    CK(cuCtxGetLimit(&got, CU_LIMIT_PRINTF_FIFO_SIZE));
    REQUIRE(got == initial, "a new context's printf FIFO reads %zu, want the default %zu", got,
            initial);
    CK(cuCtxDestroy(other));
    CK(cuCtxSetCurrent(primary));
    CK(cuCtxGetLimit(&got, CU_LIMIT_PRINTF_FIFO_SIZE));
    REQUIRE(got == fifo, "the primary context's FIFO reads %zu after another context", got);

    // 2 threads x 12,000 lines of ~90 bytes: about 2 MiB of text in one block
    const int lines = 12000, threads = 2;
    fflush(stdout);
    FILE *capture = tmpfile();
    REQUIRE(capture != NULL, "no temporary file");
    int saved = dup(1);
    dup2(fileno(capture), 1);
    chatter<<<1, threads>>>(lines);
    cudaError_t launched = cudaGetLastError();
    cudaError_t synced = cudaDeviceSynchronize();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    CHECK(launched);
    CHECK(synced);
    rewind(capture);
    char line[256];
    int seen = 0, per_thread[threads] = {0};
    while (fgets(line, sizeof(line), capture)) {
        int k, t;
        if (sscanf(line, "fifo line %d of thread %d", &k, &t) == 2 && t >= 0 && t < threads) {
            seen++;
            per_thread[t]++;
        }
    }
    fclose(capture);
    REQUIRE(seen == lines * threads, "%d of %d lines reached stdout (thread 0: %d, thread 1: %d)",
            seen, lines * threads, per_thread[0], per_thread[1]);
    printf("%d lines through a %zu-byte FIFO\n", seen, fifo);
    printf("PASS\n");
    return 0;
}
