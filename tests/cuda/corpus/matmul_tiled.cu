// matmul_tiled: C = A*B with 16x16 shared-memory tiles and __syncthreads, on
// dimensions that are not multiples of the tile so edge tiles are padded with
// zeros. Compared with a double-precision host product within a tolerance.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define TILE 16

// A is M x K, B is K x N, C is M x N, all row-major.
__global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];

    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;

    for (int t = 0; t < K; t += TILE) {
        int a_col = t + threadIdx.x;
        int b_row = t + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && a_col < K) ? A[row * K + a_col] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (b_row < K && col < N) ? B[b_row * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}

int main()
{
    const int M = 130, N = 120, K = 100;
    std::vector<float> a(M * K), b(K * N), c(M * N);
    for (int i = 0; i < M * K; ++i) a[i] = (float)((i * 7) % 17) * 0.125f - 1.0f;
    for (int i = 0; i < K * N; ++i) b[i] = (float)((i * 5) % 13) * 0.25f - 1.5f;

    float *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_b, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_c, c.size() * sizeof(float)));
    CHECK(cudaMemcpy(d_a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));

    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tiled<<<grid, block>>>(d_a, d_b, d_c, M, N, K);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d_c, c.size() * sizeof(float), cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double expected = 0.0;
            for (int k = 0; k < K; ++k) expected += (double)a[i * K + k] * (double)b[k * N + j];
            double got = c[i * N + j];
            if (fabs(got - expected) > 1e-4 * fmax(1.0, fabs(expected))) {
                if (errors < 10) {
                    printf("matmul_tiled: mismatch at (%d,%d): got %.7g expected %.7g\n", i, j, got, expected);
                }
                ++errors;
            }
        }
    }
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
    if (errors) {
        printf("matmul_tiled: FAIL (%d of %d wrong)\n", errors, M * N);
        return 1;
    }
    printf("matmul_tiled: PASS (M=%d N=%d K=%d)\n", M, N, K);
    return 0;
}
