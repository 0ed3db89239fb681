// Launches and synchronizes in a loop until a CUDA call fails or the time limit
// (argv[1] seconds, default 60) passes. Prints "started" once the first launch
// has completed. Exit: 0 after the time limit, 3 when a CUDA call failed.
#include <cstdio>
#include <cstdlib>
#include <ctime>

__global__ void bump(int *counter) { atomicAdd(counter, 1); }

static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double limit = argc > 1 ? atof(argv[1]) : 60.0;
    int *counter = nullptr;
    cudaError_t err = cudaMalloc(&counter, sizeof(int));
    if (err != cudaSuccess) {
        printf("cudaMalloc failed: %s (%d)\n", cudaGetErrorString(err), (int)err);
        return 3;
    }
    double start = now_s();
    for (long i = 0;; ++i) {
        bump<<<1, 32>>>(counter);
        err = cudaDeviceSynchronize();
        if (err == cudaSuccess) err = cudaGetLastError();
        if (err != cudaSuccess) {
            printf("iteration %ld failed: %s (%d)\n", i, cudaGetErrorString(err), (int)err);
            fflush(stdout);
            return 3;
        }
        if (i == 0) {
            printf("started\n");
            fflush(stdout);
        }
        if (now_s() - start > limit) break;
    }
    int value = 0;
    cudaMemcpy(&value, counter, sizeof(int), cudaMemcpyDeviceToHost);
    printf("loop_launches: PASS (%d increments)\n", value);
    return 0;
}
