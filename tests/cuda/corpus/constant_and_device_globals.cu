// constant_and_device_globals: a __constant__ coefficient table written with
// cudaMemcpyToSymbol, a __device__ counter bumped by atomics and read back with
// cudaMemcpyFromSymbol, and a __device__ array initialised in the module.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define DEGREE 8

__constant__ int coefficients[DEGREE];
__device__ unsigned int negative_count;
__device__ int offsets[4] = {100, -200, 300, -400};

// out[i] = offsets[i % 4] + sum_k coefficients[k] * x^k (Horner, exact in int).
__global__ void polynomial(const int* x, int* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int value = 0;
    for (int k = DEGREE - 1; k >= 0; --k) {
        value = value * x[i] + coefficients[k];
    }
    value += offsets[i % 4];
    out[i] = value;
    if (value < 0) {
        atomicAdd(&negative_count, 1u);
    }
}

int main()
{
    const int n = 1000;
    const int host_coefficients[DEGREE] = {3, -1, 2, 0, -1, 0, 0, 1};
    const int host_offsets[4] = {100, -200, 300, -400};
    std::vector<int> x(n), out(n);
    for (int i = 0; i < n; ++i) x[i] = i % 9 - 4;

    CHECK(cudaMemcpyToSymbol(coefficients, host_coefficients, sizeof(host_coefficients)));
    unsigned int zero = 0;
    CHECK(cudaMemcpyToSymbol(negative_count, &zero, sizeof(zero)));

    int *d_x, *d_out;
    CHECK(cudaMalloc(&d_x, n * sizeof(int)));
    CHECK(cudaMalloc(&d_out, n * sizeof(int)));
    CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    polynomial<<<(n + 127) / 128, 128>>>(d_x, d_out, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));
    unsigned int negatives = 0;
    CHECK(cudaMemcpyFromSymbol(&negatives, negative_count, sizeof(negatives)));

    int errors = 0;
    unsigned expected_negatives = 0;
    for (int i = 0; i < n; ++i) {
        int value = 0;
        for (int k = DEGREE - 1; k >= 0; --k) value = value * x[i] + host_coefficients[k];
        value += host_offsets[i % 4];
        if (value < 0) ++expected_negatives;
        if (out[i] != value) {
            if (errors < 10) printf("constant_and_device_globals: %d: got %d expected %d\n", i, out[i], value);
            ++errors;
        }
    }
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_out));
    if (errors || negatives != expected_negatives) {
        printf("constant_and_device_globals: FAIL (%d wrong, counter %u expected %u)\n", errors,
               negatives, expected_negatives);
        return 1;
    }
    printf("constant_and_device_globals: PASS (n=%d negatives=%u)\n", n, negatives);
    return 0;
}
