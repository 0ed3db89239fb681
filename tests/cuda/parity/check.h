// The parity programs' CHECK: a CUDA runtime call that fails prints where
// and why on stderr and ends the program with exit status 2. Each program of
// this folder includes it ("check.h", found beside the source, so nvcc needs
// no include path).
#ifndef CUMUX_PARITY_CHECK_H
#define CUMUX_PARITY_CHECK_H

#define CHECK(call)                                                           \
    do {                                                                      \
        cudaError_t err_ = (call);                                            \
        if (err_ != cudaSuccess) {                                            \
            fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__,          \
                    __LINE__, #call, cudaGetErrorString(err_), (int)err_);    \
            exit(2);                                                          \
        }                                                                     \
    } while (0)

#endif
