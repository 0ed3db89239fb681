/* A plain C program on the CUDA 12 runtime (libcudart.so.12, dynamically
 * linked): initialises, allocates, copies, loads a module from PTX text and
 * launches it through driver entry points the runtime hands out, and also
 * loads it as a library through the runtime. Prints PASS.
 *
 * Built with gcc against the toolkit headers: see crates/cli/tests/e2e_driver.rs. */
#include <stdio.h>
#include <string.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "check.h"

#define CHECK_CU(x)                                                           \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      printf("FAIL %s:%d %s -> CUresult %d\n", __FILE__, __LINE__, #x, r_);   \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static const char *ptx =
    ".version 8.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry saxpy(\n"
    "  .param .f32 saxpy_param_0,\n"
    "  .param .u64 saxpy_param_1,\n"
    "  .param .u64 saxpy_param_2,\n"
    "  .param .u32 saxpy_param_3\n"
    ")\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .f32 %f<5>;\n"
    "  .reg .b32 %r<6>;\n"
    "  .reg .b64 %rd<8>;\n"
    "  ld.param.f32 %f1, [saxpy_param_0];\n"
    "  ld.param.u64 %rd1, [saxpy_param_1];\n"
    "  ld.param.u64 %rd2, [saxpy_param_2];\n"
    "  ld.param.u32 %r2, [saxpy_param_3];\n"
    "  mov.u32 %r3, %ctaid.x;\n"
    "  mov.u32 %r4, %ntid.x;\n"
    "  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.s32 %p1, %r1, %r2;\n"
    "  @%p1 bra $L__BB0_2;\n"
    "  cvta.to.global.u64 %rd3, %rd2;\n"
    "  cvta.to.global.u64 %rd4, %rd1;\n"
    "  mul.wide.s32 %rd5, %r1, 4;\n"
    "  add.s64 %rd6, %rd4, %rd5;\n"
    "  ld.global.f32 %f2, [%rd6];\n"
    "  add.s64 %rd7, %rd3, %rd5;\n"
    "  ld.global.f32 %f3, [%rd7];\n"
    "  fma.rn.f32 %f4, %f2, %f1, %f3;\n"
    "  st.global.f32 [%rd7], %f4;\n"
    "$L__BB0_2:\n"
    "  ret;\n"
    "}\n";

typedef CUresult (*ModuleLoadData)(CUmodule *, const void *);
typedef CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
typedef CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **);

static int entry(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult status;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || *fn == NULL) {
    printf("FAIL entry point %s: %s (%d)\n", name, cudaGetErrorString(e), (int)status);
    return 1;
  }
  return 0;
}

int main(void) {
  int count = 0, runtime = 0;
  CHECK(cudaGetDeviceCount(&count));
  CHECK(cudaRuntimeGetVersion(&runtime));
  printf("devices: %d runtime: %d\n", count, runtime);
  if (count < 1 || runtime / 1000 != 12) { printf("FAIL setup\n"); return 1; }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(0)); /* makes the primary context current */

  enum { N = 1000 };
  float hx[N], hy[N];
  for (int i = 0; i < N; i++) { hx[i] = (float)i; hy[i] = 1.0f; }
  float *x, *y;
  CHECK(cudaMalloc((void **)&x, sizeof hx));
  CHECK(cudaMalloc((void **)&y, sizeof hy));
  CHECK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(y, hy, sizeof hy, cudaMemcpyHostToDevice));

  ModuleLoadData load;
  ModuleGetFunction get;
  LaunchKernel launch;
  if (entry("cuModuleLoadData", (void **)&load) || entry("cuModuleGetFunction", (void **)&get) ||
      entry("cuLaunchKernel", (void **)&launch))
    return 1;
  CUmodule module;
  CUfunction saxpy;
  CHECK_CU(load(&module, ptx));
  CHECK_CU(get(&saxpy, module, "saxpy"));
  float a = 2.0f;
  int n = N;
  void *args[] = {&a, &x, &y, &n};
  CHECK_CU(launch(saxpy, (N + 127) / 128, 1, 1, 128, 1, 1, 0, 0, args, NULL));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) {
    if (hy[i] != 2.0f * i + 1.0f) { printf("FAIL y[%d] = %f\n", i, hy[i]); return 1; }
  }

  /* The same PTX as a library, through the runtime. */
  cudaLibrary_t library;
  cudaKernel_t kernel;
  CHECK(cudaLibraryLoadData(&library, ptx, NULL, NULL, 0, NULL, NULL, 0));
  CHECK(cudaLibraryGetKernel(&kernel, library, "saxpy"));
  if (kernel == NULL) { printf("FAIL null kernel\n"); return 1; }
  CHECK(cudaLibraryUnload(library));

  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  printf("PASS\n");
  return 0;
}
