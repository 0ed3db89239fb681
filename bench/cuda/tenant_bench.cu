// One tenant of issue 6's sharing benchmark (bench/h100/tenants.sh runs
// several at once, natively, under MPS and through cumux):
//
//   tenant_bench calibrate US            iterations of `work` that take US µs alone
//   tenant_bench throughput ITERS SECS   back-to-back kernels of ITERS iterations
//                                        for SECS seconds: prints kernels/s
//   tenant_bench latency ITERS SECS      one kernel at a time, 1 ms apart:
//                                        prints p50/p99 of launch-to-completion
//                                        and of the launch call alone
//   tenant_bench paced STYLE ITERS SECS  back-to-back kernels paced as programs
//                                        pace them (issue 20), prints kernels/s:
//     window      an event after each launch, 32 in flight, sync on the oldest
//     sync        each launch followed by a stream synchronize
//     streamsync  a stream synchronize after every 16 launches
//     graph       a graph of 16 launches, two graphs in flight
//     streams     4 streams round robin, an event window of 32 across them
//
// The kernel does fixed work (dependent FMAs; one block of 256 threads per SM,
// or TENANT_BLOCKS_PER_SM blocks per SM) rather than spinning on the clock, so
// a kernel that is switched out takes longer instead of hiding contention. Output: `metric NAME VALUE UNIT`.
//
// TENANT_START_AT (seconds since the epoch, as `date +%s.%N` prints): the
// timed part starts then, once the context, streams and first kernel are
// ready, so tenants of one mix are timed over the same window however long
// each took to start (through cumux an isolated tenant's worker and context
// are made at its first call, which skewed 3 s windows by up to a second).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            fprintf(stderr, "tenant_bench: %s:%d: %s failed: %s\n", __FILE__,    \
                    __LINE__, #call, cudaGetErrorString(err_));                  \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

using Clock = std::chrono::steady_clock;

__global__ void work(float *out, long long iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 1e-7f;
    for (long long i = 0; i < iters; i++) a = fmaf(a, b, c);
    if (a == 12345.0f) out[threadIdx.x] = a;  // keeps the loop
}

// Blocks per launch: one per SM by default, so kernels of several tenants can
// share the SMs; TENANT_BLOCKS_PER_SM=8 fills every SM (8 x 256 threads), so a
// kernel holds the whole GPU until its blocks drain. Looked up once.
static int blocks() {
    static int n = 0;
    if (n == 0) {
        int sms = 0;
        CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const char *per_sm = getenv("TENANT_BLOCKS_PER_SM");
        int k = per_sm ? atoi(per_sm) : 1;
        n = sms * (k > 0 ? k : 1);
    }
    return n;
}

// Waits until TENANT_START_AT, if it is set and still ahead.
static void wait_for_start() {
    const char *at = getenv("TENANT_START_AT");
    if (!at || !*at) return;
    double target = atof(at);
    for (;;) {
        double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
        if (now >= target) return;
        double left = target - now;
        std::this_thread::sleep_for(std::chrono::duration<double>(left > 0.01 ? left - 0.005 : left));
    }
}

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median time of one kernel of `iters` iterations, in µs.
static double time_kernel(float *out, long long iters, int reps) {
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        Clock::time_point t0 = Clock::now();
        work<<<blocks(), 256>>>(out, iters);
        CHECK(cudaDeviceSynchronize());
        t.push_back(seconds_since(t0) * 1e6);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// `paced` mode: kernels of `iters` for `secs` seconds in pacing `style`.
static int paced(const char *style, float *out, long long iters, double secs) {
    const int window = 32, batch = 16, nstreams = 4;
    std::vector<cudaStream_t> streams(nstreams);
    for (auto &st : streams) CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> events(window);
    for (auto &e : events) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaGraphExec_t graph = nullptr;
    if (!strcmp(style, "graph")) {
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < batch; i++) work<<<blocks(), 256, 0, streams[0]>>>(out, iters);
        CHECK(cudaStreamEndCapture(streams[0], &g));
        CHECK(cudaGraphInstantiate(&graph, g, 0));
    } else if (strcmp(style, "window") && strcmp(style, "sync") && strcmp(style, "streamsync") &&
               strcmp(style, "streams")) {
        fprintf(stderr, "tenant_bench: unknown pacing %s\n", style);
        return 64;
    }
    long long done = 0, n = 0;
    wait_for_start();
    Clock::time_point t0 = Clock::now();
    while (seconds_since(t0) < secs) {
        if (!strcmp(style, "sync")) {
            work<<<blocks(), 256, 0, streams[0]>>>(out, iters);
            CHECK(cudaStreamSynchronize(streams[0]));
            done++;
        } else if (!strcmp(style, "streamsync")) {
            for (int i = 0; i < batch; i++) work<<<blocks(), 256, 0, streams[0]>>>(out, iters);
            CHECK(cudaStreamSynchronize(streams[0]));
            done += batch;
        } else if (!strcmp(style, "graph")) {
            // Two graphs in flight: wait for the one before this one.
            CHECK(cudaGraphLaunch(graph, streams[0]));
            CHECK(cudaEventRecord(events[n & 1], streams[0]));
            if (n > 0) CHECK(cudaEventSynchronize(events[(n - 1) & 1]));
            done += batch;
            n++;
        } else {
            // window / streams: an event after each launch; past 32 in
            // flight, wait for the oldest.
            cudaStream_t st = streams[!strcmp(style, "streams") ? n % nstreams : 0];
            if (n >= window) CHECK(cudaEventSynchronize(events[n % window]));
            work<<<blocks(), 256, 0, st>>>(out, iters);
            CHECK(cudaEventRecord(events[n % window], st));
            done++;
            n++;
        }
    }
    CHECK(cudaDeviceSynchronize());
    double elapsed = seconds_since(t0);
    printf("metric kernels_per_s %.3f 1/s\nmetric kernels %lld count\n", done / elapsed, done);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tenant_bench calibrate US | throughput ITERS SECS | latency ITERS SECS | paced STYLE ITERS SECS\n");
        return 64;
    }
    float *out;
    CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    work<<<blocks(), 256>>>(out, 1);
    CHECK(cudaDeviceSynchronize());
    const char *mode = argv[1];
    if (!strcmp(mode, "calibrate")) {
        double target = atof(argv[2]);
        // Launch+sync floor, then scale the iterations to the target.
        double floor_us = time_kernel(out, 1, 20);
        long long iters = 1000;
        double us = time_kernel(out, iters, 5);
        for (int round = 0; round < 8; round++) {
            double per_iter = std::max(1e-6, (us - floor_us) / iters);
            iters = std::max(1LL, (long long)((target - floor_us) / per_iter));
            if (target <= floor_us) iters = 1;
            us = time_kernel(out, iters, 5);
            if (us > 0.95 * target && us < 1.05 * target) break;
        }
        printf("metric iters %lld count\nmetric kernel_us %.3f us\nmetric floor_us %.3f us\n",
               iters, us, floor_us);
        return 0;
    }
    if (argc < 4) return 64;
    long long iters = atoll(argv[2]);
    double secs = atof(argv[3]);
    if (!strcmp(mode, "throughput")) {
        // Keep at most 64 kernels queued: the queue never grows past what a
        // GPU runs in a few ms, so rates reflect sharing, not buffering.
        cudaEvent_t marks[2];
        CHECK(cudaEventCreateWithFlags(&marks[0], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&marks[1], cudaEventDisableTiming));
        long long done = 0;
        int k = 0;
        wait_for_start();
        Clock::time_point t0 = Clock::now();
        while (seconds_since(t0) < secs) {
            for (int i = 0; i < 32; i++) work<<<blocks(), 256>>>(out, iters);
            CHECK(cudaEventRecord(marks[k & 1]));
            if (k > 0) CHECK(cudaEventSynchronize(marks[(k - 1) & 1]));
            done += 32;
            k++;
        }
        CHECK(cudaDeviceSynchronize());
        double elapsed = seconds_since(t0);
        printf("metric kernels_per_s %.3f 1/s\nmetric kernels %lld count\n", done / elapsed, done);
        return 0;
    }
    if (!strcmp(mode, "paced")) {
        if (argc < 5) return 64;
        return paced(argv[2], out, atoll(argv[3]), atof(argv[4]));
    }
    if (!strcmp(mode, "latency")) {
        // TENANT_STREAM=blocking|nonblocking|urgent: a stream of the program's
        // own (urgent: the most urgent priority) instead of the legacy default.
        cudaStream_t stream = 0;
        const char *kind = getenv("TENANT_STREAM");
        if (kind && *kind) {
            int least = 0, greatest = 0;
            CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
            unsigned flags = strcmp(kind, "nonblocking") ? cudaStreamDefault : cudaStreamNonBlocking;
            int priority = strcmp(kind, "urgent") ? least : greatest;
            CHECK(cudaStreamCreateWithPriority(&stream, flags, priority));
        }
        std::vector<double> lat, launch;
        wait_for_start();
        Clock::time_point t0 = Clock::now();
        while (seconds_since(t0) < secs) {
            Clock::time_point a = Clock::now();
            work<<<blocks(), 256, 0, stream>>>(out, iters);
            launch.push_back(seconds_since(a) * 1e6);
            CHECK(cudaStreamSynchronize(stream));
            lat.push_back(seconds_since(a) * 1e6);
            Clock::time_point until = Clock::now() + std::chrono::milliseconds(1);
            while (Clock::now() < until) {
            }
        }
        std::sort(lat.begin(), lat.end());
        std::sort(launch.begin(), launch.end());
        auto p99 = [](const std::vector<double> &v) { return v[std::min(v.size() - 1, v.size() * 99 / 100)]; };
        printf("metric p50_us %.3f us\nmetric p99_us %.3f us\nmetric samples %zu count\n",
               lat[lat.size() / 2], p99(lat), lat.size());
        // The launch call alone (returns once the kernel is queued).
        printf("metric launch_p50_us %.3f us\nmetric launch_p99_us %.3f us\n",
               launch[launch.size() / 2], p99(launch));
        return 0;
    }
    fprintf(stderr, "tenant_bench: unknown mode %s\n", mode);
    return 64;
}
