// half_precision: __half and __nv_bfloat16 conversions (all four rounding
// modes, to and from int) and arithmetic (add, sub, mul, fma, half2 lanes).
// Results come back as raw 16-bit patterns; the host computes each exact
// result in float or double and rounds it once, so most compares are bit-exact.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "check.h"

#define RESULTS 18

__global__ void half_precision(const float* a, const float* b, const float* c, unsigned short* out,
                               int* ints, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned short* o = out + RESULTS * i;

    __half ha = __float2half_rn(a[i]);
    __half hb = __float2half_rn(b[i]);
    __half hc = __float2half_rn(c[i]);
    o[0] = __half_as_ushort(ha);
    o[1] = __half_as_ushort(__float2half_rz(a[i]));
    o[2] = __half_as_ushort(__float2half_rd(a[i]));
    o[3] = __half_as_ushort(__float2half_ru(a[i]));
    o[4] = __half_as_ushort(__hadd(ha, hb));
    o[5] = __half_as_ushort(__hsub(ha, hb));
    o[6] = __half_as_ushort(__hmul(ha, hb));
    o[7] = __half_as_ushort(__hfma(ha, hb, hc));
    __half2 pair = __hmul2(__halves2half2(ha, hb), __halves2half2(hc, ha));
    o[8] = __half_as_ushort(__low2half(pair));
    o[9] = __half_as_ushort(__high2half(pair));
    o[10] = __half_as_ushort(__int2half_rn(i - 1000));
    ints[2 * i] = __half2int_rz(__hmul(ha, __float2half(100.0f)));

    __nv_bfloat16 ba = __float2bfloat16_rn(a[i]);
    __nv_bfloat16 bb = __float2bfloat16_rn(b[i]);
    __nv_bfloat16 bc = __float2bfloat16_rn(c[i]);
    o[11] = __bfloat16_as_ushort(ba);
    o[12] = __bfloat16_as_ushort(__float2bfloat16_rz(a[i]));
    o[13] = __bfloat16_as_ushort(__hadd(ba, bb));
    o[14] = __bfloat16_as_ushort(__hsub(ba, bb));
    o[15] = __bfloat16_as_ushort(__hmul(ba, bb));
    o[16] = __bfloat16_as_ushort(__hadd(__hmul(ba, bb), bc)); // no bf16 fma before sm_80
    o[17] = __bfloat16_as_ushort(__float2bfloat16(__bfloat162float(ba) * 3.0f));
    ints[2 * i + 1] = __bfloat162int_rz(__hmul(ba, __float2bfloat16(100.0f)));
}

static unsigned short h_bits(__half h) { return __half_as_ushort(h); }
static unsigned short b_bits(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }

// Distance in units in the last place between two 16-bit patterns of one sign.
static int ulp_distance(unsigned short x, unsigned short y)
{
    if ((x ^ y) & 0x8000) return (x & 0x7fff) + (y & 0x7fff);
    return abs((int)(x & 0x7fff) - (int)(y & 0x7fff));
}

int main()
{
    const int n = 2048;
    std::vector<float> a(n), b(n), c(n);
    unsigned state = 7u;
    auto uniform = [&state](float lo, float hi) {
        state = state * 1664525u + 1013904223u;
        return lo + (hi - lo) * ((float)(state >> 8) / (float)(1u << 24));
    };
    for (int i = 0; i < n; ++i) {
        a[i] = uniform(-8.0f, 8.0f);
        b[i] = uniform(-4.0f, 4.0f);
        c[i] = uniform(-16.0f, 16.0f);
    }
    a[0] = 65504.0f; // largest finite half
    a[1] = 1e-6f;    // subnormal as a half
    a[2] = 70000.0f; // overflows a half, not a bfloat16

    float *d_a, *d_b, *d_c;
    unsigned short* d_out;
    int* d_ints;
    CHECK(cudaMalloc(&d_a, n * sizeof(float)));
    CHECK(cudaMalloc(&d_b, n * sizeof(float)));
    CHECK(cudaMalloc(&d_c, n * sizeof(float)));
    CHECK(cudaMalloc(&d_out, RESULTS * n * sizeof(unsigned short)));
    CHECK(cudaMalloc(&d_ints, 2 * n * sizeof(int)));
    CHECK(cudaMemcpy(d_a, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_b, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_c, c.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    half_precision<<<n / 128, 128>>>(d_a, d_b, d_c, d_out, d_ints, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned short> out(RESULTS * n);
    std::vector<int> ints(2 * n);
    CHECK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(unsigned short), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ints.data(), d_ints, ints.size() * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_ints));

    int errors = 0;
    for (int i = 0; i < n; ++i) {
        __half ha = __float2half_rn(a[i]), hb = __float2half_rn(b[i]), hc = __float2half_rn(c[i]);
        double da = __half2float(ha), db = __half2float(hb), dc = __half2float(hc);
        __nv_bfloat16 ba = __float2bfloat16_rn(a[i]), bb = __float2bfloat16_rn(b[i]),
                      bc = __float2bfloat16_rn(c[i]);
        float fa = __bfloat162float(ba), fb = __bfloat162float(bb), fc = __bfloat162float(bc);
        unsigned short want[RESULTS] = {
            h_bits(ha),
            h_bits(__float2half_rz(a[i])),
            h_bits(__float2half_rd(a[i])),
            h_bits(__float2half_ru(a[i])),
            h_bits(__double2half(da + db)),
            h_bits(__double2half(da - db)),
            h_bits(__double2half(da * db)),
            h_bits(__double2half(fma(da, db, dc))),
            h_bits(__double2half(da * dc)),
            h_bits(__double2half(db * da)),
            h_bits(__double2half((double)(i - 1000))),
            b_bits(ba),
            b_bits(__float2bfloat16_rz(a[i])),
            b_bits(__float2bfloat16(fa + fb)),
            b_bits(__float2bfloat16(fa - fb)),
            b_bits(__float2bfloat16(fa * fb)),
            b_bits(__float2bfloat16(__bfloat162float(__float2bfloat16(fa * fb)) + fc)),
            b_bits(__float2bfloat16(fa * 3.0f)),
        };
        for (int k = 0; k < RESULTS; ++k) {
            unsigned short got = out[RESULTS * i + k];
            // The half fma may round twice on the host side: allow 1 ulp.
            int allowed = k == 7 ? 1 : 0;
            if (ulp_distance(got, want[k]) > allowed) {
                if (errors < 10) {
                    printf("half_precision: element %d result %d: got 0x%04x expected 0x%04x\n", i,
                           k, got, want[k]);
                }
                ++errors;
            }
        }
        double scaled_half = (double)__half2float(__double2half(da * 100.0));
        double scaled_bf16 = (double)__bfloat162float(__float2bfloat16(fa * 100.0f));
        int want_h = isinf(scaled_half) ? (scaled_half > 0 ? 2147483647 : (int)0x80000000)
                                        : (int)trunc(scaled_half);
        int want_b = (int)trunc(scaled_bf16);
        if (ints[2 * i] != want_h || ints[2 * i + 1] != want_b) {
            if (errors < 10) {
                printf("half_precision: element %d to-int: got %d/%d expected %d/%d\n", i,
                       ints[2 * i], ints[2 * i + 1], want_h, want_b);
            }
            ++errors;
        }
    }
    if (errors) {
        printf("half_precision: FAIL (%d wrong)\n", errors);
        return 1;
    }
    printf("half_precision: PASS (n=%d)\n", n);
    return 0;
}
