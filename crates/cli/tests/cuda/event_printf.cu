// A kernel prints; an event recorded after it is synchronized; then the host
// prints. The device's line must come out before the host's, as the driver
// flushes printf at an event synchronize. Prints PASS (last) and exits 0.
#include <cstdio>

__global__ void speak(int i) { printf("device line %d\n", i); }

int main() {
    cudaEvent_t event;
    if (cudaEventCreate(&event) != cudaSuccess) return 1;
    for (int i = 0; i < 3; i++) {
        speak<<<1, 1>>>(i);
        if (cudaEventRecord(event, 0) != cudaSuccess) return 1;
        if (cudaEventSynchronize(event) != cudaSuccess) return 1;
        printf("host line %d\n", i);
        fflush(stdout);
    }
    printf("PASS\n");
    return 0;
}
