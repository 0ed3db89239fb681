// What a launch is rejected for at the call, through the runtime: too many
// threads, a block over the kernel's launch bound, too much dynamic shared
// memory until the kernel opts in. Rejections are not sticky. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void stage(int *out, int n) {
  extern __shared__ int buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i * 3;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}

__global__ void __launch_bounds__(128) bounded(int *out) { out[threadIdx.x] = threadIdx.x; }

int main() {
  const int big = 64 * 1024;  // over the default 48 KiB
  const int n = big / sizeof(int);
  int *d;
  CHECK(cudaMalloc(&d, big));

  cudaFuncAttributes attr;
  CHECK(cudaFuncGetAttributes(&attr, bounded));
  printf("bounded.maxThreadsPerBlock: %d\n", attr.maxThreadsPerBlock);
  if (attr.maxThreadsPerBlock <= 0 || attr.maxThreadsPerBlock > 1024) { printf("FAIL attr\n"); return 1; }
  CHECK(cudaFuncGetAttributes(&attr, stage));

  stage<<<1, 2048, 0>>>(d, 16);
  cudaError_t e = cudaGetLastError();
  printf("2048 threads: %s\n", cudaGetErrorName(e));
  if (e == cudaSuccess) { printf("FAIL 2048 threads accepted\n"); return 1; }

  if (attr.maxThreadsPerBlock >= 256) {
    bounded<<<1, 256>>>(d);
    e = cudaGetLastError();
    printf("over the launch bound: %s\n", cudaGetErrorName(e));
  }

  stage<<<1, 256, big>>>(d, n);
  e = cudaGetLastError();
  printf("64 KiB without opt-in: %s\n", cudaGetErrorName(e));
  if (e == cudaSuccess) { printf("FAIL 64 KiB accepted without opt-in\n"); return 1; }

  int optin = 0;
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  if (optin >= big) {
    CHECK(cudaFuncSetAttribute(stage, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    stage<<<1, 256, big>>>(d, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int h[8];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 8; i++)
      if (h[i] != (n - 1 - i) * 3) { printf("FAIL h[%d] = %d\n", i, h[i]); return 1; }
    if (cudaFuncSetAttribute(stage, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1) == cudaSuccess) {
      printf("FAIL opt-in over the device limit accepted\n");
      return 1;
    }
    cudaGetLastError();
  }

  // Occupancy, as cuDNN and PyTorch ask for it before choosing a launch.
  int active = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&active, bounded, 32, 0));
  if (active <= 0) { printf("FAIL %d active blocks of 32 threads\n", active); return 1; }
  int min_grid = 0, best_block = 0;
  CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &best_block, stage, 0, 0));
  if (min_grid <= 0 || best_block <= 0 || best_block % 32 != 0) {
    printf("FAIL potential block size %d, grid %d\n", best_block, min_grid);
    return 1;
  }
  size_t dyn_one = 0, dyn_two = 0;
  CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&dyn_one, stage, 1, 256));
  CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&dyn_two, stage, 2, 256));
  if (dyn_one == 0 || dyn_two > dyn_one) {
    printf("FAIL dynamic shared memory per block: %zu for one, %zu for two\n", dyn_one, dyn_two);
    return 1;
  }
  printf("occupancy: %d blocks of 32, best block %d, %zu B dynamic shared for one block\n",
         active, best_block, dyn_one);

  // Nothing above is sticky: the device still works.
  bounded<<<1, 32>>>(d);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(d));
  printf("PASS\n");
  return 0;
}
