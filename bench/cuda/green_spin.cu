// The green probe's kernel (bench/cuda/green_probe.c): fixed work per block; each thread runs ITER dependent FMAs.
extern "C" __global__ void spin(float *out, int iters) {
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    for (int i = 0; i < iters; i++) a = fmaf(a, b, 1e-7f);
    if (a == -1.0f) out[blockIdx.x] = a;  // never true; keeps the loop
    if (threadIdx.x == 0) out[blockIdx.x] = (float)blockIdx.x;
}
