// indirect_calls: calls through function pointers (a __device__ table and a
// pointer passed through memory), virtual functions of objects built on the
// device, and recursion deep enough to need cudaLimitStackSize raised.
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

typedef int (*binop)(int, int);
__device__ __noinline__ int add(int a, int b) { return a + b; }
__device__ __noinline__ int mul(int a, int b) { return a * b; }
__device__ __noinline__ int sub(int a, int b) { return a - b; }
__device__ binop table[3] = {add, mul, sub};

struct Shape {
    __device__ virtual int area() const = 0;
    __device__ virtual ~Shape() {}
};
struct Square : Shape {
    int side;
    __device__ Square(int s) : side(s) {}
    __device__ int area() const override { return side * side; }
};
struct Rect : Shape {
    int w, h;
    __device__ Rect(int w, int h) : w(w), h(h) {}
    __device__ int area() const override { return w * h; }
};

__device__ __noinline__ int depth_sum(int n, volatile int* pad)
{
    int local[8];
    for (int k = 0; k < 8; ++k) local[k] = pad[k] + n;
    if (n == 0) return local[n % 8];
    return local[n % 8] + depth_sum(n - 1, pad);
}

__global__ void calls(int* out, int depth, volatile int* pad)
{
    int i = threadIdx.x;
    binop f = table[i % 3];
    out[i] = f(i, 3);
    Square sq(i);
    Rect re(i, 2);
    Shape* shapes[2] = {&sq, &re};
    Shape* s = shapes[i & 1];
    out[32 + i] = s->area();
    out[64 + i] = depth_sum(depth + i % 4, pad);
}

int main()
{
    const int depth = 400;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 64 * 1024));
    int *d_out, *d_pad;
    CHECK(cudaMalloc(&d_out, 96 * sizeof(int)));
    CHECK(cudaMalloc(&d_pad, 8 * sizeof(int)));
    CHECK(cudaMemset(d_pad, 0, 8 * sizeof(int)));
    calls<<<1, 32>>>(d_out, depth, d_pad);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int h[96];
    CHECK(cudaMemcpy(h, d_out, sizeof(h), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; ++i) {
        int want_f = i % 3 == 0 ? i + 3 : i % 3 == 1 ? i * 3 : i - 3;
        int want_area = (i & 1) ? i * 2 : i * i;
        int n = depth + i % 4, want_depth = 0;
        for (int k = 0; k <= n; ++k) want_depth += k;
        if (h[i] != want_f || h[32 + i] != want_area || h[64 + i] != want_depth) {
            printf("indirect_calls: FAIL (thread %d: %d %d %d, expected %d %d %d)\n", i, h[i],
                   h[32 + i], h[64 + i], want_f, want_area, want_depth);
            return 1;
        }
    }
    printf("indirect_calls: PASS\n");
    return 0;
}
