// black_scholes: European call and put prices for many options, using expf,
// logf, sqrtf and the Abramowitz-Stegun polynomial for the normal CDF.
// Compared with the same formula evaluated in double on the host.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

// Cumulative normal distribution, Abramowitz & Stegun 26.2.17 (|error| < 7.5e-8).
__device__ inline float cnd(float d)
{
    const float a1 = 0.31938153f, a2 = -0.356563782f, a3 = 1.781477937f,
                a4 = -1.821255978f, a5 = 1.330274429f;
    const float rsqrt2pi = 0.39894228040143267794f;
    float k = 1.0f / (1.0f + 0.2316419f * fabsf(d));
    float poly = k * (a1 + k * (a2 + k * (a3 + k * (a4 + k * a5))));
    float value = rsqrt2pi * expf(-0.5f * d * d) * poly;
    return d > 0.0f ? 1.0f - value : value;
}

__global__ void black_scholes(float* call, float* put, const float* spot, const float* strike,
                              const float* years, float rate, float volatility, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = spot[i], x = strike[i], t = years[i];
    float sqrt_t = sqrtf(t);
    float d1 = (logf(s / x) + (rate + 0.5f * volatility * volatility) * t) / (volatility * sqrt_t);
    float d2 = d1 - volatility * sqrt_t;
    float discount = expf(-rate * t);
    call[i] = s * cnd(d1) - x * discount * cnd(d2);
    put[i] = x * discount * (1.0f - cnd(d2)) - s * (1.0f - cnd(d1));
}

static double host_cnd(double d)
{
    const double a1 = 0.31938153, a2 = -0.356563782, a3 = 1.781477937, a4 = -1.821255978,
                 a5 = 1.330274429;
    double k = 1.0 / (1.0 + 0.2316419 * fabs(d));
    double value = 0.39894228040143267794 * exp(-0.5 * d * d) *
                   (k * (a1 + k * (a2 + k * (a3 + k * (a4 + k * a5)))));
    return d > 0 ? 1.0 - value : value;
}

int main()
{
    const int n = 4000;
    const float rate = 0.02f, volatility = 0.30f;
    std::vector<float> spot(n), strike(n), years(n), call(n), put(n);
    unsigned state = 5u;
    auto uniform = [&state](float lo, float hi) {
        state = state * 1664525u + 1013904223u;
        return lo + (hi - lo) * ((float)(state >> 8) / (float)(1u << 24));
    };
    for (int i = 0; i < n; ++i) {
        spot[i] = uniform(5.0f, 30.0f);
        strike[i] = uniform(1.0f, 100.0f);
        years[i] = uniform(0.25f, 10.0f);
    }

    float *d_call, *d_put, *d_spot, *d_strike, *d_years;
    CHECK(cudaMalloc(&d_call, n * sizeof(float)));
    CHECK(cudaMalloc(&d_put, n * sizeof(float)));
    CHECK(cudaMalloc(&d_spot, n * sizeof(float)));
    CHECK(cudaMalloc(&d_strike, n * sizeof(float)));
    CHECK(cudaMalloc(&d_years, n * sizeof(float)));
    CHECK(cudaMemcpy(d_spot, spot.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_strike, strike.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_years, years.data(), n * sizeof(float), cudaMemcpyHostToDevice));

    black_scholes<<<(n + 127) / 128, 128>>>(d_call, d_put, d_spot, d_strike, d_years, rate, volatility, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(call.data(), d_call, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(put.data(), d_put, n * sizeof(float), cudaMemcpyDeviceToHost));

    int errors = 0;
    double worst = 0.0;
    for (int i = 0; i < n; ++i) {
        double s = spot[i], x = strike[i], t = years[i], r = rate, v = volatility;
        double d1 = (log(s / x) + (r + 0.5 * v * v) * t) / (v * sqrt(t));
        double d2 = d1 - v * sqrt(t);
        double disc = exp(-r * t);
        double ref_call = s * host_cnd(d1) - x * disc * host_cnd(d2);
        double ref_put = x * disc * (1.0 - host_cnd(d2)) - s * (1.0 - host_cnd(d1));
        double err = fmax(fabs(call[i] - ref_call), fabs(put[i] - ref_put));
        if (err > worst) worst = err;
        if (err > 1e-3 * fmax(1.0, s)) {
            if (errors < 10) {
                printf("black_scholes: option %d: call %.6f (ref %.6f) put %.6f (ref %.6f)\n", i,
                       call[i], ref_call, put[i], ref_put);
            }
            ++errors;
        }
    }
    CHECK(cudaFree(d_call));
    CHECK(cudaFree(d_put));
    CHECK(cudaFree(d_spot));
    CHECK(cudaFree(d_strike));
    CHECK(cudaFree(d_years));
    if (errors) {
        printf("black_scholes: FAIL (%d of %d options wrong, worst error %g)\n", errors, n, worst);
        return 1;
    }
    printf("black_scholes: PASS (n=%d worst=%.2e)\n", n, worst);
    return 0;
}
