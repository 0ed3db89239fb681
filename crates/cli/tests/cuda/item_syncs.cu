// item_syncs: a training loop's `loss.item()`, 20 times: a kernel, a 4-byte
// copy to pageable memory in the stream's order, then a synchronize of the
// stream and of an event recorded after the copy, a query of each, a second
// stream waiting on the event, and a device synchronize (a program of two
// threads, as PyTorch is). The copy's answer leaves the stream idle, so none
// of the waits after it needs the server. After the loop, in one thread:
// new work, whose waits do; and an elapsed time between events whose waits were answered
// without the server (the device stamps them at once). Prints PASS.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cuda_runtime.h>

__global__ void bump(int *x) { *x += 1; }

int main() {
  std::atomic<bool> stop{false};
  std::thread idle([&] {
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  cudaStream_t s, other;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  cudaEvent_t done, t0, t1;
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  int *d;
  cudaMalloc(&d, sizeof(int));
  cudaMemset(d, 0, sizeof(int));
  for (int i = 1; i <= 20; i++) {
    bump<<<1, 1, 0, s>>>(d);
    int h = 0;
    cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaEventRecord(done, s);
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaEventSynchronize(done) != cudaSuccess ||
        cudaStreamQuery(s) != cudaSuccess || cudaEventQuery(done) != cudaSuccess ||
        cudaStreamWaitEvent(other, done, 0) != cudaSuccess ||
        cudaStreamSynchronize(other) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      printf("FAIL waits at %d\n", i);
      return 1;
    }
    if (h != i) {
      printf("FAIL read %d at %d\n", h, i);
      return 1;
    }
  }
  // One thread from here, so each wait is one call, not polls.
  stop = true;
  idle.join();
  // Work after the copy: the wait goes to the server again, and sees it.
  bump<<<1, 1, 0, s>>>(d);
  cudaEventRecord(done, s);
  int h = 0;
  if (cudaEventSynchronize(done) != cudaSuccess ||
      cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess || h != 21) {
    printf("FAIL the last bump: %d\n", h);
    return 1;
  }
  // Timed by the device once it has stamped events the client answered for
  // (radixSortThrust's pattern).
  float ms = -1;
  cudaEventRecord(t0, s);
  cudaEventRecord(t1, s);
  if (cudaEventSynchronize(t1) != cudaSuccess || cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess ||
      ms < 0) {
    printf("FAIL elapsed time: %f\n", ms);
    return 1;
  }
  printf("PASS\n");
  return 0;
}
