// Several streams with priorities, events, elapsed time, stream queries and a
// cross-stream wait. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *out, int n, int value, int spin) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int acc = value;
    for (int k = 0; k < spin; k++) acc = (acc * 3 + k) % 1000003;
    out[i] = value + (acc & 0);
  }
}

__global__ void add_from(int *dst, const int *src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

int main() {
  const int N = 4096;
  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  if (greatest > least) { printf("FAIL priority range %d %d\n", least, greatest); return 1; }
  cudaStream_t s[3];
  CHECK(cudaStreamCreateWithPriority(&s[0], cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreateWithPriority(&s[1], cudaStreamNonBlocking, least));
  CHECK(cudaStreamCreate(&s[2]));
  int prio = 1;
  CHECK(cudaStreamGetPriority(s[0], &prio));
  if (prio != greatest) { printf("FAIL stream priority %d\n", prio); return 1; }
  unsigned flags = 0;
  CHECK(cudaStreamGetFlags(s[0], &flags));
  if (flags != cudaStreamNonBlocking) { printf("FAIL stream flags\n"); return 1; }

  int *a, *b, *c;
  CHECK(cudaMalloc(&a, N * sizeof(int)));
  CHECK(cudaMalloc(&b, N * sizeof(int)));
  CHECK(cudaMalloc(&c, N * sizeof(int)));

  cudaEvent_t start, stop, a_done;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming));

  CHECK(cudaEventRecord(start, s[0]));
  fill<<<N / 256, 256, 0, s[0]>>>(a, N, 7, 200);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(a_done, s[0]));
  CHECK(cudaEventRecord(stop, s[0]));

  fill<<<N / 256, 256, 0, s[1]>>>(b, N, 5, 10);
  // s[1] must not read `a` before s[0] has written it.
  CHECK(cudaStreamWaitEvent(s[1], a_done, 0));
  add_from<<<N / 256, 256, 0, s[1]>>>(b, a, N);
  fill<<<N / 256, 256, 0, s[2]>>>(c, N, 3, 0);

  CHECK(cudaEventSynchronize(stop));
  CHECK(cudaEventQuery(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  printf("elapsed_ms: %f\n", ms);
  if (!(ms > 0)) { printf("FAIL elapsed %f\n", ms); return 1; }
  if (cudaEventElapsedTime(&ms, start, a_done) == cudaSuccess) {
    printf("FAIL elapsed time on a timing-disabled event\n");
    return 1;
  }
  cudaGetLastError();

  for (int i = 0; i < 3; i++) CHECK(cudaStreamSynchronize(s[i]));
  for (int i = 0; i < 3; i++) CHECK(cudaStreamQuery(s[i]));

  int hb[N], hc[N];
  CHECK(cudaMemcpy(hb, b, sizeof hb, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) {
    if (hb[i] != 12 || hc[i] != 3) { printf("FAIL at %d: %d %d\n", i, hb[i], hc[i]); return 1; }
  }

  // A stream that is still busy answers cudaErrorNotReady or, if already
  // done, success; anything else is wrong.
  fill<<<N / 256, 256, 0, s[2]>>>(c, N, 1, 2000);
  cudaError_t q = cudaStreamQuery(s[2]);
  if (q != cudaSuccess && q != cudaErrorNotReady) { printf("FAIL query %d\n", q); return 1; }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaStreamQuery(s[2]));

  for (int i = 0; i < 3; i++) CHECK(cudaStreamDestroy(s[i]));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaEventDestroy(a_done));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));
  printf("PASS\n");
  return 0;
}
