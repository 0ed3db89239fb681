// saxpy: y = a*x + y with a grid-stride loop over a grid smaller than the data,
// so each thread handles several elements. Compared against host fmaf with a
// small tolerance (the device may or may not contract to an FMA).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        y[i] = a * x[i] + y[i];
    }
}

int main()
{
    const int n = 1 << 20;
    const float a = 2.5f;
    std::vector<float> x(n), y(n), out(n);
    unsigned state = 12345u;
    for (int i = 0; i < n; ++i) {
        state = state * 1664525u + 1013904223u;
        x[i] = (float)(state >> 8) / (float)(1u << 24) - 0.5f;
        y[i] = (float)(i % 1000) * 0.001f;
    }

    float *d_x, *d_y;
    CHECK(cudaMalloc(&d_x, n * sizeof(float)));
    CHECK(cudaMalloc(&d_y, n * sizeof(float)));
    CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_y, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    saxpy<<<64, 256>>>(n, a, d_x, d_y);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out.data(), d_y, n * sizeof(float), cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int i = 0; i < n; ++i) {
        float expected = fmaf(a, x[i], y[i]);
        if (fabsf(out[i] - expected) > 1e-6f * fmaxf(1.0f, fabsf(expected))) {
            if (errors < 10) {
                printf("saxpy: mismatch at %d: got %.9g expected %.9g\n", i, out[i], expected);
            }
            ++errors;
        }
    }
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_y));
    if (errors) {
        printf("saxpy: FAIL (%d of %d wrong)\n", errors, n);
        return 1;
    }
    printf("saxpy: PASS (n=%d)\n", n);
    return 0;
}
