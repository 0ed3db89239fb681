// What memory a tenant freed still holds when another tenant allocates it.
//   leftover leave SIZE  allocates SIZE (bytes, or with K or M), fills it with 0xA5,
//                        frees it, exits
//   leftover find SIZE   allocates SIZE and counts the bytes that are not zero:
//                        prints "leftover: PASS" when none are (cudaMalloc does not
//                        promise zeroes, but another tenant's bytes must not show)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: leftover leave|find SIZE\n");
        return 2;
    }
    char* unit = nullptr;
    size_t bytes = strtoull(argv[2], &unit, 10);
    if (*unit == 'K') bytes <<= 10;
    if (*unit == 'M') bytes <<= 20;
    unsigned char* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        printf("leftover: FAIL: cudaMalloc\n");
        return 1;
    }
    if (strcmp(argv[1], "leave") == 0) {
        cudaMemset(p, 0xA5, bytes);
        cudaError_t e = cudaFree(p);
        printf("leftover: left %zu bytes of 0xA5 (%s)\n", bytes, cudaGetErrorName(e));
        return e == cudaSuccess ? 0 : 1;
    }
    std::vector<unsigned char> host(bytes);
    if (cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("leftover: FAIL: cudaMemcpy\n");
        return 1;
    }
    size_t marked = 0, nonzero = 0;
    for (unsigned char b : host) {
        marked += b == 0xA5;
        nonzero += b != 0;
    }
    printf("leftover: %s: %zu of %zu bytes are 0xA5, %zu not zero\n",
           marked ? "FAIL" : "PASS", marked, bytes, nonzero);
    return marked ? 1 : 0;
}
