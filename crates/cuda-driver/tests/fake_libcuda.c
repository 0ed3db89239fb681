/* A stand-in for NVIDIA's libcuda.so.1 for GPU-free tests of cumux-cuda-driver:
 * one fake GPU with known answers, whose memory is host memory and whose two
 * kernels run on the host at launch. -DFAKE_NO_DEVICE makes cuInit fail as on a
 * machine without GPUs; -DFAKE_CUMUX adds cumux's client marker symbol;
 * -DFAKE_QUIET keeps the fake device printf off stdout. FAKE_KERNEL_US in the
 * environment makes every kernel take that many microseconds, as a GPU slower
 * than the launches would; FAKE_SYNC_ERROR fails every synchronize. */
#define _GNU_SOURCE /* memfd_create */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

#ifdef FAKE_CUMUX
int cumuxClientVersion = 1;
#endif

static int dummy_context;

CUresult cuInit(unsigned flags) {
    (void)flags;
#ifdef FAKE_NO_DEVICE
    return 100;
#else
    return 0;
#endif
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuGetErrorName(CUresult code, const char **name) {
    switch (code) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
    default: *name = NULL; return 1;
    }
}
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return 101;
    *d = 0;
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    strncpy(name, "Fake GPU 80GB", (size_t)len);
    name[len - 1] = 0;
    return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
    (void)d;
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xa0 + i);
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    (void)d;
    *bytes = (size_t)80 << 30;
    return 0;
}
/* Attribute n answers n * 10, except 92..94 and everything above 147, which
 * it does not know (as drivers answer retired or future numbers). */
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)d;
    if (attr < 1 || attr > 147 || (attr >= 92 && attr <= 94)) return 1;
    *v = attr == 75 ? 9 : attr == 76 ? 0 : attr * 10;
    return 0;
}
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, CUdevice d) {
    (void)flags; (void)d;
    *ctx = &dummy_context;
    return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) { return ctx == &dummy_context ? 0 : 400; }
/* The current context, per thread: the one context, or a green context
 * (whose context is its own handle). */
static __thread void *current_context = &dummy_context;
static int is_live_green(void *ctx);
CUresult cuCtxSetCurrent(void *ctx) {
    if (ctx != &dummy_context && !is_live_green(ctx)) return 201;
    current_context = ctx;
    return 0;
}
static void flush_prints(void);
/* FAKE_SYNC_ERROR=N in the environment: every synchronize answers CUresult
 * N, as a GPU whose memory took an uncorrectable ECC error (214) does. */
static CUresult sync_error(void) {
    const char *code = getenv("FAKE_SYNC_ERROR");
    return code ? (CUresult)atoi(code) : 0;
}
CUresult cuCtxSynchronize(void) { flush_prints(); return sync_error(); }
/* Context limits (CUlimit 0..6: stack, printf FIFO, malloc heap, ...), the
 * driver's defaults; a stack of more than 1 MiB per thread is out of memory.
 * The live report names the stack, printf FIFO and heap as they are now. */
static size_t limits[7] = {1024, 1 << 20, 8 << 20, 2, 2048, 0, 0};
static long limit_sets;
static void live_change(long *counter, long by);
CUresult cuCtxGetLimit(size_t *value, unsigned limit) {
  if (limit >= 7 || !value) return 1;
  *value = limits[limit];
  return 0;
}
CUresult cuCtxSetLimit(unsigned limit, size_t value) {
  if (limit >= 7) return 1;
  if (limit == 0 && value > (1 << 20)) return 2;
  limits[limit] = value;
  live_change(&limit_sets, 1);
  return 0;
}
/* primary_retained: live retains of the primary context (the report names
 * them when there are). */
static long primary_retained;
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
    (void)d; *ctx = &dummy_context;
    live_change(&primary_retained, 1);
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; live_change(&primary_retained, -1); return 0; }

/* Green contexts: 132 SMs, split in groups of 8 (at least 8), the SMs no
 * group took left as the rest. A CUdevResource is 144 bytes (arrays of them
 * have that stride); its SM part (smCount, minSmPartitionSize,
 * smCoscheduledAlignment) sits at byte 96, and the fake keeps the number of
 * its first SM at byte 4 (the driver's padding). A green context is the one
 * context, on the SMs its descriptor names; the live report lists each live
 * green context's SMs as first-end stretches. */
#define FAKE_RESOURCE_BYTES 144
#define FAKE_MOST_GREENS 64
struct fake_green { unsigned sms; char stretches[256]; };
static struct fake_green *live_greens[FAKE_MOST_GREENS];
static long live_green_sms;
/* made_in_green: streams and events made while a green context was current
 * (the report names them when there are). */
static long made_in_green;
static void live_change(long *counter, long by);
static unsigned *sm_part(const void *resource) { return (unsigned *)((char *)resource + 96); }
static unsigned *first_sm(const void *resource) { return (unsigned *)((char *)resource + 4); }
static void set_sm_part(void *resource, unsigned first, unsigned sms) {
    *(int *)resource = 1;
    *first_sm(resource) = first;
    unsigned *sm = sm_part(resource);
    sm[0] = sms; sm[1] = 8; sm[2] = 8;
}
CUresult cuDeviceGetDevResource(CUdevice d, void *resource, int type) {
    (void)d;
    if (type != 1 || !resource) return 1;
    set_sm_part(resource, 0, 132);
    return 0;
}
CUresult cuDevSmResourceSplitByCount(void *result, unsigned *groups, const void *input, void *rest, unsigned flags, unsigned min_count) {
    (void)flags;
    unsigned total = sm_part(input)[0], first = *first_sm(input);
    unsigned sms = (min_count + 7) / 8 * 8;
    if (!groups || *groups == 0 || sms == 0 || sms > total) return 1;
    unsigned n = total / sms;
    if (!result) { *groups = n; return 0; }
    if (n > *groups) n = *groups;
    for (unsigned i = 0; i < n; i++)
        set_sm_part((char *)result + i * FAKE_RESOURCE_BYTES, first + i * sms, sms);
    if (rest) set_sm_part(rest, first + n * sms, total - n * sms);
    *groups = n;
    return 0;
}
CUresult cuDevResourceGenerateDesc(void **desc, void *resources, unsigned n) {
    if (n == 0 || n > 64) return 1;
    struct fake_green *g = calloc(1, sizeof *g);
    unsigned end = ~0u;
    size_t used = 0;
    for (unsigned i = 0; i < n; i++) {
        const char *r = (const char *)resources + i * FAKE_RESOURCE_BYTES;
        if (*(const int *)r != 1 || sm_part(r)[0] == 0) { free(g); return 1; }
        unsigned first = *first_sm(r), sms = sm_part(r)[0];
        g->sms += sms;
        if (first == end) {
            /* one stretch on from the last: rewrite its end */
            char *dash = strrchr(g->stretches, '-');
            used = (size_t)(dash - g->stretches);
            used += (size_t)snprintf(g->stretches + used, sizeof g->stretches - used, "-%u", first + sms);
        } else {
            used += (size_t)snprintf(g->stretches + used, sizeof g->stretches - used, "%s%u-%u",
                                     used ? "," : "", first, first + sms);
        }
        end = first + sms;
    }
    *desc = g;
    return 0;
}
CUresult cuGreenCtxCreate(void **green, void *desc, CUdevice d, unsigned flags) {
    (void)d; (void)flags;
    *green = desc;
    for (int i = 0; i < FAKE_MOST_GREENS; i++)
        if (!live_greens[i]) { live_greens[i] = desc; break; }
    live_change(&live_green_sms, ((struct fake_green *)desc)->sms);
    return 0;
}
CUresult cuCtxFromGreenCtx(void **ctx, void *green) { *ctx = green; return 0; }
static int is_live_green(void *ctx) {
    for (int i = 0; i < FAKE_MOST_GREENS; i++)
        if (ctx && live_greens[i] == ctx) return 1;
    return 0;
}
CUresult cuGreenCtxDestroy(void *green) {
    for (int i = 0; i < FAKE_MOST_GREENS; i++)
        if (live_greens[i] == green) live_greens[i] = 0;
    live_change(&live_green_sms, -(long)((struct fake_green *)green)->sms);
    free(green);
    return 0;
}

/* Live objects: allocations, host registrations, streams, events and modules.
 * With FAKE_LIVE_REPORT set, each change rewrites that file with the counts
 * ("allocations A registrations R streams S events E modules M"), so a test
 * can see what a worker process holds after its sessions end; and the file
 * named after it and this process's pid (`PATH.PID`) too, which no other
 * process overwrites. */
static long live_allocations, live_host_registrations, live_streams, live_events, live_modules;
/* live_green_sms: SMs of the live green contexts; the report names them
 * only when there are. */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static void live_change(long *counter, long by) {
    pthread_mutex_lock(&report_lock);
    *counter += by;
    const char *report = getenv("FAKE_LIVE_REPORT");
    char own[4096];
    if (report) snprintf(own, sizeof own, "%s.%d", report, (int)getpid());
    for (int copy = 0; report && copy < 2; copy++) {
        FILE *f = fopen(copy ? own : report, "w");
        if (f) {
            fprintf(f, "allocations %ld registrations %ld streams %ld events %ld modules %ld\n",
                    live_allocations, live_host_registrations, live_streams, live_events, live_modules);
            if (live_green_sms) {
                fprintf(f, " green_sms %ld", live_green_sms);
                for (int i = 0; i < FAKE_MOST_GREENS; i++)
                    if (live_greens[i]) fprintf(f, " green %s", live_greens[i]->stretches);
            }
            if (made_in_green) fprintf(f, " made_in_green %ld", made_in_green);
            if (primary_retained) fprintf(f, " primary %ld", primary_retained);
            fprintf(f, " limits stack %zu printf %zu heap %zu", limits[0], limits[1], limits[2]);
            fclose(f);
        }
    }
    pthread_mutex_unlock(&report_lock);
}

/* Device memory is host memory; an allocation over 64 GiB is too large. Like a
 * GPU's allocator within a context, a freed block goes to the next allocation
 * of its size as it is, bytes and all (a few are kept for that). */
#define KEPT_BLOCKS 16
static struct { void *base; size_t bytes; } kept[KEPT_BLOCKS];
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
/* Marks an allocation's header (its size, then this), so that an address
 * query on any other address answers "not ours" instead of reading it. */
#define FAKE_ALLOCATION_MAGIC 0xfa4eda7a5eed0001ULL
static int is_our_allocation(CUdeviceptr p) {
    if (p < 16) return 0;
    uintptr_t header = (uintptr_t)p - 16;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    unsigned char resident[2];
    uintptr_t first = header & ~(page - 1), last = (header + 15) & ~(page - 1);
    if (mincore((void *)first, last - first + 1, resident) != 0) return 0;
    return *(unsigned long long *)(header + 8) == FAKE_ALLOCATION_MAGIC;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (bytes > ((size_t)64 << 30)) return 2;
    size_t size = bytes ? bytes : 1;
    void *m = NULL;
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < KEPT_BLOCKS && !m; i++) {
        if (kept[i].base && kept[i].bytes == size) {
            m = kept[i].base;
            kept[i].base = NULL;
        }
    }
    pthread_mutex_unlock(&kept_lock);
    if (!m) m = calloc(1, size + 16);
    if (!m) return 2;
    *(size_t *)m = size;
    *(unsigned long long *)((char *)m + 8) = FAKE_ALLOCATION_MAGIC;
    live_change(&live_allocations, 1);
    *p = (CUdeviceptr)(uintptr_t)((char *)m + 16);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p) return 1;
    void *base = (char *)(uintptr_t)p - 16;
    size_t size = *(size_t *)base;
    int kept_it = 0;
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < KEPT_BLOCKS && !kept_it; i++) {
        if (!kept[i].base) {
            kept[i].base = base;
            kept[i].bytes = size;
            kept_it = 1;
        }
    }
    pthread_mutex_unlock(&kept_lock);
    if (!kept_it) free(base);
    live_change(&live_allocations, -1);
    return 0;
}
long fake_live_allocations(void) { return live_allocations; }

/* IPC handles: the handle names the exporter's block, its size and process.
 * Another process "opens" it as a fresh block of that size (its bytes are not
 * shared: a fake GPU has no memory two processes reach), as many as
 * IPC_OPENED at once; the exporting process itself cannot open it, as with
 * the real driver. */
typedef struct { char reserved[64]; } CUipcMemHandle;
#define IPC_OPENED 16
static CUdeviceptr ipc_opened[IPC_OPENED];
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    if (!h || !p) return 1;
    size_t size = *(size_t *)((char *)(uintptr_t)p - 16);
    uint32_t pid = (uint32_t)getpid();
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, "fakeipc!", 8);
    memcpy(h->reserved + 8, &size, 8);
    memcpy(h->reserved + 16, &p, 8);
    memcpy(h->reserved + 24, &pid, 4);
    return 0;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, CUipcMemHandle h, unsigned flags) {
    (void)flags;
    size_t size;
    uint32_t pid;
    if (memcmp(h.reserved, "fakeipc!", 8) != 0) return 1;
    memcpy(&size, h.reserved + 8, 8);
    memcpy(&pid, h.reserved + 24, 4);
    if (pid == (uint32_t)getpid()) return 201;
    for (int i = 0; i < IPC_OPENED; i++) {
        if (!ipc_opened[i]) {
            CUresult r = cuMemAlloc_v2(out, size);
            if (r == 0) ipc_opened[i] = *out;
            return r;
        }
    }
    return 2;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    for (int i = 0; i < IPC_OPENED; i++) {
        if (p && ipc_opened[i] == p) {
            ipc_opened[i] = 0;
            return cuMemFree_v2(p);
        }
    }
    return 1;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    for (int i = 0; i < IPC_OPENED; i++) {
        if (p && ipc_opened[i] == p) {
            if (base) *base = p;
            if (size) *size = *(size_t *)((char *)(uintptr_t)p - 16);
            return 0;
        }
    }
    /* Otherwise the start of an allocation of ours (its size in the header
     * before it), as the driver answers for its own allocations. */
    if (!is_our_allocation(p)) return 1;
    if (base) *base = p;
    if (size) *size = *(size_t *)((char *)(uintptr_t)p - 16);
    return 0;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *free_bytes = (size_t)70 << 30;
    *total = (size_t)80 << 30;
    return 0;
}
CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    *p = malloc(bytes);
    return *p ? 0 : 2;
}
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    if (!p || !bytes) return 1;
    live_change(&live_host_registrations, 1);
    return 0;
}
CUresult cuMemHostUnregister(void *p) {
    if (!p) return 1;
    live_change(&live_host_registrations, -1);
    return 0;
}
long fake_live_host_registrations(void) { return live_host_registrations; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
    (void)s; memcpy((void *)(uintptr_t)dst, src, n); return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
    (void)s; memcpy(dst, (const void *)(uintptr_t)src, n); return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
    (void)s; memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n); return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n); return 0;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s) {
    (void)s; memset((void *)(uintptr_t)dst, v, n); return 0;
}
CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, void *s) {
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned short *)(uintptr_t)dst)[i] = v;
    return 0;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, void *s) {
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)dst)[i] = v;
    return 0;
}

/* Streams and events are tokens; work runs at once. A launch of `scale`
 * leaves a printf line that the next synchronize writes through C stdio, as
 * the real driver flushes device printf. */
static int stream_token, event_token;
static int pending_print = -1;
static void flush_prints(void) {
    if (pending_print >= 0) {
#ifndef FAKE_QUIET
        printf("scale printed n=%d\n", pending_print);
#endif
        pending_print = -1;
    }
}
CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    (void)flags; (void)prio; *s = &stream_token;
    if (current_context != &dummy_context) live_change(&made_in_green, 1);
    live_change(&live_streams, 1);
    return 0;
}
/* The null stream (legacy default) is a stream too, except to destroy. */
CUresult cuStreamDestroy_v2(void *s) {
    if (s != &stream_token) return 400;
    live_change(&live_streams, -1);
    return 0;
}
CUresult cuStreamQuery(void *s) { return s == &stream_token || !s ? 0 : 400; }
CUresult cuStreamSynchronize(void *s) {
    if (s != &stream_token && s) return 400;
    flush_prints();
    return sync_error();
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    return (s == &stream_token || !s) && e == &event_token && !flags ? 0 : 400;
}
CUresult cuEventCreate(void **e, unsigned flags) {
    (void)flags; *e = &event_token;
    if (current_context != &dummy_context) live_change(&made_in_green, 1);
    live_change(&live_events, 1);
    return 0;
}
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuEventQuery(void *e) { (void)e; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; flush_prints(); return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 1.5f; return 0; }
CUresult cuEventDestroy_v2(void *e) {
    if (e != &event_token) return 400;
    live_change(&live_events, -1);
    return 0;
}
/* An event's IPC handle names the fake's one event; another process opens it
 * as that event (every fake event is always done). */
CUresult cuIpcGetEventHandle(void *h, void *e) {
    if (!h || !e) return 1;
    memset(h, 0, 64);
    memcpy(h, "fakeevt!", 8);
    return 0;
}
typedef struct { char reserved[64]; } fake_ipc_event_handle;
CUresult cuIpcOpenEventHandle(void **e, fake_ipc_event_handle h) {
    if (!e || memcmp(h.reserved, "fakeevt!", 8) != 0) return 1;
    *e = &event_token;
    live_change(&live_events, 1);
    return 0;
}

/* Every module holds the kernels of crates/fatbin/tests/fixtures/k.cu:
 * add(const float*, const float*, float*, int) and scale(float*, float, int),
 * and the variable g_val[4]. */
struct fake_function { const char *name; int nparams; size_t offsets[4]; size_t sizes[4]; };
static struct fake_function fake_add = {"add", 4, {0, 8, 16, 24}, {8, 8, 8, 4}};
static struct fake_function fake_scale = {"scale", 3, {0, 8, 12}, {8, 4, 4}};
static int module_token;
static int g_val[4] = {1, 0, 0, 0};

/* FAKE_MODULE_AT=ADDR: a module's loading takes a 2 MiB page of device
 * memory at the first free address from ADDR up, as NVIDIA's driver puts
 * its own memory at the next free address of its heap (where the program's
 * next allocation would have gone). Kept until the process ends. */
static void take_module_memory(void) {
    const char *from = getenv("FAKE_MODULE_AT");
    if (!from) return;
    const size_t page = (size_t)2 << 20;
    uintptr_t at = (uintptr_t)strtoull(from, NULL, 0) & ~(page - 1);
    for (int tries = 0; tries < (1 << 17) && at; tries++, at += page) {
        void *got = mmap((void *)at, page, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (got == (void *)at) return;
        if (got != MAP_FAILED) munmap(got, page);
    }
}
CUresult cuModuleLoadData(void **m, const void *image) {
    if (*(const unsigned *)image != 0xBA55ED50u) return 200;
    take_module_memory();
    *m = &module_token;
    live_change(&live_modules, 1);
    return 0;
}
/* PTX (anything but a fat binary) fails to JIT, with a log. */
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *options, void **values) {
    if (*(const unsigned *)image == 0xBA55ED50u) return cuModuleLoadData(m, image);
    for (unsigned i = 0; i < n; i++) {
        if (options[i] != 5) continue;
        size_t size = 0;
        for (unsigned j = 0; j < n; j++)
            if (options[j] == 6) size = (size_t)(uintptr_t)values[j];
        if (size > 0) snprintf((char *)values[i], size, "ptxas fatal : fake syntax error");
    }
    return 218;
}
CUresult cuModuleUnload(void *m) {
    if (m != &module_token) return 400;
    live_change(&live_modules, -1);
    return 0;
}
CUresult cuModuleGetFunctionCount(unsigned *n, void *m) { (void)m; *n = 2; return 0; }
CUresult cuModuleEnumerateFunctions(void **fs, unsigned n, void *m) {
    (void)m;
    if (n > 0) fs[0] = &fake_add;
    if (n > 1) fs[1] = &fake_scale;
    return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    (void)m;
    if (!strcmp(name, "add")) { *f = &fake_add; return 0; }
    if (!strcmp(name, "scale")) { *f = &fake_scale; return 0; }
    return 500;
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *size, void *m, const char *name) {
    (void)m;
    if (strcmp(name, "g_val")) return 500;
    *p = (CUdeviceptr)(uintptr_t)g_val;
    *size = sizeof g_val;
    return 0;
}
CUresult cuFuncGetName(const char **name, void *f) {
    *name = ((struct fake_function *)f)->name;
    return 0;
}
CUresult cuFuncGetParamInfo(void *f, size_t index, size_t *offset, size_t *size) {
    struct fake_function *ff = f;
    if (index >= (size_t)ff->nparams) return 1;
    *offset = ff->offsets[index];
    if (size) *size = ff->sizes[index];
    return 0;
}
CUresult cuFuncGetAttribute(int *v, int attr, void *f) {
    (void)f;
    switch (attr) {
    case 0: *v = 1024; return 0;   /* max threads per block */
    case 4: *v = 16; return 0;     /* registers */
    case 5: *v = 90; return 0;     /* PTX version */
    case 6: *v = 90; return 0;     /* binary version */
    case 8: *v = 48 << 10; return 0;
    default: *v = 0; return 0;
    }
}
static int dynamic_shared_set, non_portable_set;
CUresult cuFuncSetAttribute(void *f, int attr, int v) {
    (void)f;
    if (attr == 8) dynamic_shared_set = v;
    if (attr == 14) non_portable_set = v;
    return 0;
}
int fake_dynamic_shared_set(void) { return dynamic_shared_set; }

/* Runs the kernel on the host from the packed parameter buffer in `extra`. */
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream,
                        void **params, void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shared; (void)stream;
    if (params || !extra) return 1;
    const unsigned char *buf = NULL;
    size_t size = 0;
    for (int i = 0; extra[i] != (void *)0; i += 2) {
        if (extra[i] == (void *)1) buf = extra[i + 1];
        else if (extra[i] == (void *)2) size = *(size_t *)extra[i + 1];
        else return 1;
    }
    struct fake_function *ff = f;
    size_t need = ff->offsets[ff->nparams - 1] + ff->sizes[ff->nparams - 1];
    if (!buf || size < need) return 1;
    /* `add` plays a driver that wants its 28 parameter bytes rounded up to 32. */
    if (ff == &fake_add && size != 32) return 1;
    unsigned threads = gx * bx;
    if (ff == &fake_add) {
        float *a, *b, *c; int n;
        memcpy(&a, buf, 8); memcpy(&b, buf + 8, 8); memcpy(&c, buf + 16, 8); memcpy(&n, buf + 24, 4);
        for (int i = 0; i < n && (unsigned)i < threads; i++) c[i] = a[i] + b[i];
    } else {
        float *a; float s; int n;
        memcpy(&a, buf, 8); memcpy(&s, buf + 8, 4); memcpy(&n, buf + 12, 4);
        for (int i = 0; i < n && (unsigned)i < threads; i++) a[i] *= s + (float)g_val[0];
        pending_print = n;
    }
    static long kernel_us = -1;
    if (kernel_us < 0) {
        const char *us = getenv("FAKE_KERNEL_US");
        kernel_us = us ? atol(us) : 0;
    }
    if (kernel_us > 0) {
        struct timespec t = { kernel_us / 1000000, (kernel_us % 1000000) * 1000 };
        nanosleep(&t, NULL);
    }
    return 0;
}

/* cuLaunchKernelEx runs the kernel as cuLaunchKernel does; cluster
 * dimensions (attribute 4) that do not divide the grid fail with
 * CUDA_ERROR_INVALID_CLUSTER_SIZE, as on a GPU. */
typedef struct { unsigned id; unsigned char pad[4]; unsigned value[16]; } fake_launch_attribute;
typedef struct {
    unsigned grid[3], block[3], shared;
    void *stream;
    fake_launch_attribute *attrs;
    unsigned num_attrs;
} fake_launch_config;
unsigned fake_last_cluster[3];
CUresult cuLaunchKernelEx(const fake_launch_config *config, void *f, void **params, void **extra) {
    if (!config || (config->num_attrs && !config->attrs)) return 1;
    fake_last_cluster[0] = fake_last_cluster[1] = fake_last_cluster[2] = 0;
    for (unsigned i = 0; i < config->num_attrs; i++)
        if (config->attrs[i].id == 4) {
            memcpy(fake_last_cluster, config->attrs[i].value, sizeof fake_last_cluster);
            for (int d = 0; d < 3; d++)
                if (!fake_last_cluster[d] || config->grid[d] % fake_last_cluster[d]) return 912;
        }
    return cuLaunchKernel(f, config->grid[0], config->grid[1], config->grid[2], config->block[0],
                          config->block[1], config->block[2], config->shared, config->stream,
                          params, extra);
}

/* Cluster occupancy of a chip whose processing clusters hold 30 clusters of
 * 4 blocks and 15 of 8 (not its 132 SMs divided by the cluster size, which
 * is what a model from attributes would say): the cluster from the config's
 * attribute 4, none being CUDA_ERROR_INVALID_CLUSTER_SIZE. As on a GPU, a
 * block's shared memory over 48 KiB must be opted in to first, and clusters
 * over 8 blocks must be allowed (attribute 14). */
CUresult cuOccupancyMaxActiveClusters(int *n, void *f, const fake_launch_config *config) {
    (void)f;
    if (!n || !config || (config->num_attrs && !config->attrs)) return 1;
    if (config->shared > (48u << 10) && (unsigned)dynamic_shared_set < config->shared) return 1;
    unsigned blocks = 0;
    for (unsigned i = 0; i < config->num_attrs; i++)
        if (config->attrs[i].id == 4)
            blocks = config->attrs[i].value[0] * config->attrs[i].value[1] * config->attrs[i].value[2];
    if (!blocks || (blocks > 8 && !non_portable_set)) return 912;
    *n = blocks == 4 ? 30 : blocks == 8 ? 15 : (int)(132 / blocks);
    return 0;
}
CUresult cuOccupancyMaxPotentialClusterSize(int *n, void *f, const fake_launch_config *config) {
    (void)f;
    if (!n || !config) return 1;
    if (config->shared > (48u << 10) && (unsigned)dynamic_shared_set < config->shared) return 1;
    *n = non_portable_set ? 16 : 8;
    return 0;
}

/* A tiled tensor map: the address, rank and box sizes, laid out where a test
 * can check them; rank 0 or over 5 is invalid, as for the real driver. */
CUresult cuTensorMapEncodeTiled(void *map, unsigned type, unsigned rank, void *address,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *elem_strides,
                                unsigned interleave, unsigned swizzle, unsigned l2, unsigned oob) {
    (void)type; (void)strides; (void)elem_strides; (void)interleave; (void)swizzle; (void)l2; (void)oob;
    if (!map || rank == 0 || rank > 5 || ((uintptr_t)map % 64)) return 1;
    memset(map, 0, 128);
    memcpy(map, &address, 8);
    memcpy((char *)map + 8, &rank, 4);
    memcpy((char *)map + 16, dims, 8);
    memcpy((char *)map + 24, box, 4 * rank);
    return 0;
}

/* Registered host memory is addressed by its host address; stream memory
 * operations run at once, like all work here. */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    if (flags) return 1;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
CUresult cuStreamWriteValue64_v2(void *s, CUdeviceptr addr, unsigned long long value, unsigned flags) {
    if ((s != &stream_token && s) || flags) return 400;
    *(volatile unsigned long long *)(uintptr_t)addr = value;
    return 0;
}

/* Virtual memory. A reservation is host address space (PROT_NONE), a
 * physical allocation a memfd, a mapping that memfd mapped over part of a
 * reservation, so mappings side by side read as one range and one allocation
 * may be mapped twice; access is mprotect. Granularity 2 MiB. As the
 * allocator above, a released allocation no mapping uses goes to the next
 * cuMemCreate of its size as it is, bytes and all. */
#define FAKE_GRANULARITY ((size_t)2 << 20)
typedef struct { int type; int id; } fake_location;
typedef struct { int type; int handle_types; fake_location location; void *win32; unsigned char flags[8]; } fake_prop;
typedef struct { fake_location location; int flags; } fake_access;
struct fake_physical { int fd; size_t size; int released; int mappings; int shareable; };
#define FAKE_MAPPINGS 64
static struct { uintptr_t at; size_t size; struct fake_physical *ph; } fake_maps[FAKE_MAPPINGS];
static struct fake_physical *kept_physical[KEPT_BLOCKS];
static long live_physical, live_reservations;
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuMemGetAllocationGranularity(size_t *g, const fake_prop *prop, int option) {
    if (!g || !prop || prop->type != 1 || option < 0 || option > 1) return 1;
    *g = FAKE_GRANULARITY;
    return 0;
}
/* Whether a reservation's hint is passed over as NVIDIA's driver passes
 * some over: FAKE_MIN_HINT=N in the environment, those of ranges under N
 * bytes (the H100 passed over 2-4 MiB ones); FAKE_TAKEN=ADDR:LEN, those
 * overlapping a range the driver keeps for itself. */
static int hint_passed_over(CUdeviceptr hint, size_t size) {
    const char *min = getenv("FAKE_MIN_HINT");
    if (min && size < strtoull(min, NULL, 0)) return 1;
    const char *taken = getenv("FAKE_TAKEN");
    if (!taken) return 0;
    char *colon = NULL;
    unsigned long long at = strtoull(taken, &colon, 0);
    if (!colon || *colon != ':') return 0;
    unsigned long long len = strtoull(colon + 1, NULL, 0);
    return hint < at + len && at < hint + size;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr hint,
                             unsigned long long flags) {
    (void)align;
    if (!p || !size || size % FAKE_GRANULARITY || flags) return 1;
    /* A hint is honoured where the range is free, as the driver does. */
    if (hint && hint % FAKE_GRANULARITY == 0 && !hint_passed_over(hint, size)) {
        void *at = mmap((void *)(uintptr_t)hint, size, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (at == (void *)(uintptr_t)hint) {
            *p = hint;
            live_reservations++;
            return 0;
        }
        if (at != MAP_FAILED) munmap(at, size);
    }
    size_t len = size + FAKE_GRANULARITY;
    char *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    uintptr_t start = ((uintptr_t)m + FAKE_GRANULARITY - 1) & ~(FAKE_GRANULARITY - 1);
    if (start > (uintptr_t)m) munmap(m, start - (uintptr_t)m);
    munmap((void *)(start + size), (uintptr_t)m + len - (start + size));
    *p = start;
    live_reservations++;
    return 0;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    if (!p || !size || munmap((void *)(uintptr_t)p, size)) return 1;
    live_reservations--;
    return 0;
}
long fake_live_reservations(void) { return live_reservations; }
CUresult cuMemCreate(unsigned long long *h, size_t size, const fake_prop *prop, unsigned long long flags) {
    if (!h || !prop || !size || size % FAKE_GRANULARITY || flags) return 1;
    if (prop->type != 1 || prop->location.type != 1 || prop->location.id != 0) return 101;
    struct fake_physical *ph = NULL;
    pthread_mutex_lock(&vmm_lock);
    for (int i = 0; i < KEPT_BLOCKS && !ph; i++)
        if (kept_physical[i] && kept_physical[i]->size == size) {
            ph = kept_physical[i];
            kept_physical[i] = NULL;
        }
    pthread_mutex_unlock(&vmm_lock);
    if (!ph) {
        int fd = memfd_create("fake-vmm", 0);
        if (fd < 0) return 2;
        if (ftruncate(fd, (off_t)size)) { close(fd); return 2; }
        ph = calloc(1, sizeof *ph);
        if (!ph) { close(fd); return 2; }
        ph->fd = fd;
        ph->size = size;
    }
    ph->released = 0;
    ph->shareable = prop->handle_types & 1;
    live_physical++;
    *h = (unsigned long long)(uintptr_t)ph;
    return 0;
}
/* A physical allocation's memfd is its shareable descriptor: another process
 * importing it maps the same pages. */
CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int type, unsigned long long flags) {
    struct fake_physical *ph = (struct fake_physical *)(uintptr_t)h;
    if (!out || !ph || ph->released || type != 1 || flags) return 1;
    if (!ph->shareable) return 1;
    int fd = dup(ph->fd);
    if (fd < 0) return 2;
    *(int *)out = fd;
    return 0;
}
CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os_handle, int type) {
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    if (!h || type != 1 || fd < 0 || fstat(fd, &st) || st.st_size <= 0) return 1;
    struct fake_physical *ph = calloc(1, sizeof *ph);
    if (!ph) return 2;
    ph->fd = dup(fd);
    ph->size = (size_t)st.st_size;
    ph->shareable = 1;
    pthread_mutex_lock(&vmm_lock);
    live_physical++;
    pthread_mutex_unlock(&vmm_lock);
    *h = (unsigned long long)(uintptr_t)ph;
    return 0;
}
/* Frees (or keeps) a released allocation once nothing maps it; vmm_lock held. */
static void fake_settle(struct fake_physical *ph) {
    if (!ph->released || ph->mappings) return;
    /* Shared pages go with their last user, never to another allocation. */
    for (int i = 0; i < KEPT_BLOCKS && !ph->shareable; i++)
        if (!kept_physical[i]) { kept_physical[i] = ph; return; }
    close(ph->fd);
    free(ph);
}
CUresult cuMemRelease(unsigned long long h) {
    struct fake_physical *ph = (struct fake_physical *)(uintptr_t)h;
    if (!ph || ph->released) return 1;
    pthread_mutex_lock(&vmm_lock);
    ph->released = 1;
    live_physical--;
    fake_settle(ph);
    pthread_mutex_unlock(&vmm_lock);
    return 0;
}
long fake_live_physical(void) { return live_physical; }
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long h, unsigned long long flags) {
    struct fake_physical *ph = (struct fake_physical *)(uintptr_t)h;
    if (!p || !ph || !size || p % FAKE_GRANULARITY || size % FAKE_GRANULARITY || flags) return 1;
    if (offset || size > ph->size) return 801;
    pthread_mutex_lock(&vmm_lock);
    int slot = -1;
    for (int i = 0; i < FAKE_MAPPINGS; i++) {
        if (fake_maps[i].ph && fake_maps[i].at < p + size && p < fake_maps[i].at + fake_maps[i].size) {
            pthread_mutex_unlock(&vmm_lock);
            return 1;
        }
        if (!fake_maps[i].ph && slot < 0) slot = i;
    }
    void *m = slot < 0 ? MAP_FAILED
        : mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0);
    if (m == MAP_FAILED) { pthread_mutex_unlock(&vmm_lock); return 2; }
    fake_maps[slot].at = p;
    fake_maps[slot].size = size;
    fake_maps[slot].ph = ph;
    ph->mappings++;
    pthread_mutex_unlock(&vmm_lock);
    return 0;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    if (!p || !size) return 1;
    pthread_mutex_lock(&vmm_lock);
    for (int i = 0; i < FAKE_MAPPINGS; i++) {
        if (!fake_maps[i].ph || fake_maps[i].at < p || fake_maps[i].at >= p + size) continue;
        struct fake_physical *ph = fake_maps[i].ph;
        /* The range stays reserved. */
        mmap((void *)fake_maps[i].at, fake_maps[i].size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        fake_maps[i].ph = NULL;
        ph->mappings--;
        fake_settle(ph);
    }
    pthread_mutex_unlock(&vmm_lock);
    return 0;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const fake_access *desc, size_t count) {
    if (!p || !size || !desc || !count) return 1;
    int prot = desc[0].flags == 3 ? PROT_READ | PROT_WRITE : desc[0].flags == 1 ? PROT_READ : PROT_NONE;
    return mprotect((void *)(uintptr_t)p, size, prot) ? 1 : 0;
}

/* CUDA arrays as host memory with their descriptor (elements packed, rows
 * then layers), copies to and from them (cuMemcpy3D), and texture and
 * surface objects as numbers over live arrays. */
typedef struct { size_t w, h, d; unsigned format, channels, flags; } fake_array_desc;
#define FAKE_ARRAY_MAGIC 0xa77a7u
struct fake_array { unsigned magic; fake_array_desc desc; size_t row; unsigned char *data; };
static size_t fake_channel_bytes(unsigned format) {
    switch (format) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
    }
}
static size_t fake_rows(const fake_array_desc *d) { return d->h ? d->h : 1; }
static size_t fake_layers(const fake_array_desc *d) { return d->d ? d->d : 1; }
CUresult cuArray3DCreate_v2(void **out, const fake_array_desc *desc) {
    size_t elem = fake_channel_bytes(desc->format) * desc->channels;
    if (!out || !desc->w || !elem || (desc->channels != 1 && desc->channels != 2 && desc->channels != 4))
        return 1;
    struct fake_array *a = calloc(1, sizeof *a);
    if (!a) return 2;
    a->magic = FAKE_ARRAY_MAGIC;
    a->desc = *desc;
    a->row = desc->w * elem;
    /* Not zeroed, as a GPU's new array is not: whatever lay there. */
    a->data = malloc(fake_rows(desc) * fake_layers(desc) * a->row);
    if (!a->data) { free(a); return 2; }
    memset(a->data, 0xa5, fake_rows(desc) * fake_layers(desc) * a->row);
    *out = a;
    return 0;
}
static struct fake_array *fake_array_of(void *h) {
    struct fake_array *a = h;
    return a && a->magic == FAKE_ARRAY_MAGIC ? a : NULL;
}
CUresult cuArrayDestroy(void *h) {
    struct fake_array *a = fake_array_of(h);
    if (!a) return 400;
    a->magic = 0;
    free(a->data);
    free(a);
    return 0;
}
typedef struct {
    size_t src_x, src_y, src_z, src_lod;
    int src_type;
    const void *src_host;
    CUdeviceptr src_device;
    void *src_array, *reserved0;
    size_t src_pitch, src_height;
    size_t dst_x, dst_y, dst_z, dst_lod;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_device;
    void *dst_array, *reserved1;
    size_t dst_pitch, dst_height;
    size_t width, height, depth;
} fake_memcpy3d;
/* The first byte of row (y, z) of one end, or NULL past an array's box. */
static unsigned char *fake_row(int type, const void *host, CUdeviceptr device, void *array,
                               size_t x, size_t y, size_t z, size_t pitch, size_t height,
                               size_t width) {
    switch (type) {
    case 1: return (unsigned char *)host + (z * height + y) * pitch + x;
    case 2: return (unsigned char *)(uintptr_t)device + (z * height + y) * pitch + x;
    case 3: {
        struct fake_array *a = fake_array_of(array);
        if (!a || x + width > a->row || y >= fake_rows(&a->desc) || z >= fake_layers(&a->desc))
            return NULL;
        return a->data + (z * fake_rows(&a->desc) + y) * a->row + x;
    }
    default: return NULL;
    }
}
CUresult cuMemcpy3D_v2(const fake_memcpy3d *c) {
    if (!c) return 1;
    size_t depth = c->depth ? c->depth : 1, height = c->height ? c->height : 1;
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < height; y++) {
            unsigned char *from = fake_row(c->src_type, c->src_host, c->src_device, c->src_array,
                                           c->src_x, c->src_y + y, c->src_z + z, c->src_pitch,
                                           c->src_height, c->width);
            unsigned char *to = fake_row(c->dst_type, c->dst_host, c->dst_device, c->dst_array,
                                         c->dst_x, c->dst_y + y, c->dst_z + z, c->dst_pitch,
                                         c->dst_height, c->width);
            if (!from || !to) return 1;
            memmove(to, from, c->width);
        }
    return 0;
}
CUresult cuMemcpy3DAsync_v2(const fake_memcpy3d *c, void *s) { (void)s; return cuMemcpy3D_v2(c); }
/* Objects: 0x7e00 + slot, over a live array (or any memory for linear ones). */
#define FAKE_OBJECTS 64
static int fake_objects[FAKE_OBJECTS];
static pthread_mutex_t objects_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct { unsigned type; unsigned long long words[16]; unsigned flags; } fake_resource;
static CUresult fake_object(unsigned long long *out, const fake_resource *r, int surface) {
    if (!out || !r || r->flags) return 1;
    if (surface || r->type == 0) {
        struct fake_array *a = fake_array_of((void *)(uintptr_t)r->words[0]);
        if (r->type != 0 || !a) return 400;
        if (surface && !(a->desc.flags & 0x02)) return 1;
    } else if (r->type > 3) {
        return 1;
    }
    pthread_mutex_lock(&objects_lock);
    for (int i = 0; i < FAKE_OBJECTS; i++)
        if (!fake_objects[i]) {
            fake_objects[i] = 1;
            pthread_mutex_unlock(&objects_lock);
            *out = 0x7e00 + (unsigned long long)i;
            return 0;
        }
    pthread_mutex_unlock(&objects_lock);
    return 2;
}
static CUresult fake_object_destroy(unsigned long long o) {
    if (o < 0x7e00 || o >= 0x7e00 + FAKE_OBJECTS) return 400;
    pthread_mutex_lock(&objects_lock);
    int live = fake_objects[o - 0x7e00];
    fake_objects[o - 0x7e00] = 0;
    pthread_mutex_unlock(&objects_lock);
    return live ? 0 : 400;
}
CUresult cuTexObjectCreate(unsigned long long *o, const fake_resource *r, const void *tex, const void *view) {
    (void)view;
    return tex ? fake_object(o, r, 0) : 1;
}
CUresult cuTexObjectDestroy(unsigned long long o) { return fake_object_destroy(o); }
CUresult cuSurfObjectCreate(unsigned long long *o, const fake_resource *r) { return fake_object(o, r, 1); }
CUresult cuSurfObjectDestroy(unsigned long long o) { return fake_object_destroy(o); }
/* Mipmapped arrays: one fake array per level, each dimension halved. */
#define FAKE_MIPMAP_MAGIC 0xb1bb1u
struct fake_mipmap { unsigned magic, levels; void *level[16]; };
CUresult cuMipmappedArrayCreate(void **out, const fake_array_desc *desc, unsigned levels) {
    if (!out || !levels || levels > 16) return 1;
    struct fake_mipmap *m = calloc(1, sizeof *m);
    if (!m) return 2;
    for (unsigned l = 0; l < levels; l++) {
        fake_array_desc d = *desc;
        d.w = d.w >> l ? d.w >> l : 1;
        if (d.h) d.h = d.h >> l ? d.h >> l : 1;
        if (d.d) d.d = d.d >> l ? d.d >> l : 1;
        CUresult r = cuArray3DCreate_v2(&m->level[l], &d);
        if (r) return r;
    }
    m->magic = FAKE_MIPMAP_MAGIC;
    m->levels = levels;
    *out = m;
    return 0;
}
CUresult cuMipmappedArrayGetLevel(void **out, void *h, unsigned level) {
    struct fake_mipmap *m = h;
    if (!m || m->magic != FAKE_MIPMAP_MAGIC) return 400;
    if (!out || level >= m->levels) return 1;
    *out = m->level[level];
    return 0;
}
CUresult cuMipmappedArrayDestroy(void *h) {
    struct fake_mipmap *m = h;
    if (!m || m->magic != FAKE_MIPMAP_MAGIC) return 400;
    for (unsigned l = 0; l < m->levels; l++) cuArrayDestroy(m->level[l]);
    m->magic = 0;
    free(m);
    return 0;
}
