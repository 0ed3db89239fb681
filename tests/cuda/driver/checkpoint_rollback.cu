// checkpoint_rollback: state that `cumux restore` brings back (issue 17).
// Holds MIB of device memory (argv[2], default 12): its first half noise
// (a hash of each word's index), its second half one value, set by a kernel.
// Prints "ready" and waits for the file argv[1].taken (an admin checkpointed
// it); then sets the buffer to zero, prints "changed" and waits for
// argv[1].restored (an admin restored the checkpoint); then checks the buffer
// holds the first state again, adds 1 to every word with a kernel (its
// module works after the restore) and checks that. Waiting, it reads a word
// back every 2 ms, so that an admin's order finds a call to run at. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

#include "check.h"

__host__ __device__ unsigned int state_of(size_t i, size_t n) {
  if (i >= n / 2) return 0x5a5a5a5au;
  unsigned int x = (unsigned int)i * 2654435761u;
  x ^= x >> 15;
  x *= 2246822519u;
  return x ^ (x >> 13);
}

__global__ void fill(unsigned int *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = state_of(i, n);
}

__global__ void add_one(unsigned int *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] += 1;
}

static int wait_for(const std::string &path, unsigned int *x) {
  unsigned int word;
  while (access(path.c_str(), F_OK) != 0) {
    CHECK(cudaMemcpy(&word, x, sizeof word, cudaMemcpyDeviceToHost));
    usleep(2000);
  }
  return 0;
}

// 0 when every word is its state plus `plus`.
static int check(const unsigned int *x, size_t n, unsigned int plus, const char *when) {
  std::vector<unsigned int> host(n);
  CHECK(cudaMemcpy(host.data(), x, n * sizeof(unsigned int), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) {
    if (host[i] != state_of(i, n) + plus) {
      printf("FAIL %s: word %zu is %#x, want %#x\n", when, i, host[i], state_of(i, n) + plus);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { printf("FAIL usage: checkpoint_rollback PREFIX [MIB]\n"); return 1; }
  std::string prefix = argv[1];
  size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 12) << 20;
  size_t n = bytes / sizeof(unsigned int);
  unsigned int *x;
  CHECK(cudaMalloc(&x, bytes));
  fill<<<64, 256>>>(x, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  printf("ready\n");
  fflush(stdout);
  if (wait_for(prefix + ".taken", x)) return 1;
  CHECK(cudaMemset(x, 0, bytes));
  CHECK(cudaDeviceSynchronize());
  printf("changed\n");
  fflush(stdout);
  if (wait_for(prefix + ".restored", x)) return 1;
  if (check(x, n, 0, "after the restore")) return 1;
  add_one<<<64, 256>>>(x, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (check(x, n, 1, "after a kernel")) return 1;
  CHECK(cudaFree(x));
  printf("PASS\n");
  return 0;
}
