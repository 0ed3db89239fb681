// Limits that must reach the device: a recursive kernel whose stack is deeper
// than the driver's default runs once cudaDeviceSetLimit(cudaLimitStackSize)
// gave it room, and the printf buffer set larger holds more than the default's
// 1 MiB of lines. Natively and through cumux the same; before cumux applied
// limits on the device the recursion overflowed its stack. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__device__ int deep(int n, volatile int *sink) {
  int local[48];
  for (int i = 0; i < 48; i++) local[i] = n * 3 + i;
  sink[threadIdx.x] = local[n % 48];
  if (n == 0) return local[47];
  return deep(n - 1, sink) + local[(n * 7) % 48] - local[(n * 7) % 48 + 0] + 1;
}

__global__ void recurse(int depth, int *out, volatile int *sink) {
  out[threadIdx.x] = deep(depth, sink);
}

__global__ void chatter(int lines) {
  for (int i = 0; i < lines; i++) printf("line %06d of thread %03d ........................................\n", i, threadIdx.x);
}

int main() {
  const int depth = 40, threads = 32;
  size_t stack = 0;
  CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 16 << 10));
  CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
  if (stack < (16 << 10)) {
    printf("FAIL stack limit reads %zu after setting 16 KiB\n", stack);
    return 1;
  }
  int *out, *sink;
  CHECK(cudaMalloc(&out, threads * sizeof(int)));
  CHECK(cudaMalloc(&sink, threads * sizeof(int)));
  recurse<<<1, threads>>>(depth, out, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  int got[threads];
  CHECK(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost));
  for (int t = 0; t < threads; t++) {
    if (got[t] != 47 + depth) {
      printf("FAIL thread %d: %d, want %d\n", t, got[t], 47 + depth);
      return 1;
    }
  }
  printf("recursion %d deep: ok\n", depth);

  // 2 threads x 12,000 lines of ~80 bytes: ~2 MiB, past the default buffer.
  CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 8 << 20));
  chatter<<<1, 2>>>(12000);
  CHECK(cudaDeviceSynchronize());
  fflush(stdout);
  printf("PASS\n");
  return 0;
}
