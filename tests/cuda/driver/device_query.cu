// Prints what the runtime reports about device 0 as `key: value` lines (the
// end-to-end test compares them with `cumux status --json`), checks that the
// runtime and the driver attributes agree, and prints PASS.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#include "check.h"

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  printf("device_count: %d\n", count);
  if (count < 1) { printf("FAIL no device\n"); return 1; }
  int driver = 0, runtime = 0;
  CHECK(cudaDriverGetVersion(&driver));
  CHECK(cudaRuntimeGetVersion(&runtime));
  printf("driver_version: %d\nruntime_version: %d\n", driver, runtime);

  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("name: %s\n", p.name);
  printf("compute_capability: %d.%d\n", p.major, p.minor);
  printf("multiprocessors: %d\n", p.multiProcessorCount);
  printf("total_mem: %zu\n", p.totalGlobalMem);
  printf("shared_mem_per_block: %zu\n", p.sharedMemPerBlock);
  printf("shared_mem_per_block_optin: %zu\n", p.sharedMemPerBlockOptin);
  printf("regs_per_block: %d\n", p.regsPerBlock);
  printf("warp_size: %d\n", p.warpSize);
  printf("max_threads_per_block: %d\n", p.maxThreadsPerBlock);
  printf("max_threads_dim: %d %d %d\n", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
  printf("max_grid_size: %d %d %d\n", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
  printf("total_const_mem: %zu\n", p.totalConstMem);
  printf("l2_cache_size: %d\n", p.l2CacheSize);
  printf("max_threads_per_multiprocessor: %d\n", p.maxThreadsPerMultiProcessor);
  printf("unified_addressing: %d\n", p.unifiedAddressing);
  printf("concurrent_kernels: %d\n", p.concurrentKernels);
  printf("async_engine_count: %d\n", p.asyncEngineCount);
  printf("pci: %04x:%02x:%02x\n", p.pciDomainID, p.pciBusID, p.pciDeviceID);
  printf("uuid: ");
  for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)p.uuid.bytes[i]);
  printf("\n");

  char bus[32];
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  printf("pci_bus_id: %s\n", bus);
  int by_bus = -1;
  CHECK(cudaDeviceGetByPCIBusId(&by_bus, bus));
  if (by_bus != 0) { printf("FAIL cudaDeviceGetByPCIBusId gave %d\n", by_bus); return 1; }

  int v = 0;
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
  if (v != p.multiProcessorCount) { printf("FAIL SM count %d vs %d\n", v, p.multiProcessorCount); return 1; }
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
  if (v != p.major) { printf("FAIL CC major\n"); return 1; }
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, 0));
  if (v != p.maxThreadsPerBlock) { printf("FAIL max threads\n"); return 1; }

  CHECK(cudaSetDevice(0));
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  printf("mem_info: %zu %zu\n", free_b, total_b);
  if (total_b != p.totalGlobalMem || free_b > total_b) { printf("FAIL mem info\n"); return 1; }
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  if (dev != 0) { printf("FAIL current device\n"); return 1; }
  if (cudaSetDevice(count) == cudaSuccess) { printf("FAIL set bad device\n"); return 1; }
  cudaGetLastError();
  printf("PASS\n");
  return 0;
}
