// Host accesses to managed memory while a kernel may still run, which a
// device without concurrent managed access does not allow: they wait for the
// device, so neither side loses the other's writes. Host and device add to
// one counter at once; the host writes a word no kernel touches before it
// synchronizes; memory attached to the host, or to another stream, stays
// usable. With the argument "crash", a stray pointer still ends the program
// with SIGSEGV after managed memory was closed to the host.
// Prints PASS.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#include "check.h"

__global__ void add(int *counter, int times) {
  for (int i = 0; i < times; i++) atomicAdd_system(counter, 1);
}

__global__ void mark(int *v, int value) { v[0] = value; }

int main(int argc, char **argv) {
  int concurrent = -1;
  CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
  printf("concurrentManagedAccess: %d\n", concurrent);

  // Host and device add to one counter at once (NVIDIA's systemWideAtomics
  // does this with ten operations).
  const int blocks = 8, threads = 128, times = 20;
  const int each = blocks * threads * times;
  int *counter;
  CHECK(cudaMallocManaged(&counter, sizeof(int)));
  *counter = 0;
  add<<<blocks, threads>>>(counter, times);
  for (int i = 0; i < each; i++) __sync_fetch_and_add(counter, 1);
  CHECK(cudaDeviceSynchronize());
  if (*counter != 2 * each) {
    printf("FAIL counter %d, want %d\n", *counter, 2 * each);
    return 1;
  }

  // A host write before the synchronize is not undone by the kernel's.
  int *v;
  CHECK(cudaMallocManaged(&v, 2 * sizeof(int)));
  v[0] = v[1] = 0;
  mark<<<1, 1>>>(v, 7);
  v[1] = 5;
  CHECK(cudaDeviceSynchronize());
  if (v[0] != 7 || v[1] != 5) {
    printf("FAIL after a host write during a kernel: %d %d\n", v[0], v[1]);
    return 1;
  }
  // And the next kernel sees it.
  mark<<<1, 1>>>(v, v[1] + 1);
  CHECK(cudaDeviceSynchronize());
  if (v[0] != 6) {
    printf("FAIL the next kernel: %d\n", v[0]);
    return 1;
  }

  // Attached to the host, or to another stream: the host keeps it.
  int *host_side, *on_s;
  cudaStream_t s, other;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreate(&other));
  CHECK(cudaMallocManaged(&host_side, sizeof(int), cudaMemAttachHost));
  CHECK(cudaMallocManaged(&on_s, sizeof(int)));
  CHECK(cudaStreamAttachMemAsync(s, on_s, 0, cudaMemAttachSingle));
  CHECK(cudaStreamSynchronize(s));
  *host_side = 1;
  *on_s = 2;
  mark<<<1, 1, 0, other>>>(v, 9);
  *host_side += 1;
  *on_s += 1;
  CHECK(cudaDeviceSynchronize());
  if (*host_side != 2 || *on_s != 3 || v[0] != 9) {
    printf("FAIL attached: %d %d %d\n", *host_side, *on_s, v[0]);
    return 1;
  }

  if (argc > 1 && strcmp(argv[1], "crash") == 0) {
    mark<<<1, 1>>>(v, 1);
    fflush(stdout);
    volatile int *stray = (volatile int *)16;
    *stray = 1;
    printf("FAIL a stray pointer did not end the program\n");
    return 1;
  }

  CHECK(cudaFree(counter));
  CHECK(cudaFree(v));
  CHECK(cudaFree(host_side));
  CHECK(cudaFree(on_s));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(other));
  printf("PASS\n");
  return 0;
}
