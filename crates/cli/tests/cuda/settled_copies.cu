// settled_copies: copies in whose waits the client answers itself (a program
// of two threads, as PyTorch is, whose `.to("cuda")` copies a tensor in and
// synchronizes). Each round fills pageable memory with the round's value,
// copies it in (3 MiB, several chunks on a socket), waits, scribbles over the
// host buffer at once, and has a kernel on another non-blocking stream count
// the bytes that are not the round's value: the copy must be done before any
// later call runs, whichever stream it is on.
//   20 rounds: cudaMemcpyAsync on a non-blocking stream, cudaStreamSynchronize
//   20 rounds: cudaMemcpy (synchronous, the legacy default stream)
//    5 rounds: cudaMemcpyAsync, cudaDeviceSynchronize (the checking kernel
//              waited for after each, so that the next waits for copies alone)
//   10 rounds: cudaMemset and cudaMemcpy device to device, unanswered (as
//              natively, they return at once), checked in the legacy stream
// Then a copy into freed memory, which must fail at the copy or its wait (not
// later), and work after it. Prints PASS.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

__global__ void count_wrong(const unsigned char *d, size_t n, unsigned char want,
                            unsigned long long *wrong) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    mine += d[i] != want;
  if (mine) atomicAdd(wrong, mine);
}

int main() {
  std::atomic<bool> stop{false};
  std::thread idle([&] {
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const size_t n = 3 << 20;
  std::vector<unsigned char> h(n);
  unsigned char *d = nullptr;
  unsigned long long *wrong = nullptr;
  cudaStream_t s, other;
  if (cudaMalloc(&d, n) != cudaSuccess || cudaMalloc(&wrong, sizeof *wrong) != cudaSuccess ||
      cudaMemset(wrong, 0, sizeof *wrong) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) != cudaSuccess) {
    printf("settled_copies: FAIL: setup\n");
    return 1;
  }
  int round = 0;
  auto check = [&](const char *how, cudaError_t copied, cudaError_t waited) {
    if (copied != cudaSuccess || waited != cudaSuccess) {
      printf("settled_copies: FAIL: %s round %d: %s / %s\n", how, round,
             cudaGetErrorName(copied), cudaGetErrorName(waited));
      return false;
    }
    memset(h.data(), 0xEE, n);
    count_wrong<<<8, 256, 0, other>>>(d, n, (unsigned char)round, wrong);
    return true;
  };
  for (int i = 0; i < 20; i++, round++) {
    memset(h.data(), round, n);
    cudaError_t copied = cudaMemcpyAsync(d, h.data(), n, cudaMemcpyHostToDevice, s);
    if (!check("stream", copied, cudaStreamSynchronize(s))) return 1;
  }
  for (int i = 0; i < 20; i++, round++) {
    memset(h.data(), round, n);
    if (!check("synchronous", cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice), cudaSuccess))
      return 1;
  }
  if (cudaStreamSynchronize(other) != cudaSuccess) return 1;
  for (int i = 0; i < 5; i++, round++) {
    memset(h.data(), round, n);
    cudaError_t copied = cudaMemcpyAsync(d, h.data(), n, cudaMemcpyHostToDevice, s);
    if (!check("device", copied, cudaDeviceSynchronize())) return 1;
    // The next round's device synchronize then waits for its copy alone.
    if (cudaStreamSynchronize(other) != cudaSuccess) return 1;
  }
  // Synchronous memsets and copies within the device return at once, as
  // natively (no host-side wait): a kernel in the legacy stream's order
  // checks them.
  unsigned char *d2 = nullptr;
  if (cudaMalloc(&d2, n) != cudaSuccess) return 1;
  for (int i = 0; i < 10; i++, round++) {
    cudaError_t set = cudaMemset(d, round, n);
    cudaError_t copied = cudaMemcpy(d2, d, n, cudaMemcpyDeviceToDevice);
    if (set != cudaSuccess || copied != cudaSuccess) {
      printf("settled_copies: FAIL: memset round %d: %s / %s\n", round, cudaGetErrorName(set),
             cudaGetErrorName(copied));
      return 1;
    }
    count_wrong<<<8, 256>>>(d2, n, (unsigned char)round, wrong);
  }
  unsigned long long host_wrong = ~0ull;
  cudaError_t e = cudaMemcpy(&host_wrong, wrong, sizeof host_wrong, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess || host_wrong != 0) {
    printf("settled_copies: FAIL: %llu bytes were not the round's value (%s)\n", host_wrong,
           cudaGetErrorName(e));
    return 1;
  }
  // A copy into freed memory: an error at the copy or at its wait.
  unsigned char *gone = nullptr;
  cudaMalloc(&gone, 4096);
  cudaFree(gone);
  cudaError_t copied = cudaMemcpyAsync(gone, h.data(), 4096, cudaMemcpyHostToDevice, s);
  cudaError_t waited = cudaStreamSynchronize(s);
  if (copied == cudaSuccess && waited == cudaSuccess) {
    printf("settled_copies: FAIL: a copy into freed memory and its wait both succeeded\n");
    return 1;
  }
  cudaGetLastError();
  memset(h.data(), 7, n);
  e = cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice);
  unsigned char back = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&back, d + n - 1, 1, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess || back != 7) {
    printf("settled_copies: FAIL: after the failed copy: %s, read %d\n", cudaGetErrorName(e),
           back);
    return 1;
  }
  stop = true;
  idle.join();
  printf("settled_copies: PASS\n");
  return 0;
}
