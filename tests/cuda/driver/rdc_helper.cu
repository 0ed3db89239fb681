// Relocatable device code for jit_link.cu and rdc_program.cu: the device
// function they call from another translation unit.
template <typename T> __device__ __noinline__ T twice(T x) { return x + x; }
__device__ int helper(int x) { return twice(x) / 2 * 5 + 1; }
