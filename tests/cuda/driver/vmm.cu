// Virtual memory management as PyTorch's expandable segments and XLA use it:
// a large reservation, physical allocations created and mapped side by side
// as the segment grows, access set, kernels, copies and memsets across the
// boundaries between them; the driver's answers to misaligned calls (measured
// on an H200, driver 580); unmapped, released, freed. Linked with -lcuda.
// Prints PASS.
#include <cstdio>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

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

__global__ void fill(unsigned *p, size_t n, unsigned first) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = first + (unsigned)i;
}

__global__ void add_one(unsigned *p, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

// Checks that words [0, n) at device address p are first, first + 1, ….
static int expect_words(CUdeviceptr p, size_t n, unsigned first, const char *what) {
  std::vector<unsigned> host(n);
  if (cudaMemcpy(host.data(), (void *)p, n * 4, cudaMemcpyDefault) != cudaSuccess) {
    printf("FAIL %s: copy back\n", what);
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    if (host[i] != first + (unsigned)i) {
      printf("FAIL %s: word %zu is %u, want %u\n", what, i, host[i], first + (unsigned)i);
      return 1;
    }
  return 0;
}

int main() {
  CHECK(cudaFree(0));  // the runtime's primary context, current
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  int supported = 0;
  CK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  if (!supported) { printf("FAIL no virtual memory management\n"); return 1; }

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0, recommended = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (gran == 0 || recommended % gran != 0) { printf("FAIL granularity %zu %zu\n", gran, recommended); return 1; }
  EXPECT(cuMemGetAllocationGranularity(&gran, &prop, (CUmemAllocationGranularity_flags)7), CUDA_ERROR_INVALID_VALUE);

  // Room for eight segments of one granule; the segment grows into it.
  const size_t seg = gran;
  CUdeviceptr base = 0, unused = 0;
  EXPECT(cuMemAddressReserve(&unused, 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemAddressReserve(&unused, seg, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CK(cuMemAddressReserve(&base, 8 * seg, 0, 0, 0));
  if (base % gran != 0) { printf("FAIL reservation at %llx\n", (unsigned long long)base); return 1; }

  // PyTorch asks for a shareable file descriptor; the others ask for none.
  CUmemAllocationProp shareable = prop;
  shareable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h[3], bad;
  EXPECT(cuMemCreate(&bad, seg + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemCreate(&bad, seg, &prop, 1), CUDA_ERROR_INVALID_VALUE);
  CK(cuMemCreate(&h[0], seg, &shareable, 0));
  CK(cuMemCreate(&h[1], seg, &prop, 0));
  CK(cuMemCreate(&h[2], seg, &prop, 0));

  // Two handles side by side, access set for both in one call.
  EXPECT(cuMemMap(base + seg / 2, seg, 0, h[0], 0), CUDA_ERROR_INVALID_VALUE);
  CK(cuMemMap(base, seg, 0, h[0], 0));
  EXPECT(cuMemMap(base, seg, 0, h[1], 0), CUDA_ERROR_INVALID_VALUE);
  CK(cuMemMap(base + seg, seg, 0, h[1], 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  unsigned long long flags = 99;
  CK(cuMemGetAccess(&flags, &prop.location, base + 8));
  if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) { printf("FAIL access before %llu\n", flags); return 1; }
  EXPECT(cuMemSetAccess(base, 3 * seg, &access, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemSetAccess(base, 2 * seg, &access, 0), CUDA_ERROR_INVALID_VALUE);
  CK(cuMemSetAccess(base, 2 * seg, &access, 1));
  CK(cuMemGetAccess(&flags, &prop.location, base + seg + 8));
  if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) { printf("FAIL access %llu\n", flags); return 1; }

  // A kernel writes 2048 words across the boundary; read back.
  const size_t n = 2048;
  CUdeviceptr edge = base + seg - n / 2 * 4;
  fill<<<(n + 255) / 256, 256>>>((unsigned *)edge, n, 1000);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (expect_words(edge, n, 1000, "kernel across the boundary")) return 1;

  // Pointer queries see device memory, each mapping its own range.
  CUmemorytype type = (CUmemorytype)0;
  CK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + seg + 8));
  if (type != CU_MEMORYTYPE_DEVICE) { printf("FAIL memory type %d\n", (int)type); return 1; }
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  CK(cuMemGetAddressRange(&range_base, &range_size, base + seg + 8));
  if (range_base != base + seg || range_size != seg) { printf("FAIL address range\n"); return 1; }

  // The segment grows by a third handle; a kernel, a copy and a memset
  // across the second boundary.
  CK(cuMemMap(base + 2 * seg, seg, 0, h[2], 0));
  CK(cuMemSetAccess(base + 2 * seg, seg, &access, 1));
  CUdeviceptr edge2 = base + 2 * seg - n / 2 * 4;
  CHECK(cudaMemcpy((void *)edge2, (void *)edge, n * 4, cudaMemcpyDeviceToDevice));
  add_one<<<(n + 255) / 256, 256>>>((unsigned *)edge2, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (expect_words(edge2, n, 1001, "copy and kernel across the second boundary")) return 1;
  CK(cuMemsetD32(edge2 + (n / 2 - 2) * 4, 7, 4));
  unsigned words[6];
  CK(cuMemcpyDtoH(words, edge2 + (n / 2 - 3) * 4, sizeof words));
  if (words[0] != 1001 + n / 2 - 3 || words[1] != 7 || words[4] != 7 || words[5] != 1001 + n / 2 + 2) {
    printf("FAIL memset across the boundary: %u %u %u %u\n", words[0], words[1], words[4], words[5]);
    return 1;
  }

  // The handle behind an address, and a handle's properties.
  CUmemGenericAllocationHandle retained = 0;
  CK(cuMemRetainAllocationHandle(&retained, (void *)(base + seg + 100)));
  if (retained != h[1]) { printf("FAIL retained handle\n"); return 1; }
  CK(cuMemRelease(retained));
  EXPECT(cuMemRetainAllocationHandle(&retained, (void *)(base + 3 * seg)), CUDA_ERROR_INVALID_VALUE);
  CUmemAllocationProp got = {};
  CK(cuMemGetAllocationPropertiesFromHandle(&got, h[0]));
  if (got.type != CU_MEM_ALLOCATION_TYPE_PINNED || got.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      got.location.id != dev || got.requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    printf("FAIL properties\n");
    return 1;
  }

  // Compressible memory: granted where the device says it compresses (the
  // properties say so), never where it does not.
  int compresses = 0;
  CK(cuDeviceGetAttribute(&compresses, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev));
  CUmemAllocationProp compressible = prop;
  compressible.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
  CUmemGenericAllocationHandle packed;
  CK(cuMemCreate(&packed, seg, &compressible, 0));
  CUmemAllocationProp packed_got = {};
  CK(cuMemGetAllocationPropertiesFromHandle(&packed_got, packed));
  if ((packed_got.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC) != (compresses != 0)) {
    printf("FAIL compression %d on a device that says %d\n", packed_got.allocFlags.compressionType, compresses);
    return 1;
  }
  if (got.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE) { printf("FAIL compressed unasked\n"); return 1; }
  CK(cuMemRelease(packed));

  // Nothing goes while mapped, and no mapping is cut in two.
  EXPECT(cuMemAddressFree(base, 8 * seg), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMemUnmap(base, seg / 2), CUDA_ERROR_INVALID_VALUE);
  // Released while mapped: the memory stays until it is unmapped.
  CK(cuMemRelease(h[0]));
  if (expect_words(edge, n / 2, 1000, "memory of a released handle")) return 1;
  CK(cuMemUnmap(base, 3 * seg));
  CK(cuMemRelease(h[1]));
  CK(cuMemRelease(h[2]));
  CK(cuMemAddressFree(base, 8 * seg));
  EXPECT(cuMemAddressFree(base, 8 * seg), CUDA_ERROR_INVALID_VALUE);
  printf("PASS\n");
  return 0;
}
