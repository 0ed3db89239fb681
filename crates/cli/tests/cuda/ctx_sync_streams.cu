// ctx_sync_streams: a program of two threads with 16 streams, work on one of
// them, synchronizing its context 10 times: each synchronize polls the
// streams that had work (each poll is a round trip), not every stream.
// Prints PASS.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cuda_runtime.h>

__global__ void bump(int *x) { atomicAdd(x, 1); }

int main() {
  std::atomic<bool> stop{false};
  std::thread idle([&] {
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  cudaStream_t s[16];
  for (auto &x : s) cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
  int *d;
  cudaMalloc(&d, sizeof(int));
  cudaMemset(d, 0, sizeof(int));
  for (int i = 0; i < 10; i++) {
    bump<<<1, 1, 0, s[3]>>>(d);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      printf("FAIL synchronize %d\n", i);
      return 1;
    }
  }
  int h = 0;
  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  stop = true;
  idle.join();
  if (h != 10) {
    printf("FAIL %d bumps, want 10\n", h);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
