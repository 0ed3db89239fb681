// Calls a driver entry point cumux does not implement (OpenGL interop): it
// must resolve, return CUDA_ERROR_NOT_SUPPORTED (801) and name itself on
// stderr. Prints PASS.
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>

typedef CUresult (*RegisterBuffer)(void **resource, unsigned int buffer, unsigned int flags);

int main() {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuGraphicsGLRegisterBuffer", &fn, 13000,
                                                   cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    printf("FAIL lookup: %s status=%d\n", cudaGetErrorString(e), (int)status);
    return 1;
  }
  void *resource = nullptr;
  CUresult r = ((RegisterBuffer)fn)(&resource, 1, 0);
  printf("cuGraphicsGLRegisterBuffer -> %d\n", (int)r);
  if (r != CUDA_ERROR_NOT_SUPPORTED) { printf("FAIL result %d\n", (int)r); return 1; }
  // A second call still fails the same way (the log line is printed once).
  r = ((RegisterBuffer)fn)(&resource, 1, 0);
  if (r != CUDA_ERROR_NOT_SUPPORTED) { printf("FAIL second result %d\n", (int)r); return 1; }

  // A name the driver has never had is "not found", not a crash.
  e = cudaGetDriverEntryPointByVersion("cuNoSuchEntryPoint", &fn, 13000, cudaEnableDefault, &status);
  if (status != cudaDriverEntryPointSymbolNotFound) { printf("FAIL unknown status %d\n", (int)status); return 1; }
  printf("PASS\n");
  return 0;
}
