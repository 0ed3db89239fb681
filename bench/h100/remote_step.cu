// A training step's shape without PyTorch, for bench/h100/remote.sh where torch
// is absent (DEVICE=cpu): a few kernels a step, then one 4-byte copy back (the loss).
//
//   remote_step [STEPS] [WARMUP]
//
// Prints what remote_step.py prints (`pid:`, `stamp PHASE NS` on
// CLOCK_MONOTONIC, `step K loss X ms Y`, `step_ms_p50:`, `step_ms_p99:`,
// `remote_step: PASS`), so that remote.sh reads both alike.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <vector>

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void stamp(const char *phase) {
    printf("stamp %s %lld\n", phase, now_ns());
    fflush(stdout);
}

#define CHECK(call)                                                                 \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            printf("remote_step: FAIL %s: %s\n", #call, cudaGetErrorString(e_));    \
            return 1;                                                               \
        }                                                                           \
    } while (0)

__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void sum_first(const float *y, float *loss, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0;
        for (int i = 0; i < n && i < 64; i++) s += y[i];
        *loss = s;
    }
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 30;
    int warmup = argc > 2 ? atoi(argv[2]) : 5;
    const int n = 4096, kernels = 8;
    printf("pid: %d\n", (int)getpid());
    stamp("start");
    stamp("imported");
    CHECK(cudaFree(0));
    stamp("cuda_ready");
    std::vector<float> host(n, 0.5f);
    float *x = nullptr, *y = nullptr, *loss = nullptr;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMalloc(&y, n * sizeof(float)));
    CHECK(cudaMalloc(&loss, sizeof(float)));
    CHECK(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y, 0, n * sizeof(float)));
    printf("model: %d kernels a step over %d floats\n", kernels + 1, n);
    stamp("model_ready");
    std::vector<double> times;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup) stamp("steps_begin");
        long long t0 = now_ns();
        for (int k = 0; k < kernels; k++) axpy<<<(n + 255) / 256, 256>>>(y, x, 0.001f, n);
        sum_first<<<1, 32>>>(y, loss, n);
        float value = 0;
        CHECK(cudaMemcpy(&value, loss, sizeof(float), cudaMemcpyDeviceToHost));
        double ms = (now_ns() - t0) / 1e6;
        if (i == 0) stamp("first_step");
        if (i >= warmup) {
            times.push_back(ms);
            printf("step %d loss %.5f ms %.3f\n", i - warmup, value, ms);
        }
    }
    stamp("steps_end");
    std::sort(times.begin(), times.end());
    if (!times.empty()) {
        printf("step_ms_p50: %.3f\n", times[times.size() / 2]);
        printf("step_ms_p99: %.3f\n", times[std::min(times.size() - 1, (size_t)(0.99 * times.size()))]);
    }
    printf("remote_step: PASS\n");
    return 0;
}
