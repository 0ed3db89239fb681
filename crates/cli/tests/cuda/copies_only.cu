// Copies and memsets on a stream, and no kernel: under `fair` and `priority`
// the scheduling gate schedules them as it schedules launches.
//   copies_only        checks the copies and exits
//   copies_only hold   then prints "holding" and sleeps until killed
#include <cstdio>
#include <cstring>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
    const size_t bytes = 1 << 20;
    const int rounds = 64;
    unsigned char *a = nullptr, *b = nullptr;
    cudaStream_t s;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaStreamCreate(&s) != cudaSuccess) {
        printf("copies_only: FAIL: setup\n");
        return 1;
    }
    for (int i = 0; i < rounds; i++) {
        cudaMemsetAsync(a, i, bytes, s);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    }
    cudaError_t e = cudaStreamSynchronize(s);
    std::vector<unsigned char> host(bytes);
    if (e == cudaSuccess) e = cudaMemcpy(host.data(), b, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        printf("copies_only: FAIL: %s\n", cudaGetErrorName(e));
        return 1;
    }
    for (size_t i = 0; i < bytes; i++) {
        if (host[i] != rounds - 1) {
            printf("copies_only: FAIL: byte %zu is %d\n", i, host[i]);
            return 1;
        }
    }
    printf("copies_only: PASS\n");
    if (argc > 1 && strcmp(argv[1], "hold") == 0) {
        printf("holding\n");
        fflush(stdout);
        for (;;) sleep(1);
    }
    return 0;
}
