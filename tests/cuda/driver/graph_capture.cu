// A CUDA graph by stream capture: copies in, two kernels, a host function,
// copy out; replayed several times with new input (graph copies read and
// write host memory when the graph runs). Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x)                                                              \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x,                 \
             cudaGetErrorString(e_));                                         \
      return 1;                                                               \
    }                                                                         \
  } while (0)

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
