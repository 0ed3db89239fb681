// Stream-ordered memory pools: attributes that stick and read back, usage
// statistics that follow the allocations, a pool's size limit, the device's
// current pool, access descriptors, and the properties a pool cannot have here refused rather than
// ignored.
// Prints PASS.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *v, int n, int value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = value + i;
}

static uint64_t attr64(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = 12345;
  if (cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess) return ~0ull;
  return v;
}

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  // A device whose pools work says so (NVIDIA's samples waive without it).
  int pools = 0;
  CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0));
  REQUIRE(pools == 1, "the device says it has no memory pools (%d)", pools);

  // The default pool: the release threshold and a reuse policy stick.
  cudaMemPool_t def;
  CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
  uint64_t threshold = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
  REQUIRE(attr64(def, cudaMemPoolAttrReleaseThreshold) == UINT64_MAX, "release threshold did not stick");
  int no = 0, got = -1;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &no));
  CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &got));
  REQUIRE(got == 0, "reuse policy read back %d", got);
  // Read-only statistics cannot be set; high-water marks only to 0.
  uint64_t five = 5;
  REQUIRE(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &five) == cudaErrorInvalidValue,
         "a read-only attribute was set");
  REQUIRE(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &five) == cudaErrorInvalidValue,
         "a high-water mark was set to 5");
  cudaGetLastError();

  // Statistics follow stream-ordered allocations from the default pool.
  const int n = 1 << 16;
  int *a;
  CHECK(cudaMallocAsync((void **)&a, n * sizeof(int), s));
  REQUIRE(attr64(def, cudaMemPoolAttrUsedMemCurrent) >= n * sizeof(int), "used after an allocation");
  fill<<<(n + 255) / 256, 256, 0, s>>>(a, n, 7);
  int back[4];
  CHECK(cudaMemcpyAsync(back, a + n - 4, sizeof back, cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(a, s));
  CHECK(cudaStreamSynchronize(s));
  REQUIRE(back[3] == 7 + n - 1, "pool memory holds %d", back[3]);
  REQUIRE(attr64(def, cudaMemPoolAttrUsedMemCurrent) == 0, "used after the free");
  REQUIRE(attr64(def, cudaMemPoolAttrUsedMemHigh) >= n * sizeof(int), "high-water mark");
  uint64_t zero = 0;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero));
  REQUIRE(attr64(def, cudaMemPoolAttrUsedMemHigh) == 0, "high-water mark after its reset");

  // A pool of our own, later made the device's current pool.
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  props.maxSize = 2 << 20;
  cudaMemPool_t mine;
  CHECK(cudaMemPoolCreate(&mine, &props));
  // Its size limit holds as NVIDIA's driver holds it: never below 32 MiB.
  int *chunks[33];
  int taken = 0;
  while (taken < 33 && cudaMallocFromPoolAsync((void **)&chunks[taken], 1 << 20, mine, s) == cudaSuccess)
    taken++;
  cudaGetLastError();
  REQUIRE(taken == 32, "%d allocations of 1 MiB under a 2 MiB limit (32 natively)", taken);
  for (int i = 0; i < taken; i++) CHECK(cudaFreeAsync(chunks[i], s));
  CHECK(cudaStreamSynchronize(s));
  int *b, *c;
  CHECK(cudaMallocFromPoolAsync((void **)&b, 1536 << 10, mine, s));
  REQUIRE(attr64(mine, cudaMemPoolAttrUsedMemCurrent) == 1536 << 10, "the pool's use");
  CHECK(cudaDeviceSetMemPool(0, mine));
  cudaMemPool_t current;
  CHECK(cudaDeviceGetMemPool(&current, 0));
  REQUIRE(current == mine, "the current pool");
  CHECK(cudaMallocAsync((void **)&c, 256 << 10, s));
  REQUIRE(attr64(mine, cudaMemPoolAttrUsedMemCurrent) == 1792 << 10, "cudaMallocAsync took from the current pool");
  CHECK(cudaFreeAsync(b, s));
  CHECK(cudaFreeAsync(c, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemPoolTrimTo(mine, 0));

  // Access: the pool's own device reads and writes it.
  cudaMemLocation here = {};
  here.type = cudaMemLocationTypeDevice;
  here.id = 0;
  cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
  CHECK(cudaMemPoolGetAccess(&flags, mine, &here));
  REQUIRE(flags == cudaMemAccessFlagsProtReadWrite, "own device's access %d", (int)flags);
  cudaMemAccessDesc desc = {};
  desc.location = here;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK(cudaMemPoolSetAccess(mine, &desc, 1));

  // A default pool is never destroyed; ours is.
  CHECK(cudaDeviceSetMemPool(0, def));
  REQUIRE(cudaMemPoolDestroy(def) != cudaSuccess, "the default pool was destroyed");
  cudaGetLastError();
  CHECK(cudaMemPoolDestroy(mine));

  // What a pool cannot be here is refused, as the device attribute says.
  int ipc_types = -1;
  CHECK(cudaDeviceGetAttribute(&ipc_types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
  cudaMemPoolProps ipc = props;
  ipc.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  cudaMemPool_t shared;
  cudaError_t e = cudaMemPoolCreate(&shared, &ipc);
  if (ipc_types == 0) {
    REQUIRE(e == cudaErrorNotSupported, "a pool with IPC handles: %s", cudaGetErrorName(e));
  } else {
    CHECK(e);
    CHECK(cudaMemPoolDestroy(shared));
  }
  cudaGetLastError();

  CHECK(cudaStreamDestroy(s));
  printf("PASS\n");
  return 0;
}
