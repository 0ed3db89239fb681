// vector_add: c[i] = a[i] + b[i] over a length that is not a multiple of the
// block size, so the bounds check in the kernel matters. Exact float compare
// (a single IEEE add gives the same bits on device and host).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__global__ void vector_add(const float* a, const float* b, float* c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}

int main()
{
    const int n = 100003;
    const size_t bytes = n * sizeof(float);
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; ++i) {
        a[i] = (float)i * 0.5f;
        b[i] = 1.0f / (float)(i + 1);
    }

    float *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, bytes));
    CHECK(cudaMalloc(&d_b, bytes));
    CHECK(cudaMalloc(&d_c, bytes));
    CHECK(cudaMemcpy(d_a, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_c, 0, bytes));

    const int block = 256;
    const int grid = (n + block - 1) / block;
    vector_add<<<grid, block>>>(d_a, d_b, d_c, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d_c, bytes, cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int i = 0; i < n; ++i) {
        float expected = a[i] + b[i];
        if (c[i] != expected) {
            if (errors < 10) {
                printf("vector_add: mismatch at %d: got %.9g expected %.9g\n", i, c[i], expected);
            }
            ++errors;
        }
    }
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
    if (errors) {
        printf("vector_add: FAIL (%d of %d wrong)\n", errors, n);
        return 1;
    }
    printf("vector_add: PASS (n=%d)\n", n);
    return 0;
}
