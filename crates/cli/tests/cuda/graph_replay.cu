// Captures a stream's 20 launches into a CUDA graph and launches it 10 times,
// then checks every launch ran (in order: each doubles, then adds one).
// Prints PASS, else exits 1.
#include <cstdio>

__global__ void step(unsigned *v, unsigned k) { *v = *v * 2 + k; }

int main() {
    unsigned *v = nullptr, host = 0;
    cudaStream_t s;
    if (cudaMalloc(&v, sizeof(unsigned)) != cudaSuccess) return 1;
    if (cudaMemset(v, 0, sizeof(unsigned)) != cudaSuccess) return 1;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) != cudaSuccess) return 1;
    for (unsigned k = 0; k < 20; k++) step<<<1, 1, 0, s>>>(v, k % 3);
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) return 1;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return 1;
    for (int i = 0; i < 10; i++) {
        if (cudaGraphLaunch(exec, s) != cudaSuccess) return 1;
    }
    if (cudaStreamSynchronize(s) != cudaSuccess) return 1;
    if (cudaMemcpy(&host, v, sizeof(unsigned), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    unsigned want = 0;
    for (int i = 0; i < 10; i++)
        for (unsigned k = 0; k < 20; k++) want = want * 2 + k % 3;
    if (host != want) {
        printf("read %u, expected %u\n", host, want);
        return 1;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    printf("PASS\n");
    return 0;
}
