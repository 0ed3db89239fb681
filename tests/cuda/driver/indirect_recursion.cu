// Indirect calls and recursion on the device, and the stack they need
// (issue 22, item 3: the CPU device refused them as invalid PTX, and did not
// keep the stack size set). Device function pointers fetched by the host with
// cudaMemcpyFromSymbol and passed back as kernel arguments (as NVIDIA's
// function-pointer samples do), mutual recursion through a pointer, a
// recursive quicksort of each thread's local array, and a recursion whose
// frames need more than the default stack once cudaLimitStackSize was raised
// (read back as at least what was set). Prints PASS.
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

typedef int (*op_t)(int, int);
typedef int (*step_t)(int);

__device__ __noinline__ int op_add(int a, int b) { return a + b; }
__device__ __noinline__ int op_max(int a, int b) { return a > b ? a : b; }
__device__ __noinline__ int op_xor(int a, int b) { return a ^ b; }
__device__ op_t d_add = op_add;
__device__ op_t d_max = op_max;
__device__ op_t d_xor = op_xor;

// is_even / is_odd call each other through a table in global memory
__device__ int is_even(int n);
__device__ int is_odd(int n);
__device__ step_t parity_table[2] = {is_even, is_odd};
__device__ __noinline__ int is_even(int n) { return n == 0 ? 1 : parity_table[1](n - 1); }
__device__ __noinline__ int is_odd(int n) { return n == 0 ? 0 : parity_table[0](n - 1); }

__device__ __noinline__ void quicksort(int *v, int lo, int hi)
{
    if (lo >= hi) return;
    int pivot = v[(lo + hi) / 2], l = lo, r = hi;
    while (l <= r) {
        while (v[l] < pivot) l++;
        while (v[r] > pivot) r--;
        if (l <= r) {
            int t = v[l];
            v[l] = v[r];
            v[r] = t;
            l++;
            r--;
        }
    }
    quicksort(v, lo, r);
    quicksort(v, l, hi);
}

// about 300 bytes of frame per level: 48 levels need more than 1 KiB
__device__ __noinline__ int deep(int n, volatile int *pad)
{
    int local[64];
    for (int k = 0; k < 64; ++k) local[k] = pad[k] + n + k;
    if (n == 0) return local[63];
    return local[n % 64] - n - n % 64 + deep(n - 1, pad);
}

__global__ void folds(const int *in, int n, op_t op, int *out)
{
    int acc = in[0];
    for (int k = 1; k < n; ++k) acc = op(acc, in[k]);
    out[blockIdx.x] = acc;
}

__global__ void recursions(int *out, volatile int *pad, int depth)
{
    int t = threadIdx.x;
    out[t * 4] = parity_table[t & 1](t + 40);
    int v[24];
    for (int k = 0; k < 24; ++k) v[k] = (k * 7919 + t * 31) % 101;
    quicksort(v, 0, 23);
    int sorted = 1;
    for (int k = 1; k < 24; ++k) sorted &= v[k - 1] <= v[k];
    out[t * 4 + 1] = sorted;
    out[t * 4 + 2] = v[0] + v[23] * 1000;
    out[t * 4 + 3] = deep(depth, pad);
}

int main()
{
    const int stack = 32 << 10, depth = 48, threads = 32;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, stack));
    size_t got = 0;
    CHECK(cudaDeviceGetLimit(&got, cudaLimitStackSize));
    REQUIRE(got >= (size_t)stack, "stack limit reads %zu after setting %d", got, stack);

    const int n = 100;
    int h_in[n];
    for (int k = 0; k < n; ++k) h_in[k] = (k * 37) % 91;
    op_t ops[3];
    CHECK(cudaMemcpyFromSymbol(&ops[0], d_add, sizeof(op_t)));
    CHECK(cudaMemcpyFromSymbol(&ops[1], d_max, sizeof(op_t)));
    CHECK(cudaMemcpyFromSymbol(&ops[2], d_xor, sizeof(op_t)));
    int *d_in, *d_out, *d_pad;
    CHECK(cudaMalloc(&d_in, sizeof(h_in)));
    CHECK(cudaMalloc(&d_out, threads * 4 * sizeof(int)));
    CHECK(cudaMalloc(&d_pad, 64 * sizeof(int)));
    CHECK(cudaMemset(d_pad, 0, 64 * sizeof(int)));
    CHECK(cudaMemcpy(d_in, h_in, sizeof(h_in), cudaMemcpyHostToDevice));
    int want_fold[3] = {h_in[0], h_in[0], h_in[0]};
    for (int k = 1; k < n; ++k) {
        want_fold[0] += h_in[k];
        want_fold[1] = want_fold[1] > h_in[k] ? want_fold[1] : h_in[k];
        want_fold[2] ^= h_in[k];
    }
    for (int f = 0; f < 3; ++f) {
        folds<<<1, 1>>>(d_in, n, ops[f], d_out);
        CHECK(cudaGetLastError());
        int r = 0;
        CHECK(cudaMemcpy(&r, d_out, sizeof(int), cudaMemcpyDeviceToHost));
        REQUIRE(r == want_fold[f], "fold %d through a pointer: %d, want %d", f, r, want_fold[f]);
    }

    recursions<<<1, threads>>>(d_out, d_pad, depth);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int h[threads * 4];
    CHECK(cudaMemcpy(h, d_out, sizeof(h), cudaMemcpyDeviceToHost));
    const int want_deep = 63; // each level adds local[n % 64] - n - n % 64 = 0
    for (int t = 0; t < threads; ++t) {
        int v[24];
        for (int k = 0; k < 24; ++k) v[k] = (k * 7919 + t * 31) % 101;
        int lo = v[0], hi = v[0];
        for (int k = 1; k < 24; ++k) {
            lo = v[k] < lo ? v[k] : lo;
            hi = v[k] > hi ? v[k] : hi;
        }
        // is_odd for odd t, is_even for even t: both true
        REQUIRE(h[t * 4] == 1, "thread %d: parity through pointers %d", t, h[t * 4]);
        REQUIRE(h[t * 4 + 1] == 1, "thread %d: quicksort left its array unsorted", t);
        REQUIRE(h[t * 4 + 2] == lo + hi * 1000, "thread %d: sorted ends %d, want %d", t,
                h[t * 4 + 2], lo + hi * 1000);
        REQUIRE(h[t * 4 + 3] == want_deep, "thread %d: deep recursion %d, want %d", t,
                h[t * 4 + 3], want_deep);
    }
    printf("PASS\n");
    return 0;
}
