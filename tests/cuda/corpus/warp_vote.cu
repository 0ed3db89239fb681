// warp_vote: warp-wide votes and matches. Each warp evaluates __ballot_sync,
// __any_sync, __all_sync, __match_any_sync, __match_all_sync and __activemask
// on per-lane predicates, including a divergent branch where only some lanes
// take part. Exact compare with a host model of one warp.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define WORDS 9

// Per thread: WORDS result words.
//  0 ballot(v > 0)            1 any(v == 7)          2 all(v >= 0)
//  3 match_any(v % 4)         4 match_all(v / 1000) (value) 5 its pred
//  6 ballot among odd lanes only (0 for even lanes)  7 popc(ballot(v & 1))
//  8 __activemask() in converged code (all 32 lanes)
__global__ void warp_vote(const int* values, unsigned* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = values[i];
    unsigned* o = out + WORDS * i;
    const unsigned full = 0xffffffffu;
    o[0] = __ballot_sync(full, v > 0);
    o[1] = __any_sync(full, v == 7);
    o[2] = __all_sync(full, v >= 0);
    o[3] = __match_any_sync(full, v % 4);
    int pred = 0;
    o[4] = __match_all_sync(full, v / 1000, &pred);
    o[5] = pred;
    unsigned lane = threadIdx.x % 32;
    if (lane & 1) {
        o[6] = __ballot_sync(0xaaaaaaaau, v > 3);
    } else {
        o[6] = 0;
    }
    o[7] = __popc(__ballot_sync(full, v & 1));
    o[8] = __activemask();
}

int main()
{
    const int warps = 8, n = warps * 32;
    std::vector<int> values(n);
    for (int i = 0; i < n; ++i) {
        int w = i / 32;
        if (w == 0) values[i] = i % 32;          // includes 7, all >= 0
        else if (w == 1) values[i] = -(i % 5);   // mixed <= 0
        else if (w == 2) values[i] = 5;          // uniform
        else if (w == 3) values[i] = 1000 + (i % 3);  // match_all on v/1000 holds
        else values[i] = (i * 2654435761u) % 23 - 11;
    }
    std::vector<unsigned> out(WORDS * n);

    int* d_values;
    unsigned* d_out;
    CHECK(cudaMalloc(&d_values, n * sizeof(int)));
    CHECK(cudaMalloc(&d_out, out.size() * sizeof(unsigned)));
    CHECK(cudaMemcpy(d_values, values.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    warp_vote<<<2, 128>>>(d_values, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_values));
    CHECK(cudaFree(d_out));

    int errors = 0;
    for (int w = 0; w < warps; ++w) {
        const int* v = &values[w * 32];
        unsigned ballot = 0, odd_ballot = 0, parity = 0;
        bool any7 = false, all_nonneg = true, all_same = true;
        for (int l = 0; l < 32; ++l) {
            if (v[l] > 0) ballot |= 1u << l;
            if ((l & 1) && v[l] > 3) odd_ballot |= 1u << l;
            if (v[l] & 1) parity |= 1u << l;
            any7 |= v[l] == 7;
            all_nonneg &= v[l] >= 0;
            all_same &= v[l] / 1000 == v[0] / 1000;
        }
        for (int l = 0; l < 32; ++l) {
            unsigned match = 0;
            for (int m = 0; m < 32; ++m) {
                if (v[m] % 4 == v[l] % 4) match |= 1u << m;
            }
            unsigned expected[WORDS] = {ballot, any7 ? 1u : 0u, all_nonneg ? 1u : 0u, match,
                                    all_same ? 0xffffffffu : 0u, all_same ? 1u : 0u,
                                    (l & 1) ? odd_ballot : 0u, (unsigned)__builtin_popcount(parity), 0xffffffffu};
            for (int k = 0; k < WORDS; ++k) {
                unsigned got = out[WORDS * (w * 32 + l) + k];
                // any/all return a non-zero int for true.
                if (k == 1 || k == 2 || k == 5) got = got != 0;
                if (got != expected[k]) {
                    if (errors < 10) {
                        printf("warp_vote: warp %d lane %d result %d: got 0x%08x expected 0x%08x\n",
                               w, l, k, got, expected[k]);
                    }
                    ++errors;
                }
            }
        }
    }
    if (errors) {
        printf("warp_vote: FAIL (%d wrong)\n", errors);
        return 1;
    }
    printf("warp_vote: PASS (warps=%d)\n", warps);
    return 0;
}
