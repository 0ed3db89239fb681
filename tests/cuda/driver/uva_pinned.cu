// Pinned host memory passed where device memory goes, as unified addressing
// lets a program do (XLA reads 8-byte results that way): cuMemcpyDtoH(Async),
// cuMemcpyHtoD and cuMemcpyDtoD(Async) with a pinned buffer on the device
// side, and cuMemHostGetDevicePointer giving the buffer's own address.
// Linked with -lcuda. Prints PASS.
#include <cstdio>
#include <cuda.h>

#include "check.h"

static int expect(const unsigned long long *got, unsigned long long first, const char *what) {
  for (int i = 0; i < 8; i++) {
    if (got[i] != first + i) {
      printf("FAIL %s: element %d is %llu, expected %llu\n", what, i, got[i], first + i);
      return 1;
    }
  }
  return 0;
}

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t bytes = 8 * sizeof(unsigned long long);
  unsigned long long *a, *b;
  CK(cuMemHostAlloc((void **)&a, bytes, 0));
  CK(cuMemHostAlloc((void **)&b, bytes, 0));
  for (int i = 0; i < 8; i++) a[i] = 1000 + i;
  CUdeviceptr alias;
  CK(cuMemHostGetDevicePointer(&alias, a, 0));
  if (alias != (CUdeviceptr)a) {
    printf("FAIL: cuMemHostGetDevicePointer gave %#llx for %p\n", (unsigned long long)alias, (void *)a);
    return 1;
  }
  unsigned long long got[8] = {0};
  CK(cuMemcpyDtoHAsync(got, (CUdeviceptr)a, sizeof(got[0]), s));
  CK(cuStreamSynchronize(s));
  if (got[0] != 1000) {
    printf("FAIL DtoHAsync from pinned: %llu\n", got[0]);
    return 1;
  }
  CK(cuMemcpyDtoH(got, (CUdeviceptr)a, bytes));
  if (expect(got, 1000, "DtoH from pinned")) return 1;
  // Through device memory and back, the pinned buffers on the device side.
  CUdeviceptr d;
  CK(cuMemAlloc(&d, bytes));
  CK(cuMemcpyDtoD(d, (CUdeviceptr)a, bytes));
  CK(cuMemcpyDtoDAsync((CUdeviceptr)b, d, bytes, s));
  CK(cuStreamSynchronize(s));
  if (expect(b, 1000, "DtoD through device memory")) return 1;
  unsigned long long src[8];
  for (int i = 0; i < 8; i++) src[i] = 7 + i;
  CK(cuMemcpyHtoD((CUdeviceptr)b, src, bytes));
  if (expect(b, 7, "HtoD into pinned")) return 1;
  CK(cuMemFree(d));
  CK(cuMemFreeHost(a));
  CK(cuMemFreeHost(b));
  printf("PASS\n");
  return 0;
}
