// shared_window: 32-bit shared-memory addresses wrap as on a GPU. A
// shared-window address from __cvta_generic_to_shared, moved below zero and
// back by 32-bit arithmetic, still names the same word; an ld.shared through
// a 64-bit register reads the word its low 32 bits name.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

__global__ void wrap(int* out)
{
    __shared__ int s[64];
    int i = threadIdx.x;
    s[i] = i * 3 + 1;
    __syncthreads();
    unsigned a = (unsigned)__cvta_generic_to_shared(&s[i]);
    unsigned below = a - 4096u; // wraps below zero for the first words
    int v;
    asm volatile("ld.shared.u32 %0, [%1+4096];" : "=r"(v) : "r"(below));
    out[i] = v;
    uint64_t wide = 0x100000000ull * 7 + a; // high bits set above the 32-bit window
    int w;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w) : "l"(wide));
    out[64 + i] = w;
    uint64_t back;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(back) : "l"(&s[i]));
    out[128 + i] = (int)((unsigned)back - a);
}

int main()
{
    int h_out[192];
    int* d_out;
    CHECK(cudaMalloc(&d_out, sizeof(h_out)));
    wrap<<<1, 64>>>(d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h_out, d_out, sizeof(h_out), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; ++i) {
        if (h_out[i] != i * 3 + 1 || h_out[64 + i] != i * 3 + 1 || h_out[128 + i] != 0) {
            printf("shared_window: FAIL (word %d: %d, %d, expected %d; cvta off by %d)\n", i,
                   h_out[i], h_out[64 + i], i * 3 + 1, h_out[128 + i]);
            return 1;
        }
    }
    printf("shared_window: PASS\n");
    return 0;
}
