// Host functions run in stream order: after the work queued before them,
// before the work queued after them. Prints PASS.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

static int order[8];
static int calls = 0;
static int *host_view = nullptr;

struct Note { int id; };

static void CUDART_CB note(void *arg) {
  Note *n = (Note *)arg;
  order[calls++] = n->id;
  // The copy queued before this callback has landed.
  if (n->id == 1 && host_view[0] != 42) order[calls - 1] = -1;
}

static void CUDART_CB old_style(cudaStream_t, cudaError_t status, void *arg) {
  Note *n = (Note *)arg;
  order[calls++] = status == cudaSuccess ? n->id : -2;
}

// Runs on the driver's thread: it waits for the host to say "go" after
// cudaLaunchHostFunc has returned, which only works if the call did not wait
// for the function to run.
static std::atomic<int> go(0);
static std::atomic<int> waited_ok(0);
static void CUDART_CB waiter(void *) {
  auto start = std::chrono::steady_clock::now();
  while (!go.load()) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) return;
  }
  waited_ok = 1;
}

__global__ void set(int *v, int x) { v[threadIdx.x] = x; }

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int *dev;
  CHECK(cudaMalloc(&dev, 32 * sizeof(int)));
  CHECK(cudaMallocHost((void **)&host_view, 32 * sizeof(int)));
  host_view[0] = 0;

  Note one = {1}, two = {2}, three = {3};
  set<<<1, 32, 0, s>>>(dev, 42);
  CHECK(cudaMemcpyAsync(host_view, dev, 32 * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, note, &one));
  set<<<1, 32, 0, s>>>(dev, 7);
  CHECK(cudaStreamAddCallback(s, old_style, &two, 0));
  CHECK(cudaLaunchHostFunc(s, note, &three));
  CHECK(cudaStreamSynchronize(s));

  if (calls != 3 || order[0] != 1 || order[1] != 2 || order[2] != 3) {
    printf("FAIL order: calls=%d %d %d %d\n", calls, order[0], order[1], order[2]);
    return 1;
  }
  int back[32];
  CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 32; i++) if (back[i] != 7) { printf("FAIL value %d\n", back[i]); return 1; }
  // Asynchronous: the call returns before the function runs.
  cudaStream_t s2;
  CHECK(cudaStreamCreate(&s2));
  set<<<1, 32, 0, s2>>>(dev, 1);
  CHECK(cudaLaunchHostFunc(s2, waiter, nullptr));
  go = 1;
  CHECK(cudaStreamSynchronize(s2));
  if (!waited_ok) { printf("FAIL host function ran inside cudaLaunchHostFunc\n"); return 1; }
  CHECK(cudaStreamDestroy(s2));

  CHECK(cudaFreeHost(host_view));
  CHECK(cudaFree(dev));
  CHECK(cudaStreamDestroy(s));
  printf("PASS\n");
  return 0;
}
