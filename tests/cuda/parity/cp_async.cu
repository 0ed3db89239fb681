// cp_async: asynchronous copies from global into shared memory (built for
// sm_80 so nvcc emits cp.async): 4-, 8- and 16-byte __pipeline_memcpy_async
// with and without zero fill (cp.async.ca / .cg, commit_group, wait_group),
// cooperative_groups::memcpy_async and cuda::memcpy_async with a pipeline.
#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cuda/pipeline>
#include <cuda_pipeline.h>
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

namespace cg = cooperative_groups;

constexpr int N = 256;

__global__ void copies(const int* in, int* out, int zfill)
{
    __shared__ int4 s16[N / 4];
    __shared__ int2 s8[N / 2];
    __shared__ int s4[N];
    __shared__ int t[N];
    __shared__ int u[N];
    int i = threadIdx.x;
    if (i < N / 4) __pipeline_memcpy_async(&s16[i], &((const int4*)in)[i], 16, i == 3 ? zfill : 0);
    if (i < N / 2) __pipeline_memcpy_async(&s8[i], &((const int2*)in)[i], 8);
    __pipeline_commit();
    __pipeline_memcpy_async(&s4[i], &in[i], 4);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    auto block = cg::this_thread_block();
    cg::memcpy_async(block, t, in, sizeof(int) * N);
    cg::wait(block);
    cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
    pipe.producer_acquire();
    cuda::memcpy_async(&u[i], &in[i], sizeof(int), pipe);
    pipe.producer_commit();
    pipe.consumer_wait();
    __syncthreads();
    const int* a = (const int*)s16;
    const int* b = (const int*)s8;
    out[i] = a[i];
    out[N + i] = b[i];
    out[2 * N + i] = s4[i];
    out[3 * N + i] = t[N - 1 - i];
    out[4 * N + i] = u[i];
    pipe.consumer_release();
}

int main()
{
    int h_in[N], h_out[5 * N];
    for (int i = 0; i < N; ++i) h_in[i] = i * 7 + 1;
    int *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, sizeof(h_in)));
    CHECK(cudaMalloc(&d_out, sizeof(h_out)));
    CHECK(cudaMemcpy(d_in, h_in, sizeof(h_in), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_out, 0, sizeof(h_out)));
    const int zfill = 8; // the last 8 bytes of element 3 of the 16-byte copies are zeros
    copies<<<1, N>>>(d_in, d_out, zfill);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h_out, d_out, sizeof(h_out), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; ++i) {
        int want16 = (i == 14 || i == 15) ? 0 : h_in[i];
        int want[5] = {want16, h_in[i], h_in[i], h_in[N - 1 - i], h_in[i]};
        for (int k = 0; k < 5; ++k) {
            if (h_out[k * N + i] != want[k]) {
                if (bad++ < 8)
                    printf("cp_async: copy %d element %d: got %d expected %d\n", k, i,
                           h_out[k * N + i], want[k]);
            }
        }
    }
    if (bad) {
        printf("cp_async: FAIL (%d wrong)\n", bad);
        return 1;
    }
    printf("cp_async: PASS\n");
    return 0;
}
