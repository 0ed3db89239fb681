// Copies between device memory and pinned host memory (cudaMallocHost,
// cudaHostAlloc): synchronous and async, whole buffers and parts at offsets,
// through two streams, then freed and allocated again; and large pageable
// copies. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "check.h"

__global__ void add(unsigned *v, unsigned k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += k;
}

static int check(const unsigned *got, int n, unsigned base, unsigned k, const char *what) {
  for (int i = 0; i < n; i++)
    if (got[i] != base + (unsigned)i * 3u + k) {
      printf("FAIL %s at %d: %u, want %u\n", what, i, got[i], base + (unsigned)i * 3u + k);
      return 1;
    }
  return 0;
}

int main() {
  const int N = 1 << 18;  // 1 MiB of unsigned
  const size_t bytes = N * sizeof(unsigned);
  unsigned *in = nullptr, *out = nullptr, *dev = nullptr, *dev2 = nullptr;
  CHECK(cudaMallocHost((void **)&in, bytes));
  CHECK(cudaHostAlloc((void **)&out, bytes, cudaHostAllocDefault));
  CHECK(cudaMalloc(&dev, bytes));
  CHECK(cudaMalloc(&dev2, bytes));
  for (int i = 0; i < N; i++) in[i] = 7u + (unsigned)i * 3u;

  // Synchronous, whole buffers.
  CHECK(cudaMemcpy(dev, in, bytes, cudaMemcpyHostToDevice));
  add<<<N / 256, 256>>>(dev, 1, N);
  CHECK(cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost));
  if (check(out, N, 7, 1, "sync")) return 1;

  // Async on two streams, each ordered after its own copy in.
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  memset(out, 0, bytes);
  CHECK(cudaMemcpyAsync(dev, in, bytes, cudaMemcpyHostToDevice, s1));
  CHECK(cudaMemcpyAsync(dev2, in, bytes, cudaMemcpyHostToDevice, s2));
  add<<<N / 256, 256, 0, s1>>>(dev, 2, N);
  add<<<N / 256, 256, 0, s2>>>(dev2, 5, N);
  CHECK(cudaMemcpyAsync(out, dev, bytes / 2, cudaMemcpyDeviceToHost, s1));
  CHECK(cudaMemcpyAsync(out + N / 2, dev2 + N / 2, bytes / 2, cudaMemcpyDeviceToHost, s2));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaStreamSynchronize(s2));
  if (check(out, N / 2, 7, 2, "async first half")) return 1;
  if (check(out + N / 2, N / 2, 7 + (unsigned)(N / 2) * 3u, 5, "async second half")) return 1;

  // Parts at offsets, through cudaMemcpyDefault and the legacy stream.
  memset(out, 0, bytes);
  CHECK(cudaMemcpy(dev + 1000, in + 1000, 4096 * sizeof(unsigned), cudaMemcpyDefault));
  CHECK(cudaMemcpyAsync(out + 1000, dev + 1000, 4096 * sizeof(unsigned), cudaMemcpyDefault, 0));
  CHECK(cudaDeviceSynchronize());
  if (check(out + 1000, 4096, 7 + 1000u * 3u, 0, "offset")) return 1;
  if (out[999] != 0 || out[5096] != 0) { printf("FAIL outside the offset copy\n"); return 1; }

  // Freed and allocated again: the new buffer copies as well.
  CHECK(cudaFreeHost(in));
  CHECK(cudaMallocHost((void **)&in, bytes));
  for (int i = 0; i < N; i++) in[i] = 11u + (unsigned)i * 3u;
  CHECK(cudaMemcpyAsync(dev, in, bytes, cudaMemcpyHostToDevice, s1));
  CHECK(cudaMemcpyAsync(out, dev, bytes, cudaMemcpyDeviceToHost, s1));
  CHECK(cudaStreamSynchronize(s1));
  if (check(out, N, 11, 0, "after free")) return 1;

  // Pageable synchronous copies (staged through the driver's own pinned buffer),
  // of a size that is no multiple of anything.
  const size_t big = (10u << 20) + 12345;
  unsigned char *pageable = (unsigned char *)malloc(big);
  unsigned char *back = (unsigned char *)malloc(big);
  unsigned char *dbig = nullptr;
  CHECK(cudaMalloc(&dbig, big));
  for (size_t i = 0; i < big; i++) pageable[i] = (unsigned char)(i * 31 + 7);
  CHECK(cudaMemcpy(dbig, pageable, big, cudaMemcpyHostToDevice));
  memset(back, 0, big);
  CHECK(cudaMemcpy(back, dbig, big, cudaMemcpyDeviceToHost));
  if (memcmp(back, pageable, big) != 0) { printf("FAIL large pageable round trip\n"); return 1; }
  // Small ones too: 64 KiB + 3 bytes each way.
  const size_t small = (64u << 10) + 3;
  memset(back, 0, small);
  CHECK(cudaMemcpy(dbig, pageable + 5, small, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(back, dbig, small, cudaMemcpyDeviceToHost));
  if (memcmp(back, pageable + 5, small) != 0) { printf("FAIL small pageable round trip\n"); return 1; }
  CHECK(cudaFree(dbig));
  free(pageable);
  free(back);

  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaFree(dev));
  CHECK(cudaFree(dev2));
  CHECK(cudaFreeHost(in));
  CHECK(cudaFreeHost(out));
  printf("PASS\n");
  return 0;
}
