// Which green-context splits give disjoint SMs (issue 20's partitions), natively:
// a part and the rest of one split at once, the rest split again, groups of 8
// combined in one descriptor. Usage: green_split_probe SPIN.ptx (bench/cuda/green_spin.cu).
// Found on the H100 (driver 580): the rest is disjoint from its part; a rest cannot be
// split again (915); 132 SMs split in groups of 8 give 15 groups. (3)/(4): groups of
// one split combined in one descriptor, and whether a second split's groups are the same SMs.
#include <cuda.h>
#include <stdio.h>
#include <string.h>

static CUdevice dev; static CUmodule m; static CUfunction f; static CUdeviceptr out; static int iters = 200000, blocks;
static float run2(CUcontext a, CUcontext b) {
    CUstream sa, sb; CUevent e0, e1; float ms = -1; void *args[] = { &out, &iters };
    cuCtxSetCurrent(a); cuStreamCreate(&sa, CU_STREAM_NON_BLOCKING);
    if (b) { cuCtxSetCurrent(b); cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING); }
    cuEventCreate(&e0, 0); cuEventCreate(&e1, 0); cuCtxSynchronize(); cuEventRecord(e0, 0);
    cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, sa, args, 0);
    if (b) cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, sb, args, 0);
    cuStreamSynchronize(sa); if (b) cuStreamSynchronize(sb); cuEventRecord(e1, 0); cuEventSynchronize(e1); cuEventElapsedTime(&ms, e0, e1);
    return ms;
}
static CUcontext mk(CUdevResource *res, unsigned n, const char *what) {
    CUdevResourceDesc d; CUgreenCtx g; CUcontext c = 0; CUresult r;
    r = cuDevResourceGenerateDesc(&d, res, n); if (r) { printf("%s: desc of %u resources -> %d\n", what, n, r); return 0; }
    r = cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM); if (r) { printf("%s: create -> %d\n", what, r); return 0; }
    cuCtxFromGreenCtx(&c, g); unsigned sms = 0; for (unsigned i = 0; i < n; i++) sms += res[i].sm.smCount;
    printf("%s: green context of %u SMs made\n", what, sms); return c;
}
int main(int argc, char **argv) {
    cuInit(0); cuDeviceGet(&dev, 0); CUcontext p; cuDevicePrimaryCtxRetain(&p, dev); cuCtxSetCurrent(p);
    int sms; cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev); blocks = sms * 8 * 4;
    cuModuleLoad(&m, argv[1]); cuModuleGetFunction(&f, m, "spin"); cuMemAlloc(&out, blocks * 4);
    printf("whole alone: %.3f ms\n", run2(p, 0));
    CUdevResource all, p1, rest, p2, rest2; unsigned n = 1; CUresult r;
    memset(&all, 0, sizeof all); cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    memset(&p1, 0, sizeof p1); memset(&rest, 0, sizeof rest);
    r = cuDevSmResourceSplitByCount(&p1, &n, &all, &rest, 0, 32); printf("split all by 32 -> %d: part %u, rest %u\n", r, p1.sm.smCount, rest.sm.smCount);
    CUcontext crest = mk(&rest, 1, "(1) the rest of a split, whole");
    n = 1; memset(&p2, 0, sizeof p2); memset(&rest2, 0, sizeof rest2);
    r = cuDevSmResourceSplitByCount(&p2, &n, &rest, &rest2, 0, 64); printf("(2) split the rest by 64 -> %d: part %u, rest %u\n", r, p2.sm.smCount, rest2.sm.smCount);
    CUcontext c2 = r ? 0 : mk(&p2, 1, "(2) a part of the rest");
    CUcontext c1 = mk(&p1, 1, "front 32");
    if (c1 && c2) printf("(2) front 32 and the rest's 64 at once: %.3f ms (alone 32: %.3f, alone 64: %.3f)\n", run2(c1, c2), run2(c1, 0), run2(c2, 0));
    if (c1 && crest) printf("(1) front 32 and the whole rest at once: %.3f ms (alone rest: %.3f)\n", run2(c1, crest), run2(crest, 0));
    // (3) groups of 8 of one split, combined, the rest (SMs no group took) behind the last
    CUdevResource g[33], grest; memset(g, 0, sizeof g); memset(&grest, 0, sizeof grest); n = 32;
    r = cuDevSmResourceSplitByCount(g, &n, &all, &grest, 0, 8);
    printf("(3) split all in groups of 8 -> %d: %u groups, rest %u SMs\n", r, n, grest.sm.smCount);
    if (!r && n > 8) {
        g[n] = grest;
        CUcontext front = mk(g, 4, "(3) groups 0-3");
        CUcontext back = mk(g + 4, n - 4 + 1, "(3) groups 4 to the last, and the rest");
        if (front && back) printf("(3) groups 0-3 and 4-end+rest at once: %.3f ms (alone: %.3f / %.3f)\n", run2(front, back), run2(front, 0), run2(back, 0));
        CUcontext mid = mk(g + 4, 4, "(3) groups 4-7");
        if (front && mid) printf("(3) groups 0-3 and 4-7 at once: %.3f ms (alone: %.3f / %.3f)\n", run2(front, mid), run2(front, 0), run2(mid, 0));
        // (4) a second split from scratch gives the same groups: the first split's 0-3 beside the
        // second's 4-7 (disjoint if the same), and beside the second's 0-3 (the same SMs: twice as long)
        CUdevResource h[33]; memset(h, 0, sizeof h); unsigned m = 32; cuDevSmResourceSplitByCount(h, &m, &all, 0, 0, 8);
        CUcontext b47 = mk(h + 4, 4, "(4) second split's groups 4-7"), b03 = mk(h, 4, "(4) second split's groups 0-3");
        if (front && b47) printf("(4) first's 0-3 and second's 4-7 at once: %.3f ms (alone: %.3f)\n", run2(front, b47), run2(front, 0));
        if (front && b03) printf("(4) first's 0-3 and second's 0-3 at once: %.3f ms (alone: %.3f)\n", run2(front, b03), run2(front, 0));
    }
    return 0;
}
