// Launches without synchronizing are held near the device, as NVIDIA's driver
// holds them (it blocks a launch while about a thousand wait on the stream):
// once launch i has returned, the event recorded WINDOW launches earlier has
// completed. The kernels are slow enough that a queue with no bound would be
// thousands deep. Prints PASS. Optional argument: the kernel's loop count.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "check.h"

__global__ void spin(float *out, int iters) {
  float x = threadIdx.x;
  for (int i = 0; i < iters; i++) x = x * 0.999f + 1.0f;
  if (x < 0.0f) *out = x;  // never true: keeps the loop
}

int main(int argc, char **argv) {
  const int LAUNCHES = 6144, WINDOW = 4096, EVERY = 256;
  const int iters = argc > 1 ? atoi(argv[1]) : 500;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  float *out;
  CHECK(cudaMalloc(&out, sizeof(float)));
  cudaEvent_t marks[LAUNCHES / EVERY];
  for (cudaEvent_t &e : marks) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  int checked = 0;
  for (int i = 1; i <= LAUNCHES; i++) {
    spin<<<1, 32, 0, s>>>(out, iters);
    CHECK(cudaGetLastError());
    if (i % EVERY != 0) continue;
    CHECK(cudaEventRecord(marks[i / EVERY - 1], s));
    if (i <= WINDOW) continue;
    cudaError_t q = cudaEventQuery(marks[(i - WINDOW) / EVERY - 1]);
    if (q == cudaErrorNotReady) {
      printf("FAIL: launch %d returned while launch %d had not finished\n", i, i - WINDOW);
      return 1;
    }
    CHECK(q);
    checked++;
  }
  CHECK(cudaStreamSynchronize(s));
  printf("checked %d marks\nPASS\n", checked);
  return 0;
}
