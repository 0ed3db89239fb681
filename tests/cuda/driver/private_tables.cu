// The driver's private tables that NVIDIA's math libraries call, used the way
// they use them (observed natively with bench/h100/probes/export_log.sh):
// - tools module (6e163fbe-…), slot 7: cuFFT finds a plan's kernel by
//   visiting the functions of the module it loaded;
// - tools context (21318c60-…), slots 51 and 39: cuSOLVER's getrs asks for an
//   object of the context, then a value of it.
// The functions found are launched and their results checked. Prints each
// table's answers and PASS. Linked with -lcuda.
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda.h>

#include "check.h"

static const char *kOneKernel = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry add_one(.param .u64 p, .param .u32 n) {
  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .f32 %f<3>; .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.s32 %p1, %r5, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.s32 %rd3, %r5, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  add.f32 %f2, %f1, 0f3F800000;
  st.global.f32 [%rd4], %f2;
DONE:
  ret;
}
)";

static const char *kTwoKernels = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry set_two(.param .u64 p) {
  .reg .b64 %rd<3>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.f32 %f1, 0f40000000;
  st.global.f32 [%rd2], %f1;
  ret;
}
.visible .entry set_three(.param .u64 p) {
  .reg .b64 %rd<3>; .reg .f32 %f<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.f32 %f1, 0f40400000;
  st.global.f32 [%rd2], %f1;
  ret;
}
)";

static const CUuuid kToolsModule = {{(char)0x6e, (char)0x16, (char)0x3f, (char)0xbe, (char)0xb9,
                                     (char)0x58, (char)0x44, (char)0x4d, (char)0x83, (char)0x5c,
                                     (char)0xe1, (char)0x82, (char)0xaf, (char)0xf1, (char)0x99,
                                     (char)0x1e}};
static const CUuuid kToolsContext = {{(char)0x21, (char)0x31, (char)0x8c, (char)0x60, (char)0x97,
                                      (char)0x14, (char)0x32, (char)0x48, (char)0x8c, (char)0xa6,
                                      (char)0x41, (char)0xff, (char)0x73, (char)0x24, (char)0xc8,
                                      (char)0xf2}};

typedef void (*visitor_fn)(void *, CUfunction, unsigned long long);
typedef unsigned (*visit_functions_fn)(CUcontext, CUmodule, visitor_fn, void *);
typedef CUresult (*context_object_fn)(CUcontext, unsigned long long, const void **);
typedef CUresult (*context_value_fn)(CUcontext, const void *, unsigned long long *);

static void keep(void *user, CUfunction f, unsigned long long) {
  static_cast<std::vector<CUfunction> *>(user)->push_back(f);
}

// The functions of a module, as slot 7 visits them; prints its answer.
static std::vector<CUfunction> visit(const void *const *table, CUcontext ctx, CUmodule m,
                                     const char *what) {
  std::vector<CUfunction> seen;
  unsigned answer = ((visit_functions_fn)table[7])(ctx, m, keep, &seen);
  printf("tools module slot 7 on %s: answered %u, visited %zu\n", what, answer, seen.size());
  return seen;
}

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));

  const void *const *module_table = nullptr;
  CK(cuGetExportTable((const void **)&module_table, &kToolsModule));
  printf("tools module table: %llu bytes\n", (unsigned long long)(size_t)module_table[0]);

  CUmodule one, two;
  CK(cuModuleLoadData(&one, kOneKernel));
  CK(cuModuleLoadData(&two, kTwoKernels));
  std::vector<CUfunction> f1 = visit(module_table, ctx, one, "one kernel");
  std::vector<CUfunction> f2 = visit(module_table, ctx, two, "two kernels");
  if (f1.size() != 1 || f2.size() != 2) {
    printf("FAIL visited %zu and %zu functions, want 1 and 2\n", f1.size(), f2.size());
    return 1;
  }

  // Launch what was found: add_one over n floats, then each of set_two/set_three.
  const unsigned n = 1000;
  CUdeviceptr d;
  CK(cuMemAlloc(&d, n * sizeof(float)));
  CK(cuMemsetD32(d, 0x3f800000u, n));  // 1.0f
  void *args1[] = {&d, (void *)&n};
  CK(cuLaunchKernel(f1[0], (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args1, nullptr));
  std::vector<float> h(n);
  CK(cuMemcpyDtoH(h.data(), d, n * sizeof(float)));
  for (unsigned i = 0; i < n; i++) {
    if (h[i] != 2.0f) {
      printf("FAIL add_one found by slot 7 gave %f at %u\n", h[i], i);
      return 1;
    }
  }
  float seen_values[2];
  for (int k = 0; k < 2; k++) {
    void *args[] = {&d};
    CK(cuLaunchKernel(f2[k], 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    CK(cuMemcpyDtoH(&seen_values[k], d, sizeof(float)));
  }
  bool both = (seen_values[0] == 2.0f && seen_values[1] == 3.0f) ||
              (seen_values[0] == 3.0f && seen_values[1] == 2.0f);
  if (!both) {
    printf("FAIL the two kernels found wrote %f and %f\n", seen_values[0], seen_values[1]);
    return 1;
  }

  const void *const *context_table = nullptr;
  CK(cuGetExportTable((const void **)&context_table, &kToolsContext));
  const void *object = nullptr;
  CK(((context_object_fn)context_table[51])(ctx, 0, &object));
  unsigned long long value = 0;
  CK(((context_value_fn)context_table[39])(ctx, object, &value));
  printf("tools context slot 51: %s object; slot 39: %llu\n", object ? "an" : "no", value);
  if (!object) {
    printf("FAIL slot 51 gave no object\n");
    return 1;
  }

  CK(cuMemFree(d));
  CK(cuModuleUnload(one));
  CK(cuModuleUnload(two));
  CK(cuDevicePrimaryCtxRelease(dev));
  printf("PASS\n");
  return 0;
}
