// __constant__ and __device__ globals through cudaMemcpyToSymbol /
// FromSymbol / GetSymbolAddress. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__constant__ float coef[4];
__device__ int total;
__device__ int table[8];

__global__ void poly(const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    y[i] = coef[0] + v * (coef[1] + v * (coef[2] + v * coef[3]));
    atomicAdd(&total, table[i % 8]);
  }
}

int main() {
  const int N = 256;
  float hx[N], hy[N];
  for (int i = 0; i < N; i++) hx[i] = (float)(i % 7) - 3.0f;
  float hc[4] = {1.0f, 2.0f, 0.5f, -0.25f};
  int ht[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int zero = 0;
  CHECK(cudaMemcpyToSymbol(coef, hc, sizeof hc));
  CHECK(cudaMemcpyToSymbol(table, ht, sizeof ht));
  CHECK(cudaMemcpyToSymbol(total, &zero, sizeof zero));

  float *x, *y;
  CHECK(cudaMalloc(&x, sizeof hx));
  CHECK(cudaMalloc(&y, sizeof hy));
  CHECK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  poly<<<1, N>>>(x, y, N);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) {
    float v = hx[i];
    float want = hc[0] + v * (hc[1] + v * (hc[2] + v * hc[3]));
    if (hy[i] != want) { printf("FAIL y[%d] = %f, want %f\n", i, hy[i], want); return 1; }
  }
  int got = -1;
  CHECK(cudaMemcpyFromSymbol(&got, total, sizeof got));
  if (got != (N / 8) * 36) { printf("FAIL total %d\n", got); return 1; }

  // Part of a symbol, at an offset.
  int mid[2] = {0, 0};
  CHECK(cudaMemcpyFromSymbol(mid, table, sizeof mid, 3 * sizeof(int)));
  if (mid[0] != 4 || mid[1] != 5) { printf("FAIL offset read %d %d\n", mid[0], mid[1]); return 1; }

  int *addr = nullptr;
  size_t size = 0;
  CHECK(cudaGetSymbolAddress((void **)&addr, table));
  CHECK(cudaGetSymbolSize(&size, table));
  if (size != sizeof ht) { printf("FAIL symbol size %zu\n", size); return 1; }
  int back[8];
  CHECK(cudaMemcpy(back, addr, sizeof back, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 8; i++) if (back[i] != ht[i]) { printf("FAIL table\n"); return 1; }
  printf("PASS\n");
  return 0;
}
