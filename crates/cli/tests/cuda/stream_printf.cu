// A kernel prints; its stream is synchronized (a non-blocking stream, then the
// legacy default stream); then the host prints. The device's line must come
// out before the host's, as the driver flushes printf at a stream
// synchronize. Prints PASS (last) and exits 0.
#include <cstdio>

__global__ void speak(int i) { printf("device line %d\n", i); }

int main() {
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
    for (int i = 0; i < 6; i++) {
        cudaStream_t on = i < 3 ? s : 0;
        speak<<<1, 1, 0, on>>>(i);
        if (cudaStreamSynchronize(on) != cudaSuccess) return 1;
        printf("host line %d\n", i);
        fflush(stdout);
    }
    printf("PASS\n");
    return 0;
}
