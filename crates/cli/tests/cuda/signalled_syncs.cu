// Launches and waits for the stream, again and again (as a latency-critical
// tenant does), then checks every launch ran. Prints PASS, else exits 1.
#include <cstdio>

__global__ void add_one(int *v) { *v += 1; }

int main() {
    int *v = nullptr, host = 0;
    if (cudaMalloc(&v, sizeof(int)) != cudaSuccess) return 1;
    if (cudaMemset(v, 0, sizeof(int)) != cudaSuccess) return 1;
    for (int i = 0; i < 50; i++) {
        add_one<<<1, 1>>>(v);
        cudaError_t e = cudaStreamSynchronize(0);
        if (e != cudaSuccess) {
            printf("synchronize %d: %s\n", i, cudaGetErrorString(e));
            return 1;
        }
    }
    if (cudaMemcpy(&host, v, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    if (host != 50) {
        printf("read %d, expected 50\n", host);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
