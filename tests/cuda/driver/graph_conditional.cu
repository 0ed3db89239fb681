// Conditional graph nodes built node by node: an if node whose body runs
// only when a kernel before it set the condition, an if/else pair, a while
// node whose body counts down until it clears the condition (its handle set
// to its default at each launch), and a switch node. Each graph is launched
// twice with different inputs and checked. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include <cstdlib>

#include "check.h"

// CHECK for helpers that return a value: a failure ends the program.
#define MUST(x)                                                                              \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

__global__ void set_if(const int *in, cudaGraphConditionalHandle h) {
  cudaGraphSetConditional(h, *in > 0 ? 1 : 0);
}

__global__ void add(int *v, int k) { *v += k; }

__global__ void count_down(int *counter, int *passes, cudaGraphConditionalHandle h) {
  *counter -= 1;
  *passes += 1;
  if (*counter <= 0) cudaGraphSetConditional(h, 0);
}

__global__ void choose(const int *in, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *in); }

__global__ void positive(const int *v, cudaGraphConditionalHandle h) { cudaGraphSetConditional(h, *v > 0); }

__global__ void step_down(int *v, int *passes, cudaGraphConditionalHandle h) {
  *v -= 1;
  *passes += 1;
  cudaGraphSetConditional(h, *v > 0);
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t n, void *fn, void **args) {
  cudaGraphNodeParams p = {cudaGraphNodeTypeKernel};
  p.kernel.func = fn;
  p.kernel.gridDim = dim3(1);
  p.kernel.blockDim = dim3(1);
  p.kernel.kernelParams = args;
  cudaGraphNode_t node;
  MUST(cudaGraphAddNode(&node, g, deps, NULL, n, &p));
  return node;
}

static cudaGraph_t *conditional_node(cudaGraph_t g, cudaGraphNode_t dep, cudaGraphConditionalHandle h,
                                     cudaGraphConditionalNodeType type, unsigned size) {
  cudaGraphNodeParams p = {cudaGraphNodeTypeConditional};
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  cudaGraphNode_t node;
  MUST(cudaGraphAddNode(&node, g, dep ? &dep : NULL, NULL, dep ? 1 : 0, &p));
  return p.conditional.phGraph_out;
}

static int get(const int *d) {
  int v = 0;
  MUST(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

static void put(int *d, int v) { MUST(cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice)); }

int main() {
  int *in, *out, *counter, *passes;
  CHECK(cudaMalloc(&in, sizeof(int)));
  CHECK(cudaMalloc(&out, sizeof(int)));
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMalloc(&passes, sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  // If and if/else: out += 10 when in > 0, else out += 1 (else branch).
  {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    void *set_args[] = {&in, &h};
    cudaGraphNode_t setter = kernel_node(g, NULL, 0, (void *)set_if, set_args);
    cudaGraph_t *bodies = conditional_node(g, setter, h, cudaGraphCondTypeIf, 2);
    int ten = 10, one = 1;
    void *then_args[] = {&out, &ten};
    void *else_args[] = {&out, &one};
    kernel_node(bodies[0], NULL, 0, (void *)add, then_args);
    kernel_node(bodies[1], NULL, 0, (void *)add, else_args);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int round = 0; round < 2; round++) {
      put(in, round == 0 ? 5 : -5);
      put(out, 0);
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      int want = round == 0 ? 10 : 1;
      if (get(out) != want) { printf("FAIL if/else round %d: %d, want %d\n", round, get(out), want); return 1; }
    }
    printf("if/else: ok\n");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }

  // While: the body runs until the counter reaches 0; the handle starts at
  // its default (1) at each launch.
  {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    cudaGraph_t *bodies = conditional_node(g, NULL, h, cudaGraphCondTypeWhile, 1);
    void *args[] = {&counter, &passes, &h};
    kernel_node(bodies[0], NULL, 0, (void *)count_down, args);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int round = 0; round < 2; round++) {
      int n = round == 0 ? 5 : 3;
      put(counter, n);
      put(passes, 0);
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (get(passes) != n || get(counter) != 0) {
        printf("FAIL while round %d: %d passes, counter %d\n", round, get(passes), get(counter));
        return 1;
      }
    }
    printf("while: ok\n");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }

  // Switch: the body the value names runs; a value past the last runs none.
  {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    void *choose_args[] = {&in, &h};
    cudaGraphNode_t chooser = kernel_node(g, NULL, 0, (void *)choose, choose_args);
    cudaGraph_t *bodies = conditional_node(g, chooser, h, cudaGraphCondTypeSwitch, 3);
    int k[3] = {100, 200, 300};
    void *args0[] = {&out, &k[0]}, *args1[] = {&out, &k[1]}, *args2[] = {&out, &k[2]};
    kernel_node(bodies[0], NULL, 0, (void *)add, args0);
    kernel_node(bodies[1], NULL, 0, (void *)add, args1);
    kernel_node(bodies[2], NULL, 0, (void *)add, args2);
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    int inputs[3] = {2, 0, 7}, wants[3] = {300, 100, 0};
    for (int round = 0; round < 3; round++) {
      put(in, inputs[round]);
      put(out, 0);
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (get(out) != wants[round]) { printf("FAIL switch %d: %d, want %d\n", inputs[round], get(out), wants[round]); return 1; }
    }
    printf("switch: ok\n");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
  }
  // Built by stream capture, as NVIDIA's graphConditionalNodes sample does:
  // the capture's graph asked for while capturing, a while node added to it
  // by hand after a captured kernel, the capture's dependencies moved onto
  // it, a kernel captured after it; the body captured into its graph.
  {
    cudaStream_t cs;
    CHECK(cudaStreamCreate(&cs));
    CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    cudaGraph_t g;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    CHECK(cudaStreamGetCaptureInfo(cs, &status, NULL, &g, &deps, NULL, &ndeps));
    if (status != cudaStreamCaptureStatusActive || g == NULL) { printf("FAIL no capture graph\n"); return 1; }
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphConditionalHandleCreate(&h, g));
    positive<<<1, 1, 0, cs>>>(counter, h);
    CHECK(cudaStreamGetCaptureInfo(cs, &status, NULL, &g, &deps, NULL, &ndeps));
    cudaGraphNodeParams p = {cudaGraphNodeTypeConditional};
    p.conditional.handle = h;
    p.conditional.type = cudaGraphCondTypeWhile;
    p.conditional.size = 1;
    cudaGraphNode_t loop;
    CHECK(cudaGraphAddNode(&loop, g, deps, NULL, ndeps, &p));
    cudaGraph_t body = p.conditional.phGraph_out[0];
    CHECK(cudaStreamUpdateCaptureDependencies(cs, &loop, NULL, 1, cudaStreamSetCaptureDependencies));
    add<<<1, 1, 0, cs>>>(out, 1);
    cudaGraph_t captured;
    CHECK(cudaStreamEndCapture(cs, &captured));
    if (captured != g) { printf("FAIL the capture's graph changed\n"); return 1; }
    cudaStream_t bs;
    CHECK(cudaStreamCreate(&bs));
    CHECK(cudaStreamBeginCaptureToGraph(bs, body, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    step_down<<<1, 1, 0, bs>>>(counter, passes, h);
    CHECK(cudaStreamEndCapture(bs, NULL));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, captured, 0));
    for (int round = 0; round < 2; round++) {
      int n = round == 0 ? 0 : 4;
      put(counter, n);
      put(passes, 0);
      put(out, 0);
      CHECK(cudaGraphLaunch(e, s));
      CHECK(cudaStreamSynchronize(s));
      if (get(passes) != n || get(counter) != 0 || get(out) != 1) {
        printf("FAIL captured while round %d: %d passes, counter %d, out %d\n", round, get(passes), get(counter),
               get(out));
        return 1;
      }
    }
    printf("captured while: ok\n");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(captured));
    CHECK(cudaStreamDestroy(cs));
    CHECK(cudaStreamDestroy(bs));
  }
  CHECK(cudaStreamDestroy(s));
  printf("PASS\n");
  return 0;
}
