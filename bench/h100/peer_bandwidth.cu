// peer_bandwidth: device-to-device copy bandwidth between GPUs 0 and 1
// (cudaMemcpyPeerAsync, peer access on), natively: the D2D figure a move's
// pause is held against (issue 17). Prints GB/s each way for SIZE MiB
// (argv[1], default 4096), best of 5.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
  size_t bytes = (size_t)(argc > 1 ? atoi(argv[1]) : 4096) << 20;
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n < 2) { printf("FAIL needs 2 GPUs\n"); return 1; }
  void *buf[2];
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK(cudaMalloc(&buf[d], bytes));
    CHECK(cudaMemset(buf[d], d, bytes));
  }
  for (int from = 0; from < 2; from++) {
    int to = 1 - from;
    CHECK(cudaSetDevice(from));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
      CHECK(cudaEventRecord(a));
      CHECK(cudaMemcpyPeerAsync(buf[to], to, buf[from], from, bytes));
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (ms < best) best = ms;
    }
    printf("peer copy %d -> %d: %zu MiB in %.3f ms, %.1f GB/s\n", from, to, bytes >> 20, best,
           bytes / (best * 1e-3) / 1e9);
  }
  printf("PASS\n");
  return 0;
}
