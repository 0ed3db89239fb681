// Ends while the driver still holds objects, from each place a program can
// end (argv[1] picks one); linked with -lcuda. A clean exit prints nothing on
// stderr; e2e_exit.rs checks that through cumux.
//   live        main returns with work queued on several streams, and
//               modules, allocations and streams never destroyed
//   atexit      atexit handlers tear down through the driver, one before the
//               CUDA runtime's own teardown and one after it (as PyTorch's
//               does); prints "atexit: PASS" when every call succeeded
//   thread-exit a second thread calls exit(0) while the main thread is in a
//               loop of driver calls
//   key-dtor    a thread's key destructor (and a C++ thread_local made before
//               its first driver call) frees through the driver as the
//               thread ends; prints "thread teardown: PASS"
//   lost FILE   the server goes away (the test kills it, then makes FILE)
//               before the program's atexit handler tears down through the
//               driver: the calls fail, quietly; prints "lost: PASS"
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <pthread.h>
#include <unistd.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"

static const char *kPtx =
    ".version 8.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry add_one(.param .u64 p_data, .param .u32 p_n)\n"
    "{\n"
    "  .reg .pred %p<2>; .reg .b32 %r<7>; .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [p_data]; ld.param.u32 %r2, [p_n];\n"
    "  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n"
    "  setp.ge.s32 %p1, %r1, %r2;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.s32 %rd3, %r1, 4;\n"
    "  add.s64 %rd2, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd2];\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  st.global.u32 [%rd2], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

__global__ void bump(int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += 1;
}

static const int N = 4096;

// What the driver-API side of every mode works on.
struct Objects {
  CUdevice dev;
  CUcontext primary;  // the runtime's, retained here too
  CUcontext own;      // created by cuCtxCreate
  CUmodule module;    // in `own`
  CUfunction add_one;
  CUdeviceptr buf;    // in `own`
  CUstream stream;    // in `own`
  CUdeviceptr late_buf;  // in `primary`, freed after the runtime's teardown
};
static Objects g;

static int failures = 0;

// Records a call made during teardown: its name and result on a FAIL line
// when it did not succeed.
static void expect_success(const char *where, const char *call, CUresult r) {
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("%s: FAIL %s -> %s\n", where, call, name);
    failures++;
  }
}
#define TEARDOWN(where, x) expect_success(where, #x, (x))

static int launch_add_one(CUstream s) {
  int n = N;
  void *params[] = {&g.buf, &n};
  CK(cuLaunchKernel(g.add_one, N / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
  return 0;
}

// The runtime's context, with this program's kernels loaded (the runtime's
// teardown unloads them at exit), then a created context holding a module,
// an allocation and a stream, with work queued; the runtime's context is
// current after.
static int setup() {
  int *d;
  CHECK(cudaMalloc(&d, N * sizeof(int)));
  bump<<<N / 256, 256>>>(d, N);
  CHECK(cudaDeviceSynchronize());
  CK(cuInit(0));
  CK(cuDeviceGet(&g.dev, 0));
  CK(cuDevicePrimaryCtxRetain(&g.primary, g.dev));
  CK(cuMemAlloc(&g.late_buf, N * sizeof(int)));
  CK(cuCtxCreate(&g.own, nullptr, 0, g.dev));
  CK(cuModuleLoadData(&g.module, kPtx));
  CK(cuModuleGetFunction(&g.add_one, g.module, "add_one"));
  CK(cuMemAlloc(&g.buf, N * sizeof(int)));
  CK(cuMemsetD32(g.buf, 0, N));
  CK(cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING));
  if (launch_add_one(g.stream)) return 1;
  CUcontext popped;
  CK(cuCtxPopCurrent(&popped));
  if (popped != g.own) { printf("FAIL popped another context\n"); return 1; }
  return 0;
}

// live: work queued on runtime and driver streams, nothing waited for or
// destroyed.
static int live() {
  int *d;
  CHECK(cudaMalloc(&d, N * sizeof(int)));
  cudaStream_t streams[4];
  for (auto &s : streams) {
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k = 0; k < 4; k++) bump<<<N / 256, 256, 0, s>>>(d, N);
    CHECK(cudaGetLastError());
  }
  int *pool;
  CHECK(cudaMallocAsync(&pool, 1 << 20, streams[0]));
  CK(cuCtxPushCurrent(g.own));
  for (int k = 0; k < 4; k++)
    if (launch_add_one(g.stream)) return 1;
  printf("live: queued\n");
  return 0;
}

// Runs before the runtime's teardown (registered in main, after it): the
// created context's objects, each destroyed through the driver.
static void teardown_before_runtime() {
  const char *at = "atexit";
  CUcontext current = nullptr;
  TEARDOWN(at, cuCtxGetCurrent(&current));
  if (current != g.primary) {
    printf("%s: FAIL the current context changed\n", at);
    failures++;
  }
  TEARDOWN(at, cuCtxPushCurrent(g.own));
  TEARDOWN(at, cuCtxSynchronize());
  TEARDOWN(at, cuStreamDestroy(g.stream));
  TEARDOWN(at, cuMemFree(g.buf));
  TEARDOWN(at, cuModuleUnload(g.module));
  CUcontext popped = nullptr;
  TEARDOWN(at, cuCtxPopCurrent(&popped));
  if (popped != g.own) {
    printf("%s: FAIL popped another context\n", at);
    failures++;
  }
  TEARDOWN(at, cuCtxDestroy(g.own));
}

// Runs after the runtime's teardown (registered by a constructor that runs
// before the runtime's): what a library's static destructor would free.
static bool late_teardown_wanted = false;
static void teardown_after_runtime() {
  if (!late_teardown_wanted) return;
  const char *at = "late atexit";
  TEARDOWN(at, cuCtxSetCurrent(g.primary));
  TEARDOWN(at, cuMemFree(g.late_buf));
  TEARDOWN(at, cuDevicePrimaryCtxRelease(g.dev));
  printf(failures ? "atexit: FAIL\n" : "atexit: PASS\n");
}

__attribute__((constructor(101))) static void register_late_teardown() {
  atexit(teardown_after_runtime);
}

static std::atomic<long> rounds(0);

// thread-exit: the second thread makes driver calls of its own, waits for
// the main thread's loop to be under way, and ends the process.
static void *exit_from_thread(void *) {
  CUcontext ctx = nullptr;
  if (cuCtxSetCurrent(g.own) != CUDA_SUCCESS || cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) {
    printf("FAIL the second thread's driver calls\n");
    fflush(stdout);
    _exit(4);
  }
  while (rounds.load() < 20) usleep(1000);
  printf("thread-exit: exiting from the second thread\n");
  exit(0);
}

static int thread_exit() {
  CK(cuCtxPushCurrent(g.own));
  pthread_t t;
  if (pthread_create(&t, nullptr, exit_from_thread, nullptr) != 0) { printf("FAIL pthread_create\n"); return 1; }
  int host[16];
  time_t begin = time(nullptr);
  // Results are not checked: the other thread's exit may tear things down
  // under this loop; it only has to keep calling until the process ends.
  while (time(nullptr) - begin < 60) {
    launch_add_one(g.stream);
    cuStreamSynchronize(g.stream);
    cuMemcpyDtoH(host, g.buf, sizeof host);
    rounds++;
  }
  printf("FAIL the process never ended\n");
  return 3;
}

// key-dtor: a thread's driver objects freed from the destructor of a
// pthread key and of a C++ thread_local, both run after the thread's own
// thread-local storage (and cumux's in it) is torn down.
struct ThreadObjects {
  CUdeviceptr buf;
  CUstream stream;
};
static pthread_key_t key;
static std::atomic<int> dtor_failures(0);
static std::atomic<int> dtors_run(0);

static void note(const char *call, CUresult r) {
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("thread teardown: FAIL %s -> %s\n", call, name);
    dtor_failures++;
  }
}
#define NOTE(x) note(#x, (x))

static void key_destructor(void *value) {
  ThreadObjects *t = static_cast<ThreadObjects *>(value);
  CUcontext current = nullptr;
  NOTE(cuCtxGetCurrent(&current));
  if (current != g.own) {
    printf("thread teardown: FAIL the current context changed\n");
    dtor_failures++;
  }
  NOTE(cuStreamSynchronize(t->stream));
  NOTE(cuStreamDestroy(t->stream));
  NOTE(cuMemFree(t->buf));
  NOTE(cuCtxSynchronize());
  delete t;
  dtors_run++;
}

// Made before the thread's first driver call, so destroyed after cumux's
// thread-local storage.
struct FreedAtThreadEnd {
  CUdeviceptr buf = 0;
  ~FreedAtThreadEnd() {
    if (buf == 0) return;
    NOTE(cuCtxSetCurrent(g.own));
    NOTE(cuMemFree(buf));
    dtors_run++;
  }
};
static thread_local FreedAtThreadEnd freed_at_thread_end;

static void *thread_with_destructors(void *) {
  FreedAtThreadEnd *early = &freed_at_thread_end;  // constructed here, first
  if (cuCtxSetCurrent(g.own) != CUDA_SUCCESS) { dtor_failures++; return nullptr; }
  ThreadObjects *t = new ThreadObjects();
  if (cuMemAlloc(&t->buf, N * sizeof(int)) != CUDA_SUCCESS ||
      cuMemAlloc(&early->buf, 256) != CUDA_SUCCESS ||
      cuStreamCreate(&t->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      cuMemsetD32Async(t->buf, 7, N, t->stream) != CUDA_SUCCESS) {
    dtor_failures++;
    return nullptr;
  }
  pthread_setspecific(key, t);
  return nullptr;
}

static int key_dtor() {
  if (pthread_key_create(&key, key_destructor) != 0) { printf("FAIL pthread_key_create\n"); return 1; }
  pthread_t t;
  if (pthread_create(&t, nullptr, thread_with_destructors, nullptr) != 0) { printf("FAIL pthread_create\n"); return 1; }
  pthread_join(t, nullptr);
  if (dtors_run != 2) { printf("thread teardown: FAIL %d of 2 destructors ran\n", dtors_run.load()); return 1; }
  printf(dtor_failures ? "thread teardown: FAIL\n" : "thread teardown: PASS\n");
  return 0;
}

// lost: the driver's calls after the server went away fail, and return.
static void teardown_after_loss() {
  CUresult sync = cuCtxSynchronize();
  cuStreamDestroy(g.stream);
  cuMemFree(g.buf);
  cuModuleUnload(g.module);
  cuCtxDestroy(g.own);
  printf(sync != CUDA_SUCCESS ? "lost: PASS\n" : "lost: FAIL cuCtxSynchronize succeeded\n");
}

static int lost(const char *file) {
  atexit(teardown_after_loss);
  CK(cuCtxPushCurrent(g.own));
  printf("started\n");
  fflush(stdout);
  time_t begin = time(nullptr);
  while (access(file, F_OK) != 0) {
    if (time(nullptr) - begin > 60) { printf("FAIL %s never appeared\n", file); return 1; }
    usleep(10000);
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (setup()) return 1;
  if (strcmp(mode, "live") == 0) return live();
  if (strcmp(mode, "atexit") == 0) {
    late_teardown_wanted = true;
    atexit(teardown_before_runtime);
    printf("atexit: registered\n");
    return 0;
  }
  if (strcmp(mode, "thread-exit") == 0) return thread_exit();
  if (strcmp(mode, "key-dtor") == 0) return key_dtor();
  if (strcmp(mode, "lost") == 0 && argc > 2) return lost(argv[2]);
  printf("FAIL unknown mode '%s'\n", mode);
  return 2;
}
