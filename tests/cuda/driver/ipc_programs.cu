// Two programs share device memory and an event (cudaIpc*), as NVIDIA's
// simpleIPC and PyTorch's CUDA tensors between processes do. The parent
// starts a copy of itself as a child and hands it the handles; the child
// fills the parent's buffer behind a slow kernel, records the parent's
// event and says so at once; the parent's stream waits for the event and
// reads the buffer, which must hold the child's values. A forged handle and
// an unknown flag open nothing. Where the device shares no events (its
// attribute is 0), their handles must be refused. Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

extern char **environ;

constexpr int N = 1 << 16;
constexpr int VALUE = 4242;
constexpr long long SPINS = 20'000'000;

// Thread 0 first spins, so its element lands well after the kernel began.
__global__ void fill_slowly(int *buf, int n, int value, long long spins, int *sink)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) {
        unsigned long long acc = 1;
        for (long long k = 0; k < spins; k++)
            acc = acc * 6364136223846793005ull + 1442695040888963407ull;
        if (acc == 42)
            sink[0] = 1;
    }
    if (i < n)
        buf[i] = value + i;
}

static void to_hex(const void *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)bytes)[i]);
}

static void from_hex(const char *hex, void *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        ((unsigned char *)bytes)[i] = (unsigned char)v;
    }
}

static int child(const char *mem_hex, const char *event_hex, int done_fd)
{
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event_handle;
    from_hex(mem_hex, &mem, sizeof mem);
    from_hex(event_hex, &event_handle, sizeof event_handle);

    void *opened = nullptr;
    cudaIpcMemHandle_t forged;
    for (size_t i = 0; i < sizeof forged.reserved; i++)
        forged.reserved[i] = (char)(mem.reserved[i] ^ 0x5a);
    REQUIRE(cudaIpcOpenMemHandle(&opened, forged, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess,
            "a forged handle opened");
    cudaGetLastError();
    REQUIRE(cudaIpcOpenMemHandle(&opened, mem, 0x40) != cudaSuccess, "an unknown flag was taken");
    cudaGetLastError();

    int *buf = nullptr;
    CHECK(cudaIpcOpenMemHandle((void **)&buf, mem, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t event;
    CHECK(cudaIpcOpenEventHandle(&event, event_handle));
    int *sink;
    CHECK(cudaMalloc(&sink, sizeof(int)));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    fill_slowly<<<N / 256, 256, 0, stream>>>(buf, N, VALUE, SPINS, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(event, stream));
    // Tell the parent now, with the kernel still running.
    REQUIRE(write(done_fd, "R", 1) == 1, "no word to the parent");
    close(done_fd);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaIpcCloseMemHandle(buf));
    CHECK(cudaEventDestroy(event));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(sink));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]));

    int events_shared = 0;
    CHECK(cudaDeviceGetAttribute(&events_shared, cudaDevAttrIpcEventSupport, 0));
    int *buf;
    CHECK(cudaMalloc(&buf, N * sizeof(int)));
    if (!events_shared) {
        cudaEvent_t event;
        cudaIpcEventHandle_t handle;
        CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess));
        REQUIRE(cudaIpcGetEventHandle(&handle, event) != cudaSuccess,
                "an event handle where the attribute says none");
        printf("no events shared between programs on this device (as its attribute says)\nPASS\n");
        return 0;
    }
    CHECK(cudaMemset(buf, 0, N * sizeof(int)));
    cudaEvent_t event;
    cudaEvent_t timed;
    CHECK(cudaEventCreate(&timed));
    cudaIpcEventHandle_t refused;
    REQUIRE(cudaIpcGetEventHandle(&refused, timed) != cudaSuccess,
            "a timed event, not interprocess, got a handle");
    cudaGetLastError();
    CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event_handle;
    CHECK(cudaIpcGetMemHandle(&mem, buf));
    CHECK(cudaIpcGetEventHandle(&event_handle, event));

    char mem_hex[2 * sizeof mem + 1], event_hex[2 * sizeof event_handle + 1], fd[16];
    to_hex(&mem, sizeof mem, mem_hex);
    to_hex(&event_handle, sizeof event_handle, event_hex);
    int done[2];
    REQUIRE(pipe(done) == 0, "no pipe");
    snprintf(fd, sizeof fd, "%d", done[1]);
    char *args[] = {argv[0], (char *)"child", mem_hex, event_hex, fd, nullptr};
    pid_t pid;
    REQUIRE(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, environ) == 0,
            "the child did not start");
    close(done[1]);
    char word = 0;
    REQUIRE(read(done[0], &word, 1) == 1 && word == 'R', "the child recorded nothing");

    // The child's kernel is still running: this stream's read waits for it.
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(stream, event, 0));
    static int host[N];
    CHECK(cudaMemcpyAsync(host, buf, sizeof host, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < N; i++)
        REQUIRE(host[i] == VALUE + i, "element %d is %d after the child's event, not %d", i, host[i],
                VALUE + i);
    CHECK(cudaEventSynchronize(event));
    CHECK(cudaEventQuery(event));

    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid, "no child to wait for");
    REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
    CHECK(cudaEventDestroy(event));
    CHECK(cudaEventDestroy(timed));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(buf));
    printf("PASS\n");
    return 0;
}
