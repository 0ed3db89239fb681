// Managed memory: one pointer for host and device, coherent at launches and
// synchronisation, as on devices without concurrent managed access.
// Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void scale(float *v, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= s;
}

int main() {
  const int N = 100000;
  float *v;
  CHECK(cudaMallocManaged(&v, N * sizeof(float)));
  for (int i = 0; i < N; i++) v[i] = (float)i;
  scale<<<(N + 255) / 256, 256>>>(v, N, 2.0f);
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < N; i++)
    if (v[i] != 2.0f * i) { printf("FAIL after first kernel v[%d] = %f\n", i, v[i]); return 1; }

  // Host writes between launches reach the device; two launches in a row
  // see each other's results.
  v[7] = 1000.0f;
  scale<<<(N + 255) / 256, 256>>>(v, N, 0.5f);
  scale<<<(N + 255) / 256, 256>>>(v, N, 3.0f);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamSynchronize(0));
  if (v[7] != 1500.0f || v[10] != 30.0f) { printf("FAIL after two kernels %f %f\n", v[7], v[10]); return 1; }

  // Copies to and from managed memory.
  float *d, back[4];
  CHECK(cudaMalloc(&d, 4 * sizeof(float)));
  CHECK(cudaMemcpy(d, v + 8, 4 * sizeof(float), cudaMemcpyDefault));
  CHECK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
  if (back[0] != 24.0f || back[3] != 33.0f) { printf("FAIL copy out %f %f\n", back[0], back[3]); return 1; }
  CHECK(cudaMemcpy(v, d, 4 * sizeof(float), cudaMemcpyDeviceToDevice));
  if (v[0] != 24.0f) { printf("FAIL copy in %f\n", v[0]); return 1; }

  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, v + 5));
  if (attr.type != cudaMemoryTypeManaged) { printf("FAIL pointer type %d\n", attr.type); return 1; }

  // Hints: a prefetch, advice and attaching to a stream leave the values as
  // they were; outside managed memory they are refused.
  int dev;
  CHECK(cudaGetDevice(&dev));
  cudaMemLocation here = {};
  here.type = cudaMemLocationTypeDevice;
  here.id = dev;
  CHECK(cudaMemPrefetchAsync(v, N * sizeof(float), here, 0, s));
  CHECK(cudaMemAdvise(v, N * sizeof(float), cudaMemAdviseSetReadMostly, here));
  CHECK(cudaStreamAttachMemAsync(s, v, 0, cudaMemAttachGlobal));
  scale<<<(N + 255) / 256, 256, 0, s>>>(v, N, 2.0f);
  CHECK(cudaStreamSynchronize(s));
  if (v[0] != 48.0f || v[10] != 60.0f) { printf("FAIL after hints %f %f\n", v[0], v[10]); return 1; }
  if (cudaMemPrefetchAsync(d, 4 * sizeof(float), here, 0, s) != cudaErrorInvalidValue) {
    printf("FAIL a prefetch of device memory was taken\n");
    return 1;
  }
  if (cudaMemPrefetchAsync(v, (N + 1) * sizeof(float), here, 0, s) != cudaErrorInvalidValue) {
    printf("FAIL a prefetch past the allocation was taken\n");
    return 1;
  }
  cudaGetLastError();

  // A second allocation, freed and reallocated.
  int *w;
  CHECK(cudaMallocManaged(&w, 64 * sizeof(int)));
  w[3] = 9;
  CHECK(cudaFree(w));
  CHECK(cudaMallocManaged(&w, 64 * sizeof(int)));
  w[0] = 1;
  CHECK(cudaFree(w));
  CHECK(cudaFree(d));
  CHECK(cudaFree(v));
  CHECK(cudaStreamDestroy(s));
  printf("PASS\n");
  return 0;
}
