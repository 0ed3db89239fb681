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

__global__ void add(const int *in, int *out, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + k;
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
  // 4. Captured over two streams (NVIDIA's graphMemoryNodes sample): an
  // input copied in, a kernel, its result copied out on a second stream while
  // the input is freed and another buffer allocated, a second kernel, its
  // result copied out; the streams, events and the graph destroyed before launches.
  {
    static int in[n], mid[n];
    cudaStream_t s2;
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t first, second;
    CHECK(cudaEventCreate(&first));
    CHECK(cudaEventCreate(&second));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int *d_in = nullptr, *d_mid = nullptr, *d_out = nullptr;
    CHECK(cudaMallocAsync(&d_in, n * sizeof(int), s));
    CHECK(cudaMallocAsync(&d_mid, n * sizeof(int), s));
    CHECK(cudaMemcpyAsync(d_in, in, sizeof(in), cudaMemcpyHostToDevice, s));
    add<<<(n + 255) / 256, 256, 0, s>>>(d_in, d_mid, n, 1);
    CHECK(cudaEventRecord(first, s));
    CHECK(cudaStreamWaitEvent(s2, first, 0));
    CHECK(cudaMemcpyAsync(mid, d_mid, sizeof(mid), cudaMemcpyDeviceToHost, s2));
    CHECK(cudaFreeAsync(d_in, s));
    CHECK(cudaMallocAsync(&d_out, n * sizeof(int), s));
    add<<<(n + 255) / 256, 256, 0, s>>>(d_mid, d_out, n, 2);
    CHECK(cudaEventRecord(second, s));
    CHECK(cudaMemcpyAsync(host, d_out, sizeof(host), cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(d_out, s));
    CHECK(cudaStreamWaitEvent(s2, second, 0));
    CHECK(cudaFreeAsync(d_mid, s2));
    CHECK(cudaEventRecord(first, s2));
    CHECK(cudaStreamWaitEvent(s, first, 0));
    CHECK(cudaStreamEndCapture(s, &g));
    // The events only ordered the capture's streams: the graph has no node
    // naming them, so they may go before it is launched (as in the sample).
    CHECK(cudaEventDestroy(first));
    CHECK(cudaEventDestroy(second));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaGraphDestroy(g));
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < n; i++) in[i] = i + 10 * round;
      for (int i = 0; i < n; i++) host[i] = mid[i] = -1;
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < n; i++) {
        if (mid[i] != i + 10 * round + 1) {
          printf("FAIL two streams: mid[%d] = %d\n", i, mid[i]);
          return 1;
        }
      }
      if (check(10 * round + 3, "captured over two streams, free then allocate")) return 1;
    }
    CHECK(cudaGraphExecDestroy(e));
  }
  printf("PASS\n");
  return 0;
}
