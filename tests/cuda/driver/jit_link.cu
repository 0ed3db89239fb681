// JIT linking of relocatable device code: argv[1] is PTX of a kernel that
// calls an extern device function, argv[2] PTX that defines it (both from
// `nvcc -rdc=true -ptx`). Links them with cuLink*, loads and runs the result.
// Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda.h>

#include "check.h"

static std::vector<char> read_file(const char *path) {
  std::vector<char> text;
  FILE *f = fopen(path, "rb");
  if (!f) return text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.insert(text.end(), buf, buf + n);
  fclose(f);
  text.push_back(0);
  return text;
}

int main(int argc, char **argv) {
  if (argc < 3) { printf("FAIL usage: jit_link USER.ptx HELPER.ptx\n"); return 1; }
  std::vector<char> user = read_file(argv[1]);
  if (user.size() < 2) { printf("FAIL cannot read %s\n", argv[1]); return 1; }
  CK(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));

  CUlinkState link;
  CK(cuLinkCreate(0, nullptr, nullptr, &link));
  CK(cuLinkAddData(link, CU_JIT_INPUT_PTX, user.data(), user.size(), "user.ptx", 0, nullptr, nullptr));
  CK(cuLinkAddFile(link, CU_JIT_INPUT_PTX, argv[2], 0, nullptr, nullptr));
  void *image = nullptr;
  size_t size = 0;
  CK(cuLinkComplete(link, &image, &size));
  if (!image || !size) { printf("FAIL empty link output\n"); return 1; }
  CUmodule module;
  CK(cuModuleLoadData(&module, image));
  CK(cuLinkDestroy(link));

  CUfunction k;
  CK(cuModuleGetFunction(&k, module, "_Z1kPi"));
  CUdeviceptr out;
  CK(cuMemAlloc(&out, 32 * sizeof(int)));
  void *params[] = {&out};
  CK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  int host[32];
  CK(cuMemcpyDtoH(host, out, sizeof host));
  for (int i = 0; i < 32; i++)
    if (host[i] != 5 * i + 1) { printf("FAIL out[%d] = %d\n", i, host[i]); return 1; }
  CK(cuMemFree(out));
  CK(cuModuleUnload(module));
  printf("PASS\n");
  return 0;
}
