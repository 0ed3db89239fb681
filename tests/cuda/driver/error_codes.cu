// Misuse of the driver API, call by call, checked against the codes NVIDIA's
// driver returns for the same calls (measured on an H100, driver 580.159,
// CUDA 13.0). Prints PASS when every code matches.
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
// Each call and the CUresult NVIDIA's driver 580 gave for it on an H100.
static int failures = 0;
#define E(x, want)                                                            \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if ((int)r_ != (want)) {                                                  \
      printf("FAIL %s -> %d, NVIDIA's driver gives %d\n", #x, (int)r_, want);  \
      failures++;                                                             \
    }                                                                         \
  } while (0)
int main() {
  int count = -1;
  E(cuDeviceGetCount(&count), 3);
  E(cuInit(0), 0);
  CUdevice dev; E(cuDeviceGet(&dev, 0), 0);
  int v; E(cuDeviceGetAttribute(&v, (CUdevice_attribute)0, dev), 1);
  E(cuDeviceGetAttribute(&v, (CUdevice_attribute)148, dev), 1);
  CUcontext cur = (CUcontext)1; E(cuCtxGetCurrent(&cur), 0); if (cur != nullptr) { printf("FAIL a current context before any was made\n"); failures++; }
  CUdeviceptr p; E(cuMemAlloc(&p, 16), 201);
  E(cuCtxGetDevice(&dev), 201);
  CUcontext prim; E(cuDevicePrimaryCtxRetain(&prim, dev), 0);
  E(cuCtxSetCurrent(prim), 0);
  E(cuCtxDestroy(prim), 201);
  E(cuMemAlloc(&p, 0), 1);
  E(cuMemAlloc(&p, 1024), 0);
  E(cuMemFree(p + 8), 1);
  E(cuMemFree(0x12345678), 1);
  E(cuMemFree(p), 0);
  E(cuMemFree(p), 1);
  int host[4]; unsigned t;
  E(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)host), 1);
  CUdeviceptr base; size_t sz;
  E(cuMemGetAddressRange(&base, &sz, (CUdeviceptr)host), 500);
  E(cuMemHostUnregister(host), 713);
  E(cuMemHostRegister(host, sizeof host, 0), 0);
  E(cuMemHostRegister(host, sizeof host, 0), 712);
  E(cuMemHostUnregister(host), 0);
  void *hp; E(cuMemHostAlloc(&hp, 64, 0), 0);
  E(cuMemHostUnregister(hp), 1);
  E(cuMemFreeHost(hp), 0);
  E(cuMemFreeHost(host), 1);
  CUevent e1, e2; E(cuEventCreate(&e1, 0), 0); E(cuEventCreate(&e2, 0), 0);
  float ms; E(cuEventElapsedTime(&ms, e1, e2), 400);
  E(cuEventQuery(e1), 0); E(cuEventSynchronize(e1), 0);
  E(cuEventCreate(&e1, 0x100), 1);
  CUstream s; E(cuStreamCreate(&s, 7), 1);
  E(cuStreamCreateWithPriority(&s, 0, -100), 0); int pr; E(cuStreamGetPriority(s, &pr), 0); if (pr != -5) { printf("FAIL priority clamped to %d\n", pr); failures++; }
  int lo, hi; E(cuCtxGetStreamPriorityRange(&lo, &hi), 0); if (lo != 0 || hi != -5) { printf("FAIL priority range %d %d\n", lo, hi); failures++; }
  CUmodule m; E(cuModuleLoadData(&m, "garbage"), 200);
  E(cuModuleLoad(&m, "/nonexistent"), 301);
  CUfunction f; E(cuModuleGetFunction(&f, (CUmodule)0, "x"), 400);
  const char *n; E(cuGetErrorName((CUresult)12345, &n), 1);
  E(cuGetErrorString((CUresult)12345, &n), 1);
  E(cuMemsetD2D32(p, 4, 0, 2, 2), 1);
  CUdeviceptr q; E(cuMemAlloc(&q, 4096), 0);
  E(cuMemsetD2D32(q, 4, 0, 2, 2), 1);
  E(cuCtxPopCurrent(&cur), 0); E(cuCtxPopCurrent(&cur), 201);
  E(cuMemAlloc(&q, 16), 201);
  E(cuCtxSynchronize(), 201);
  E(cuInit(1), 1);
  if (failures) return 1;
  printf("PASS\n");
  return 0;
}
