// A CUDA graph by stream capture: copies in, two kernels, a host function,
// copy out; replayed several times with new input (graph copies read and
// write host memory when the graph runs). Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void add(int *v, int n, int x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += x;
}
__global__ void twice(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= 2;
}

static int ran = 0;
static void CUDART_CB count(void *) { ran++; }

int main() {
  const int N = 1024;
  int *in, *out, *d;
  CHECK(cudaMallocHost((void **)&in, N * sizeof(int)));
  CHECK(cudaMallocHost((void **)&out, N * sizeof(int)));
  CHECK(cudaMalloc(&d, N * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status;
  CHECK(cudaStreamIsCapturing(s, &status));
  if (status != cudaStreamCaptureStatusActive) { printf("FAIL not capturing\n"); return 1; }
  CHECK(cudaMemcpyAsync(d, in, N * sizeof(int), cudaMemcpyHostToDevice, s));
  add<<<N / 256, 256, 0, s>>>(d, N, 3);
  twice<<<N / 256, 256, 0, s>>>(d, N);
  CHECK(cudaLaunchHostFunc(s, count, nullptr));
  CHECK(cudaMemcpyAsync(out, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
  cudaGraph_t graph;
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaStreamIsCapturing(s, &status));
  if (status != cudaStreamCaptureStatusNone) { printf("FAIL still capturing\n"); return 1; }
  if (ran != 0) { printf("FAIL captured work ran\n"); return 1; }

  // What PyTorch asks of a captured graph: how many nodes (to warn about an
  // empty capture), and, for kernel nodes, their launch parameters.
  size_t count = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  if (count != 5) { printf("FAIL %zu nodes, want 5\n", count); return 1; }
  cudaGraphNode_t nodes[6];
  count = 6;
  CHECK(cudaGraphGetNodes(graph, nodes, &count));
  if (count != 5 || nodes[5] != nullptr) { printf("FAIL node list of %zu\n", count); return 1; }
  const cudaGraphNodeType want_types[5] = {cudaGraphNodeTypeMemcpy, cudaGraphNodeTypeKernel,
                                           cudaGraphNodeTypeKernel, cudaGraphNodeTypeHost,
                                           cudaGraphNodeTypeMemcpy};
  for (int i = 0; i < 5; i++) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(nodes[i], &t));
    if (t != want_types[i]) { printf("FAIL node %d has type %d\n", i, (int)t); return 1; }
  }
  cudaKernelNodeParams kp = {};
  CHECK(cudaGraphKernelNodeGetParams(nodes[1], &kp));
  if (kp.gridDim.x != N / 256 || kp.blockDim.x != 256 || kp.sharedMemBytes != 0 ||
      kp.kernelParams == nullptr || *(int *)kp.kernelParams[1] != N ||
      *(int *)kp.kernelParams[2] != 3) {
    printf("FAIL kernel node params grid %u block %u\n", kp.gridDim.x, kp.blockDim.x);
    return 1;
  }
  size_t roots = 0, edges = 0;
  CHECK(cudaGraphGetRootNodes(graph, nullptr, &roots));
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  if (roots != 1 || edges != 4) { printf("FAIL %zu roots, %zu edges\n", roots, edges); return 1; }
  cudaGraphNode_t from[4], to[4];
  CHECK(cudaGraphGetEdges(graph, from, to, nullptr, &edges));
  if (from[0] != nodes[0] || to[3] != nodes[4]) { printf("FAIL edges\n"); return 1; }
  size_t deps = 0;
  CHECK(cudaGraphNodeGetDependencies(nodes[2], nullptr, nullptr, &deps));
  if (deps != 1) { printf("FAIL %zu dependencies\n", deps); return 1; }

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) in[i] = i + 100 * round;
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++) {
      int want = (i + 100 * round + 3) * 2;
      if (out[i] != want) { printf("FAIL round %d out[%d] = %d, want %d\n", round, i, out[i], want); return 1; }
    }
  }
  if (ran != 3) { printf("FAIL host function ran %d times\n", ran); return 1; }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaFreeHost(in));
  CHECK(cudaFreeHost(out));
  printf("PASS\n");
  return 0;
}
