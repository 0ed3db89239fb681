// A CUDA graph built node by node, as XLA's command buffers build theirs:
// memset, kernel, empty, child-graph, memcpy and event nodes with
// dependencies (one added after its nodes; one kernel by the generic
// cudaGraphAddNode; one programmatic edge between kernels, as XLA adds on
// Hopper), its edges and roots read back, launched twice. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void add_one(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += 1;
}

__global__ void twice(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= 2;
}

__global__ void noop() {}

int main() {
  const int n = 4096;
  int *a, *b;
  CHECK(cudaMalloc(&a, n * sizeof(int)));
  CHECK(cudaMalloc(&b, n));
  static int out[n];
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));

  cudaMemsetParams clear = {};
  clear.dst = a;
  clear.value = 0;
  clear.elementSize = 4;
  clear.width = n;
  clear.height = 1;
  cudaGraphNode_t set_a, set_b, inc, gap, sub, dbl, copy, rec, wait;
  CHECK(cudaGraphAddMemsetNode(&set_a, graph, nullptr, 0, &clear));
  cudaMemsetParams sevens = clear;
  sevens.dst = b;
  sevens.value = 7;
  sevens.elementSize = 1;
  CHECK(cudaGraphAddMemsetNode(&set_b, graph, nullptr, 0, &sevens));

  int count = n;
  void *args[] = {&a, &count};
  cudaKernelNodeParams k = {};
  k.func = (void *)add_one;
  k.gridDim = dim3((n + 255) / 256);
  k.blockDim = dim3(256);
  k.kernelParams = args;
  CHECK(cudaGraphAddKernelNode(&inc, graph, &set_a, 1, &k));
  CHECK(cudaGraphAddEmptyNode(&gap, graph, &inc, 1));
  // A child graph of one more increment.
  cudaGraph_t child;
  CHECK(cudaGraphCreate(&child, 0));
  cudaGraphNode_t child_inc;
  CHECK(cudaGraphAddKernelNode(&child_inc, child, nullptr, 0, &k));
  CHECK(cudaGraphAddChildGraphNode(&sub, graph, &gap, 1, child));
  // The generic call, as XLA adds its kernel nodes.
  cudaGraphNodeParams generic = {};
  generic.type = cudaGraphNodeTypeKernel;
  generic.kernel.func = (void *)twice;
  generic.kernel.gridDim = k.gridDim;
  generic.kernel.blockDim = k.blockDim;
  generic.kernel.kernelParams = args;
  CHECK(cudaGraphAddNode(&dbl, graph, &sub, nullptr, 1, &generic));
  // A kernel after the increment by a programmatic edge (it may start before
  // the increment ends; it touches nothing).
  cudaGraphNodeParams quiet = {};
  quiet.type = cudaGraphNodeTypeKernel;
  quiet.kernel.func = (void *)noop;
  quiet.kernel.gridDim = dim3(1);
  quiet.kernel.blockDim = dim3(1);
  cudaGraphEdgeData early = {};
  early.type = cudaGraphDependencyTypeProgrammatic;
  early.from_port = cudaGraphKernelNodePortProgrammatic;
  cudaGraphNode_t after_inc;
  CHECK(cudaGraphAddNode(&after_inc, graph, &inc, &early, 1, &quiet));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &dbl, 1, out, a, sizeof(out), cudaMemcpyDeviceToHost));
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  CHECK(cudaGraphAddEventRecordNode(&rec, graph, &copy, 1, done));
  CHECK(cudaGraphAddEventWaitNode(&wait, graph, &rec, 1, done));
  // An edge added once both ends exist.
  CHECK(cudaGraphAddDependencies(graph, &set_b, &dbl, nullptr, 1));

  size_t edges = 0, roots = 0, deps = 0;
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  CHECK(cudaGraphGetRootNodes(graph, nullptr, &roots));
  CHECK(cudaGraphNodeGetDependencies(dbl, nullptr, nullptr, &deps));
  if (edges != 9 || roots != 2 || deps != 2) {
    printf("FAIL: %zu edges (9), %zu roots (2), %zu dependencies of the doubling (2)\n", edges, roots, deps);
    return 1;
  }
  cudaGraphNodeType type;
  CHECK(cudaGraphNodeGetType(gap, &type));
  if (type != cudaGraphNodeTypeEmpty) {
    printf("FAIL: the empty node has type %d\n", (int)type);
    return 1;
  }
  CHECK(cudaGraphNodeGetType(sub, &type));
  if (type != cudaGraphNodeTypeGraph) {
    printf("FAIL: the child graph node has type %d\n", (int)type);
    return 1;
  }

  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < n; i++) out[i] = -1;
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventQuery(done));
    for (int i = 0; i < n; i++) {
      if (out[i] != 4) {
        printf("FAIL round %d: out[%d] = %d, expected 4\n", round, i, out[i]);
        return 1;
      }
    }
  }
  unsigned char seen[16];
  CHECK(cudaMemcpy(seen, b, sizeof(seen), cudaMemcpyDeviceToHost));
  for (unsigned char v : seen) {
    if (v != 7) {
      printf("FAIL: the memset node left %d\n", v);
      return 1;
    }
  }
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaGraphDestroy(child));
  printf("PASS\n");
  return 0;
}
