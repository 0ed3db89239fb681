// Synchronizes the device again and again with nothing queued in between, and
// checks that work queued after that still finishes before the next one.
// Prints PASS and exits 0, else exits 1.
#include <cstdio>

__global__ void store(int *out, int value) { *out = value; }

#define CHECK(call)                                                                \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != cudaSuccess) {                                                   \
            printf("%s failed: %s\n", #call, cudaGetErrorString(e_));              \
            return 1;                                                              \
        }                                                                          \
    } while (0)

int main() {
    int *out = nullptr;
    int host = 0;
    CHECK(cudaMalloc(&out, sizeof(int)));
    store<<<1, 1>>>(out, 7);
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 100; i++) CHECK(cudaDeviceSynchronize());
    store<<<1, 1>>>(out, 42);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(&host, out, sizeof(int), cudaMemcpyDeviceToHost));
    if (host != 42) {
        printf("read %d after the last synchronize, expected 42\n", host);
        return 1;
    }
    CHECK(cudaFree(out));
    printf("PASS\n");
    return 0;
}
