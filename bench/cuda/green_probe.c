// Green contexts natively, the facts cumux's SM caps (issue 20) rest on: a
// saturating kernel's time on the whole GPU and on green contexts of 25 / 50 /
// 75 % of the SMs, a primary-context module launched on a green stream, one
// green context current on two threads at once, and whether two green
// contexts made from separate splits share SMs. Usage: green_probe SPIN.ptx
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("FAIL %s: %s (line %d)\n", #x, s_ ? s_ : "?", __LINE__); return r_; } } while (0)
static CUdevice dev; static const char *ptx_path;
static int blocks, iters = 200000;
static CUresult green(unsigned sms, CUgreenCtx *g, unsigned *got) {
    CUdevResource all, part, rest; unsigned n = 1; CUdevResourceDesc desc;
    memset(&all, 0, sizeof all); memset(&part, 0, sizeof part); memset(&rest, 0, sizeof rest);
    CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CK(cuDevSmResourceSplitByCount(&part, &n, &all, &rest, 0, sms));
    CK(cuDevResourceGenerateDesc(&desc, &part, 1));
    CK(cuGreenCtxCreate(g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    *got = part.sm.smCount; return CUDA_SUCCESS;
}
static CUresult time_launch(CUfunction f, CUstream s, CUdeviceptr out, float *ms) {
    CUevent a, b; void *args[] = { &out, &iters };
    CK(cuEventCreate(&a, 0)); CK(cuEventCreate(&b, 0));
    CK(cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, s, args, 0)); // warm
    CK(cuEventRecord(a, s));
    for (int i = 0; i < 3; i++) CK(cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, s, args, 0));
    CK(cuEventRecord(b, s)); CK(cuEventSynchronize(b)); CK(cuEventElapsedTime(ms, a, b)); *ms /= 3;
    cuEventDestroy(a); cuEventDestroy(b); return CUDA_SUCCESS;
}
static CUresult check(CUdeviceptr out) {
    float *h = malloc(blocks * sizeof(float)); CK(cuMemcpyDtoH(h, out, blocks * sizeof(float)));
    for (int i = 0; i < blocks; i++) if (h[i] != (float)i) { printf("FAIL wrong value at %d: %f\n", i, h[i]); free(h); return CUDA_ERROR_UNKNOWN; }
    free(h); return CUDA_SUCCESS;
}
struct th { CUcontext ctx; CUfunction f; CUdeviceptr out; float ms; int rc; };
static void *thread_main(void *p) {
    struct th *t = p; if (cuCtxSetCurrent(t->ctx)) { t->rc = 1; return 0; }
    for (int k = 0; k < 20; k++) { if (time_launch(t->f, 0, t->out, &t->ms)) { t->rc = 2; return 0; } }
    t->rc = check(t->out) ? 3 : 0; return 0;
}
int main(int argc, char **argv) {
    ptx_path = argv[1];
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0));
    int sms; CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    blocks = sms * 8 * 4; // 8 blocks of 256 threads an SM fit at once; 4 waves
    CUcontext primary; CK(cuDevicePrimaryCtxRetain(&primary, dev)); CK(cuCtxSetCurrent(primary));
    CUdevResource all; memset(&all, 0, sizeof all); CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    printf("sizeof(CUdevResource) %zu, offset of sm %zu; SMs %d, resource smCount %u min %u align %u\n", sizeof(CUdevResource), (size_t)((char*)&all.sm - (char*)&all), sms, all.sm.smCount, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
    CUmodule m; CK(cuModuleLoad(&m, ptx_path)); CUfunction f; CK(cuModuleGetFunction(&f, m, "spin"));
    CUdeviceptr out; CK(cuMemAlloc(&out, blocks * sizeof(float)));
    float whole; CK(time_launch(f, 0, out, &whole)); CK(check(out));
    printf("whole GPU (%d SMs): %.3f ms a launch of %d blocks\n", sms, whole, blocks);
    int pct[] = { 25, 50, 75 };
    for (int i = 0; i < 3; i++) {
        unsigned want = (sms * pct[i] + 50) / 100; want = (want + 4) / 8 * 8; unsigned got;
        CUgreenCtx g; CK(green(want, &g, &got));
        CUcontext gc; CK(cuCtxFromGreenCtx(&gc, g));
        // (2) primary module on a green stream
        CUstream gs; CK(cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
        float ms2; CUresult r = time_launch(f, gs, out, &ms2);
        if (r == CUDA_SUCCESS) { CK(cuStreamSynchronize(gs)); CK(check(out)); printf("  %d%%: primary module on green stream: %.3f ms (speed %.3f of whole; SMs %u/%d = %.3f)\n", pct[i], ms2, whole / ms2, got, sms, (double)got / sms); }
        else printf("  %d%%: primary module on green stream refused (%d)\n", pct[i], r);
        // module loaded with the green context current, its default stream
        CK(cuCtxSetCurrent(gc)); CUmodule gm; CK(cuModuleLoad(&gm, ptx_path)); CUfunction gf; CK(cuModuleGetFunction(&gf, gm, "spin"));
        float ms3; CK(time_launch(gf, 0, out, &ms3)); CK(check(out));
        printf("  %d%%: green-current module, null stream: %.3f ms (speed %.3f of whole)\n", pct[i], ms3, whole / ms3);
        // a stream made with cuStreamCreate while the green context is current
        CUstream cs; CK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING)); float ms4; CK(time_launch(gf, cs, out, &ms4));
        printf("  %d%%: cuStreamCreate under green: %.3f ms (speed %.3f)\n", pct[i], ms4, whole / ms4);
        // primary function launched while green is current on the null stream
        float ms5; r = time_launch(f, 0, out, &ms5);
        printf("  %d%%: primary function, green current, null stream: %s %.3f ms\n", pct[i], r ? "refused" : "ran", r ? 0.0 : ms5);
        if (pct[i] == 50) {
            // (3) two threads with the same green context current, launching at once
            CUdeviceptr o1, o2; CK(cuMemAlloc(&o1, blocks * 4)); CK(cuMemAlloc(&o2, blocks * 4));
            struct th t1 = { gc, gf, o1, 0, 0 }, t2 = { gc, gf, o2, 0, 0 }; pthread_t a, b;
            pthread_create(&a, 0, thread_main, &t1); pthread_create(&b, 0, thread_main, &t2); pthread_join(a, 0); pthread_join(b, 0);
            printf("  two threads on one green context: rc %d / %d, last ms %.3f / %.3f\n", t1.rc, t2.rc, t1.ms, t2.ms);
        }
        CK(cuCtxSetCurrent(primary)); cuStreamDestroy(gs);
        CK(cuGreenCtxDestroy(g));
    }
    // overlapping: two green contexts from two splits of the whole device: same SMs?
    unsigned g1n, g2n; CUgreenCtx g1, g2; CK(green(64, &g1, &g1n)); CK(green(64, &g2, &g2n));
    CUstream s1, s2; CK(cuGreenCtxStreamCreate(&s1, g1, CU_STREAM_NON_BLOCKING, 0)); CK(cuGreenCtxStreamCreate(&s2, g2, CU_STREAM_NON_BLOCKING, 0));
    CUdeviceptr o2; CK(cuMemAlloc(&o2, blocks * 4)); void *a1[] = { &out, &iters }, *a2[] = { &o2, &iters };
    CUevent e0, e1; CK(cuEventCreate(&e0, 0)); CK(cuEventCreate(&e1, 0)); CK(cuCtxSynchronize()); CK(cuEventRecord(e0, 0));
    CK(cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, s1, a1, 0)); CK(cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, s2, a2, 0));
    CK(cuCtxSynchronize()); CK(cuEventRecord(e1, 0)); CK(cuEventSynchronize(e1)); float both; CK(cuEventElapsedTime(&both, e0, e1));
    printf("two green contexts of %u and %u SMs from separate splits, one launch each at once: %.3f ms (one alone on 64: see 50%% above)\n", g1n, g2n, both);
    printf("done\n"); return 0;
}
