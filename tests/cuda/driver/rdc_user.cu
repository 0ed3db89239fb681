// Relocatable device code for jit_link.cu: a kernel calling a device function
// defined in rdc_helper.cu. Compiled with `nvcc -rdc=true -ptx`.
__device__ int helper(int x);
__global__ void k(int *out) { out[threadIdx.x] = helper(threadIdx.x); }
