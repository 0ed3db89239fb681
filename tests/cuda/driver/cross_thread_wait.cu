// One thread waits for a stream whose kernel spins until a flag is set; the
// flag is copied in by another thread on another stream while the first
// waits. The wait must not hold up the other thread's calls. Prints PASS.
#include <chrono>
#include <cstdio>
#include <thread>
#include <cuda_runtime.h>

#include "check.h"

// Bounded so a failure ends: at least ~20 s on a GPU, about a second on the
// CPU reference device.
__global__ void spin(volatile int *flag, int *seen, long long limit) {
  for (long long i = 0; i < limit && *flag == 0; i++) __nanosleep(1000);
  *seen = *flag;
}

int main() {
  int *flag, *seen;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&seen, sizeof(int)));
  CHECK(cudaMemset(flag, 0, sizeof(int)));
  CHECK(cudaMemset(seen, 0, sizeof(int)));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t waiting, setting;
  CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&setting, cudaStreamNonBlocking));

  cudaError_t setter_result = cudaSuccess;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    static int one = 1;
    setter_result = cudaMemcpyAsync(flag, &one, sizeof one, cudaMemcpyHostToDevice, setting);
    if (setter_result == cudaSuccess) setter_result = cudaStreamSynchronize(setting);
  });
  spin<<<1, 1, 0, waiting>>>(flag, seen, 20000000LL);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(waiting));
  setter.join();
  CHECK(setter_result);
  int h = 0;
  CHECK(cudaMemcpy(&h, seen, sizeof h, cudaMemcpyDeviceToHost));
  if (h != 1) { printf("FAIL the kernel never saw the flag\n"); return 1; }
  printf("PASS\n");
  return 0;
}
