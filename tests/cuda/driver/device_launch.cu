// Device-side launches (issue 22, dynamic parallelism; built with -rdc=true
// -lcudadevrt): a tree of nested launches through device-made streams, data
// a parent wrote before a launch seen by its child, a recursive quicksort, a
// tail launch running after its launcher ends, fire-and-forget launches, bad
// launches returning their error to the kernel (block too large, too many
// pending, which also ends a chain of launches), and a child's out-of-bounds write failing the
// host's launch with 700. Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

// out[lo, lo + n) = index + 1, split in halves by launches down to 64
__global__ void fill(int *out, int lo, int n) {
    if (n <= 64) {
        if ((int)threadIdx.x < n)
            out[lo + threadIdx.x] = lo + threadIdx.x + 1;
        return;
    }
    if (threadIdx.x == 0) {
        cudaStream_t a, b;
        cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
        fill<<<1, 64, 0, a>>>(out, lo, n / 2);
        fill<<<1, 64, 0, b>>>(out, lo + n / 2, n - n / 2);
        cudaStreamDestroy(a);
        cudaStreamDestroy(b);
    }
}

__global__ void doubled(const int *in, int *out) { out[threadIdx.x] = in[threadIdx.x] * 2; }

// writes in[] and only then launches the child that reads it
__global__ void producer(int *in, int *out) {
    in[threadIdx.x] = threadIdx.x + 100;
    __syncthreads();
    if (threadIdx.x == 0)
        doubled<<<1, blockDim.x>>>(in, out);
}

__device__ void sort_small(unsigned *v, int lo, int hi) {
    for (int i = lo; i < hi; ++i)
        for (int j = i + 1; j < hi; ++j)
            if (v[j] < v[i]) {
                unsigned t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
}

// sorts v[lo, hi): partitions around the last element, launches each side
__global__ void quicksort(unsigned *v, int lo, int hi, int depth) {
    if (hi - lo <= 16 || depth >= 20) {
        sort_small(v, lo, hi);
        return;
    }
    unsigned pivot = v[hi - 1];
    int store = lo;
    for (int i = lo; i < hi - 1; ++i)
        if (v[i] < pivot) {
            unsigned t = v[i];
            v[i] = v[store];
            v[store] = t;
            ++store;
        }
    v[hi - 1] = v[store];
    v[store] = pivot;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    quicksort<<<1, 1, 0, s>>>(v, lo, store, depth + 1);
    cudaStreamDestroy(s);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    quicksort<<<1, 1, 0, s>>>(v, store + 1, hi, depth + 1);
    cudaStreamDestroy(s);
}

__global__ void tail_child(int *flag, int *seen) { seen[0] = *flag; }
__global__ void forgotten(int *count) { atomicAdd(count, 1); }

// a tail launch runs after its launcher's grid: it sees what the grid wrote
// after launching it
__global__ void launcher(int *flag, int *seen, int *count) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        tail_child<<<1, 1, 0, cudaStreamTailLaunch>>>(flag, seen);
        forgotten<<<1, 8, 0, cudaStreamFireAndForget>>>(count);
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1 && blockIdx.x == gridDim.x - 1)
        *flag = 1;
}

__global__ void nothing(int *p) {
    if (p)
        *p = 1;
}

// codes: [0] a launch of 2048 threads a block, [1] cudaGetLastError after it,
// [2] cudaGetLastError again, [3] a launch into a destroyed stream
__global__ void bad_launches(int *codes) {
    nothing<<<1, 2048>>>(nullptr);
    codes[0] = (int)cudaPeekAtLastError();
    codes[1] = (int)cudaGetLastError();
    codes[2] = (int)cudaGetLastError();
    nothing<<<0, 32>>>(nullptr);
    codes[3] = (int)cudaGetLastError();
    // more dynamic shared memory than any block may have
    nothing<<<1, 32, 1 << 20>>>(nullptr);
    codes[4] = (int)cudaGetLastError();
}

// launches itself until a launch fails: deepest[0] the deepest level that ran,
// deepest[1] the error of the launch that failed
__global__ void dive(int *deepest, int level) {
    atomicMax(&deepest[0], level);
    dive<<<1, 1>>>(deepest, level + 1);
    int e = (int)cudaGetLastError();
    if (e != 0)
        deepest[1] = e;
}

// 3000 launches from one thread: counts[0] queued, counts[1] refused, counts[2]
// the last refusal's code, counts[3] children that ran
__global__ void flood(int *counts) {
    for (int i = 0; i < 3000; ++i) {
        forgotten<<<1, 1>>>(&counts[3]);
        int e = (int)cudaGetLastError();
        if (e == 0) {
            counts[0]++;
        } else {
            counts[1]++;
            counts[2] = e;
        }
    }
}

__global__ void oob_child(int *p) { p[1 << 28] = 1; }
__global__ void oob_parent(int *p) { oob_child<<<1, 1>>>(p); }

int main() {
    const int N = 4096;
    int *out;
    CHECK(cudaMalloc(&out, N * sizeof(int)));
    CHECK(cudaMemset(out, 0, N * sizeof(int)));
    fill<<<1, 64>>>(out, 0, N);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    static int h[N];
    CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i)
        REQUIRE(h[i] == i + 1, "nested fill: out[%d] = %d, want %d", i, h[i], i + 1);

    int *in;
    CHECK(cudaMalloc(&in, 256 * sizeof(int)));
    producer<<<1, 256>>>(in, out);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, out, 256 * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; ++i)
        REQUIRE(h[i] == (i + 100) * 2, "child read %d at %d, want %d", h[i] / 2, i, i + 100);

    const int M = 2000;
    static unsigned keys[M];
    unsigned x = 12345;
    for (int i = 0; i < M; ++i) {
        x = x * 1103515245u + 12345u;
        keys[i] = (x >> 8) % 100000;
    }
    unsigned *v;
    CHECK(cudaMalloc(&v, sizeof keys));
    CHECK(cudaMemcpy(v, keys, sizeof keys, cudaMemcpyHostToDevice));
    quicksort<<<1, 1>>>(v, 0, M, 0);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(keys, v, sizeof keys, cudaMemcpyDeviceToHost));
    for (int i = 1; i < M; ++i)
        REQUIRE(keys[i - 1] <= keys[i], "quicksort: keys[%d] = %u > keys[%d] = %u", i - 1,
                keys[i - 1], i, keys[i]);

    int *small;
    CHECK(cudaMalloc(&small, 16 * sizeof(int)));
    CHECK(cudaMemset(small, 0, 16 * sizeof(int)));
    launcher<<<4, 64>>>(&small[0], &small[1], &small[2]);
    CHECK(cudaDeviceSynchronize());
    int s[16];
    CHECK(cudaMemcpy(s, small, sizeof s, cudaMemcpyDeviceToHost));
    REQUIRE(s[1] == 1, "the tail launch saw flag %d, want 1 (it ran before its launcher ended)",
            s[1]);
    REQUIRE(s[2] == 8, "%d fire-and-forget threads ran, want 8", s[2]);

    CHECK(cudaMemset(small, 0xff, 16 * sizeof(int)));
    bad_launches<<<1, 1>>>(small);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(s, small, sizeof s, cudaMemcpyDeviceToHost));
    REQUIRE(s[0] == cudaErrorInvalidConfiguration && s[1] == s[0] && s[2] == 0 &&
                s[3] == cudaErrorInvalidConfiguration,
            "bad launches: codes %d %d %d %d, want 9 9 0 9", s[0], s[1], s[2], s[3]);
    REQUIRE(s[4] != 0, "a launch with 1 MiB of dynamic shared memory was taken");

    CHECK(cudaMemset(small, 0, 16 * sizeof(int)));
    dive<<<1, 1>>>(small, 0);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(s, small, sizeof s, cudaMemcpyDeviceToHost));
    // A grid is complete only with its children: each level stays pending,
    // and the chain ends at the pending limit (2048; measured on an H200).
    REQUIRE(s[1] == cudaErrorLaunchPendingCountExceeded && s[0] == 2048,
            "nesting: deepest level %d, error %d, want 2048 and %d", s[0], s[1],
            (int)cudaErrorLaunchPendingCountExceeded);
    printf("launches nest %d deep\n", s[0]);

    CHECK(cudaMemset(small, 0, 16 * sizeof(int)));
    flood<<<1, 1>>>(small);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(s, small, sizeof s, cudaMemcpyDeviceToHost));
    REQUIRE(s[0] + s[1] == 3000 && s[3] == s[0] &&
                (s[1] == 0 || s[2] == cudaErrorLaunchPendingCountExceeded),
            "flood: %d queued, %d refused (last %d), %d ran", s[0], s[1], s[2], s[3]);
    printf("%d of 3000 launches queued at once\n", s[0]);

    oob_parent<<<1, 1>>>(out);
    cudaError_t e = cudaDeviceSynchronize();
    // what a write 1 GiB past an allocation hits depends on the context's
    // address map: unmapped (700), or a range reserved in a context shared
    // with other programs (717, as NVIDIA's driver answers through
    // `--sharing shared`); either fails the host's launch for good
    REQUIRE(e == cudaErrorIllegalAddress || e == cudaErrorInvalidAddressSpace,
            "a child's bad write gave %s, want %s or %s", cudaGetErrorName(e),
            cudaGetErrorName(cudaErrorIllegalAddress),
            cudaGetErrorName(cudaErrorInvalidAddressSpace));
    printf("PASS\n");
    return 0;
}
