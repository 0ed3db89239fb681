// atomics_all: every integer atomic on 32- and 64-bit words (add, sub, min, max,
// inc, dec, exch, cas, and, or, xor), float and double atomicAdd, and two
// atomicCAS loops (a 64-bit product and a float maximum). All thread orders
// give the same final value, so results compare exactly.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"

struct Results {
    int add, sub, min, max, exch, cas_target, cas_winners;
    unsigned inc, dec, and_bits, or_bits, xor_bits;
    unsigned long long add64, min64, max64, product64, or64, xor64;
    float fadd, fmax;
    double dadd;
};

// 64-bit product via a compare-and-swap loop (there is no atomicMul).
__device__ unsigned long long atomic_mul(unsigned long long* address, unsigned long long factor)
{
    unsigned long long old = *address, assumed;
    do {
        assumed = old;
        old = atomicCAS(address, assumed, assumed * factor);
    } while (old != assumed);
    return old;
}

// Float maximum via a 32-bit compare-and-swap loop on the value's bits.
__device__ float atomic_max_float(float* address, float value)
{
    int* bits = (int*)address;
    int old = *bits, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= value) break;
        old = atomicCAS(bits, assumed, __float_as_int(value));
    } while (old != assumed);
    return __int_as_float(old);
}

__global__ void atomics_all(Results* r, const int* values, int* exch_old, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = values[i];
    atomicAdd(&r->add, v);
    atomicSub(&r->sub, v);
    atomicMin(&r->min, v);
    atomicMax(&r->max, v);
    exch_old[i] = atomicExch(&r->exch, i);
    if (atomicCAS(&r->cas_target, 0, i + 1) == 0) {
        atomicAdd(&r->cas_winners, 1);
    }
    atomicInc(&r->inc, 99u);
    atomicDec(&r->dec, 50u);
    atomicAnd(&r->and_bits, ~(1u << (i % 31)) | (i & 1 ? 0u : 0x80000000u));
    atomicOr(&r->or_bits, 1u << (v & 15));
    atomicXor(&r->xor_bits, (unsigned)v * 2654435761u);

    unsigned long long big = (unsigned long long)(v + 1000) << 33;
    atomicAdd(&r->add64, big);
    atomicMin(&r->min64, big + i);
    atomicMax(&r->max64, big + i);
    atomic_mul(&r->product64, 2ull * i + 1);
    atomicOr(&r->or64, 1ull << (i % 64));
    atomicXor(&r->xor64, big ^ (unsigned long long)i);

    atomicAdd(&r->fadd, (float)v);        // small integers: every order is exact
    atomicAdd(&r->dadd, (double)v * 0.5); // halves: every order is exact
    atomic_max_float(&r->fmax, (float)v * 0.25f);
}

int main()
{
    const int n = 4096;
    std::vector<int> values(n), exch_old(n);
    unsigned state = 31337u;
    for (int i = 0; i < n; ++i) {
        state = state * 1664525u + 1013904223u;
        values[i] = (int)(state >> 20) - 2048; // [-2048, 2047]
    }

    Results init;
    memset(&init, 0, sizeof(init));
    init.min = 1 << 30;
    init.max = -(1 << 30);
    init.exch = -1;
    init.dec = 10;
    init.and_bits = 0xffffffffu;
    init.min64 = ~0ull;
    init.product64 = 1;
    init.fmax = -1e30f;

    Results* d_r;
    int *d_values, *d_exch;
    CHECK(cudaMalloc(&d_r, sizeof(Results)));
    CHECK(cudaMalloc(&d_values, n * sizeof(int)));
    CHECK(cudaMalloc(&d_exch, n * sizeof(int)));
    CHECK(cudaMemcpy(d_r, &init, sizeof(init), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_values, values.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    atomics_all<<<n / 256, 256>>>(d_r, d_values, d_exch, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    Results got;
    CHECK(cudaMemcpy(&got, d_r, sizeof(got), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(exch_old.data(), d_exch, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_r));
    CHECK(cudaFree(d_values));
    CHECK(cudaFree(d_exch));

    Results want = init;
    for (int i = 0; i < n; ++i) {
        int v = values[i];
        want.add += v;
        want.sub -= v;
        want.min = v < want.min ? v : want.min;
        want.max = v > want.max ? v : want.max;
        want.inc = want.inc >= 99u ? 0u : want.inc + 1;
        want.dec = (want.dec == 0 || want.dec > 50u) ? 50u : want.dec - 1;
        want.and_bits &= ~(1u << (i % 31)) | (i & 1 ? 0u : 0x80000000u);
        want.or_bits |= 1u << (v & 15);
        want.xor_bits ^= (unsigned)v * 2654435761u;
        unsigned long long big = (unsigned long long)(v + 1000) << 33;
        want.add64 += big;
        want.min64 = big + i < want.min64 ? big + i : want.min64;
        want.max64 = big + i > want.max64 ? big + i : want.max64;
        want.product64 *= 2ull * i + 1;
        want.or64 |= 1ull << (i % 64);
        want.xor64 ^= big ^ (unsigned long long)i;
        want.fadd += (float)v;
        want.dadd += (double)v * 0.5;
        want.fmax = (float)v * 0.25f > want.fmax ? (float)v * 0.25f : want.fmax;
    }

    int errors = 0;
#define EXPECT_EQ(field, fmt)                                                       \
    if (got.field != want.field) {                                                  \
        printf("atomics_all: " #field ": got " fmt " expected " fmt "\n", got.field, \
               want.field);                                                         \
        ++errors;                                                                   \
    }
    EXPECT_EQ(add, "%d");
    EXPECT_EQ(sub, "%d");
    EXPECT_EQ(min, "%d");
    EXPECT_EQ(max, "%d");
    EXPECT_EQ(inc, "%u");
    EXPECT_EQ(dec, "%u");
    EXPECT_EQ(and_bits, "0x%08x");
    EXPECT_EQ(or_bits, "0x%08x");
    EXPECT_EQ(xor_bits, "0x%08x");
    EXPECT_EQ(add64, "%llu");
    EXPECT_EQ(min64, "%llu");
    EXPECT_EQ(max64, "%llu");
    EXPECT_EQ(product64, "%llu");
    EXPECT_EQ(or64, "0x%016llx");
    EXPECT_EQ(xor64, "0x%016llx");
    EXPECT_EQ(fadd, "%.1f");
    EXPECT_EQ(dadd, "%.1f");
    EXPECT_EQ(fmax, "%.2f");
    if (got.cas_winners != 1 || got.cas_target < 1 || got.cas_target > n) {
        printf("atomics_all: cas: %d winners, target %d\n", got.cas_winners, got.cas_target);
        ++errors;
    }
    // atomicExch: the old values plus the final value are -1, 0, ..., n-1 once each.
    std::vector<int> seen(n + 1, 0);
    for (int i = 0; i < n; ++i) {
        if (exch_old[i] >= -1 && exch_old[i] < n) seen[exch_old[i] + 1]++;
    }
    if (got.exch >= -1 && got.exch < n) seen[got.exch + 1]++;
    for (int k = 0; k <= n; ++k) {
        if (seen[k] != 1) {
            printf("atomics_all: exch: value %d seen %d times\n", k - 1, seen[k]);
            ++errors;
            break;
        }
    }
    if (errors) {
        printf("atomics_all: FAIL (%d checks wrong)\n", errors);
        return 1;
    }
    printf("atomics_all: PASS (threads=%d)\n", n);
    return 0;
}
