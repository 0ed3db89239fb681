// A program built with `nvcc -rdc=true` from this file and rdc_helper.cu: the
// kernel calls a device function defined in the other translation unit, and
// a template instantiated in both. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

__device__ int helper(int x);
template <typename T> __device__ __noinline__ T twice(T x) { return x + x; }

__global__ void k(int *out) { out[threadIdx.x] = twice(helper(threadIdx.x)); }

int main() {
  int *d;
  if (cudaMalloc(&d, 32 * sizeof(int)) != cudaSuccess) { printf("FAIL malloc\n"); return 1; }
  k<<<1, 32>>>(d);
  int h[32];
  cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) { printf("FAIL %s\n", cudaGetErrorString(e)); return 1; }
  for (int i = 0; i < 32; i++)
    if (h[i] != 2 * (5 * i + 1)) { printf("FAIL h[%d] = %d\n", i, h[i]); return 1; }
  printf("PASS\n");
  return 0;
}
