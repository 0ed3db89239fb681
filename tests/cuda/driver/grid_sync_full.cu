// Grid-wide sync in cooperative launches as NVIDIA's multi-block
// cooperative-groups samples size them (issue 22, item 4: the CPU device
// trapped). The grid is every block the device can hold at once (occupancy
// per multiprocessor times multiprocessors), with dynamic shared memory; a
// reduction whose block partials meet after grid.sync(), launched by
// cudaLaunchCooperativeKernel and by cudaLaunchKernelEx with the cooperative
// attribute. One block more than fits is refused at the call with
// cudaErrorCooperativeLaunchTooLarge and leaves the context usable. Prints PASS.
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "check.h"

namespace cg = cooperative_groups;

__global__ void reduce_all(const int *in, int n, int *partials, long long *total, int *seen)
{
    extern __shared__ int part[];
    cg::grid_group grid = cg::this_grid();
    cg::thread_block block = cg::this_thread_block();
    int sum = 0;
    for (long long i = grid.thread_rank(); i < n; i += grid.size()) sum += in[i];
    part[block.thread_rank()] = sum;
    block.sync();
    for (unsigned s = block.size() / 2; s > 0; s /= 2) {
        if (block.thread_rank() < s) part[block.thread_rank()] += part[block.thread_rank() + s];
        block.sync();
    }
    if (block.thread_rank() == 0) partials[blockIdx.x] = part[0];
    grid.sync();
    if (grid.thread_rank() == 0) {
        long long t = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) t += partials[b];
        *total = t;
    }
    grid.sync();
    // every thread sees the total the first thread wrote after the second sync
    if (*total != 0 && block.thread_rank() == 0) atomicAdd(seen, grid.is_valid() ? 1 : 0);
}

static int run(int blocks, int threads, const int *d_in, int n, int *d_partials,
               long long *d_total, int *d_seen, bool by_ex, long long want)
{
    size_t shared = threads * sizeof(int);
    CHECK(cudaMemset(d_seen, 0, sizeof(int)));
    CHECK(cudaMemset(d_total, 0, sizeof(long long)));
    if (by_ex) {
        cudaLaunchConfig_t config = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(threads);
        config.dynamicSmemBytes = shared;
        config.attrs = attr;
        config.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&config, reduce_all, d_in, n, d_partials, d_total, d_seen));
    } else {
        void *args[] = {&d_in, &n, &d_partials, &d_total, &d_seen};
        CHECK(cudaLaunchCooperativeKernel((void *)reduce_all, blocks, threads, args, shared, 0));
    }
    CHECK(cudaDeviceSynchronize());
    long long total = 0;
    int seen = 0;
    CHECK(cudaMemcpy(&total, d_total, sizeof(total), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&seen, d_seen, sizeof(seen), cudaMemcpyDeviceToHost));
    REQUIRE(total == want, "%d blocks of %d%s: total %lld, want %lld", blocks, threads,
            by_ex ? " (Ex)" : "", total, want);
    REQUIRE(seen == blocks, "%d blocks of %d: %d saw the total", blocks, threads, seen);
    return 0;
}

int main()
{
    int device = 0, cooperative = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
    REQUIRE(cooperative, "the device has no cooperative launch");
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int n = 1 << 16;
    int *h_in = (int *)malloc(n * sizeof(int));
    long long want = 0;
    for (int i = 0; i < n; ++i) {
        h_in[i] = (i * 2654435761u) % 1000 - 500;
        want += h_in[i];
    }
    int *d_in, *d_partials, *d_seen;
    long long *d_total;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMemcpy(d_in, h_in, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&d_total, sizeof(long long)));
    CHECK(cudaMalloc(&d_seen, sizeof(int)));
    const int shapes[] = {256, 64};
    for (int threads : shapes) {
        int per_sm = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reduce_all, threads,
                                                            threads * sizeof(int)));
        int blocks = per_sm * sms;
        REQUIRE(blocks >= 1, "no block of %d threads fits", threads);
        CHECK(cudaMalloc(&d_partials, (blocks + 1) * sizeof(int)));
        if (run(blocks, threads, d_in, n, d_partials, d_total, d_seen, false, want)) return 1;
        if (run(blocks, threads, d_in, n, d_partials, d_total, d_seen, true, want)) return 1;
        // one block more than can be resident: refused at the call
        void *args[] = {&d_in, (void *)&n, &d_partials, &d_total, &d_seen};
        cudaError_t e = cudaLaunchCooperativeKernel((void *)reduce_all, blocks + 1, threads, args,
                                                    threads * sizeof(int), 0);
        cudaError_t last = cudaGetLastError(); // the launch's error, cleared
        if (e == cudaSuccess) e = last;
        REQUIRE(e == cudaErrorCooperativeLaunchTooLarge,
                "%d blocks of %d (%d fit): %s, want cudaErrorCooperativeLaunchTooLarge",
                blocks + 1, threads, blocks, cudaGetErrorName(e));
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize()); // not sticky
        if (run(blocks, threads, d_in, n, d_partials, d_total, d_seen, false, want)) return 1;
        printf("%d blocks of %d threads (%d per multiprocessor, %d multiprocessors)\n", blocks,
               threads, per_sm, sms);
        CHECK(cudaFree(d_partials));
    }
    free(h_in);
    printf("PASS\n");
    return 0;
}
