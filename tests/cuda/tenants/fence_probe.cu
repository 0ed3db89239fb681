// Kernel-level isolation in shared mode. "own" holds a secret buffer (0xA5
// bytes, its third allocation), prints "ptr 0x…" and "holding", sleeps
// (argv[2] seconds), then checks the secret is intact ("own: PASS").
// "poke 0x…" is another tenant's program whose kernel reads the owner's
// pointer and writes over it, with 16 MiB of its own allocated first (so a
// fenced access, folded into its own partition, lands on its own memory).
// Prints "kernel: <error>" and "secret: seen" or "secret: not seen"; exit 0.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

__global__ void poke(unsigned int *foreign, unsigned int *out) {
    unsigned int i = threadIdx.x;
    out[i] = foreign[i];
    foreign[i] = 0x11111111u;
}

static int own(int seconds) {
    char *pad = nullptr, *big = nullptr, *secret = nullptr;
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

static int poke_at(unsigned int *foreign) {
    char *landing = nullptr;
    unsigned int *out = nullptr;
    if (cudaMalloc(&landing, 16 << 20) != cudaSuccess || cudaMalloc(&out, 64 * 4) != cudaSuccess) {
        printf("poke: cudaMalloc failed\n");
        return 3;
    }
    cudaMemset(out, 0, 64 * 4);
    poke<<<1, 64>>>(foreign, out);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    printf("kernel: %s\n", cudaGetErrorName(e));
    unsigned int seen[64] = {0};
    if (e == cudaSuccess) cudaMemcpy(seen, out, sizeof seen, cudaMemcpyDeviceToHost);
    bool secret = false;
    for (unsigned int v : seen) secret |= v == 0xa5a5a5a5u;
    printf("secret: %s\n", secret ? "seen" : "not seen");
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "own") == 0) return own(argc > 2 ? atoi(argv[2]) : 120);
    if (argc > 2 && strcmp(argv[1], "poke") == 0)
        return poke_at((unsigned int *)strtoull(argv[2], nullptr, 16));
    printf("usage: fence_probe own [SECONDS] | poke 0xPTR\n");
    return 2;
}
