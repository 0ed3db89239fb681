// Two fat binaries (this file's and lazy_other.cu's, built together): the
// other one's kernel runs only when asked ("both"). Prints PASS.
#include <cstdio>
#include <cstring>

void launch_other(int *out);

__global__ void add_one(int *v) { *v += 1; }

int main(int argc, char **argv) {
    int *v = nullptr, host = 0;
    if (cudaMalloc(&v, sizeof(int)) != cudaSuccess) return 1;
    cudaMemset(v, 0, sizeof(int));
    add_one<<<1, 1>>>(v);
    bool both = argc > 1 && strcmp(argv[1], "both") == 0;
    if (both) launch_other(v);
    if (cudaMemcpy(&host, v, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    int want = both ? 11 : 1;
    if (host != want) {
        printf("read %d, expected %d\n", host, want);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
