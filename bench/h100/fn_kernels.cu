// Kernels of bench/h100/functions.sh, the same ones for every side: a cumux
// function (this file's fat binary), the native program (fn_native.cu) and the CuPy server.
//
// vadd: c = a + b. The MLP: mlp_init fills a weight or bias buffer with a
// fixed pseudo-random pattern scaled by 1/sqrt(fan_in) (a plan keeps no state
// between invocations, so every side makes its weights on the device, a few
// microseconds), linear computes y = x W + bias over a batch (ReLU if asked).
#include <cstdint>

extern "C" __global__ void vadd(const float *a, const float *b, float *c, uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void mlp_init(float *w, uint32_t n, uint32_t seed, uint32_t fan_in) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (i + 1u) * 2654435761u ^ (seed * 40503u + 0x9e3779b9u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float u = (float)(h & 0xffffffu) / 8388608.0f - 1.0f;  // [-1, 1)
    w[i] = u * rsqrtf((float)fan_in);
}

// x: batch x din, w: din x dout (row-major), y: batch x dout; one thread per
// output, a block of 128 across dout, the grid's y across the batch.
extern "C" __global__ void linear(const float *x, const float *w, const float *bias, float *y,
                                  uint32_t din, uint32_t dout, uint32_t relu) {
    uint32_t o = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t b = blockIdx.y;
    if (o >= dout) return;
    const float *row = x + (size_t)b * din;
    float acc = bias[o];
    for (uint32_t k = 0; k < din; k++) acc += row[k] * w[(size_t)k * dout + o];
    y[(size_t)b * dout + o] = relu && acc < 0.0f ? 0.0f : acc;
}
