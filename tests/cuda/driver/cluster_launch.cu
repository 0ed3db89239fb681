// Thread-block clusters and the function attributes around them, through the
// runtime: cudaFuncSetAttribute settings read back, bad values refused, and a
// launch in clusters (cudaLaunchKernelEx, and a required cluster width) that
// runs where the device has clusters and fails cleanly, not stickily, where it
// has none. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void mark(int *out) { out[blockIdx.x] = blockIdx.x + 1; }

// The launch's status as the program sees it: at the call or at the sync.
static cudaError_t finished(cudaError_t launched) {
  if (launched != cudaSuccess) return launched;
  return cudaDeviceSynchronize();
}

int main() {
  int clusters = 0;
  CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, 0));
  int *d;
  CHECK(cudaMalloc(&d, 8 * sizeof(int)));
  CHECK(cudaMemset(d, 0, 8 * sizeof(int)));

  // Settings read back; values out of range are refused.
  CHECK(cudaFuncSetAttribute(mark, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
  CHECK(cudaFuncSetAttribute(mark, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaFuncAttributes a;
  CHECK(cudaFuncGetAttributes(&a, mark));
  if (a.preferredShmemCarveout != 50 || a.nonPortableClusterSizeAllowed != 1) {
    printf("FAIL attributes read back: carveout %d non-portable %d\n", a.preferredShmemCarveout,
           a.nonPortableClusterSizeAllowed);
    return 1;
  }
  if (cudaFuncSetAttribute(mark, cudaFuncAttributePreferredSharedMemoryCarveout, 101) !=
      cudaErrorInvalidValue) {
    printf("FAIL a carveout of 101%% was accepted\n");
    return 1;
  }
  cudaGetLastError();

  // A launch in clusters of two blocks, named at the launch.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(8);
  config.blockDim = dim3(32);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  cudaError_t named = finished(cudaLaunchKernelEx(&config, mark, d));
  cudaGetLastError();
  // A cluster that does not divide the grid is refused.
  config.gridDim = dim3(7);
  cudaError_t uneven = finished(cudaLaunchKernelEx(&config, mark, d));
  cudaGetLastError();

  int h[8];
  CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  if (clusters) {
    if (named != cudaSuccess || uneven == cudaSuccess) {
      printf("FAIL clusters: named %s, uneven %s\n", cudaGetErrorString(named),
             cudaGetErrorString(uneven));
      return 1;
    }
    for (int i = 0; i < 8; i++)
      if (h[i] != i + 1) {
        printf("FAIL block %d wrote %d\n", i, h[i]);
        return 1;
      }
  } else if (named == cudaSuccess || uneven == cudaSuccess) {
    printf("FAIL a device without clusters ran a cluster launch\n");
    return 1;
  }
  // After a refused launch the context still works.
  mark<<<8, 32>>>(d);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 8; i++)
    if (h[i] != i + 1) {
      printf("FAIL plain launch, block %d wrote %d\n", i, h[i]);
      return 1;
    }
  printf("clusters: %s\n", clusters ? "ran" : "refused, the device has none");
  printf("PASS\n");
  return 0;
}
