// jit_log: a module load of PTX the JIT rejects (linked with -lcuda, the
// driver API directly) fails with CUDA_ERROR_INVALID_PTX and fills the error
// log buffer the program passed, with its length in the size option.
#include <cuda.h>
#include <cstdint>
#include <cstdio>
#include <cstring>

#define CK(call)                                                                  \
    do {                                                                          \
        CUresult r_ = (call);                                                     \
        if (r_ != CUDA_SUCCESS) {                                                 \
            printf("jit_log: FAIL (%s returned %d at line %d)\n", #call, (int)r_, \
                   __LINE__);                                                     \
            return 1;                                                             \
        }                                                                         \
    } while (0)

static const char bad_ptx[] =
    ".version 8.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry broken()\n"
    "{\n"
    "    frobnicate.u32 %r1, 7;\n"
    "    ret;\n"
    "}\n";

int main()
{
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    char error_log[4096];
    char info_log[4096];
    memset(error_log, 0x7f, sizeof(error_log));
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
    void* values[] = {error_log, (void*)(uintptr_t)sizeof(error_log), info_log,
                      (void*)(uintptr_t)sizeof(info_log)};
    CUmodule module;
    CUresult r = cuModuleLoadDataEx(&module, bad_ptx, 4, options, values);
    if (r != CUDA_ERROR_INVALID_PTX) {
        printf("jit_log: FAIL (cuModuleLoadDataEx returned %d, expected "
               "CUDA_ERROR_INVALID_PTX (218))\n", (int)r);
        return 1;
    }
    size_t used = (size_t)(uintptr_t)values[1];
    size_t len = strnlen(error_log, sizeof(error_log));
    if (len == 0 || len == sizeof(error_log) || used == 0 || used > sizeof(error_log)) {
        printf("jit_log: FAIL (error log of %zu bytes, size option %zu)\n", len, used);
        return 1;
    }
    printf("jit log: %s\n", error_log);
    printf("jit_log: PASS\n");
    return 0;
}
