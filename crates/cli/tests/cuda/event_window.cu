// Paces launches with a window of events, as programs do: an event after
// each launch, 32 in flight, a synchronize on the oldest. Each kernel writes
// its index into mapped pinned memory, so a synchronize that returned early
// shows as a slot not written yet. Then a fault: a kernel that writes out of
// bounds, an event after it, whose synchronize must fail. Prints PASS and
// exits 0, else exits 1.
#include <cstdio>

__global__ void stamp(volatile int *slots, int i) { slots[i] = i + 1; }
__global__ void stray(int *p) { p[1 << 28] = 1; }

#define CHECK(call)                                                                \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            printf("%s failed: %s\n", #call, cudaGetErrorString(e_));              \
            return 1;                                                              \
        }                                                                          \
    } while (0)

int main() {
    const int n = 400, window = 32;
    int *host = nullptr, *slots = nullptr;
    CHECK(cudaHostAlloc(&host, n * sizeof(int), cudaHostAllocMapped));
    for (int i = 0; i < n; i++) host[i] = 0;
    CHECK(cudaHostGetDevicePointer((void **)&slots, host, 0));
    cudaEvent_t events[window];
    for (int i = 0; i < window; i++) CHECK(cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming));
    for (int i = 0; i < n; i++) {
        if (i >= window) {
            int j = i - window;
            CHECK(cudaEventSynchronize(events[j % window]));
            if (((volatile int *)host)[j] != j + 1) {
                printf("slot %d reads %d after its event's synchronize\n", j, host[j]);
                return 1;
            }
            CHECK(cudaEventQuery(events[j % window]));
        }
        stamp<<<1, 1>>>(slots, i);
        CHECK(cudaEventRecord(events[i % window], 0));
    }
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++) {
        if (host[i] != i + 1) {
            printf("slot %d reads %d at the end\n", i, host[i]);
            return 1;
        }
    }
    int *small = nullptr;
    CHECK(cudaMalloc(&small, 64));
    stray<<<1, 1>>>(small);
    CHECK(cudaEventRecord(events[0], 0));
    cudaError_t waited = cudaEventSynchronize(events[0]);
    if (waited == cudaSuccess) {
        printf("the synchronize after a faulting kernel succeeded\n");
        return 1;
    }
    printf("fault: %s\n", cudaGetErrorString(waited));
    printf("PASS\n");
    return 0;
}
