// Checks of the tests/cuda/driver programs: a call that fails prints a FAIL
// line naming the call and its error, and returns 1 from the function using
// it (main). CHECK is for runtime API calls (cudaError_t), CK for driver API
// calls (CUresult), REQUIRE for any condition. Included as "check.h", found beside the source, so nvcc
// and cc need no include path; plain C, for cuda12_runtime.c too.
#ifndef CUMUX_DRIVER_CHECK_H
#define CUMUX_DRIVER_CHECK_H

#define CHECK(x)                                                              \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x,                 \
             cudaGetErrorString(e_));                                         \
      return 1;                                                               \
    }                                                                         \
  } while (0)

#define CK(x)                                                                 \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      const char *n_ = "?";                                                   \
      cuGetErrorName(r_, &n_);                                                \
      printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, n_);            \
      return 1;                                                               \
    }                                                                         \
  } while (0)

// REQUIRE(cond, fmt, ...): a FAIL line with the message unless cond holds.
#define REQUIRE(cond, ...)                                                    \
  do {                                                                        \
    if (!(cond)) {                                                            \
      printf("FAIL " __VA_ARGS__);                                            \
      printf("\n");                                                           \
      return 1;                                                               \
    }                                                                         \
  } while (0)

#endif
