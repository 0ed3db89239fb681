// What a mark costs natively: a launch (or a graph of 100 launches) waited
// for by cudaStreamSynchronize, against the same work followed by
// cuStreamWriteValue64 into mapped host memory that the host spins on (a
// synchronize's mark), and against an event recorded behind it that a second
// stream waits for before its store (an event's mark). p50 and p99 in µs of
// each, natively; also two stores in a row (a signal's, then a mark's), and
// a store issued 15 µs after the work. Build: nvcc -O2 -arch=sm_90 write_value.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void empty_kernel() {}

using Clock = std::chrono::steady_clock;

static void report(const char *name, std::vector<double> &us) {
    std::sort(us.begin(), us.end());
    printf("%-28s p50 %7.2f us  p99 %7.2f us\n", name, us[us.size() / 2],
           us[us.size() * 99 / 100]);
}

int main() {
    const int iters = 3000, kernels = 100;
    cudaStream_t s, side;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    volatile unsigned long long *host = nullptr;
    cudaHostAlloc((void **)&host, 64, cudaHostAllocMapped);
    *host = 0;
    void *dev = nullptr;
    cudaHostGetDevicePointer(&dev, (void *)host, 0);
    CUdeviceptr mark = (CUdeviceptr)dev;
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int k = 0; k < kernels; k++) empty_kernel<<<1, 1, 0, s>>>();
    cudaStreamEndCapture(s, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    unsigned long long value = 0;
    auto work = [&](bool g) {
        if (g)
            cudaGraphLaunch(exec, s);
        else
            empty_kernel<<<1, 1, 0, s>>>();
    };
    for (int g = 0; g < 2; g++) {
        const char *what = g ? "graph100" : "kernel";
        for (int mode = 0; mode < 5; mode++) {
            std::vector<double> us;
            for (int i = 0; i < iters + 100; i++) {
                auto t0 = Clock::now();
                work(g);
                if (mode == 0) {
                    cudaStreamSynchronize(s);
                } else if (mode == 1) {
                    value++;
                    cuStreamWriteValue64((CUstream)s, mark, value, 0);
                    while (*host < value) {
                    }
                } else if (mode == 3) {
                    // A signal's store right behind the work, then the mark's.
                    value++;
                    cuStreamWriteValue64((CUstream)s, mark + 8, value, 0);
                    cuStreamWriteValue64((CUstream)s, mark, value, 0);
                    while (*host < value) {
                    }
                } else if (mode == 4) {
                    // The mark's store issued 15 us after the work (as a
                    // worker gets it), the work still running.
                    value++;
                    auto t1 = Clock::now();
                    while (std::chrono::duration<double, std::micro>(Clock::now() - t1).count() < 15) {
                    }
                    cuStreamWriteValue64((CUstream)s, mark, value, 0);
                    while (*host < value) {
                    }
                } else {
                    value++;
                    cudaEventRecord(ev, s);
                    cudaStreamWaitEvent(side, ev, 0);
                    cuStreamWriteValue64((CUstream)side, mark, value, 0);
                    while (*host < value) {
                    }
                }
                if (i >= 100)
                    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
            }
            char name[64];
            snprintf(name, sizeof name, "%s %s", what,
                     mode == 0   ? "sync"
                     : mode == 1 ? "write-on-stream"
                     : mode == 2 ? "event+side-write"
                     : mode == 3 ? "two-writes"
                                 : "write-15us-later");
            report(name, us);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("done: %s\n", cudaGetErrorString(e));
    return e != cudaSuccess;
}
