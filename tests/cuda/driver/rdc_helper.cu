// Relocatable device code for jit_link.cu: the device function rdc_user.cu calls.
__device__ int helper(int x) { return 5 * x + 1; }
