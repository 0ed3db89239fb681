// The driver API directly: contexts, modules from PTX / fat binary / cubin /
// file, libraries and kernels, parameter info, launches through kernelParams,
// `extra` and cuLaunchKernelEx, what a launch is rejected for at the call,
// memsets, 2-D/3-D copies, the stream-ordered allocator and device printf.
// Prints PASS.
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda.h>

#include "check.h"

#define EXPECT(x, want)                                                       \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != (want)) {                                                       \
      printf("FAIL %s:%d %s -> %d, want %d\n", __FILE__, __LINE__, #x, r_,    \
             (int)(want));                                                    \
      return 1;                                                               \
    }                                                                         \
  } while (0)

// Compiled into this program's own fat binary too; here it is the source of
// the PTX below (nvcc -ptx of the same text).
static const char *kPtx =
    ".version 8.0\n.target sm_75\n.address_size 64\n"
    ".visible .global .align 4 .u32 counter;\n"
    ".visible .entry scale(.param .u64 p_data, .param .f32 p_s, .param .u32 p_n)\n"
    "{\n"
    "  .reg .pred %p<2>; .reg .f32 %f<3>; .reg .b32 %r<6>; .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p_data]; ld.param.f32 %f1, [p_s]; ld.param.u32 %r2, [p_n];\n"
    "  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.s32 %p1, %r1, %r2;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.s32 %rd3, %r1, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.f32 %f2, [%rd4];\n"
    "  mul.f32 %f2, %f2, %f1;\n"
    "  st.global.f32 [%rd4], %f2;\n"
    "  atom.global.add.u32 %r5, [counter], 1;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

extern "C" __global__ void hello(int x) { printf("hello from the device: %d\n", x); }

int main(int argc, char **argv) {
  CK(cuInit(0));
  int version = 0;
  CK(cuDriverGetVersion(&version));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  EXPECT(cuDeviceGet(&dev, 99), CUDA_ERROR_INVALID_DEVICE);
  const char *name = nullptr;
  CK(cuGetErrorName(CUDA_ERROR_NOT_SUPPORTED, &name));
  if (strcmp(name, "CUDA_ERROR_NOT_SUPPORTED") != 0) { printf("FAIL error name %s\n", name); return 1; }

  // Context stack.
  CUcontext primary, own, cur, popped;
  CK(cuDevicePrimaryCtxRetain(&primary, dev));
  unsigned flags = 0;
  int active = 0;
  CK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  if (!active) { printf("FAIL primary not active\n"); return 1; }
  CK(cuCtxSetCurrent(primary));
  CK(cuCtxCreate(&own, nullptr, 0, dev));
  CK(cuCtxGetCurrent(&cur));
  if (cur != own) { printf("FAIL created context not current\n"); return 1; }
  CK(cuCtxPopCurrent(&popped));
  CK(cuCtxGetCurrent(&cur));
  if (popped != own || cur != primary) { printf("FAIL pop\n"); return 1; }
  CK(cuCtxPushCurrent(own));
  CUdevice cdev = -1;
  CK(cuCtxGetDevice(&cdev));
  if (cdev != dev) { printf("FAIL ctx device\n"); return 1; }
  CK(cuCtxPopCurrent(&popped));
  CK(cuCtxDestroy(own));

  // Module from PTX text.
  CUmodule ptx_mod;
  CK(cuModuleLoadData(&ptx_mod, kPtx));
  CUfunction scale;
  CK(cuModuleGetFunction(&scale, ptx_mod, "scale"));
  EXPECT(cuModuleGetFunction(&scale, ptx_mod, "nope"), CUDA_ERROR_NOT_FOUND);
  CK(cuModuleGetFunction(&scale, ptx_mod, "scale"));
  size_t off = 0, size = 0;
  CK(cuFuncGetParamInfo(scale, 1, &off, &size));
  if (off != 8 || size != 4) { printf("FAIL param info %zu %zu\n", off, size); return 1; }
  int max_threads = 0;
  CK(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale));
  if (max_threads < 32) { printf("FAIL max threads %d\n", max_threads); return 1; }
  CUdeviceptr counter;
  size_t counter_size = 0;
  CK(cuModuleGetGlobal(&counter, &counter_size, ptx_mod, "counter"));
  if (counter_size != 4) { printf("FAIL global size %zu\n", counter_size); return 1; }

  const int N = 1000;
  std::vector<float> h(N);
  for (int i = 0; i < N; i++) h[i] = (float)i;
  CUdeviceptr d;
  CK(cuMemAlloc(&d, N * sizeof(float)));
  CK(cuMemcpyHtoD(d, h.data(), N * sizeof(float)));
  CK(cuMemsetD32(counter, 0, 1));

  // kernelParams.
  float s = 2.0f;
  int n = N;
  void *params[] = {&d, &s, &n};
  CK(cuLaunchKernel(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  // `extra`: one packed buffer.
  struct { CUdeviceptr data; float s; int n; } packed = {d, 0.5f, N};
  size_t packed_size = sizeof packed;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_size, CU_LAUNCH_PARAM_END};
  CK(cuLaunchKernel(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra));
  // cuLaunchKernelEx with a cooperative attribute.
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attr.value.cooperative = 1;
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDimX = (N + 127) / 128; cfg.gridDimY = 1; cfg.gridDimZ = 1;
  cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1;
  cfg.attrs = &attr; cfg.numAttrs = 1;
  s = 3.0f;
  CK(cuLaunchKernelEx(&cfg, scale, params, nullptr));
  CK(cuCtxSynchronize());
  CK(cuMemcpyDtoH(h.data(), d, N * sizeof(float)));
  for (int i = 0; i < N; i++)
    if (h[i] != 3.0f * i) { printf("FAIL scale at %d: %f\n", i, h[i]); return 1; }
  unsigned hits = 0;
  CK(cuMemcpyDtoH(&hits, counter, 4));
  if (hits != 3 * N) { printf("FAIL counter %u\n", hits); return 1; }

  // Rejected at the call.
  EXPECT(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT(cuLaunchKernel(scale, 1, 1, 1, 2048, 1, 1, 0, nullptr, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuLaunchKernel(scale, 0, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuLaunchKernel(scale, 1, 1, 1, 32, 1, 1, 1 << 30, nullptr, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  CK(cuCtxSynchronize());

  // Library and kernel handles over the same PTX.
  CUlibrary lib;
  CK(cuLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel;
  CK(cuLibraryGetKernel(&kernel, lib, "scale"));
  CUfunction kf;
  CK(cuKernelGetFunction(&kf, kernel));
  const char *kname = nullptr;
  CK(cuFuncGetName(&kname, kf));
  if (strcmp(kname, "scale") != 0) { printf("FAIL kernel name\n"); return 1; }
  CUdeviceptr lib_counter;
  CK(cuLibraryGetGlobal(&lib_counter, nullptr, lib, "counter"));
  CK(cuLibraryUnload(lib));

  // Module from a file (argv[1], a fat binary of this directory's kernels).
  if (argc > 1) {
    CUmodule file_mod;
    CK(cuModuleLoad(&file_mod, argv[1]));
    CUfunction f;
    CK(cuModuleGetFunction(&f, file_mod, "scale"));
    CK(cuModuleUnload(file_mod));
  }
  EXPECT(cuModuleLoad(&ptx_mod, "/nonexistent/module.cubin"), CUDA_ERROR_FILE_NOT_FOUND);

  // Memsets of every width, 2-D included.
  CUdeviceptr m;
  CK(cuMemAlloc(&m, 4096));
  CK(cuMemsetD8(m, 0xab, 4096));
  CK(cuMemsetD16(m + 16, 0x1234, 4));
  CK(cuMemsetD2D32(m + 1024, 256, 0xdeadbeef, 2, 3));
  unsigned char bytes[4096];
  CK(cuMemcpyDtoH(bytes, m, sizeof bytes));
  if (bytes[0] != 0xab || bytes[15] != 0xab || bytes[16] != 0x34 || bytes[17] != 0x12 || bytes[24] != 0xab) {
    printf("FAIL memset D8/D16\n");
    return 1;
  }
  unsigned w0, w1, w2;
  memcpy(&w0, bytes + 1024 + 256, 4);
  memcpy(&w1, bytes + 1024 + 256 + 8, 4);
  memcpy(&w2, bytes + 1024 + 3 * 256, 4);
  if (w0 != 0xdeadbeef || w1 != 0xabababab || w2 != 0xabababab) { printf("FAIL memset 2D\n"); return 1; }

  // 3-D copy: a 4x3x2 box out of a pitched host volume.
  unsigned char vol[2][3][16], back[2][3][4];
  for (int z = 0; z < 2; z++) for (int y = 0; y < 3; y++) for (int x = 0; x < 16; x++) vol[z][y][x] = z * 100 + y * 10 + x;
  CUDA_MEMCPY3D c3;
  memset(&c3, 0, sizeof c3);
  c3.srcMemoryType = CU_MEMORYTYPE_HOST; c3.srcHost = vol; c3.srcPitch = 16; c3.srcHeight = 3; c3.srcXInBytes = 2;
  c3.dstMemoryType = CU_MEMORYTYPE_DEVICE; c3.dstDevice = m; c3.dstPitch = 4; c3.dstHeight = 3;
  c3.WidthInBytes = 4; c3.Height = 3; c3.Depth = 2;
  CK(cuMemcpy3D(&c3));
  CK(cuMemcpyDtoH(back, m, sizeof back));
  for (int z = 0; z < 2; z++) for (int y = 0; y < 3; y++) for (int x = 0; x < 4; x++)
    if (back[z][y][x] != z * 100 + y * 10 + x + 2) { printf("FAIL 3D at %d %d %d\n", z, y, x); return 1; }

  // Stream-ordered allocator.
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a;
  CK(cuMemAllocAsync(&a, 1 << 20, st));
  CK(cuMemsetD32Async(a, 7, 1 << 18, st));
  unsigned seven = 0;
  CK(cuMemcpyDtoHAsync(&seven, a + 400, 4, st));
  CK(cuMemFreeAsync(a, st));
  CK(cuStreamSynchronize(st));
  if (seven != 7) { printf("FAIL async alloc %u\n", seven); return 1; }
  CUmemoryPool pool;
  CK(cuDeviceGetDefaultMemPool(&pool, dev));
  cuuint64_t threshold = ~0ull;
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));

  // Pointer queries.
  CUdeviceptr base;
  size_t range = 0;
  CK(cuMemGetAddressRange(&base, &range, d + 100));
  if (base != d || range != N * sizeof(float)) { printf("FAIL address range\n"); return 1; }
  unsigned mem_type = 0;
  CK(cuPointerGetAttribute(&mem_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d));
  if (mem_type != CU_MEMORYTYPE_DEVICE) { printf("FAIL memory type\n"); return 1; }

  // Device printf reaches our stdout, in order with the host's own output.
  printf("before the kernel\n");
  fflush(stdout);
  CUmodule self_mod;
  CUfunction hello_fn;
  (void)self_mod;
  (void)hello_fn;
  hello<<<1, 1>>>(42);
  CK(cuCtxSynchronize());
  printf("after the kernel\n");

  CK(cuStreamDestroy(st));
  CK(cuMemFree(m));
  CK(cuMemFree(d));
  CK(cuModuleUnload(ptx_mod));
  CK(cuDevicePrimaryCtxRelease(dev));
  printf("PASS\n");
  return 0;
}
