// Does setting a context's limits back give their device memory back? Run
// natively on a GPU: free memory (cudaMemGetInfo, the driver's cuMemGetInfo)
// at start; after a kernel whose threads each keep a 16 KiB local array over a
// grid that fills the GPU (the driver grows its local-memory reservation, the
// stack, for it and keeps it); after cudaDeviceSetLimit(cudaLimitStackSize)
// back to the default read at start; and after a 1 GiB malloc heap, a kernel
// that mallocs from it, and the heap set back (which the driver may refuse).
// One line per step, in MiB; the limits as the driver reads them back.
//
// As a tenant of a shared cumux context (bench/h100/limits.sh), one step and
// exit, leaving its limits as they are: `idle` (a trivial kernel), `stack`
// (the 16 KiB-stack kernel), `heap` (a 1 GiB heap, a trivial kernel),
// `heap-used` (a 1 GiB heap and the malloc kernel).
//
//   nvcc -O2 -arch=sm_90 -o lmem_probe bench/cuda/lmem_probe.cu && ./lmem_probe
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,        \
                    cudaGetErrorString(e_));                                     \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static const int LOCAL_INTS = 4096;  // 16 KiB a thread

// Each thread writes and reads a local array too large for registers: the
// compiler puts it in local memory, 16 KiB a thread.
__global__ void deep_stack(int *out, int n)
{
    volatile int local[LOCAL_INTS];
    for (int i = threadIdx.x % 7; i < LOCAL_INTS; i += 7) local[i] = i * n;
    int sum = 0;
    for (int i = 0; i < LOCAL_INTS; i += 97) sum += local[(i + n) % LOCAL_INTS];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// Each thread takes a block of the device heap and gives it back.
__global__ void heap_user(int *out)
{
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    int *p = (int *)malloc(256);
    if (p) {
        p[0] = id;
        out[id] = p[0];
        free(p);
    } else {
        out[id] = -1;
    }
}

__global__ void trivial(int *out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1; }

static double mib(size_t bytes) { return bytes / (1024.0 * 1024.0); }

static size_t free_bytes()
{
    size_t free = 0, total = 0;
    CHECK(cudaMemGetInfo(&free, &total));
    return free;
}

static size_t limit_of(cudaLimit limit)
{
    size_t value = 0;
    CHECK(cudaDeviceGetLimit(&value, limit));
    return value;
}

static size_t start_free;

// One line: the step, free memory, its change from the start, the limits.
static void report(const char *step, const char *note)
{
    size_t now = free_bytes();
    printf("lmem_probe: %-34s free %10.1f MiB  (%+9.1f MiB from start)  stack %zu B  heap %.1f MiB%s%s\n",
           step, mib(now), mib(now) - mib(start_free), limit_of(cudaLimitStackSize),
           mib(limit_of(cudaLimitMallocHeapSize)), note[0] ? "  " : "", note);
}

// One tenant's step, its limits left as they are (`mode` as above).
static int tenant(const char *mode, int *out, int grid, int block)
{
    const bool stack = !strcmp(mode, "stack"), used = !strcmp(mode, "heap-used");
    const bool heap = used || !strcmp(mode, "heap");
    if (!stack && !heap && strcmp(mode, "idle")) {
        fprintf(stderr, "lmem_probe: modes: (none), idle, stack, heap, heap-used\n");
        return 2;
    }
    if (heap) CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, (size_t)1 << 30));
    if (stack)
        deep_stack<<<grid, block>>>(out, 3);
    else if (used)
        heap_user<<<grid, block>>>(out);
    else
        trivial<<<grid, block>>>(out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    printf("lmem_probe %s: done; stack %zu B, heap %.1f MiB\n", mode,
           limit_of(cudaLimitStackSize), mib(limit_of(cudaLimitMallocHeapSize)));
    CHECK(cudaFree(out));
    return 0;
}

int main(int argc, char **argv)
{
    CHECK(cudaFree(0));
    int dev = 0, sms = 0, threads_per_sm = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev));
    const size_t stack0 = limit_of(cudaLimitStackSize);
    const size_t heap0 = limit_of(cudaLimitMallocHeapSize);
    const int block = 256;
    const int grid = sms * (threads_per_sm / block);
    int *out = nullptr;
    CHECK(cudaMalloc(&out, (size_t)grid * block * sizeof(int)));
    if (argc > 1) return tenant(argv[1], out, grid, block);
    start_free = free_bytes();
    printf("lmem_probe: %d SMs, %d threads an SM, grid %d x %d; default stack %zu B, heap %.1f MiB\n",
           sms, threads_per_sm, grid, block, stack0, mib(heap0));
    report("(a) start", "");

    deep_stack<<<grid, block>>>(out, 3);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    report("(b) after the 16 KiB-stack kernel", "");

    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, stack0));
    report("(c) stack set back to the default", "");

    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, (size_t)1 << 30));
    report("(d1) heap set to 1 GiB", "");
    heap_user<<<grid, block>>>(out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    report("(d2) after the malloc kernel", "");
    cudaError_t back = cudaDeviceSetLimit(cudaLimitMallocHeapSize, heap0);
    char note[160];
    snprintf(note, sizeof note, "(setting it back: %s)", cudaGetErrorString(back));
    cudaGetLastError();  // a refusal is this step's answer, not a failure
    report("(d3) heap set back to the default", note);

    CHECK(cudaFree(out));
    return 0;
}
