// grid_sync: cooperative_groups::this_grid().sync() in a kernel launched with
// cudaLaunchCooperativeKernel: every block writes its part, the whole grid
// waits, then each block reads what the others wrote (three rounds).
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

namespace cg = cooperative_groups;

__global__ void rounds(int* data, int* sums, int n)
{
    cg::grid_group grid = cg::this_grid();
    int i = grid.thread_rank();
    for (int r = 0; r < 3; ++r) {
        data[i] = i + r * 1000;
        grid.sync();
        // each thread reads a value another block wrote
        int j = (i + blockDim.x * 5 + 7) % n;
        sums[r * n + i] = data[j];
        grid.sync();
    }
}

int main()
{
    int device = 0, supported = 0, per_sm = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, device));
    if (!supported) {
        printf("grid_sync: FAIL (no cooperative launch)\n");
        return 1;
    }
    const int threads = 64;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rounds, threads, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int blocks = per_sm * sms < 8 ? per_sm * sms : 8;
    if (blocks < 2) {
        printf("grid_sync: FAIL (only %d co-resident blocks)\n", blocks);
        return 1;
    }
    int n = blocks * threads;
    int *d_data, *d_sums;
    CHECK(cudaMalloc(&d_data, n * sizeof(int)));
    CHECK(cudaMalloc(&d_sums, 3 * n * sizeof(int)));
    void* args[] = {&d_data, &d_sums, &n};
    CHECK(cudaLaunchCooperativeKernel((void*)rounds, blocks, threads, args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    int* h = (int*)malloc(3 * n * sizeof(int));
    CHECK(cudaMemcpy(h, d_sums, 3 * n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int r = 0; r < 3; ++r) {
        for (int i = 0; i < n; ++i) {
            int j = (i + threads * 5 + 7) % n;
            if (h[r * n + i] != j + r * 1000) {
                printf("grid_sync: FAIL (round %d thread %d: got %d expected %d)\n", r, i,
                       h[r * n + i], j + r * 1000);
                return 1;
            }
        }
    }
    printf("grid_sync: PASS (%d blocks)\n", blocks);
    return 0;
}
