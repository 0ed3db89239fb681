// One program on two devices, through the CUDA runtime: memory, kernels and
// streams on each; pointers of the two never alias and say their device;
// copies between them (cudaMemcpyPeer, cudaMemcpy by unified address, and
// cudaMemcpyPeerAsync ordered after an event of the other device); each
// device synchronizes alone; peer access, where the devices have it, lets a
// kernel of one read the other's memory, and virtual memory made on one
// device is given to the other by cuMemSetAccess (as XLA gives every peer
// access to each device's memory), refused where the devices have no peer
// access. Prints the devices' peer access as
// "can_access_peer: N", "peer_access: used|unsupported" and PASS; with fewer
// than two devices it prints "SKIP: one device" and exits 0.
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"

static const int N = 1 << 16;

__global__ void fill(int *p, int value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value + i;
}

// Reads another device's memory directly (peer access).
__global__ void copy_from(int *dst, const int *src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// The driver's entry point `name`, through the runtime (no -lcuda).
template <typename F> static F driver(const char *name) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess) return nullptr;
  return (F)fn;
}

#define CU(x)                                                                 \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      printf("FAIL %s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)r_);        \
      return 1;                                                               \
    }                                                                         \
  } while (0)

__global__ void fill(int *p, int value, int n);

// Memory made on device 1 and mapped there; device 0 given access to it by
// cuMemSetAccess where it can reach device 1, refused where it cannot.
static int vmm_across_devices(int can) {
  auto create = driver<CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)>("cuMemCreate");
  auto granularity = driver<CUresult (*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)>("cuMemGetAllocationGranularity");
  auto reserve = driver<CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)>("cuMemAddressReserve");
  auto map = driver<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>("cuMemMap");
  auto set_access = driver<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)>("cuMemSetAccess");
  auto get_access = driver<CUresult (*)(unsigned long long *, const CUmemLocation *, CUdeviceptr)>("cuMemGetAccess");
  auto unmap = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto release = driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  auto address_free = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  if (!create || !granularity || !reserve || !map || !set_access || !get_access || !unmap || !release || !address_free) {
    printf("FAIL: a virtual memory entry point is missing\n");
    return 1;
  }
  CHECK(cudaSetDevice(1));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  size_t size = 0;
  CU(granularity(&size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  CU(create(&h, size, &prop, 0));
  CUdeviceptr va = 0;
  CU(reserve(&va, size, 0, 0, 0));
  CU(map(va, size, 0, h, 0));
  CUmemAccessDesc desc[2] = {};
  for (int d = 0; d < 2; d++) {
    desc[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[d].location.id = 1 - d;
    desc[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(set_access(va, size, desc, 1));
  CUresult peer = set_access(va, size, desc, 2);
  if (can) {
    CU(peer);
    unsigned long long flags = 0;
    CU(get_access(&flags, &desc[1].location, va));
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      printf("FAIL: device 0's access reads %llu\n", flags);
      return 1;
    }
    // Device 0 writes device 1's memory; device 1 reads it back.
    int n = (int)(size / sizeof(int));
    CHECK(cudaSetDevice(0));
    fill<<<(n + 255) / 256, 256>>>((int *)va, 300, n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(1));
    int first[4];
    CHECK(cudaMemcpy(first, (void *)va, sizeof(first), cudaMemcpyDeviceToHost));
    if (first[0] != 300 || first[3] != 303) {
      printf("FAIL: device 0 wrote %d %d into device 1's virtual memory\n", first[0], first[3]);
      return 1;
    }
    printf("vmm_peer_access: used\n");
  } else if (peer == CUDA_SUCCESS) {
    printf("FAIL: access for a device that cannot reach the memory was granted\n");
    return 1;
  } else {
    printf("vmm_peer_access: refused\n");
  }
  CU(unmap(va, size));
  CU(release(h));
  CU(address_free(va, size));
  CHECK(cudaSetDevice(0));
  return 0;
}

// Uses dynamic shared memory past the default 48 KiB.
__global__ void big_shared(int *out, int words) {
  extern __shared__ int tile[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) tile[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = tile[words - 1];
}

__global__ void add(int *p, int value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += value;
}

// Runs long enough that a copy not ordered after it would read stale data.
__global__ void slow_fill(int *p, int value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  volatile int v = value + i;
  for (int k = 0; k < 200; k++) v = v + 1 - 1;
  p[i] = v;
}

static int expect(const int *got, int first, const char *what) {
  for (int i = 0; i < N; i++) {
    if (got[i] != first + i) {
      printf("FAIL %s: element %d is %d, expected %d\n", what, i, got[i], first + i);
      return 1;
    }
  }
  return 0;
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    printf("SKIP: one device\n");
    return 0;
  }
  const size_t bytes = N * sizeof(int);
  const int blocks = (N + 255) / 256;
  int *a[2], *b[2];
  cudaStream_t s[2];
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaMalloc(&a[d], bytes));
    CHECK(cudaMalloc(&b[d], bytes));
    CHECK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
    fill<<<blocks, 256>>>(a[d], 1000 * (d + 1), N);
    CHECK(cudaGetLastError());
  }
  // Each device's pointers are its own, and say so.
  for (int d = 0; d < 2; d++) {
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, a[d]));
    if (attr.device != d || attr.type != cudaMemoryTypeDevice) {
      printf("FAIL: a[%d] says device %d, type %d\n", d, attr.device, (int)attr.type);
      return 1;
    }
  }
  for (int x = 0; x < 2; x++) {
    for (int y = 0; y < 2; y++) {
      char *p = (char *)a[x], *q = (char *)b[y];
      if (p < q + bytes && q < p + bytes) {
        printf("FAIL: a[%d] and b[%d] overlap\n", x, y);
        return 1;
      }
    }
  }
  int can = -1;
  CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
  printf("can_access_peer: %d\n", can);
  // Peer access where the devices have it, refused as the driver refuses it
  // where they do not.
  CHECK(cudaSetDevice(0));
  cudaError_t enabled = cudaDeviceEnablePeerAccess(1, 0);
  if (can) {
    CHECK(enabled);
    if (cudaDeviceEnablePeerAccess(1, 0) != cudaErrorPeerAccessAlreadyEnabled) {
      printf("FAIL: peer access enabled twice\n");
      return 1;
    }
    cudaGetLastError();
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(0));
    static int peer_read[N];
    copy_from<<<blocks, 256>>>(b[0], a[1], N);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(peer_read, b[0], bytes, cudaMemcpyDeviceToHost));
    if (expect(peer_read, 2000, "a kernel reading the peer's memory")) return 1;
    CHECK(cudaDeviceDisablePeerAccess(1));
    printf("peer_access: used\n");
  } else if (enabled != cudaErrorPeerAccessUnsupported) {
    printf("FAIL: peer access without it said %s\n", cudaGetErrorString(enabled));
    return 1;
  } else {
    cudaGetLastError();
    printf("peer_access: unsupported\n");
  }

  if (vmm_across_devices(can)) return 1;

  static int host[N];
  // Each device synchronizes alone, and its memory holds what its kernel wrote.
  for (int d = 1; d >= 0; d--) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host, a[d], bytes, cudaMemcpyDeviceToHost));
    if (expect(host, 1000 * (d + 1), "a kernel's result")) return 1;
  }

  // Device 0's data to device 1 by cudaMemcpyPeer, then a kernel there.
  CHECK(cudaMemcpyPeer(b[1], 1, a[0], 0, bytes));
  CHECK(cudaSetDevice(1));
  add<<<blocks, 256>>>(b[1], 5, N);
  CHECK(cudaMemcpy(host, b[1], bytes, cudaMemcpyDeviceToHost));
  if (expect(host, 1005, "a peer copy")) return 1;

  // Device 1's data to device 0 by unified address, device 0 current.
  CHECK(cudaSetDevice(0));
  CHECK(cudaMemcpy(b[0], a[1], bytes, cudaMemcpyDefault));
  CHECK(cudaMemcpy(host, b[0], bytes, cudaMemcpyDeviceToHost));
  if (expect(host, 2000, "a copy by unified address")) return 1;

  // A copy on device 1's stream waits for an event of device 0's stream.
  cudaEvent_t done;
  CHECK(cudaSetDevice(0));
  CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  slow_fill<<<blocks, 256, 0, s[0]>>>(a[0], 7000, N);
  CHECK(cudaEventRecord(done, s[0]));
  CHECK(cudaSetDevice(1));
  CHECK(cudaStreamWaitEvent(s[1], done, 0));
  CHECK(cudaMemcpyPeerAsync(b[1], 1, a[0], 0, bytes, s[1]));
  CHECK(cudaStreamSynchronize(s[1]));
  CHECK(cudaMemcpy(host, b[1], bytes, cudaMemcpyDeviceToHost));
  if (expect(host, 7000, "a copy after another device's event")) return 1;

  // A kernel's attributes are its copy's on each device: shared memory past
  // 48 KiB given on device 1 by cuKernelSetAttribute, device 0 current (as
  // NCCL sets its kernels' on every device), then a launch there.
  {
    const int words = 16 * 1024;
    auto kernel_set = driver<CUresult (*)(CUfunction_attribute, int, CUkernel, CUdevice)>("cuKernelSetAttribute");
    cudaKernel_t k;
    CHECK(cudaGetKernel(&k, big_shared));
    CHECK(cudaSetDevice(0));
    if (!kernel_set) {
      printf("FAIL: no cuKernelSetAttribute\n");
      return 1;
    }
    CU(kernel_set(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, words * 4, (CUkernel)k, 1));
    CHECK(cudaSetDevice(1));
    big_shared<<<1, 128, words * 4>>>(b[1], words);
    CHECK(cudaGetLastError());
    int last = 0;
    CHECK(cudaMemcpy(&last, b[1], sizeof(last), cudaMemcpyDeviceToHost));
    if (last != words - 1) {
      printf("FAIL: 64 KiB of shared memory on device 1 held %d\n", last);
      return 1;
    }
  }

  // Memory information is each device's own.
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (total == 0 || free_bytes > total) {
      printf("FAIL: device %d memory %zu of %zu\n", d, free_bytes, total);
      return 1;
    }
  }
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaFree(a[d]));
    CHECK(cudaFree(b[d]));
    CHECK(cudaStreamDestroy(s[d]));
  }
  CHECK(cudaEventDestroy(done));
  printf("PASS\n");
  return 0;
}
