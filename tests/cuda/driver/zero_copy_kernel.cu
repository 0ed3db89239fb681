// Pinned host memory reached by its pointer from device work, as unified
// addressing allows and XLA's redzone checker does: a memset clears a small
// pinned counter, a kernel counts into it with atomics, a copy reads it back
// and the host reads it directly. Prints PASS. GPU only: cumux's CPU device
// does not reach host memory by pointer.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i % 3 == 0 ? 7 : 1;
}

__global__ void count_sevens(const int *data, int n, unsigned *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && data[i] == 7) atomicAdd(out, 1u);
}

int main() {
  const int n = 1 << 20;
  const unsigned expected = (n + 2) / 3;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int *data;
  CHECK(cudaMalloc(&data, n * sizeof(int)));
  unsigned *counter;
  CHECK(cudaHostAlloc((void **)&counter, 8, cudaHostAllocMapped));
  unsigned *device_view;
  CHECK(cudaHostGetDevicePointer((void **)&device_view, counter, 0));
  if (device_view != counter) {
    printf("FAIL: the device names pinned memory %p, not %p\n", (void *)device_view, (void *)counter);
    return 1;
  }
  for (int round = 0; round < 3; round++) {
    CHECK(cudaMemsetAsync(counter, 0, 8, s));
    fill<<<(n + 255) / 256, 256, 0, s>>>(data, n);
    count_sevens<<<(n + 255) / 256, 256, 0, s>>>(data, n, counter);
    unsigned copied = 0;
    CHECK(cudaMemcpyAsync(&copied, counter, sizeof(copied), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    if (copied != expected || *counter != expected) {
      printf("FAIL round %d: copied %u, read %u, expected %u\n", round, copied, *counter, expected);
      return 1;
    }
  }
  CHECK(cudaFreeHost(counter));
  CHECK(cudaFree(data));
  printf("PASS\n");
  return 0;
}
