// Pinned host memory: cudaHostAlloc, cudaMallocHost, cudaHostRegister,
// pointer attributes and async copies through a stream. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "check.h"

__global__ void twice(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= 2;
}

int main() {
  const int N = 1 << 16;
  const size_t bytes = N * sizeof(int);
  int *pinned = nullptr, *pinned2 = nullptr;
  CHECK(cudaHostAlloc((void **)&pinned, bytes, cudaHostAllocDefault));
  CHECK(cudaMallocHost((void **)&pinned2, bytes));
  int *plain = (int *)malloc(bytes);
  CHECK(cudaHostRegister(plain, bytes, cudaHostRegisterDefault));
  for (int i = 0; i < N; i++) { pinned[i] = i; plain[i] = -i; }

  int *dev;
  CHECK(cudaMalloc(&dev, bytes));

  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, pinned));
  if (attr.type != cudaMemoryTypeHost) { printf("FAIL pinned type %d\n", attr.type); return 1; }
  CHECK(cudaPointerGetAttributes(&attr, plain));
  if (attr.type != cudaMemoryTypeHost) { printf("FAIL registered type %d\n", attr.type); return 1; }
  CHECK(cudaPointerGetAttributes(&attr, dev + 5));
  if (attr.type != cudaMemoryTypeDevice || attr.device != 0 || attr.devicePointer != dev + 5) {
    printf("FAIL device attributes type=%d device=%d\n", attr.type, attr.device);
    return 1;
  }
  int stack_value = 0;
  CHECK(cudaPointerGetAttributes(&attr, &stack_value));
  if (attr.type != cudaMemoryTypeUnregistered) { printf("FAIL unregistered type %d\n", attr.type); return 1; }
  unsigned hflags = 99;
  CHECK(cudaHostGetFlags(&hflags, pinned));

  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s));
  twice<<<N / 256, 256, 0, s>>>(dev, N);
  CHECK(cudaMemcpyAsync(pinned2, dev, bytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaMemcpyAsync(dev, plain, bytes, cudaMemcpyHostToDevice, s));
  twice<<<N / 256, 256, 0, s>>>(dev, N);
  CHECK(cudaMemcpyAsync(plain, dev, bytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < N; i++) {
    if (pinned2[i] != 2 * i || plain[i] != -2 * i) {
      printf("FAIL at %d: %d %d\n", i, pinned2[i], plain[i]);
      return 1;
    }
  }

  // cudaMemcpyDefault infers the direction from the pointers.
  CHECK(cudaMemcpy(dev, pinned, bytes, cudaMemcpyDefault));
  CHECK(cudaMemcpy(pinned2, dev, bytes, cudaMemcpyDefault));
  for (int i = 0; i < N; i++) if (pinned2[i] != i) { printf("FAIL default copy at %d\n", i); return 1; }

  // 2-D copy into a pitched allocation and back.
  int *pitched;
  size_t pitch = 0;
  const int W = 100, H = 37;
  CHECK(cudaMallocPitch((void **)&pitched, &pitch, W * sizeof(int), H));
  if (pitch < W * sizeof(int)) { printf("FAIL pitch %zu\n", pitch); return 1; }
  CHECK(cudaMemcpy2DAsync(pitched, pitch, pinned, W * sizeof(int), W * sizeof(int), H,
                          cudaMemcpyHostToDevice, s));
  CHECK(cudaMemset2DAsync(pitched, pitch, 0, 4 * sizeof(int), H, s));
  CHECK(cudaMemcpy2D(pinned2, W * sizeof(int), pitched, pitch, W * sizeof(int), H,
                     cudaMemcpyDeviceToHost));
  for (int r = 0; r < H; r++)
    for (int c = 0; c < W; c++) {
      int want = c < 4 ? 0 : r * W + c;
      if (pinned2[r * W + c] != want) { printf("FAIL 2D at %d,%d: %d\n", r, c, pinned2[r * W + c]); return 1; }
    }

  CHECK(cudaHostUnregister(plain));
  CHECK(cudaPointerGetAttributes(&attr, plain));
  if (attr.type != cudaMemoryTypeUnregistered) { printf("FAIL after unregister %d\n", attr.type); return 1; }
  free(plain);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFreeHost(pinned2));
  CHECK(cudaFree(pitched));
  CHECK(cudaFree(dev));
  CHECK(cudaStreamDestroy(s));
  printf("PASS\n");
  return 0;
}
