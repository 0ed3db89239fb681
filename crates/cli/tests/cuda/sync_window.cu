// Synchronizes that marks answer: a launch then its stream's synchronize,
// synchronous copies to and from pinned memory around a kernel, and a
// context synchronize with two streams busy. Each is checked against what
// the kernels wrote (mapped memory, the copied bytes), so a wait that
// returned early shows. Then a fault: the synchronize after a faulting
// kernel must fail. Prints PASS and exits 0, else exits 1.
#include <cstdio>

__global__ void stamp(volatile int *slots, int i) { slots[i] = i + 1; }
__global__ void bump(int *v, int by) { v[threadIdx.x] += by; }
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
    const int n = 200, words = 64;
    int *host = nullptr, *slots = nullptr;
    CHECK(cudaHostAlloc(&host, n * sizeof(int), cudaHostAllocMapped));
    for (int i = 0; i < n; i++) host[i] = 0;
    CHECK(cudaHostGetDevicePointer((void **)&slots, host, 0));
    cudaStream_t s, t;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreate(&t));
    int *dev = nullptr, *pinned = nullptr;
    CHECK(cudaMalloc(&dev, words * sizeof(int)));
    CHECK(cudaMallocHost(&pinned, words * sizeof(int)));
    for (int i = 0; i < n; i++) {
        stamp<<<1, 1, 0, s>>>(slots, i);
        CHECK(cudaStreamSynchronize(s));
        if (((volatile int *)host)[i] != i + 1) {
            printf("slot %d reads %d after its stream's synchronize\n", i, host[i]);
            return 1;
        }
        for (int k = 0; k < words; k++) pinned[k] = i + k;
        CHECK(cudaMemcpy(dev, pinned, words * sizeof(int), cudaMemcpyHostToDevice));
        for (int k = 0; k < words; k++) pinned[k] = -1;
        bump<<<1, words>>>(dev, 1);
        CHECK(cudaMemcpy(pinned, dev, words * sizeof(int), cudaMemcpyDeviceToHost));
        for (int k = 0; k < words; k++) {
            if (pinned[k] != i + k + 1) {
                printf("round %d: word %d reads %d after the copy back\n", i, k, pinned[k]);
                return 1;
            }
        }
    }
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < n; i++) host[i] = 0;
        for (int i = 0; i < n; i++) stamp<<<1, 1, 0, i % 2 ? s : t>>>(slots, i);
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; i++) {
            if (((volatile int *)host)[i] != i + 1) {
                printf("round %d: slot %d reads %d after the context's synchronize\n", round,
                       i, host[i]);
                return 1;
            }
        }
    }
    int *small = nullptr;
    CHECK(cudaMalloc(&small, 64));
    stray<<<1, 1, 0, s>>>(small);
    cudaError_t waited = cudaStreamSynchronize(s);
    if (waited == cudaSuccess) {
        printf("the synchronize after a faulting kernel succeeded\n");
        return 1;
    }
    printf("fault: %s\n", cudaGetErrorString(waited));
    printf("PASS\n");
    return 0;
}
