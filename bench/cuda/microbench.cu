// Micro-benchmarks of issue 4, run the same way natively and through cumux
// (bench/h100/microbench.sh runs both and writes the JSON result).
//
//   microbench launch_rate [LAUNCHES]          async empty-kernel launch rate
//   microbench launch_sync [ITERS]             launch + stream sync latency
//   microbench bandwidth [REP_SCALE] [MAX_BYTES] HtoD/DtoH, pinned and pageable
//   microbench sync_rtt [ITERS]                synchronous round trips with no work:
//                                              cudaDeviceSynchronize, cudaMemGetInfo
//   microbench graph_replay [ITERS]            a captured graph of 100 empty kernels,
//                                              launched again and again
//
// Every figure is printed as soon as it is known, one per line:
//   metric NAME VALUE UNIT
// so a run that fails part way still reports what it measured. Every CUDA call
// is checked; any error exits non-zero.
//
// Build: nvcc -O2 -o microbench bench/cuda/microbench.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            fprintf(stderr, "microbench: %s:%d: %s failed: %s (%d)\n", __FILE__, \
                    __LINE__, #call, cudaGetErrorString(err_), (int)err_);       \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

static void metric(const char *name, double value, const char *unit) {
    printf("metric %s %.6g %s\n", name, value, unit);
    fflush(stdout);
}

__global__ void empty_kernel() {}

static long arg_long(int argc, char **argv, int i, long dflt) {
    if (argc <= i) return dflt;
    char *end = nullptr;
    long v = strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v <= 0) {
        fprintf(stderr, "microbench: bad number '%s'\n", argv[i]);
        exit(64);
    }
    return v;
}

static double arg_double(int argc, char **argv, int i, double dflt) {
    if (argc <= i) return dflt;
    char *end = nullptr;
    double v = strtod(argv[i], &end);
    if (end == argv[i] || *end != '\0' || !(v > 0)) {
        fprintf(stderr, "microbench: bad number '%s'\n", argv[i]);
        exit(64);
    }
    return v;
}

static double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    // Nearest rank: the smallest sample with at least p of the samples <= it.
    size_t rank = (size_t)std::ceil(p * (double)v.size());
    if (rank < 1) rank = 1;
    if (rank > v.size()) rank = v.size();
    return v[rank - 1];
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Async launches on one stream, one synchronize at the end.
static int launch_rate(long launches) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    long warm = std::max(1L, std::min(1000L, launches / 10));
    for (long i = 0; i < warm; i++) {
        empty_kernel<<<1, 1, 0, s>>>();
        CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(s));

    Clock::time_point t0 = Clock::now();
    for (long i = 0; i < launches; i++) {
        empty_kernel<<<1, 1, 0, s>>>();
        CHECK(cudaGetLastError());
    }
    double issue = seconds_since(t0);
    CHECK(cudaStreamSynchronize(s));
    double total = seconds_since(t0);

    metric("launch_rate", (double)launches / total, "launches/s");
    metric("launch_async_us", total * 1e6 / (double)launches, "us");
    metric("launch_issue_us", issue * 1e6 / (double)launches, "us");
    CHECK(cudaStreamDestroy(s));
    return 0;
}

// One launch, then cudaStreamSynchronize, timed per iteration.
static int launch_sync(long iters) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    long warm = std::max(1L, std::min(200L, iters / 10));
    for (long i = 0; i < warm; i++) {
        empty_kernel<<<1, 1, 0, s>>>();
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
    }
    std::vector<double> us;
    us.reserve(iters);
    for (long i = 0; i < iters; i++) {
        Clock::time_point t0 = Clock::now();
        empty_kernel<<<1, 1, 0, s>>>();
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
        us.push_back(seconds_since(t0) * 1e6);
    }
    metric("launch_sync_p50_us", percentile(us, 0.50), "us");
    metric("launch_sync_p99_us", percentile(us, 0.99), "us");
    CHECK(cudaStreamDestroy(s));
    return 0;
}

// A CUDA graph of 100 empty-kernel launches (a decode step's shape: many tiny
// kernels, captured once), launched again and again: the time per graph
// launch, queued back to back and waited for at the end, and a graph launch
// plus its synchronize.
static int graph_replay(long iters) {
    const int kernels = 100;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < kernels; k++) empty_kernel<<<1, 1, 0, s>>>();
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    long warm = std::max(1L, std::min(50L, iters / 10));
    for (long i = 0; i < warm; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    Clock::time_point t0 = Clock::now();
    for (long i = 0; i < iters; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    metric("graph_100_kernels_us", seconds_since(t0) * 1e6 / iters, "us");
    std::vector<double> us;
    us.reserve(iters);
    for (long i = 0; i < iters; i++) {
        Clock::time_point t1 = Clock::now();
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        us.push_back(seconds_since(t1) * 1e6);
    }
    metric("graph_100_sync_p50_us", percentile(us, 0.50), "us");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    return 0;
}

// Calls that go to the driver and wait for it, with nothing queued: the cost
// of one synchronous round trip.
static int sync_rtt(long iters) {
    long warm = std::max(1L, std::min(200L, iters / 10));
    size_t free_b = 0, total_b = 0;
    for (long i = 0; i < warm; i++) {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemGetInfo(&free_b, &total_b));
    }
    std::vector<double> sync_us, info_us;
    sync_us.reserve(iters);
    info_us.reserve(iters);
    for (long i = 0; i < iters; i++) {
        Clock::time_point t0 = Clock::now();
        CHECK(cudaDeviceSynchronize());
        sync_us.push_back(seconds_since(t0) * 1e6);
    }
    for (long i = 0; i < iters; i++) {
        Clock::time_point t0 = Clock::now();
        CHECK(cudaMemGetInfo(&free_b, &total_b));
        info_us.push_back(seconds_since(t0) * 1e6);
    }
    metric("ctx_sync_p50_us", percentile(sync_us, 0.50), "us");
    metric("ctx_sync_p99_us", percentile(sync_us, 0.99), "us");
    metric("mem_get_info_p50_us", percentile(info_us, 0.50), "us");
    metric("mem_get_info_p99_us", percentile(info_us, 0.99), "us");
    return 0;
}

static const char *size_name(size_t bytes, char *buf, size_t len) {
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, len, "%zum", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, len, "%zuk", bytes >> 10);
    else
        snprintf(buf, len, "%zub", bytes);
    return buf;
}

static inline uint8_t pattern(size_t i, uint32_t seed) {
    return (uint8_t)((i * 2654435761u + seed) >> 13);
}

// Checks a sample of positions (and both ends) of a copied-back buffer.
static void verify(const uint8_t *h, size_t bytes, uint32_t seed, const char *what) {
    size_t step = std::max<size_t>(1, bytes / 4096);
    for (size_t i = 0; i < bytes; i += step) {
        if (h[i] != pattern(i, seed)) {
            fprintf(stderr, "microbench: %s: byte %zu is %u, want %u\n", what, i, h[i],
                    pattern(i, seed));
            exit(3);
        }
    }
    if (h[bytes - 1] != pattern(bytes - 1, seed)) {
        fprintf(stderr, "microbench: %s: last byte wrong\n", what);
        exit(3);
    }
}

// Synchronous cudaMemcpy, timed per copy with steady_clock; median of reps.
static int bandwidth(double rep_scale, size_t max_bytes) {
    const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 256u << 20};
    size_t biggest = 0;
    for (size_t sz : sizes)
        if (sz <= max_bytes) biggest = sz;
    if (biggest == 0) {
        fprintf(stderr, "microbench: max bytes %zu below the smallest size\n", max_bytes);
        return 64;
    }

    void *dev = nullptr;
    CHECK(cudaMalloc(&dev, biggest));
    uint8_t *pinned = nullptr;
    CHECK(cudaMallocHost((void **)&pinned, biggest));
    uint8_t *pageable = (uint8_t *)malloc(biggest);
    if (!pageable) {
        fprintf(stderr, "microbench: malloc(%zu) failed\n", biggest);
        return 2;
    }
    // Touch every page so first-touch faults are not timed.
    memset(pinned, 0, biggest);
    memset(pageable, 0, biggest);

    uint32_t seed = 1;
    for (size_t bytes : sizes) {
        if (bytes > biggest) break;
        int base = bytes <= (1u << 20) ? 20 : bytes <= (16u << 20) ? 10 : 3;
        int reps = std::max(1, (int)std::lround(base * rep_scale));
        char sz[32];
        size_name(bytes, sz, sizeof sz);
        for (int m = 0; m < 2; m++) {
            const char *mode = m == 0 ? "pinned" : "pageable";
            uint8_t *host = m == 0 ? pinned : pageable;
            seed++;
            for (size_t i = 0; i < bytes; i++) host[i] = pattern(i, seed);

            // HtoD: one warm-up copy, then reps timed copies.
            CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
            std::vector<double> gbs;
            for (int r = 0; r < reps; r++) {
                Clock::time_point t0 = Clock::now();
                CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
                gbs.push_back((double)bytes / seconds_since(t0) / 1e9);
            }
            char name[96];
            snprintf(name, sizeof name, "htod_%s_%s_gbps", mode, sz);
            metric(name, median(gbs), "GB/s");

            // DtoH of what was just sent, checked afterwards.
            memset(host, 0, bytes);
            CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
            gbs.clear();
            for (int r = 0; r < reps; r++) {
                Clock::time_point t0 = Clock::now();
                CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
                gbs.push_back((double)bytes / seconds_since(t0) / 1e9);
            }
            char what[96];
            snprintf(what, sizeof what, "%s %s round trip", mode, sz);
            verify(host, bytes, seed, what);
            snprintf(name, sizeof name, "dtoh_%s_%s_gbps", mode, sz);
            metric(name, median(gbs), "GB/s");
        }
    }

    free(pageable);
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dev));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s launch_rate [LAUNCHES] | launch_sync [ITERS] | "
                "bandwidth [REP_SCALE] [MAX_BYTES] | sync_rtt [ITERS] | graph_replay [ITERS]\n",
                argv[0]);
        return 64;
    }
    const char *cmd = argv[1];
    // Create the context before anything is timed.
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    int rc;
    if (!strcmp(cmd, "launch_rate"))
        rc = launch_rate(arg_long(argc, argv, 2, 20000));
    else if (!strcmp(cmd, "launch_sync"))
        rc = launch_sync(arg_long(argc, argv, 2, 2000));
    else if (!strcmp(cmd, "sync_rtt"))
        rc = sync_rtt(arg_long(argc, argv, 2, 5000));
    else if (!strcmp(cmd, "graph_replay"))
        rc = graph_replay(arg_long(argc, argv, 2, 1000));
    else if (!strcmp(cmd, "bandwidth"))
        rc = bandwidth(arg_double(argc, argv, 2, 1.0),
                       (size_t)arg_long(argc, argv, 3, 256L << 20));
    else {
        fprintf(stderr, "microbench: unknown subcommand '%s'\n", cmd);
        return 64;
    }
    if (rc == 0) CHECK(cudaDeviceSynchronize());
    return rc;
}
