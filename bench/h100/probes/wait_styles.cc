// wait_styles: how a waiting thread's style costs the hand-off to it and the
// work it does next, on this host: a sender busy-waits GAP us, stamps the
// time and bumps a counter; the receiver waits for it (PAUSE x4 and a clock
// look as cumux's shared-memory waits do, plain spin, one PAUSE, futex sleep,
// sched_yield), then chases pointers through 512 KiB. Prints p50/p99 of the
// hand-off and of the work per style and gap. Build: g++ -O2 -pthread.
//   wait_styles [ITERS]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
using Clock = std::chrono::steady_clock;
static inline double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
alignas(64) std::atomic<uint32_t> seq{0};
alignas(64) std::atomic<uint32_t> done{0};
alignas(64) std::atomic<long> t_send{0};
std::vector<uint64_t> table;
static long nowns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }
static uint64_t work() { // pointer chasing over 512 KB + some arithmetic
    uint64_t i = 0, s = 0;
    for (int k = 0; k < 4000; k++) { i = table[i]; s += i * 7; }
    return s;
}
int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    size_t n = 65536; table.resize(n);
    std::vector<uint64_t> perm(n); for (size_t i = 0; i < n; i++) perm[i] = i;
    srand(1); for (size_t i = n - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
    for (size_t i = 0; i < n; i++) table[perm[i]] = perm[(i + 1) % n];
    const char* styles[] = {"pause4", "nopause", "pause1", "futex", "yield"};
    double gaps[] = {5, 100, 1000};
    for (int st = 0; st < 5; st++) for (double gap : gaps) {
        seq = 0; done = 0;
        std::vector<double> lat, wk;
        std::thread rx([&] {
            uint32_t want = 1; volatile uint64_t sink = 0;
            for (int it = 0; it < iters; it++, want++) {
                for (;;) {
                    if (seq.load(std::memory_order_acquire) >= want) break;
                    if (st == 0) { for (int p = 0; p < 4; p++) _mm_pause(); (void)Clock::now(); }
                    else if (st == 2) { _mm_pause(); }
                    else if (st == 3) { uint32_t v = seq.load(); if (v < want) syscall(SYS_futex, &seq, FUTEX_WAIT, v, nullptr, nullptr, 0); }
                    else if (st == 4) { sched_yield(); }
                }
                long t1 = nowns();
                auto w0 = Clock::now(); sink += work(); auto w1 = Clock::now();
                lat.push_back((t1 - t_send.load()) / 1000.0);
                wk.push_back(us(w0, w1));
                done.store(want, std::memory_order_release);
            }
        });
        for (int it = 1; it <= iters; it++) {
            auto until = Clock::now() + std::chrono::nanoseconds((long)(gap * 1000));
            while (Clock::now() < until) {}
            t_send = nowns();
            seq.store(it, std::memory_order_release);
            if (st == 3) syscall(SYS_futex, &seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
            while (done.load(std::memory_order_acquire) < (uint32_t)it) {}
        }
        rx.join();
        std::sort(lat.begin(), lat.end()); std::sort(wk.begin(), wk.end());
        auto p = [](std::vector<double>& v, double q) { return v[std::min(v.size() - 1, (size_t)(v.size() * q))]; };
        printf("%-8s gap %6.0f us: handoff p50 %6.2f p99 %7.2f us | work p50 %6.2f p99 %7.2f us\n", styles[st], gap, p(lat, .5), p(lat, .99), p(wk, .5), p(wk, .99));
        fflush(stdout);
    }
    // baseline: work right after work (hot)
    std::vector<double> wk; volatile uint64_t sink = 0;
    for (int i = 0; i < iters; i++) { auto a = Clock::now(); sink += work(); wk.push_back(us(a, Clock::now())); }
    std::sort(wk.begin(), wk.end()); printf("hot work back to back: p50 %.2f us\n", wk[wk.size() / 2]);
}
