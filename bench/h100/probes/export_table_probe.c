// Probe of a private driver table that cuBLASLt 13 asks for on Hopper
// (1734dc26-800d-4745-8726-c0f1e7dd8bca): prints its size word, slot 4's
// outputs and the bytes they point to. Build: cc -o p export_table_probe.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*get_export_table_fn)(const void **, const unsigned char *);
typedef int (*init_fn)(unsigned);
typedef int (*prim_fn)(void **, int);
typedef int (*set_fn)(void *);
typedef int (*attr_fn)(int *, int, int);
typedef int (*slot4_fn)(void **, uint64_t *);

static const unsigned char ID[16] = {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45,
                                     0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca};

int main(int argc, char **argv) {
    void *lib = dlopen(argc > 1 ? argv[1] : "libcuda.so.1", RTLD_NOW);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
    init_fn init = (init_fn)dlsym(lib, "cuInit");
    prim_fn retain = (prim_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
    set_fn set = (set_fn)dlsym(lib, "cuCtxSetCurrent");
    attr_fn attr = (attr_fn)dlsym(lib, "cuDeviceGetAttribute");
    get_export_table_fn get = (get_export_table_fn)dlsym(lib, "cuGetExportTable");
    int sms = 0;
    void *ctx = 0;
    printf("init %d\n", init(0));
    printf("retain %d set %d\n", retain(&ctx, 0), set(ctx));
    attr(&sms, 16, 0);
    printf("sms %d\n", sms);
    const void *table = 0;
    int rc = get(&table, ID);
    printf("get %d table %p\n", rc, table);
    if (rc || !table) return 0;
    const uint64_t *words = table;
    printf("size word %lu\n", (unsigned long)words[0]);
    for (int i = 1; i < 20 && i * 8 < (int)words[0]; i++) {
        Dl_info info;
        memset(&info, 0, sizeof info);
        dladdr((void *)words[i], &info);
        printf("slot %d %p %s+%#lx\n", i, (void *)words[i], info.dli_fname ? info.dli_fname : "?",
               (unsigned long)((char *)words[i] - (char *)info.dli_fbase));
    }
    fflush(stdout);
    // Slot 4 in a child, in case the guess of its signature is wrong.
    pid_t pid = fork();
    if (pid == 0) {
        void *p = 0;
        uint64_t h = 0;
        int r = ((slot4_fn)words[4])(&p, &h);
        printf("slot4 rc %d p %p second %#lx\n", r, p, (unsigned long)h);
        if (!r && p) {
            int n = sms * 2 > 0 ? sms * 2 : 64;
            printf("bytes:");
            for (int i = 0; i < n; i++) printf(" %u", ((unsigned char *)p)[i]);
            printf("\n");
            fflush(stdout);
            typedef int (*slot13_fn)(void *, uint64_t);
            printf("slot13 rc %d\n", ((slot13_fn)words[13])(p, h));
        }
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    printf("child status %d\n", st);
    return 0;
}
