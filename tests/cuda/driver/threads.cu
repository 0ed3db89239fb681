// Several host threads at once, each with its own stream, allocations,
// kernels, copies and host function. Prints PASS.
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

__global__ void fill(int *v, int n, int x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = x + i;
}

static std::atomic<int> failures(0);
static std::atomic<int> callbacks(0);

static void CUDART_CB count(void *) { callbacks++; }

static void worker(int id) {
  const int N = 2048;
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) { failures++; return; }
  int *d = nullptr;
  std::vector<int> h(N);
  for (int round = 0; round < 20; round++) {
    if (cudaMallocAsync(&d, N * sizeof(int), s) != cudaSuccess) { failures++; return; }
    fill<<<N / 256, 256, 0, s>>>(d, N, id * 1000 + round);
    cudaLaunchHostFunc(s, count, nullptr);
    cudaMemcpyAsync(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost, s);
    cudaFreeAsync(d, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) { failures++; return; }
    for (int i = 0; i < N; i++)
      if (h[i] != id * 1000 + round + i) { failures++; return; }
  }
  cudaStreamDestroy(s);
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) { printf("FAIL no device\n"); return 1; }
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; t++) threads.emplace_back(worker, t);
  for (auto &t : threads) t.join();
  if (failures) { printf("FAIL %d threads failed\n", failures.load()); return 1; }
  if (callbacks != 6 * 20) { printf("FAIL %d host functions ran\n", callbacks.load()); return 1; }
  printf("PASS\n");
  return 0;
}
