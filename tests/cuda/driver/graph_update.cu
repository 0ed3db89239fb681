// Graphs changed after they are built, as XLA's command buffers change
// theirs: kernel and memset nodes given new parameters in an instantiated
// graph (by their own calls and by the generic cudaGraphExecNodeSetParams),
// a node changed in its graph and the exec brought up to date with
// cudaGraphExecUpdate, and an update refused when the graph gained a node.
// A graph of kernels alone is updated too (the server keeps those whole).
// Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void add_k(int *v, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += k;
}

static const int n = 2048;
static int out[n];

// Launches `exec` once and checks that every element came back as `want`.
static int expect(cudaGraphExec_t exec, cudaStream_t s, int want, const char *what) {
  for (int i = 0; i < n; i++) out[i] = -1;
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; i++) {
    if (out[i] != want) {
      printf("FAIL %s: out[%d] = %d, want %d\n", what, i, out[i], want);
      return 1;
    }
  }
  printf("%s: %d\n", what, want);
  return 0;
}

static cudaKernelNodeParams kernel(int **v, int *count, int *k, void **args) {
  args[0] = v;
  args[1] = count;
  args[2] = k;
  cudaKernelNodeParams p = {};
  p.func = (void *)add_k;
  p.gridDim = dim3((n + 255) / 256);
  p.blockDim = dim3(256);
  p.kernelParams = args;
  return p;
}

int main() {
  int *a, *b;
  CHECK(cudaMalloc(&a, n * sizeof(int)));
  CHECK(cudaMalloc(&b, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int count = n;

  // memset(a, 0) -> add_k(a, 3) -> copy a to out.
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaMemsetParams clear = {};
  clear.dst = a;
  clear.value = 0;
  clear.elementSize = 4;
  clear.width = n;
  clear.height = 1;
  cudaGraphNode_t set, add, copy;
  CHECK(cudaGraphAddMemsetNode(&set, graph, nullptr, 0, &clear));
  int k = 3;
  void *args[3];
  cudaKernelNodeParams kp = kernel(&a, &count, &k, args);
  CHECK(cudaGraphAddKernelNode(&add, graph, &set, 1, &kp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &add, 1, out, a, sizeof(out), cudaMemcpyDeviceToHost));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  if (expect(exec, s, 3, "as built")) return 1;

  // The exec's kernel adds 7; its memset starts from 10 (the graph keeps 3 and 0).
  int k2 = 7;
  void *args2[3];
  cudaKernelNodeParams kp2 = kernel(&a, &count, &k2, args2);
  CHECK(cudaGraphExecKernelNodeSetParams(exec, add, &kp2));
  cudaMemsetParams ten = clear;
  ten.value = 10;
  CHECK(cudaGraphExecMemsetNodeSetParams(exec, set, &ten));
  if (expect(exec, s, 17, "exec's kernel and memset set")) return 1;

  // The generic call: the kernel adds 100.
  int k3 = 100;
  void *args3[3];
  cudaGraphNodeParams generic = {};
  generic.type = cudaGraphNodeTypeKernel;
  cudaKernelNodeParams k3p = kernel(&a, &count, &k3, args3);
  generic.kernel.func = k3p.func;
  generic.kernel.gridDim = k3p.gridDim;
  generic.kernel.blockDim = k3p.blockDim;
  generic.kernel.kernelParams = k3p.kernelParams;
  CHECK(cudaGraphExecNodeSetParams(exec, add, &generic));
  if (expect(exec, s, 110, "exec's kernel set by the generic call")) return 1;

  // The graph's kernel adds 5; cudaGraphExecUpdate brings the exec to the graph.
  int k4 = 5;
  void *args4[3];
  cudaKernelNodeParams kp4 = kernel(&a, &count, &k4, args4);
  CHECK(cudaGraphKernelNodeSetParams(add, &kp4));
  cudaGraphExecUpdateResultInfo info = {};
  CHECK(cudaGraphExecUpdate(exec, graph, &info));
  if (info.result != cudaGraphExecUpdateSuccess) {
    printf("FAIL update result %d\n", (int)info.result);
    return 1;
  }
  if (expect(exec, s, 5, "exec updated from its graph")) return 1;

  // A node added to the graph: the update is refused and the exec unchanged.
  cudaGraphNode_t extra;
  CHECK(cudaGraphAddKernelNode(&extra, graph, &copy, 1, &kp4));
  cudaError_t e = cudaGraphExecUpdate(exec, graph, &info);
  if (e != cudaErrorGraphExecUpdateFailure || info.result != cudaGraphExecUpdateErrorTopologyChanged) {
    printf("FAIL update after a new node: %s, result %d\n", cudaGetErrorString(e), (int)info.result);
    return 1;
  }
  cudaGetLastError();
  if (expect(exec, s, 5, "exec unchanged by a refused update")) return 1;

  // A graph of kernels alone, its kernel pointed at another buffer.
  cudaGraph_t kernels;
  CHECK(cudaGraphCreate(&kernels, 0));
  cudaGraphNode_t first, second;
  CHECK(cudaGraphAddKernelNode(&first, kernels, nullptr, 0, &kp));
  CHECK(cudaGraphAddKernelNode(&second, kernels, &first, 1, &kp2));
  cudaGraphExec_t kexec;
  CHECK(cudaGraphInstantiate(&kexec, kernels, 0));
  CHECK(cudaMemset(b, 0, n * sizeof(int)));
  void *args5[3];
  cudaKernelNodeParams on_b = kernel(&b, &count, &k2, args5);
  CHECK(cudaGraphExecKernelNodeSetParams(kexec, second, &on_b));
  CHECK(cudaMemset(a, 0, n * sizeof(int)));
  CHECK(cudaGraphLaunch(kexec, s));
  CHECK(cudaStreamSynchronize(s));
  static int got_a[n], got_b[n];
  CHECK(cudaMemcpy(got_a, a, sizeof(got_a), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got_b, b, sizeof(got_b), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    if (got_a[i] != 3 || got_b[i] != 7) {
      printf("FAIL kernels-only graph: a[%d] = %d (3), b[%d] = %d (7)\n", i, got_a[i], i, got_b[i]);
      return 1;
    }
  }
  printf("kernels-only exec set: 3 and 7\n");

  // A node of another graph is refused.
  if (cudaGraphExecKernelNodeSetParams(kexec, add, &kp) == cudaSuccess) {
    printf("FAIL a node of another graph was taken\n");
    return 1;
  }
  cudaGetLastError();
  CHECK(cudaGraphExecDestroy(kexec));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(kernels));
  CHECK(cudaGraphDestroy(graph));
  printf("PASS\n");
  return 0;
}
