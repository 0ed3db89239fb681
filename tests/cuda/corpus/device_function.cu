// device_function: a kernel that calls a __noinline__ __device__ function (a
// real PTX .func call with parameters and a return value) and two recursive
// __device__ functions (factorial and Fibonacci), which need a call stack.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__device__ __noinline__ int mix(int a, int b, int salt)
{
    int x = a * 31 + b;
    x ^= salt << 3;
    return x - (salt % 7);
}

__device__ unsigned long long factorial(unsigned n)
{
    return n <= 1 ? 1ull : n * factorial(n - 1);
}

__device__ int fib(int n)
{
    if (n < 2) return n;
    return fib(n - 1) + fib(n - 2);
}

__global__ void device_function(const int* in, int* mixed, unsigned long long* facts, int* fibs, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    mixed[i] = mix(in[i], i, blockIdx.x + 1);
    facts[i] = factorial(i % 21);
    fibs[i] = fib(i % 16);
}

static int host_mix(int a, int b, int salt)
{
    int x = a * 31 + b;
    x ^= salt << 3;
    return x - (salt % 7);
}

int main()
{
    const int n = 200, block = 64;
    std::vector<int> in(n), mixed(n), fibs(n);
    std::vector<unsigned long long> facts(n);
    for (int i = 0; i < n; ++i) in[i] = i * i - 50;

    int *d_in, *d_mixed, *d_fibs;
    unsigned long long* d_facts;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_mixed, n * sizeof(int)));
    CHECK(cudaMalloc(&d_fibs, n * sizeof(int)));
    CHECK(cudaMalloc(&d_facts, n * sizeof(unsigned long long)));
    CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    // Recursion needs more per-thread stack than the default on some GPUs.
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));

    device_function<<<(n + block - 1) / block, block>>>(d_in, d_mixed, d_facts, d_fibs, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(mixed.data(), d_mixed, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(fibs.data(), d_fibs, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(facts.data(), d_facts, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int i = 0; i < n; ++i) {
        int exp_mix = host_mix(in[i], i, i / block + 1);
        unsigned long long exp_fact = 1;
        for (unsigned k = 2; k <= (unsigned)(i % 21); ++k) exp_fact *= k;
        int a = 0, b = 1;
        for (int k = 0; k < i % 16; ++k) {
            int t = a + b;
            a = b;
            b = t;
        }
        if (mixed[i] != exp_mix || facts[i] != exp_fact || fibs[i] != a) {
            if (errors < 10) {
                printf("device_function: %d: mix %d/%d fact %llu/%llu fib %d/%d\n", i, mixed[i],
                       exp_mix, facts[i], exp_fact, fibs[i], a);
            }
            ++errors;
        }
    }
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_mixed));
    CHECK(cudaFree(d_fibs));
    CHECK(cudaFree(d_facts));
    if (errors) {
        printf("device_function: FAIL (%d of %d wrong)\n", errors, n);
        return 1;
    }
    printf("device_function: PASS (n=%d)\n", n);
    return 0;
}
