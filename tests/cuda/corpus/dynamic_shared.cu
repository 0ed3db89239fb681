// dynamic_shared: extern __shared__ memory sized at launch. Each block loads its
// segment into dynamic shared memory (an int region followed by a float
// region carved from the same buffer) and writes it back reversed and scaled.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

__global__ void dynamic_shared(const int* in, int* reversed, float* scaled, int n)
{
    extern __shared__ int shared_words[];
    int* ints = shared_words;                             // blockDim.x ints
    float* floats = (float*)&shared_words[blockDim.x];    // then blockDim.x floats

    int base = blockIdx.x * blockDim.x;
    int i = base + threadIdx.x;
    ints[threadIdx.x] = i < n ? in[i] : 0;
    floats[threadIdx.x] = i < n ? (float)in[i] * 0.5f : 0.0f;
    __syncthreads();

    int mirror = blockDim.x - 1 - threadIdx.x;
    if (i < n) {
        reversed[i] = ints[mirror];
        scaled[i] = floats[mirror];
    }
}

int main()
{
    const int block = 128;
    const int n = block * 37;
    std::vector<int> in(n), reversed(n);
    std::vector<float> scaled(n);
    for (int i = 0; i < n; ++i) in[i] = i * 3 - 1000;

    int *d_in, *d_rev;
    float* d_scaled;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_rev, n * sizeof(int)));
    CHECK(cudaMalloc(&d_scaled, n * sizeof(float)));
    CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    size_t shared_bytes = block * (sizeof(int) + sizeof(float));
    dynamic_shared<<<n / block, block, shared_bytes>>>(d_in, d_rev, d_scaled, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(reversed.data(), d_rev, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(scaled.data(), d_scaled, n * sizeof(float), cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int i = 0; i < n; ++i) {
        int src = (i / block) * block + (block - 1 - i % block);
        if (reversed[i] != in[src] || scaled[i] != (float)in[src] * 0.5f) {
            if (errors < 10) {
                printf("dynamic_shared: %d: got %d/%g expected %d/%g\n", i, reversed[i], scaled[i],
                       in[src], (float)in[src] * 0.5f);
            }
            ++errors;
        }
    }
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_rev));
    CHECK(cudaFree(d_scaled));
    if (errors) {
        printf("dynamic_shared: FAIL (%d of %d wrong)\n", errors, n);
        return 1;
    }
    printf("dynamic_shared: PASS (n=%d shared=%zu bytes)\n", n, shared_bytes);
    return 0;
}
