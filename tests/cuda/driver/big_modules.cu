// Loads libraries of large images, as PyTorch loads cuBLAS's fat binaries:
// a small PTX kernel followed by a long comment, each image of its own size
// (MiB: the arguments, or four between 1 and 24 MiB), each launched once and
// checked, all kept loaded until the end. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

#include "check.h"

static const char *kKernel =
    ".version 7.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 p_ptr, .param .u32 p_n)\n{\n"
    "  .reg .pred %p<2>;\n  .reg .b32 %r<7>;\n  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p_ptr];\n  ld.param.u32 %r1, [p_n];\n"
    "  mov.u32 %r2, %ctaid.x;\n  mov.u32 %r3, %ntid.x;\n  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n  setp.ge.s32 %p1, %r5, %r1;\n  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n  mul.wide.s32 %rd3, %r5, 4;\n  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n  add.s32 %r6, %r6, 1;\n  st.global.u32 [%rd4], %r6;\n"
    "DONE:\n  ret;\n}\n";

int main(int argc, char **argv) {
  srand((unsigned)getpid());
  std::vector<size_t> mib;
  for (int i = 1; i < argc; i++) mib.push_back(strtoul(argv[i], nullptr, 10));
  if (mib.empty())
    for (int i = 0; i < 4; i++) mib.push_back(1 + rand() % 24);
  const int n = 1 << 12;
  int *dev;
  CHECK(cudaMalloc(&dev, n * sizeof(int)));
  CHECK(cudaMemset(dev, 0, n * sizeof(int)));
  std::vector<cudaLibrary_t> libs;
  for (size_t m : mib) {
    std::string image(kKernel);
    const std::string line = "// " + std::string(60, 'x') + "\n";
    while (image.size() + line.size() < (m << 20)) image += line;
    cudaLibrary_t lib;
    CHECK(cudaLibraryLoadData(&lib, image.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t k;
    CHECK(cudaLibraryGetKernel(&k, lib, "add_one"));
    int count = n;
    void *args[] = {&dev, &count};
    CHECK(cudaLaunchKernel((const void *)k, dim3(n / 256), dim3(256), args, 0, 0));
    libs.push_back(lib);
  }
  std::vector<int> host(n);
  CHECK(cudaMemcpy(host.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++)
    if (host[i] != (int)mib.size()) { printf("FAIL at %d: %d\n", i, host[i]); return 1; }
  for (cudaLibrary_t lib : libs) CHECK(cudaLibraryUnload(lib));
  printf("PASS\n");
  return 0;
}
