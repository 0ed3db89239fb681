// A steady stream of synchronous copies, for watching which thread of the
// server and its worker limits them (bench/h100/probes/tcp_threads.sh):
//   copy_loop htod|dtoh MIB SECONDS [pinned|pageable]
// prints the copies' GB/s over the whole run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: copy_loop htod|dtoh MIB SECONDS [pinned|pageable]\n");
        return 2;
    }
    bool htod = strcmp(argv[1], "htod") == 0;
    size_t bytes = (size_t)atol(argv[2]) << 20;
    double seconds = atof(argv[3]);
    bool pinned = argc < 5 || strcmp(argv[4], "pinned") == 0;
    void *dev = nullptr, *host = nullptr;
    if (cudaMalloc(&dev, bytes) != cudaSuccess) return 1;
    if (pinned ? cudaMallocHost(&host, bytes) != cudaSuccess : !(host = malloc(bytes))) return 1;
    memset(host, 1, bytes);
    auto t0 = std::chrono::steady_clock::now();
    double took = 0;
    long copies = 0;
    while (took < seconds) {
        cudaError_t e = htod ? cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice)
                             : cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            fprintf(stderr, "copy failed: %s\n", cudaGetErrorString(e));
            return 1;
        }
        copies++;
        took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    printf("%s %s %zu MiB: %ld copies in %.2f s, %.2f GB/s\n", argv[1], pinned ? "pinned" : "pageable",
           bytes >> 20, copies, took, copies * (double)bytes / took / 1e9);
    return 0;
}
