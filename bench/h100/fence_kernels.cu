// Fencing's cost on memory-bound kernels: a STREAM triad (a = b + s * c), a
// gather (out[i] = in[idx[i]]) and a read-modify-write of atomics, each timed
// with events over ITERS launches after a warm-up. Prints "NAME ms X" (per
// launch) and "check OK" when the results are right. Built with PTX
// (-gencode arch=compute_90,code=compute_90) so cumux's shared mode can fence it.
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void triad(float *a, const float *b, const float *c, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = b[i] + s * c[i];
}

__global__ void gather(float *out, const float *in, const unsigned *idx, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = in[idx[i]];
}

__global__ void histogram(unsigned *bins, const unsigned *idx, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&bins[idx[i] & 4095], 1u);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (64u << 20);
    int iters = argc > 2 ? atoi(argv[2]) : 50;
    float *a, *b, *c;
    unsigned *idx, *bins;
    cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&c, n * 4);
    cudaMalloc(&idx, n * 4); cudaMalloc(&bins, 4096 * 4);
    std::vector<unsigned> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = (unsigned)((i * 2654435761u) % n);
    cudaMemcpy(idx, h.data(), n * 4, cudaMemcpyHostToDevice);
    std::vector<float> ones(n, 1.0f);
    cudaMemcpy(b, ones.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(c, ones.data(), n * 4, cudaMemcpyHostToDevice);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto time = [&](const char *name, auto launch) {
        launch(); cudaDeviceSynchronize();
        cudaEventRecord(e0);
        for (int i = 0; i < iters; ++i) launch();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("%s ms %.5f\n", name, ms / iters);
    };
    time("triad", [&] { triad<<<1056, 512>>>(a, b, c, 2.0f, n); });
    time("gather", [&] { gather<<<1056, 512>>>(a, b, idx, n); });
    cudaMemset(bins, 0, 4096 * 4);
    time("atomics", [&] { histogram<<<1056, 512>>>(bins, idx, n); });
    float first = 0;
    cudaMemcpy(&first, a, 4, cudaMemcpyDeviceToHost);
    cudaError_t e = cudaDeviceSynchronize();
    printf(e == cudaSuccess && first == 1.0f ? "check OK\n" : "check FAILED (%s, %f)\n", cudaGetErrorName(e), first);
    return e == cudaSuccess ? 0 : 1;
}
