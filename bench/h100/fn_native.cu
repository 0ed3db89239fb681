// The native side of bench/h100/functions.sh: fn_kernels.cu's kernels run by a
// plain CUDA program, timed per iteration (p50, p99), what each function invocation does.
//
//   fn_native N BATCHES ITERS D_IN D_HIDDEN D_OUT
//
// Prints `metric NAME VALUE us`:
// - vadd_launch_sync: vadd over N floats launched and synchronized (what
//   issue 16 measures a hot invocation's overhead against);
// - vadd_full: a and b copied in, c zeroed, vadd, c copied out (pageable
//   memory, as an HTTP server holds it): the same work as an invocation;
// - mlp_bB_full for each batch B in BATCHES (comma-separated): x copied in,
//   every scratch and output buffer zeroed, the weights made, three layers,
//   y copied out: the same launches as the `mlp` function's plan.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fn_kernels.cu"

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            fprintf(stderr, "fn_native: %s: %s\n", #call, cudaGetErrorString(e_));    \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

using Clock = std::chrono::steady_clock;

static void report(const char *name, std::vector<double> &us) {
    std::sort(us.begin(), us.end());
    size_t p99 = std::min(us.size() - 1, (size_t)(0.99 * us.size()));
    printf("metric %s_p50_us %.3f us\n", name, us[us.size() / 2]);
    printf("metric %s_p99_us %.3f us\n", name, us[p99]);
    fflush(stdout);
}

template <typename F> static void timed(const char *name, int iters, F body) {
    std::vector<double> us;
    for (int i = 0; i < iters + iters / 10 + 5; i++) {
        auto t0 = Clock::now();
        body();
        double d = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (i >= iters / 10 + 5) us.push_back(d);  // the first tenth warms up
    }
    report(name, us);
}

static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? atoi(argv[1]) : 1024;
    const char *batches = argc > 2 ? argv[2] : "1,32";
    int iters = argc > 3 ? atoi(argv[3]) : 5000;
    unsigned din = argc > 4 ? atoi(argv[4]) : 1024, dh = argc > 5 ? atoi(argv[5]) : 1024,
             dout = argc > 6 ? atoi(argv[6]) : 128;
    CHECK(cudaFree(0));

    std::vector<float> ha(n, 1.0f), hb(n, 2.0f), hc(n);
    float *a, *b, *c;
    CHECK(cudaMalloc(&a, n * 4));
    CHECK(cudaMalloc(&b, n * 4));
    CHECK(cudaMalloc(&c, n * 4));
    timed("vadd_launch_sync", iters, [&] {
        vadd<<<cdiv(n, 256), 256>>>(a, b, c, n);
        CHECK(cudaStreamSynchronize(0));
    });
    timed("vadd_full", iters, [&] {
        CHECK(cudaMemcpy(a, ha.data(), n * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(b, hb.data(), n * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemsetAsync(c, 0, n * 4));
        vadd<<<cdiv(n, 256), 256>>>(a, b, c, n);
        CHECK(cudaMemcpy(hc.data(), c, n * 4, cudaMemcpyDeviceToHost));
    });
    if (hc[0] != 3.0f) {
        fprintf(stderr, "fn_native: vadd gave %f, not 3\n", hc[0]);
        return 1;
    }

    const unsigned max_batch = 256;
    float *w1, *b1, *w2, *b2, *w3, *b3, *x, *h1, *h2, *y;
    CHECK(cudaMalloc(&w1, (size_t)din * dh * 4));
    CHECK(cudaMalloc(&b1, dh * 4));
    CHECK(cudaMalloc(&w2, (size_t)dh * dh * 4));
    CHECK(cudaMalloc(&b2, dh * 4));
    CHECK(cudaMalloc(&w3, (size_t)dh * dout * 4));
    CHECK(cudaMalloc(&b3, dout * 4));
    CHECK(cudaMalloc(&x, (size_t)max_batch * din * 4));
    CHECK(cudaMalloc(&h1, (size_t)max_batch * dh * 4));
    CHECK(cudaMalloc(&h2, (size_t)max_batch * dh * 4));
    CHECK(cudaMalloc(&y, (size_t)max_batch * dout * 4));
    std::vector<float> hx((size_t)max_batch * din, 0.5f), hy((size_t)max_batch * dout);
    char list[256];
    snprintf(list, sizeof list, "%s", batches);
    for (char *tok = strtok(list, ","); tok; tok = strtok(nullptr, ",")) {
        unsigned bs = atoi(tok);
        if (bs == 0 || bs > max_batch) continue;
        char name[64];
        snprintf(name, sizeof name, "mlp_b%u_full", bs);
        timed(name, iters / 5 + 1, [&] {
            CHECK(cudaMemcpy(x, hx.data(), (size_t)bs * din * 4, cudaMemcpyHostToDevice));
            struct { float *p; size_t n; } zero[] = {{w1, (size_t)din * dh}, {b1, dh}, {w2, (size_t)dh * dh},
                {b2, dh}, {w3, (size_t)dh * dout}, {b3, dout}, {h1, (size_t)bs * dh}, {h2, (size_t)bs * dh},
                {y, (size_t)bs * dout}};
            for (auto &z : zero) CHECK(cudaMemsetAsync(z.p, 0, z.n * 4));
            mlp_init<<<cdiv(din * dh, 256), 256>>>(w1, din * dh, 1, din);
            mlp_init<<<cdiv(dh, 256), 256>>>(b1, dh, 2, din);
            mlp_init<<<cdiv(dh * dh, 256), 256>>>(w2, dh * dh, 3, dh);
            mlp_init<<<cdiv(dh, 256), 256>>>(b2, dh, 4, dh);
            mlp_init<<<cdiv(dh * dout, 256), 256>>>(w3, dh * dout, 5, dh);
            mlp_init<<<cdiv(dout, 256), 256>>>(b3, dout, 6, dh);
            linear<<<dim3(cdiv(dh, 128), bs), 128>>>(x, w1, b1, h1, din, dh, 1);
            linear<<<dim3(cdiv(dh, 128), bs), 128>>>(h1, w2, b2, h2, dh, dh, 1);
            linear<<<dim3(cdiv(dout, 128), bs), 128>>>(h2, w3, b3, y, dh, dout, 0);
            CHECK(cudaMemcpy(hy.data(), y, (size_t)bs * dout * 4, cudaMemcpyDeviceToHost));
        });
    }
    printf("fn_native: PASS\n");
    return 0;
}
