// Asynchronous global-to-shared copies as NVIDIA's async-copy samples use
// them (issue 22, item 7: the CPU device left zeros in shared memory, a
// silent wrong result). Built with -arch=sm_80, so nvcc emits cp.async: a
// tiled sum over many tiles, each tile copied four ways and double-buffered
// (the next tile's copy in flight while the current one is read):
// cuda::memcpy_async completing on a cuda::barrier (cp.async.mbarrier.arrive),
// a two-stage cuda::pipeline shared by the block, __pipeline_memcpy_async
// with __pipeline_wait_prior(1), and cooperative_groups::memcpy_async with
// wait_prior<1>. Prints PASS.
#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cuda/barrier>
#include <cuda/pipeline>
#include <cuda_pipeline.h>
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

namespace cg = cooperative_groups;

constexpr int TILE = 256, THREADS = 128, TILES = 24;

__device__ int weigh(const int *tile, int t) { return tile[t] * 3 + tile[TILE - 1 - t]; }

// one barrier per buffer; the copy of tile k+1 is in flight while tile k is read
__global__ void by_barrier(const int *in, int *out)
{
    __shared__ __align__(16) int buf[2][TILE];
#pragma nv_diag_suppress static_var_with_dynamic_init
    __shared__ cuda::barrier<cuda::thread_scope_block> bar[2];
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) {
        init(&bar[0], block.size());
        init(&bar[1], block.size());
    }
    block.sync();
    const size_t bytes = TILE * sizeof(int);
    cuda::memcpy_async(block, buf[0], in, cuda::aligned_size_t<16>(bytes), bar[0]);
    int acc = 0;
    for (int k = 0; k < TILES; ++k) {
        if (k + 1 < TILES)
            cuda::memcpy_async(block, buf[(k + 1) & 1], in + (k + 1) * TILE,
                               cuda::aligned_size_t<16>(bytes), bar[(k + 1) & 1]);
        bar[k & 1].arrive_and_wait();
        for (int t = threadIdx.x; t < TILE; t += blockDim.x) acc += weigh(buf[k & 1], t);
        block.sync(); // everyone read buffer k&1 before it is refilled
    }
    atomicAdd(out, acc);
}

__global__ void by_pipeline(const int *in, int *out)
{
    __shared__ __align__(16) int buf[2][TILE];
    __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, 2> state;
    auto block = cg::this_thread_block();
    auto pipe = cuda::make_pipeline(block, &state);
    const size_t bytes = TILE * sizeof(int);
    int acc = 0, fetched = 0;
    for (; fetched < 2 && fetched < TILES; ++fetched) {
        pipe.producer_acquire();
        cuda::memcpy_async(block, buf[fetched & 1], in + fetched * TILE,
                           cuda::aligned_size_t<16>(bytes), pipe);
        pipe.producer_commit();
    }
    for (int k = 0; k < TILES; ++k) {
        pipe.consumer_wait();
        for (int t = threadIdx.x; t < TILE; t += blockDim.x) acc += weigh(buf[k & 1], t);
        pipe.consumer_release();
        if (fetched < TILES) {
            pipe.producer_acquire();
            cuda::memcpy_async(block, buf[fetched & 1], in + fetched * TILE,
                               cuda::aligned_size_t<16>(bytes), pipe);
            pipe.producer_commit();
            ++fetched;
        }
    }
    atomicAdd(out + 1, acc);
}

// each thread copies its own 16-byte pieces; wait_prior(1) leaves the newest
// batch in flight
__global__ void by_primitives(const int *in, int *out)
{
    __shared__ __align__(16) int buf[2][TILE];
    auto copy = [&](int k) {
        for (int q = threadIdx.x; q < TILE / 4; q += blockDim.x)
            __pipeline_memcpy_async(&buf[k & 1][q * 4], in + k * TILE + q * 4, 16);
        __pipeline_commit();
    };
    int acc = 0;
    copy(0);
    for (int k = 0; k < TILES; ++k) {
        if (k + 1 < TILES) {
            copy(k + 1);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        for (int t = threadIdx.x; t < TILE; t += blockDim.x) acc += weigh(buf[k & 1], t);
        __syncthreads();
    }
    atomicAdd(out + 2, acc);
}

__global__ void by_groups(const int *in, int *out)
{
    __shared__ __align__(16) int buf[2][TILE];
    auto block = cg::this_thread_block();
    const size_t bytes = TILE * sizeof(int);
    cg::memcpy_async(block, buf[0], in, bytes);
    int acc = 0;
    for (int k = 0; k < TILES; ++k) {
        if (k + 1 < TILES) {
            cg::memcpy_async(block, buf[(k + 1) & 1], in + (k + 1) * TILE, bytes);
            cg::wait_prior<1>(block);
        } else {
            cg::wait(block);
        }
        for (int t = threadIdx.x; t < TILE; t += blockDim.x) acc += weigh(buf[k & 1], t);
        block.sync();
    }
    atomicAdd(out + 3, acc);
}

int main()
{
    const int n = TILE * TILES;
    static int h_in[n];
    long long want = 0;
    for (int i = 0; i < n; ++i) h_in[i] = (i * 131) % 997 - 400;
    for (int k = 0; k < TILES; ++k)
        for (int t = 0; t < TILE; ++t) want += h_in[k * TILE + t] * 3 + h_in[k * TILE + TILE - 1 - t];
    int *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, sizeof(h_in)));
    CHECK(cudaMalloc(&d_out, 4 * sizeof(int)));
    CHECK(cudaMemcpy(d_in, h_in, sizeof(h_in), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_out, 0, 4 * sizeof(int)));
    const int blocks = 2; // each block sums the whole input: the result is 2 * want
    by_barrier<<<blocks, THREADS>>>(d_in, d_out);
    CHECK(cudaGetLastError());
    by_pipeline<<<blocks, THREADS>>>(d_in, d_out);
    CHECK(cudaGetLastError());
    by_primitives<<<blocks, THREADS>>>(d_in, d_out);
    CHECK(cudaGetLastError());
    by_groups<<<blocks, THREADS>>>(d_in, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int got[4];
    CHECK(cudaMemcpy(got, d_out, sizeof(got), cudaMemcpyDeviceToHost));
    const char *ways[4] = {"cuda::barrier", "cuda::pipeline", "__pipeline_memcpy_async",
                           "cooperative_groups::memcpy_async"};
    for (int w = 0; w < 4; ++w)
        REQUIRE(got[w] == blocks * want, "%s: sum %d, want %lld", ways[w], got[w], blocks * want);
    printf("PASS\n");
    return 0;
}
