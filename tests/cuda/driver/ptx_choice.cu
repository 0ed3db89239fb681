// Which PTX of a fat binary runs (issue 22, item 1). Built with PTX only, for
// compute_75, compute_80 and compute_90 (no cubins), as NVIDIA's samples are
// built for many architectures. The device must run the highest PTX its own
// compute capability may run (else the lowest newer one), and say which it
// ran where CUB and the runtime look: cudaFuncAttributes::ptxVersion is the
// virtual architecture (75 for compute_75), cub::PtxVersion that times ten,
// both what __CUDA_ARCH__ was in the code that ran. The kernel uses what
// each architecture has: a 64-thread tile of cooperative groups (its scratch
// in the block's reserved shared memory, %reserved_smem_offset_1, from sm_80
// on), warp match from 7.0, warp reductions from 8.0. Prints PASS.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cstdio>
#include <cub/util_device.cuh>
#include <cuda_runtime.h>

#include "check.h"

namespace cg = cooperative_groups;

__global__ void tiles(const int *in, int *out, int *arch)
{
    __shared__ cg::block_tile_memory<256> scratch;
    cg::thread_block block = cg::this_thread_block(scratch);
    auto tile = cg::tiled_partition<64>(block);
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    int sum = cg::reduce(tile, v, cg::plus<int>());
    if (tile.thread_rank() == 0) out[blockIdx.x * 4 + tile.meta_group_rank()] = sum;
    unsigned lane = threadIdx.x % 32;
#if __CUDA_ARCH__ >= 800
    int warp_max = __reduce_max_sync(0xffffffffu, v);
#else
    int warp_max = v;
    for (int d = 16; d > 0; d /= 2) warp_max = max(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, d));
#endif
    unsigned same = __match_any_sync(0xffffffffu, v & 1);
    if (lane == 0) out[64 + blockIdx.x * 8 + threadIdx.x / 32] = warp_max;
    if (lane == 0) out[128 + blockIdx.x * 8 + threadIdx.x / 32] = __popc(same & 0xffffffffu) > 0;
#ifdef __CUDA_ARCH__
    if (blockIdx.x == 0 && threadIdx.x == 0) *arch = __CUDA_ARCH__;
#endif
}

int main()
{
    int device = 0;
    cudaDeviceProp prop;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaGetDeviceProperties(&prop, device));
    const int cc = prop.major * 10 + prop.minor;
    const int built[] = {75, 80, 90};
    int want = 0;
    for (int b : built)
        if (b <= cc) want = b;
    if (want == 0) want = built[0]; // older device: the lowest newer PTX
    cudaFuncAttributes attrs;
    CHECK(cudaFuncGetAttributes(&attrs, tiles));
    REQUIRE(attrs.ptxVersion == want, "ptxVersion %d on a %d.%d device, want %d", attrs.ptxVersion,
            prop.major, prop.minor, want);
    int cub_version = 0;
    CHECK(cub::PtxVersion(cub_version));
    REQUIRE(cub_version == want * 10, "cub::PtxVersion %d, want %d", cub_version, want * 10);

    const int blocks = 3, threads = 256, n = blocks * threads;
    int h_in[n], h_out[192] = {0}, h_arch = 0;
    for (int i = 0; i < n; ++i) h_in[i] = (i * 37) % 101 - 50;
    int *d_in, *d_out, *d_arch;
    CHECK(cudaMalloc(&d_in, sizeof(h_in)));
    CHECK(cudaMalloc(&d_out, sizeof(h_out)));
    CHECK(cudaMalloc(&d_arch, sizeof(int)));
    CHECK(cudaMemcpy(d_in, h_in, sizeof(h_in), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_out, 0, sizeof(h_out)));
    tiles<<<blocks, threads>>>(d_in, d_out, d_arch);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h_out, d_out, sizeof(h_out), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&h_arch, d_arch, sizeof(int), cudaMemcpyDeviceToHost));
    REQUIRE(h_arch == want * 10, "the kernel ran compute_%d's code, want compute_%d", h_arch / 10,
            want);
    for (int t = 0; t < blocks * 4; ++t) {
        int sum = 0;
        for (int k = 0; k < 64; ++k) sum += h_in[t * 64 + k];
        REQUIRE(h_out[t] == sum, "tile %d: sum %d, want %d", t, h_out[t], sum);
    }
    for (int w = 0; w < blocks * 8; ++w) {
        int top = -1000;
        for (int k = 0; k < 32; ++k) top = h_in[w * 32 + k] > top ? h_in[w * 32 + k] : top;
        REQUIRE(h_out[64 + w] == top, "warp %d: max %d, want %d", w, h_out[64 + w], top);
        REQUIRE(h_out[128 + w] == 1, "warp %d: match_any found no peers", w);
    }
    printf("ran compute_%d on a %d.%d device\n", want, prop.major, prop.minor);
    printf("PASS\n");
    return 0;
}
