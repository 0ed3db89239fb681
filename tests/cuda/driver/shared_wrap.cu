// Shared-memory addresses are 32-bit offsets in the block's window and wrap
// as a GPU's do (issue 22, item 2: the CPU device faulted with 700 where a
// GPU passes). Every kind of shared access through a base register that went
// below zero (or past 2^32) and an offset that brings it back: st, ld, a
// vector ld, atom (add, cas, exch), red, in 32-bit registers and in a 64-bit
// one from cvta.to.shared that went below zero. Prints PASS.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "check.h"

__global__ void wrapped(int *out)
{
    __shared__ int s[64];
    __shared__ int counts[64];
    __shared__ __align__(16) int pairs[128];
    const int i = threadIdx.x;
    counts[i] = 0;
    pairs[2 * i] = 0;
    pairs[2 * i + 1] = 0;
    __syncthreads();
    const unsigned a = (unsigned)__cvta_generic_to_shared(&s[i]);
    const unsigned c = (unsigned)__cvta_generic_to_shared(&counts[i]);
    const unsigned p = (unsigned)__cvta_generic_to_shared(&pairs[2 * i]);
    // below zero for the first words of the window; 4096 brings it back
    const unsigned a_below = a - 4096u, c_below = c - 4096u, p_below = p - 4096u;
    // past 2^32: the offset -256 + 2^32 wraps back
    const unsigned a_above = a + 256u;
    asm volatile("st.shared.u32 [%0+4096], %1;" ::"r"(a_below), "r"(i * 3 + 1) : "memory");
    asm volatile("st.shared.v2.u32 [%0+4096], {%1, %2};" ::"r"(p_below), "r"(i), "r"(-i)
                 : "memory");
    __syncthreads();
    int v, w, x, y, old_add, old_cas, old_exch;
    asm volatile("ld.shared.u32 %0, [%1+4096];" : "=r"(v) : "r"(a_below) : "memory");
    asm volatile("ld.shared.u32 %0, [%1+-256];" : "=r"(w) : "r"(a_above) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2+4096];" : "=r"(x), "=r"(y) : "r"(p_below)
                 : "memory");
    asm volatile("atom.shared.add.u32 %0, [%1+4096], 5;" : "=r"(old_add) : "r"(c_below)
                 : "memory");
    asm volatile("red.shared.add.u32 [%0+4096], 2;" ::"r"(c_below) : "memory");
    asm volatile("atom.shared.cas.b32 %0, [%1+4096], 7, 100;" : "=r"(old_cas) : "r"(c_below)
                 : "memory");
    asm volatile("atom.shared.exch.b32 %0, [%1+4096], 1000;" : "=r"(old_exch) : "r"(c_below)
                 : "memory");
    // a 64-bit shared address below zero, as nvcc emits for &s[i - k]
    uint64_t wide;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(wide) : "l"(&s[i]));
    int z;
    asm volatile("{ .reg .u64 t; sub.u64 t, %1, 8192; ld.shared.u32 %0, [t+8192]; }"
                 : "=r"(z)
                 : "l"(wide)
                 : "memory");
    __syncthreads();
    int *o = out + i * 8;
    o[0] = v;
    o[1] = w;
    o[2] = x;
    o[3] = y;
    o[4] = old_add;
    o[5] = old_cas;
    o[6] = old_exch;
    o[7] = z + counts[i] * 0x10000;
}

int main()
{
    const int threads = 64;
    int h[threads * 8];
    int *d;
    CHECK(cudaMalloc(&d, sizeof(h)));
    CHECK(cudaMemset(d, 0, sizeof(h)));
    wrapped<<<2, threads>>>(d);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    for (int i = 0; i < threads; ++i) {
        const int *o = h + i * 8;
        const int want[8] = {i * 3 + 1, i * 3 + 1, i, -i, 0, 7, 100, i * 3 + 1 + 1000 * 0x10000};
        for (int k = 0; k < 8; ++k)
            REQUIRE(o[k] == want[k], "thread %d, value %d: %d, want %d", i, k, o[k], want[k]);
    }
    printf("PASS\n");
    return 0;
}
