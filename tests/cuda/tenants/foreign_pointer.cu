// Two tenants, one pointer. "own" allocates a secret buffer (filled with 0xA5),
// prints "ptr 0x…" and "holding", and sleeps (argv[2] seconds, default 120).
// "steal 0x…" is another program that tries the owner's pointer: copy from
// it, copy to it, set it, free it, and read it from a kernel. Each must fail
// (the kernel with an illegal address, 700) and no secret byte may appear.
// Prints "steal: PASS" or what went wrong. Exit: 0 on PASS, 3 otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

__global__ void peek(const unsigned int *src, unsigned int *dst) { *dst = *src; }

static int own(int seconds) {
    char *pad = nullptr, *big = nullptr, *secret = nullptr;
    // The secret lies past anything the thief will hold, so its kernel cannot
    // land on memory of its own at that address.
    if (cudaMalloc(&pad, 4096) != cudaSuccess || cudaMalloc(&big, 1 << 20) != cudaSuccess ||
        cudaMalloc(&secret, 4096) != cudaSuccess) {
        printf("own: cudaMalloc failed\n");
        return 3;
    }
    if (cudaMemset(secret, 0xa5, 4096) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        printf("own: cudaMemset failed\n");
        return 3;
    }
    printf("ptr %p\nholding\n", (void *)secret);
    fflush(stdout);
    sleep(seconds);
    unsigned char check[4096];
    if (cudaMemcpy(check, secret, sizeof check, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("own: cannot read back\n");
        return 3;
    }
    for (unsigned char c : check) {
        if (c != 0xa5) {
            printf("own: the secret was changed\n");
            return 3;
        }
    }
    printf("own: PASS\n");
    return 0;
}

static int steal(void *foreign) {
    int failures = 0;
    auto expect_error = [&](const char *what, cudaError_t e) {
        printf("%s: %s (%d)\n", what, cudaGetErrorName(e), (int)e);
        if (e == cudaSuccess) ++failures;
        (void)cudaGetLastError();
    };
    unsigned char buf[64];
    memset(buf, 0, sizeof buf);
    expect_error("memcpy from", cudaMemcpy(buf, foreign, sizeof buf, cudaMemcpyDeviceToHost));
    for (unsigned char c : buf) {
        if (c == 0xa5) {
            printf("a secret byte leaked\n");
            ++failures;
            break;
        }
    }
    expect_error("memcpy to", cudaMemcpy(foreign, buf, sizeof buf, cudaMemcpyHostToDevice));
    cudaError_t set = cudaMemset(foreign, 0, 64);
    if (set == cudaSuccess) set = cudaDeviceSynchronize();
    expect_error("memset", set);
    expect_error("free", cudaFree(foreign));
    unsigned int *out = nullptr;
    if (cudaMalloc(&out, sizeof *out) != cudaSuccess) {
        printf("cudaMalloc failed\n");
        return 3;
    }
    cudaMemset(out, 0, sizeof *out);
    peek<<<1, 1>>>((const unsigned int *)foreign, out);
    cudaError_t launched = cudaDeviceSynchronize();
    printf("kernel: %s (%d)\n", cudaGetErrorName(launched), (int)launched);
    if (launched != cudaErrorIllegalAddress) ++failures;
    if (failures == 0) printf("steal: PASS\n");
    return failures == 0 ? 0 : 3;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "own") == 0) return own(argc > 2 ? atoi(argv[2]) : 120);
    if (argc > 2 && strcmp(argv[1], "steal") == 0)
        return steal((void *)strtoull(argv[2], nullptr, 16));
    printf("usage: foreign_pointer own [SECONDS] | steal 0xPTR\n");
    return 2;
}
