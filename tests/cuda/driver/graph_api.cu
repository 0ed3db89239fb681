// The rest of the explicit graph API, as samples use it: a graph cloned (and
// its node found in the clone) and launched; memset and memcpy nodes' and
// event nodes' parameters read back; an event node given another event; a
// host node's function changed in an instantiation; a kernel node disabled
// and enabled again; an edge removed; the graph printed in DOT; a memcpy node
// of a 2-D box of a pitched buffer. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

// Element (x, y) of a pitched 2-D buffer gets y * 1000 + x.
__global__ void fill_2d(int *p, size_t pitch, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) ((int *)((char *)p + y * pitch))[x] = y * 1000 + x;
}

__global__ void add_k(int *v, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += k;
}

static const int n = 1024;
static int out[n];
static int which_host = 0;
static void CUDART_CB host_a(void *) { which_host = 1; }
static void CUDART_CB host_b(void *) { which_host = 2; }

static int expect(cudaGraphExec_t e, cudaStream_t s, int want, const char *what) {
  for (int i = 0; i < n; i++) out[i] = -1;
  CHECK(cudaGraphLaunch(e, s));
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

int main() {
  int *a;
  CHECK(cudaMalloc(&a, n * sizeof(int)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaEvent_t ev1, ev2;
  CHECK(cudaEventCreate(&ev1));
  CHECK(cudaEventCreate(&ev2));
  int count = n, k = 4;

  // memset(a, 1) -> add_k(a, 4) -> record ev1 -> copy out -> host node.
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaMemsetParams ms = {};
  ms.dst = a;
  ms.value = 1;
  ms.elementSize = 4;
  ms.width = n;
  ms.height = 1;
  cudaGraphNode_t set, add, rec, copy, hostn;
  CHECK(cudaGraphAddMemsetNode(&set, g, nullptr, 0, &ms));
  void *args[] = {&a, &count, &k};
  cudaKernelNodeParams kp = {};
  kp.func = (void *)add_k;
  kp.gridDim = dim3((n + 255) / 256);
  kp.blockDim = dim3(256);
  kp.kernelParams = args;
  CHECK(cudaGraphAddKernelNode(&add, g, &set, 1, &kp));
  CHECK(cudaGraphAddEventRecordNode(&rec, g, &add, 1, ev1));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &rec, 1, out, a, sizeof(out), cudaMemcpyDeviceToHost));
  cudaHostNodeParams hp = {};
  hp.fn = host_a;
  CHECK(cudaGraphAddHostNode(&hostn, g, &copy, 1, &hp));

  // Parameters read back.
  cudaMemsetParams ms_back = {};
  CHECK(cudaGraphMemsetNodeGetParams(set, &ms_back));
  if (ms_back.dst != a || ms_back.value != 1 || ms_back.elementSize != 4 || ms_back.width != (size_t)n) {
    printf("FAIL memset parameters read back differ\n");
    return 1;
  }
  cudaMemcpy3DParms mc = {};
  CHECK(cudaGraphMemcpyNodeGetParams(copy, &mc));
  if (mc.srcPtr.ptr != a || mc.dstPtr.ptr != out || mc.extent.width != sizeof(out)) {
    printf("FAIL memcpy parameters read back differ: %p %p %zu\n", mc.srcPtr.ptr, mc.dstPtr.ptr, mc.extent.width);
    return 1;
  }
  cudaEvent_t got;
  CHECK(cudaGraphEventRecordNodeGetEvent(rec, &got));
  if (got != ev1) {
    printf("FAIL event node's event differs\n");
    return 1;
  }
  CHECK(cudaGraphEventRecordNodeSetEvent(rec, ev2));
  CHECK(cudaGraphEventRecordNodeGetEvent(rec, &got));
  if (got != ev2) {
    printf("FAIL event node's event not set\n");
    return 1;
  }

  // A clone, its node found, launched.
  cudaGraph_t cl;
  CHECK(cudaGraphClone(&cl, g));
  cudaGraphNode_t add_in_clone;
  CHECK(cudaGraphNodeFindInClone(&add_in_clone, add, cl));
  cudaGraphNodeType t;
  CHECK(cudaGraphNodeGetType(add_in_clone, &t));
  if (t != cudaGraphNodeTypeKernel) {
    printf("FAIL the clone's node has type %d\n", (int)t);
    return 1;
  }
  cudaGraphExec_t ce;
  CHECK(cudaGraphInstantiate(&ce, cl, 0));
  if (expect(ce, s, 5, "clone")) return 1;
  CHECK(cudaEventSynchronize(ev2));

  // The instantiation's host node calls another function; its kernel is
  // disabled, then enabled again.
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  which_host = 0;
  if (expect(e, s, 5, "as built")) return 1;
  if (which_host != 1) {
    printf("FAIL host node ran %d, want 1\n", which_host);
    return 1;
  }
  cudaHostNodeParams hb = {};
  hb.fn = host_b;
  CHECK(cudaGraphExecHostNodeSetParams(e, hostn, &hb));
  CHECK(cudaGraphNodeSetEnabled(e, add, 0));
  unsigned enabled = 1;
  CHECK(cudaGraphNodeGetEnabled(e, add, &enabled));
  if (enabled != 0) {
    printf("FAIL the disabled node reads enabled\n");
    return 1;
  }
  if (expect(e, s, 1, "kernel disabled")) return 1;
  if (which_host != 2) {
    printf("FAIL host node ran %d, want 2\n", which_host);
    return 1;
  }
  CHECK(cudaGraphNodeSetEnabled(e, add, 1));
  if (expect(e, s, 5, "kernel enabled again")) return 1;

  // An edge removed; the graph printed.
  size_t edges = 0;
  CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  CHECK(cudaGraphRemoveDependencies(g, &copy, &hostn, nullptr, 1));
  size_t after = 0;
  CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &after));
  if (edges != 4 || after != 3) {
    printf("FAIL edges %zu then %zu, want 4 then 3\n", edges, after);
    return 1;
  }
  if (cudaGraphRemoveDependencies(g, &copy, &hostn, nullptr, 1) == cudaSuccess) {
    printf("FAIL an edge removed twice\n");
    return 1;
  }
  cudaGetLastError();
  const char *dot = "/tmp/cumux-graph-api.dot";
  CHECK(cudaGraphDebugDotPrint(g, dot, 0));
  FILE *f = fopen(dot, "r");
  long size = 0;
  if (f) {
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fclose(f);
  }
  remove(dot);
  if (size <= 0) {
    printf("FAIL the DOT file is empty or missing\n");
    return 1;
  }
  // A memcpy node of a 2-D box: 5 rows of 7 elements from (3, 2) of a
  // pitched buffer to a host array of rows of 8.
  {
    const int w = 64, h = 16, bw = 7, bh = 5;
    int *p2;
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&p2, &pitch, w * sizeof(int), h));
    fill_2d<<<dim3(1, h), w>>>(p2, pitch, w, h);
    CHECK(cudaDeviceSynchronize());
    static int box[bh][8];
    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(p2, pitch, w, h);
    cp.srcPos = make_cudaPos(3 * sizeof(int), 2, 0);
    cp.dstPtr = make_cudaPitchedPtr(box, 8 * sizeof(int), 8, bh);
    cp.extent = make_cudaExtent(bw * sizeof(int), bh, 1);
    cp.kind = cudaMemcpyDeviceToHost;
    cudaGraph_t g2;
    CHECK(cudaGraphCreate(&g2, 0));
    cudaGraphNode_t copy2;
    CHECK(cudaGraphAddMemcpyNode(&copy2, g2, nullptr, 0, &cp));
    cudaGraphExec_t e2;
    CHECK(cudaGraphInstantiate(&e2, g2, 0));
    CHECK(cudaGraphLaunch(e2, s));
    CHECK(cudaStreamSynchronize(s));
    for (int y = 0; y < bh; y++) {
      for (int x = 0; x < bw; x++) {
        if (box[y][x] != (y + 2) * 1000 + x + 3) {
          printf("FAIL 2-D memcpy node: box[%d][%d] = %d\n", y, x, box[y][x]);
          return 1;
        }
      }
    }
    printf("2-D memcpy node: ok\n");
    CHECK(cudaGraphExecDestroy(e2));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaFree(p2));
  }

  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaGraphExecDestroy(ce));
  CHECK(cudaGraphDestroy(cl));
  CHECK(cudaGraphDestroy(g));
  printf("PASS\n");
  return 0;
}
