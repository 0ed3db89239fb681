// What a launch after an idle gap costs in the driver, in the ways a cumux
// worker launches (bench/h100/probes; diagnostics, not a benchmark):
// one 50 us kernel at a time, 1 ms apart, as tenant_bench's latency tenant,
// with one change per variant against the plain driver-API baseline:
//
//   plain     cuLaunchKernel(kernelParams) on the legacy stream, cuStreamSynchronize
//   setctx    cuCtxSetCurrent before every launch (the worker does)
//   extra     parameters through CU_LAUNCH_PARAM_BUFFER_POINTER (the worker does)
//   urgent    a blocking stream of the most urgent priority (shared mode's default stream)
//   signal    cuStreamWriteValue64 into mapped host memory after the kernel, and the
//             host spins on that word instead of cuStreamSynchronize (the server does)
//   worker    all of the above at once
//
//   launch_probe ITERS SECS   prints `variant launch p50/p99, total p50/p99` in us
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            const char *s_ = nullptr;                                           \
            cuGetErrorString(r_, &s_);                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);   \
            exit(2);                                                            \
        }                                                                       \
    } while (0)

extern "C" __global__ void work(float *out, long long iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 1e-7f;
    for (long long i = 0; i < iters; i++) a = fmaf(a, b, c);
    if (a == 12345.0f) out[threadIdx.x] = a;
}

using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}
static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(v.size() * q))];
}

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    long long iters = atoll(argv[1]);
    double secs = atof(argv[2]);
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    int sms = 0;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    // The kernel of this file, through the runtime-free path: its own module.
    CUmodule module;
    CUfunction fn;
    CHECK(cuModuleLoad(&module, argv[3] ? argv[3] : "launch_probe.cubin"));
    CHECK(cuModuleGetFunction(&fn, module, "work"));
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 4096));
    int least = 0, greatest = 0;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUstream urgent;
    CHECK(cuStreamCreateWithPriority(&urgent, CU_STREAM_DEFAULT, greatest));
    auto *word = (volatile unsigned long long *)aligned_alloc(4096, 4096);
    memset((void *)word, 0, 4096);
    CHECK(cuMemHostRegister((void *)word, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr word_dev;
    CHECK(cuMemHostGetDevicePointer(&word_dev, (void *)word, 0));
    unsigned long long count = 0;

    const char *variants[] = {"plain", "setctx", "extra", "urgent", "signal", "worker"};
    for (const char *v : variants) {
        bool setctx = !strcmp(v, "setctx") || !strcmp(v, "worker");
        bool extra = !strcmp(v, "extra") || !strcmp(v, "worker");
        bool use_urgent = !strcmp(v, "urgent") || !strcmp(v, "worker");
        bool signal = !strcmp(v, "signal") || !strcmp(v, "worker");
        CUstream stream = use_urgent ? urgent : (CUstream)0;
        std::vector<double> launch, total;
        Clock::time_point t0 = Clock::now();
        while (std::chrono::duration<double>(Clock::now() - t0).count() < secs) {
            struct {
                CUdeviceptr out;
                long long iters;
            } packed = {out, iters};
            void *params[] = {&packed.out, &packed.iters};
            size_t size = sizeof(packed);
            void *extras[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                              &size, CU_LAUNCH_PARAM_END};
            Clock::time_point a = Clock::now();
            if (setctx) CHECK(cuCtxSetCurrent(ctx));
            CHECK(cuLaunchKernel(fn, sms, 1, 1, 256, 1, 1, 0, stream, extra ? nullptr : params,
                                 extra ? extras : nullptr));
            launch.push_back(us_since(a));
            if (signal) {
                count++;
                CHECK(cuStreamWriteValue64(stream, word_dev, count, CU_STREAM_WRITE_VALUE_DEFAULT));
                while (*word < count) std::atomic_thread_fence(std::memory_order_acquire);
            } else {
                CHECK(cuStreamSynchronize(stream));
            }
            total.push_back(us_since(a));
            Clock::time_point until = Clock::now() + std::chrono::milliseconds(1);
            while (Clock::now() < until) {
            }
        }
        printf("%-7s launch p50 %6.2f p99 %6.2f | total p50 %6.2f p99 %6.2f us (n=%zu)\n", v,
               pct(launch, 0.5), pct(launch, 0.99), pct(total, 0.5), pct(total, 0.99),
               total.size());
    }
    return 0;
}
