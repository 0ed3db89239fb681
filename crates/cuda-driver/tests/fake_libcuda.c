/* A stand-in for NVIDIA's libcuda.so.1 for GPU-free tests of cumux-cuda-driver:
 * one fake GPU with known answers. -DFAKE_NO_DEVICE makes cuInit fail as on a
 * machine without GPUs; -DFAKE_CUMUX adds cumux's client marker symbol. */
#include <stddef.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

#ifdef FAKE_CUMUX
int cumuxClientVersion = 1;
#endif

static int dummy_context;

CUresult cuInit(unsigned flags) {
    (void)flags;
#ifdef FAKE_NO_DEVICE
    return 100;
#else
    return 0;
#endif
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuGetErrorName(CUresult code, const char **name) {
    switch (code) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    default: *name = NULL; return 1;
    }
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return 101;
    *d = 0;
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    strncpy(name, "Fake GPU 80GB", (size_t)len);
    name[len - 1] = 0;
    return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
    (void)d;
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xa0 + i);
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    (void)d;
    *bytes = (size_t)80 << 30;
    return 0;
}
/* Attribute n answers n * 10, except 92..94 and everything above 147, which
 * it does not know (as drivers answer retired or future numbers). */
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)d;
    if (attr < 1 || attr > 147 || (attr >= 92 && attr <= 94)) return 1;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr * 10;
    return 0;
}
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, CUdevice d) {
    (void)flags; (void)d;
    *ctx = &dummy_context;
    return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) { return ctx == &dummy_context ? 0 : 400; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &dummy_context ? 0 : 201; }
/* Every allocation is too large. */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) { (void)p; (void)bytes; return 2; }
CUresult cuModuleLoadData(void **m, const void *image) { (void)m; (void)image; return 200; }
CUresult cuLaunchKernel(void) { return 0; }
