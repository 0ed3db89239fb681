// Pinned host memory reached by its pointer from device work, as unified
// addressing allows and XLA's redzone checker does: a memset clears a small
// pinned counter, a kernel counts into it with atomics, a copy reads it back
// and the host reads it directly. Then zero-copy vectors (simpleZeroCopy's
// pattern): the host writes two mapped inputs, a kernel adds them into a
// mapped output, the host reads it with no copy; and a copy from device
// memory into mapped memory by its pointer; and a kernel held on a pinned
// latch the host sets only after queueing, behind it in the same stream, the
// attachment of host-attached managed memory and a kernel on it
// (UnifiedMemoryPerf's pattern: nothing queued may wait for the latch's
// kernel). Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i % 3 == 0 ? 7 : 1;
}

__global__ void add(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

__global__ void spin_until_set(volatile unsigned *latch) {
  while (*latch < 1) {
  }
}

__global__ void double_all(int *data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= 2;
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
  // Zero-copy vectors: mapped inputs and output, no copy either way.
  const int m = 1 << 18;
  float *a, *b, *c;
  CHECK(cudaHostAlloc((void **)&a, m * sizeof(float), cudaHostAllocMapped));
  CHECK(cudaHostAlloc((void **)&b, m * sizeof(float), cudaHostAllocMapped));
  CHECK(cudaHostAlloc((void **)&c, m * sizeof(float), cudaHostAllocMapped));
  for (int i = 0; i < m; i++) {
    a[i] = (float)i;
    b[i] = (float)(2 * i + 1);
    c[i] = -1.0f;
  }
  float *da, *db, *dc;
  CHECK(cudaHostGetDevicePointer((void **)&da, a, 0));
  CHECK(cudaHostGetDevicePointer((void **)&db, b, 0));
  CHECK(cudaHostGetDevicePointer((void **)&dc, c, 0));
  add<<<(m + 255) / 256, 256, 0, s>>>(da, db, dc, m);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < m; i++) {
    if (c[i] != (float)(3 * i + 1)) {
      printf("FAIL zero-copy add at %d: %f\n", i, c[i]);
      return 1;
    }
  }
  // Device memory into mapped memory by its pointer, and back out of it.
  CHECK(cudaMemcpyAsync(c, data, 64 * sizeof(int), cudaMemcpyDeviceToDevice, s));
  CHECK(cudaMemcpyAsync(data + 64, a, 64 * sizeof(int), cudaMemcpyDeviceToDevice, s));
  int back[128];
  CHECK(cudaMemcpyAsync(back, data, sizeof(back), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  const int *as_ints = (const int *)c;
  const int *a_ints = (const int *)a;
  for (int i = 0; i < 64; i++) {
    if (as_ints[i] != (i % 3 == 0 ? 7 : 1) || back[64 + i] != a_ints[i]) {
      printf("FAIL copy at %d: %d into mapped, %d out of it\n", i, as_ints[i], back[64 + i]);
      return 1;
    }
  }
  // A latch in pinned memory holds the stream; managed memory the host wrote
  // is used by a kernel queued behind it; only then the host opens the latch.
  unsigned *latch;
  CHECK(cudaHostAlloc((void **)&latch, sizeof(unsigned), cudaHostAllocMapped));
  *latch = 0;
  const int k = 4096;
  int *managed;
  CHECK(cudaMallocManaged(&managed, k * sizeof(int), cudaMemAttachHost));
  for (int i = 0; i < k; i++) managed[i] = i;
  spin_until_set<<<1, 1, 0, s>>>(latch);
  CHECK(cudaStreamAttachMemAsync(s, managed, 0, cudaMemAttachGlobal));
  double_all<<<(k + 255) / 256, 256, 0, s>>>(managed, k);
  CHECK(cudaGetLastError());
  *(volatile unsigned *)latch = 1;
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < k; i++) {
    if (managed[i] != 2 * i) {
      printf("FAIL managed behind a latch at %d: %d\n", i, managed[i]);
      return 1;
    }
  }
  CHECK(cudaFree(managed));
  CHECK(cudaFreeHost(latch));
  CHECK(cudaFreeHost(a));
  CHECK(cudaFreeHost(b));
  CHECK(cudaFreeHost(c));
  CHECK(cudaFreeHost(counter));
  CHECK(cudaFree(data));
  printf("PASS\n");
  return 0;
}
