// Keeps working until the server goes away (the test kills it after
// "started"); every call after that must fail promptly, never hang or crash.
// Works on the device its first argument names (default 0). Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cuda_runtime.h>

__global__ void touch(int *p) { p[threadIdx.x] += 1; }

int main(int argc, char **argv) {
  int device = argc > 1 ? atoi(argv[1]) : 0;
  if (cudaSetDevice(device) != cudaSuccess) { printf("FAIL set device %d\n", device); return 1; }
  int *d;
  if (cudaMalloc(&d, 1024) != cudaSuccess) { printf("FAIL malloc\n"); return 1; }
  printf("started\n");
  fflush(stdout);
  time_t begin = time(nullptr);
  cudaError_t e = cudaSuccess;
  while (time(nullptr) - begin < 60) {
    touch<<<1, 32>>>(d);
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) break;
  }
  if (e == cudaSuccess) { printf("FAIL the server never went away\n"); return 1; }
  printf("error: %s\n", cudaGetErrorName(e));
  // Later calls fail too, quickly.
  int host[8];
  cudaError_t again = cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost);
  printf("later: %s\n", cudaGetErrorName(again));
  if (again == cudaSuccess) { printf("FAIL a call succeeded after the loss\n"); return 1; }
  int *more;
  if (cudaMalloc(&more, 64) == cudaSuccess) { printf("FAIL malloc after the loss\n"); return 1; }
  printf("PASS\n");
  return 0;
}
