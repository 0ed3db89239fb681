// migrate_loop: a long-running program for live migration (issue 17). It
// adds a __constant__ step table to a buffer on a stream of its own, kernel
// after kernel, counts its launches in a __device__ counter, and checks the
// buffer against the closed form every 10 launches ("progress N"), until
// the file named by argv[1] exists (at most 20,000 launches). With argv[2]
// (MiB) it also holds a buffer that large, set once and checked at the end,
// so that its state is larger than a frame. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>

#include "check.h"

__constant__ int step_of[8];
__device__ unsigned int launches_seen;

__global__ void add_step(int *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += step_of[i % 8];
  if (i == 0) atomicAdd(&launches_seen, 1u);
}

int main(int argc, char **argv) {
  if (argc < 2) { printf("FAIL usage: migrate_loop STOP_FILE [EXTRA_MIB]\n"); return 1; }
  size_t extra_bytes = argc > 2 ? (size_t)atoi(argv[2]) << 20 : 0;
  unsigned char *extra = nullptr;
  if (extra_bytes > 0) {
    CHECK(cudaMalloc(&extra, extra_bytes));
    CHECK(cudaMemset(extra, 0x5a, extra_bytes));
  }
  const int N = 2048;
  int steps[8] = {1, 2, 3, 5, 8, 13, 21, 34};
  CHECK(cudaMemcpyToSymbol(step_of, steps, sizeof steps));
  int *x;
  CHECK(cudaMalloc(&x, N * sizeof(int)));
  static int host[N];
  for (int i = 0; i < N; i++) host[i] = i;
  CHECK(cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t done;
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  unsigned int launches = 0;
  for (; launches < 20000;) {
    add_step<<<N / 256, 256, 0, s>>>(x, N);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(done, s));
    launches++;
    if (launches % 10 != 0) continue;
    CHECK(cudaEventSynchronize(done));
    CHECK(cudaMemcpy(host, x, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) {
      int want = i + (int)launches * steps[i % 8];
      if (host[i] != want) {
        printf("FAIL after %u launches x[%d] = %d, want %d\n", launches, i, host[i], want);
        return 1;
      }
    }
    printf("progress %u\n", launches);
    fflush(stdout);
    if (access(argv[1], F_OK) == 0) break;
    usleep(2000);
  }
  unsigned int seen = 0;
  CHECK(cudaMemcpyFromSymbol(&seen, launches_seen, sizeof seen));
  if (seen != launches) { printf("FAIL the device counted %u launches of %u\n", seen, launches); return 1; }
  if (extra_bytes > 0) {
    unsigned char *back = (unsigned char *)malloc(extra_bytes);
    CHECK(cudaMemcpy(back, extra, extra_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < extra_bytes; i++) {
      if (back[i] != 0x5a) { printf("FAIL extra[%zu] = %d\n", i, back[i]); return 1; }
    }
    free(back);
    CHECK(cudaFree(extra));
  }
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(x));
  printf("launches %u\nPASS\n", launches);
  return 0;
}
