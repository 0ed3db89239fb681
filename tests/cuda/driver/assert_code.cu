// A failed device assert is cudaErrorAssert (710), as NVIDIA's driver gives
// it (issue 22, item 6: the CPU device gave 719). Three ways to fail, each
// in a process of its own: in a plain arithmetic kernel late in a large
// grid, inside a __noinline__ device function, and in one thread while the
// rest of its block waits at a barrier it never reaches. Each time the
// launch itself succeeds and the synchronize returns 710, and keeps
// returning it. Prints PASS.
#include <cassert>
#include <cstdio>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

__global__ void late(const float *in, float *out, int n, int bad)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) acc = acc * 0.5f + in[(i + k) % n];
    out[i] = acc;
    assert(i != bad);
}

__device__ __noinline__ int checked_div(int a, int b)
{
    assert(b != 0);
    return a / b;
}

__global__ void in_function(const int *in, int *out)
{
    int i = threadIdx.x;
    out[i] = checked_div(100, in[i]);
}

__global__ void before_barrier(int *out)
{
    __shared__ int s[128];
    int i = threadIdx.x;
    assert(!(blockIdx.x == 1 && i == 40));
    s[i] = i;
    __syncthreads();
    out[blockIdx.x * 128 + i] = s[127 - i];
}

static int expect_assert(const char *what)
{
    cudaError_t e = cudaDeviceSynchronize();
    REQUIRE(e == cudaErrorAssert, "%s: synchronize gave %s (%d), want cudaErrorAssert (710)", what,
            cudaGetErrorName(e), (int)e);
    e = cudaDeviceSynchronize();
    REQUIRE(e == cudaErrorAssert, "%s: a second synchronize gave %s (%d), want 710 again", what,
            cudaGetErrorName(e), (int)e);
    printf("%s: cudaErrorAssert\n", what);
    return 0;
}

static int late_in_a_large_grid()
{
    const int n = 64 * 256;
    float *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CHECK(cudaMemset(d_in, 0, n * sizeof(float)));
    late<<<64, 256>>>(d_in, d_out, n, n - 300);
    CHECK(cudaGetLastError());
    return expect_assert("late in a large grid");
}

static int in_a_device_function()
{
    int h[128];
    for (int i = 0; i < 128; ++i) h[i] = i == 77 ? 0 : 1 + i % 9;
    int *d_div, *d_res;
    CHECK(cudaMalloc(&d_div, sizeof(h)));
    CHECK(cudaMalloc(&d_res, sizeof(h)));
    CHECK(cudaMemcpy(d_div, h, sizeof(h), cudaMemcpyHostToDevice));
    in_function<<<1, 128>>>(d_div, d_res);
    CHECK(cudaGetLastError());
    return expect_assert("in a device function");
}

static int before_a_barrier()
{
    int *d_b;
    CHECK(cudaMalloc(&d_b, 2 * 128 * sizeof(int)));
    before_barrier<<<1, 128>>>(d_b); // first a block that passes
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int back[128];
    CHECK(cudaMemcpy(back, d_b, sizeof(back), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 128; ++i) REQUIRE(back[i] == 127 - i, "barrier: %d at %d", back[i], i);
    before_barrier<<<2, 128>>>(d_b);
    CHECK(cudaGetLastError());
    return expect_assert("before a barrier");
}

// Each case in a child process of its own (a failed assert ends its
// context), forked before this process touches CUDA.
int main()
{
    int (*cases[])() = {late_in_a_large_grid, in_a_device_function, before_a_barrier};
    for (auto run : cases) {
        fflush(stdout);
        pid_t child = fork();
        REQUIRE(child >= 0, "fork failed");
        if (child == 0) {
            int failed = run();
            fflush(stdout);
            _exit(failed);
        }
        int status = 0;
        REQUIRE(waitpid(child, &status, 0) == child, "waitpid failed");
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a case failed (status %d)", status);
    }
    printf("PASS\n");
    return 0;
}
