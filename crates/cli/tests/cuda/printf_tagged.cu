// Device printf of a tag of the program's own, many times over, for the test
// that two tenants of one shared context each see only their own lines.
//   printf_tagged TAG N   launches a kernel that prints "TAG i" N times (two
//                         launches queued before each synchronize)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void say(char a, char b, char c, int i) {
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("tag %c%c%c %d\n", a, b, c, i);
}

int main(int argc, char** argv) {
    const char* tag = argc > 1 ? argv[1] : "xyz";
    int n = argc > 2 ? atoi(argv[2]) : 20;
    if (strlen(tag) != 3) {
        fprintf(stderr, "a tag has 3 letters\n");
        return 2;
    }
    for (int i = 0; i < n; i += 2) {
        say<<<1, 32>>>(tag[0], tag[1], tag[2], i);
        if (i + 1 < n) say<<<1, 32>>>(tag[0], tag[1], tag[2], i + 1);
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            printf("printf_tagged: FAIL: %s\n", cudaGetErrorName(e));
            return 1;
        }
    }
    printf("printf_tagged: PASS (%d lines)\n", n);
    return 0;
}
