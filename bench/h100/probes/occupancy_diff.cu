// The occupancy API's answers for kernels of different register and shared-memory needs,
// printed one per line: run natively and through cumux and compare (occupancy_diff.sh).
// cumux answers these on the client from attributes; a wrong answer sizes libraries'
// grids wrongly (over: cooperative launches that cannot all be resident; under: idle SMs).
#include <cstdio>
#include <cuda_runtime.h>

__global__ void small(float *x) { x[threadIdx.x] += 1.0f; }

__global__ void __launch_bounds__(256, 1) many_regs(float *x, int n) {
  float acc[48];
#pragma unroll
  for (int i = 0; i < 48; i++) acc[i] = x[(threadIdx.x + i * 7) % n];
  for (int r = 0; r < n; r++) {
#pragma unroll
    for (int i = 0; i < 48; i++) acc[i] = acc[i] * acc[(i + 1) % 48] + 1.0f;
  }
  float s = 0;
#pragma unroll
  for (int i = 0; i < 48; i++) s += acc[i];
  x[threadIdx.x] = s;
}

__global__ void static_smem(float *x) {
  __shared__ float buf[10 * 1024];
  buf[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}

__global__ void dynamic_smem(float *x) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

template <typename K> static void table(const char *name, K kernel, bool dynamic) {
  cudaFuncAttributes a;
  cudaFuncGetAttributes(&a, kernel);
  printf("%s regs %d static %zu maxThreads %d\n", name, a.numRegs, a.sharedSizeBytes,
         a.maxThreadsPerBlock);
  const int blocks[] = {32, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024};
  const size_t smems[] = {0, 1024, 8192, 20000, 40000, 100000, 200000};
  for (size_t smem : smems) {
    if (!dynamic && smem) continue;
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    for (int b : blocks) {
      if (b > a.maxThreadsPerBlock) continue;
      int n = -1;
      cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, b, smem);
      printf("%s block %d smem %zu active %d %s\n", name, b, smem, n,
             e ? cudaGetErrorName(e) : "");
      cudaGetLastError();
    }
  }
  int grid = 0, block = 0;
  cudaError_t e = cudaOccupancyMaxPotentialBlockSize(&grid, &block, kernel, 0, 0);
  printf("%s potential grid %d block %d %s\n", name, grid, block, e ? cudaGetErrorName(e) : "");
  for (int b : {128, 256, 1024}) {
    if (b > a.maxThreadsPerBlock) continue;
    for (int n : {1, 2, 4}) {
      size_t avail = 0;
      e = cudaOccupancyAvailableDynamicSMemPerBlock(&avail, kernel, n, b);
      printf("%s avail blocks %d block %d smem %zu %s\n", name, n, b, avail,
             e ? cudaGetErrorName(e) : "");
    }
  }
}

int main() {
  table("small", small, false);
  table("many_regs", many_regs, false);
  table("static_smem", static_smem, false);
  table("dynamic_smem", dynamic_smem, true);
  printf("PASS\n");
  return 0;
}
