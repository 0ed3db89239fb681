// Does freeing memory or unloading a module wait for other streams' work in
// the same context? (What a shared-mode session's teardown does while other
// tenants' kernels run.) A second thread keeps ~32 kernels of ~1 ms queued on
// a non-blocking stream; the main thread times cuMemFree of a fresh 2 MiB
// allocation and cuModuleUnload of a freshly loaded module, with and without
// that load. Diagnostics, not a benchmark.
//
//   nvcc -O2 -arch=sm_90 -o free_sync free_sync.cu -lcuda
//   nvcc -arch=sm_90 -cubin -o free_sync.cubin free_sync.cu
//   ./free_sync free_sync.cubin
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void report(const char *what, std::vector<double> &v) {
    std::sort(v.begin(), v.end());
    printf("%-28s p50 %9.1f  p99 %9.1f  max %9.1f us (n=%zu)\n", what, v[v.size() / 2],
           v[v.size() * 99 / 100], v.back(), v.size());
}

int main(int argc, char **argv) {
    const char *cubin = argc > 1 ? argv[1] : "free_sync.cubin";
    cudaFree(0);
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    long long ms_cycles = (long long)clock_khz;  // ~1 ms
    for (int loaded = 0; loaded < 2; loaded++) {
        std::atomic<bool> stop{false};
        std::thread busy;
        if (loaded) {
            busy = std::thread([&] {
                cudaStream_t s;
                cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
                cudaEvent_t ev[32];
                for (auto &e : ev) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
                for (long i = 0; !stop; i++) {
                    cudaEventSynchronize(ev[i % 32]);
                    spin<<<1, 1, 0, s>>>(ms_cycles);
                    cudaEventRecord(ev[i % 32], s);
                }
                cudaStreamSynchronize(s);
            });
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        std::vector<double> frees, unloads;
        for (int i = 0; i < 30; i++) {
            void *p = nullptr;
            cudaMalloc(&p, 2 << 20);
            double t0 = now_us();
            cudaFree(p);
            frees.push_back(now_us() - t0);
            CUmodule m;
            if (cuModuleLoad(&m, cubin) != CUDA_SUCCESS) {
                printf("cannot load %s\n", cubin);
                return 2;
            }
            t0 = now_us();
            cuModuleUnload(m);
            unloads.push_back(now_us() - t0);
        }
        stop = true;
        if (busy.joinable()) busy.join();
        printf("%s:\n", loaded ? "with 32 x 1 ms kernels queued on another stream" : "idle device");
        report("  cudaFree (2 MiB)", frees);
        report("  cuModuleUnload", unloads);
    }
    return 0;
}
