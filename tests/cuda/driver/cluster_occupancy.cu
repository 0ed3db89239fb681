// Cluster occupancy as the GPU's driver reports it (sm_90): for clusters of 2, 4 and 8
// blocks of a kernel that fills an SM's shared memory, cudaOccupancyMaxActiveClusters'
// answer must be true. Each block of a grid of exactly that many clusters waits (with a
// time limit) until every block has arrived: an answer over what fits leaves blocks
// waiting for a slot, and the wait runs out. cudaOccupancyMaxPotentialClusterSize must
// answer, and a grid of one cluster of that size must run. cuBLAS sizes its grids and
// picks its kernels by these answers. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

// About 2 s of an SM's clock (1.6-2 GHz on Hopper).
static const long long WAIT_CYCLES = 4000000000LL;

__global__ void resident(unsigned *arrived, unsigned total, int *late) {
  extern __shared__ unsigned char room[];
  if (threadIdx.x == 0) {
    room[0] = 1;
    atomicAdd(arrived, 1u);
    long long start = clock64();
    while (atomicAdd(arrived, 0u) < total) {
      if (clock64() - start > WAIT_CYCLES) {
        atomicAdd(late, 1);
        break;
      }
    }
  }
}

int main() {
  int clusters = 0, sms = 0, optin = 0;
  CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, 0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  if (!clusters) {
    printf("SKIP: no thread-block clusters on this device\n");
    printf("PASS\n");
    return 0;
  }
  // Most of an SM's shared memory: one block per SM.
  size_t shared = (size_t)optin - 8 * 1024;
  CHECK(cudaFuncSetAttribute(resident, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  unsigned *arrived;
  int *late;
  CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
  CHECK(cudaMalloc(&late, sizeof(int)));

  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(128);
  config.dynamicSmemBytes = shared;
  config.attrs = attr;
  config.numAttrs = 1;
  for (unsigned size = 2; size <= 8; size *= 2) {
    attr[0].val.clusterDim.x = size;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = dim3(size * (unsigned)sms);
    int n = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&n, resident, &config));
    if (n < 1 || n > sms / (int)size) {
      printf("FAIL clusters of %u: %d active, out of 1 .. %d\n", size, n, sms / (int)size);
      return 1;
    }
    unsigned total = n * size;
    CHECK(cudaMemset(arrived, 0, sizeof(unsigned)));
    CHECK(cudaMemset(late, 0, sizeof(int)));
    config.gridDim = dim3(total);
    CHECK(cudaLaunchKernelEx(&config, resident, arrived, total, late));
    CHECK(cudaDeviceSynchronize());
    int h_late = 0;
    CHECK(cudaMemcpy(&h_late, late, sizeof h_late, cudaMemcpyDeviceToHost));
    printf("clusters of %u: %d active (%u blocks of %d SMs), %d blocks waited in vain\n", size, n,
           total, sms, h_late);
    if (h_late) {
      printf("FAIL %d clusters of %u were reported able to be resident at once, but %d blocks "
             "never saw the others\n",
             n, size, h_late);
      return 1;
    }
  }

  int most = 0;
  attr[0].val.clusterDim.x = 1;
  config.numAttrs = 0;
  config.gridDim = dim3(16);
  CHECK(cudaOccupancyMaxPotentialClusterSize(&most, resident, &config));
  printf("largest potential cluster: %d\n", most);
  if (most < 1 || most > 16) {
    printf("FAIL a potential cluster size of %d\n", most);
    return 1;
  }
  attr[0].val.clusterDim.x = most;
  config.numAttrs = 1;
  config.gridDim = dim3(most);
  CHECK(cudaMemset(arrived, 0, sizeof(unsigned)));
  CHECK(cudaMemset(late, 0, sizeof(int)));
  CHECK(cudaLaunchKernelEx(&config, resident, arrived, (unsigned)most, late));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(arrived));
  CHECK(cudaFree(late));
  printf("PASS\n");
  return 0;
}
