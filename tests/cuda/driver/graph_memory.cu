// Graphs that allocate and free memory, and call the host: allocation, free
// and host nodes added explicitly and by the generic cudaGraphAddNode; memory
// a graph allocated and the program freed, the graph launched again; a
// capture of cudaMallocAsync / kernel / copy / cudaFreeAsync. Each graph is
// launched twice and checked. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *v, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i + k;
}

static const int n = 4096;
static int host[n];
static long long host_sum = 0;
static int host_calls = 0;

static void CUDART_CB sum_host(void *) {
  long long s = 0;
  for (int i = 0; i < n; i++) s += host[i];
  host_sum = s;
  host_calls++;
}

// Every element of `host` is i + k, and the host node saw the same.
static int check(int k, const char *what) {
  for (int i = 0; i < n; i++) {
    if (host[i] != i + k) {
      printf("FAIL %s: host[%d] = %d, want %d\n", what, i, host[i], i + k);
      return 1;
    }
  }
  printf("%s: ok\n", what);
  return 0;
}

static cudaMemAllocNodeParams alloc_params(int device) {
  cudaMemAllocNodeParams p = {};
  p.poolProps.allocType = cudaMemAllocationTypePinned;
  p.poolProps.location.type = cudaMemLocationTypeDevice;
  p.poolProps.location.id = device;
  p.bytesize = n * sizeof(int);
  return p;
}

int main() {
  int device = 0;
  CHECK(cudaGetDevice(&device));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int count = n;

  // 1. alloc -> fill -> copy out -> host node -> free, explicit nodes.
  {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = alloc_params(device);
    cudaGraphNode_t alloc, kern, copy, hostn, freen;
    CHECK(cudaGraphAddMemAllocNode(&alloc, g, nullptr, 0, &ap));
    int *d = (int *)ap.dptr;
    int k = 5;
    void *args[] = {&d, &count, &k};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)fill;
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&kern, g, &alloc, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &kern, 1, host, d, sizeof(host), cudaMemcpyDeviceToHost));
    cudaHostNodeParams hp = {};
    hp.fn = sum_host;
    CHECK(cudaGraphAddHostNode(&hostn, g, &copy, 1, &hp));
    CHECK(cudaGraphAddMemFreeNode(&freen, g, &copy, 1, d));
    cudaMemAllocNodeParams back = {};
    CHECK(cudaGraphMemAllocNodeGetParams(alloc, &back));
    void *freed = nullptr;
    CHECK(cudaGraphMemFreeNodeGetParams(freen, &freed));
    if (back.dptr != ap.dptr || back.bytesize != ap.bytesize || freed != ap.dptr) {
      printf("FAIL node parameters read back differ\n");
      return 1;
    }
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < n; i++) host[i] = -1;
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (check(5, "alloc, fill, copy, host, free")) return 1;
    }
    long long want = (long long)n * (n - 1) / 2 + 5LL * n;
    if (host_calls != 2 || host_sum != want) {
      printf("FAIL host node: %d calls, sum %lld (want 2, %lld)\n", host_calls, host_sum, want);
      return 1;
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }

  // 2. Generic nodes; no free node: the program frees, then launches again.
  {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNodeParams an = {};
    an.type = cudaGraphNodeTypeMemAlloc;
    cudaMemAllocNodeParams ap = alloc_params(device);
    an.alloc.poolProps = ap.poolProps;
    an.alloc.bytesize = ap.bytesize;
    cudaGraphNode_t alloc, kern, copy;
    CHECK(cudaGraphAddNode(&alloc, g, nullptr, nullptr, 0, &an));
    int *d = (int *)an.alloc.dptr;
    int k = 9;
    void *args[] = {&d, &count, &k};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)fill;
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&kern, g, &alloc, 1, &kp));
    CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &kern, 1, host, d, sizeof(host), cudaMemcpyDeviceToHost));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < n; i++) host[i] = -1;
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (check(9, "generic alloc node, freed by the program")) return 1;
      CHECK(cudaFree(d));
    }
    size_t used = 0;
    CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used));
    CHECK(cudaDeviceGraphMemTrim(device));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }

  // 3. Captured: cudaMallocAsync, kernel, copy out, cudaFreeAsync.
  {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int *d = nullptr;
    CHECK(cudaMallocAsync(&d, n * sizeof(int), s));
    fill<<<(n + 255) / 256, 256, 0, s>>>(d, n, 13);
    CHECK(cudaMemcpyAsync(host, d, sizeof(host), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(d, s));
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < n; i++) host[i] = -1;
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (check(13, "captured malloc, fill, copy, free")) return 1;
    }
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }
  printf("PASS\n");
  return 0;
}
