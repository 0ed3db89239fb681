// A kernel that never ends (it waits for a flag nobody sets), for the kernel
// watchdog (`cumux serve --kernel-timeout`).
//   endless_kernel wait: launches it and synchronizes; passes when the wait fails
//                        with cudaErrorLaunchTimeout and later calls fail too.
//   endless_kernel hold: launches it, prints "launched" and sleeps until killed.
//   endless_kernel wait-killed: launches it, prints "launched" and waits for it
//                        (a synchronize that ends only when it is killed).
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void wait_for(volatile int* flag) {
    while (*flag == 0) {
    }
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "wait";
    int* flag = nullptr;
    if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess ||
        cudaMemset(flag, 0, sizeof(int)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        printf("endless_kernel: FAIL: setup\n");
        return 1;
    }
    wait_for<<<1, 1>>>(flag);
    cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) {
        printf("endless_kernel: FAIL: launch: %s\n", cudaGetErrorName(launched));
        return 1;
    }
    if (strcmp(mode, "hold") == 0 || strcmp(mode, "wait-killed") == 0) {
        printf("launched\n");
        fflush(stdout);
        if (strcmp(mode, "hold") == 0) {
            for (;;) sleep(1);
        }
        cudaError_t waited = cudaDeviceSynchronize();
        printf("endless_kernel: FAIL: the wait ended: %s\n", cudaGetErrorName(waited));
        return 1;
    }
    cudaError_t waited = cudaDeviceSynchronize();
    printf("synchronize: %s (%d)\n", cudaGetErrorName(waited), (int)waited);
    if (waited != cudaErrorLaunchTimeout) {
        printf("endless_kernel: FAIL: expected cudaErrorLaunchTimeout\n");
        return 1;
    }
    // The context was reset: nothing more runs on it.
    cudaError_t after = cudaMemset(flag, 1, sizeof(int));
    if (after == cudaSuccess) {
        printf("endless_kernel: FAIL: a call after the reset succeeded\n");
        return 1;
    }
    printf("endless_kernel: timed out, then %s\n", cudaGetErrorName(after));
    return 0;
}
