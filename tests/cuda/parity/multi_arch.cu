// multi_arch: built with PTX for several architectures (the test passes
// -gencode flags, e.g. compute_75 and compute_90, or compute_80 alone). The
// device must run the PTX its reported compute capability may run, or a newer
// one whose features it has: here a 64-thread tile of cooperative groups,
// which keeps its scratch in the block's reserved shared memory from sm_80 on
// (%reserved_smem_offset_1) and in a user buffer before.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

namespace cg = cooperative_groups;

__global__ void tile_sums(const int* in, int* out)
{
    __shared__ cg::block_tile_memory<256> scratch;
    cg::thread_block block = cg::this_thread_block(scratch);
    auto tile = cg::tiled_partition<64>(block);
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    int sum = cg::reduce(tile, v, cg::plus<int>());
    if (tile.thread_rank() == 0) out[blockIdx.x * 4 + tile.meta_group_rank()] = sum;
}

int main()
{
    const int blocks = 3, threads = 256, n = blocks * threads;
    int h_in[n], h_out[blocks * 4];
    for (int i = 0; i < n; ++i) h_in[i] = (i * 37) % 101 - 50;
    int *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, sizeof(h_in)));
    CHECK(cudaMalloc(&d_out, sizeof(h_out)));
    CHECK(cudaMemcpy(d_in, h_in, sizeof(h_in), cudaMemcpyHostToDevice));
    tile_sums<<<blocks, threads>>>(d_in, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h_out, d_out, sizeof(h_out), cudaMemcpyDeviceToHost));
    for (int t = 0; t < blocks * 4; ++t) {
        int want = 0;
        for (int k = 0; k < 64; ++k) want += h_in[t * 64 + k];
        if (h_out[t] != want) {
            printf("multi_arch: FAIL (tile %d: got %d expected %d)\n", t, h_out[t], want);
            return 1;
        }
    }
    printf("multi_arch: PASS\n");
    return 0;
}
