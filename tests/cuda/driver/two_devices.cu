// One program on two devices, through the CUDA runtime: memory, kernels and
// streams on each; pointers of the two never alias and say their device;
// copies between them (cudaMemcpyPeer, cudaMemcpy by unified address, and
// cudaMemcpyPeerAsync ordered after an event of the other device); each
// device synchronizes alone; peer access, where the devices have it, lets a
// kernel of one read the other's memory. Prints the devices' peer access as
// "can_access_peer: N", "peer_access: used|unsupported" and PASS; with fewer
// than two devices it prints "SKIP: one device" and exits 0.
#include <cstdio>
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
