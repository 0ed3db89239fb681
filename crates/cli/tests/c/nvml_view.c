/* A tenant's NVML as a monitoring tool reads it: loads libnvidia-ml.so.1
 * and libcuda.so.1 as a program would, holds some device memory through
 * the driver (argument 1, bytes), then prints what NVML says of device 0
 * (count, name, UUID, memory, processes, utilization, and calls that go to
 * NVIDIA's NVML where one stands behind: temperature, driver version, power,
 * another device by PCI bus id, nvidia-smi's private table) as key: value lines, and stays that many
 * seconds more (argument 2). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvml_process;

static void *must(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f) { printf("FAIL: no %s\n", name); exit(1); }
  return f;
}

int main(int argc, char **argv) {
  unsigned long long hold = argc > 1 ? strtoull(argv[1], 0, 0) : 0;
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!cuda || !nvml) { printf("FAIL: %s\n", dlerror()); return 1; }
  int (*cuInit)(unsigned) = must(cuda, "cuInit");
  int (*cuDeviceGet)(int *, int) = must(cuda, "cuDeviceGet");
  int (*cuCtxCreate)(void **, unsigned, int) = must(cuda, "cuCtxCreate_v2");
  int (*cuMemAlloc)(unsigned long long *, size_t) = must(cuda, "cuMemAlloc_v2");
  int dev;
  void *ctx;
  unsigned long long ptr = 0;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate(&ctx, 0, dev)) { printf("FAIL: cuda\n"); return 1; }
  if (hold && cuMemAlloc(&ptr, hold)) { printf("FAIL: cuMemAlloc\n"); return 1; }

  int (*init)(void) = must(nvml, "nvmlInit_v2");
  int (*count)(unsigned *) = must(nvml, "nvmlDeviceGetCount_v2");
  int (*handle)(unsigned, void **) = must(nvml, "nvmlDeviceGetHandleByIndex_v2");
  int (*name)(void *, char *, unsigned) = must(nvml, "nvmlDeviceGetName");
  int (*uuid)(void *, char *, unsigned) = must(nvml, "nvmlDeviceGetUUID");
  int (*memory)(void *, nvml_memory *) = must(nvml, "nvmlDeviceGetMemoryInfo");
  int (*procs)(void *, unsigned *, nvml_process *) = must(nvml, "nvmlDeviceGetComputeRunningProcesses_v3");
  int (*util)(void *, void *) = must(nvml, "nvmlDeviceGetUtilizationRates");
  int (*shutdown)(void) = must(nvml, "nvmlShutdown");
  unsigned n = 0;
  void *d;
  char text[96];
  nvml_memory m;
  if (init() || count(&n) || handle(0, &d)) { printf("FAIL: nvml init\n"); return 1; }
  printf("count: %u\n", n);
  if (name(d, text, sizeof text)) { printf("FAIL: name\n"); return 1; }
  printf("name: %s\n", text);
  if (uuid(d, text, sizeof text)) { printf("FAIL: uuid\n"); return 1; }
  printf("uuid: %s\n", text);
  if (memory(d, &m)) { printf("FAIL: memory\n"); return 1; }
  printf("total: %llu\nused: %llu\nfree: %llu\n", m.total, m.used, m.free);
  nvml_process list[8];
  unsigned room = 8;
  if (procs(d, &room, list)) { printf("FAIL: processes\n"); return 1; }
  for (unsigned i = 0; i < room; i++)
    printf("process: %u %llu%s\n", list[i].pid, list[i].used, list[i].pid == (unsigned)getpid() ? " (me)" : "");
  unsigned rates[2] = {777, 777};
  int rc = util(d, rates);
  printf("utilization: %d %u %u\n", rc, rates[0], rates[1]);
  int (*temperature)(void *, unsigned, unsigned *) = must(nvml, "nvmlDeviceGetTemperature");
  unsigned degrees = 0;
  rc = temperature(d, 0, &degrees);
  printf("temperature: %d %u\n", rc, degrees);
  int (*driver)(char *, unsigned) = must(nvml, "nvmlSystemGetDriverVersion");
  rc = driver(text, sizeof text);
  printf("driver: %d %s\n", rc, rc ? "-" : text);
  int (*power)(void *, unsigned *) = must(nvml, "nvmlDeviceGetPowerUsage");
  printf("power: %d\n", power(d, &degrees));
  int (*by_pci)(const char *, void **) = must(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
  void *other = 0;
  printf("other device: %d\n", by_pci("0000:99:00.0", &other));
  /* nvidia-smi's private table: its device lookup and process list. */
  int (*get_table)(void **, const unsigned char *) = must(nvml, "nvmlInternalGetExportTable");
  static const unsigned char smi[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                        0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
  void **table = 0;
  rc = get_table((void **)&table, smi);
  printf("private table: %d\n", rc);
  if (rc == 0) {
    int (*by_index)(unsigned, void **, unsigned) = (int (*)(unsigned, void **, unsigned))table[81];
    void *same = 0;
    rc = by_index(0, &same, 0x22);
    printf("table device: %d %s\n", rc, same == d ? "same" : "other");
    int (*list)(void *, unsigned *, unsigned char *) = (int (*)(void *, unsigned *, unsigned char *))table[213];
    static unsigned char entries[4][4128];
    unsigned n = 4;
    rc = list(d, &n, &entries[0][0]);
    for (unsigned i = 0; rc == 0 && i < n; i++)
      printf("table process: %u %llu %s\n", *(unsigned *)entries[i],
             *(unsigned long long *)(entries[i] + 8), (char *)entries[i] + 32);
    int (*other_entry)(void) = (int (*)(void))table[100];
    printf("table other entry: %d\n", other_entry());
  }
  shutdown();
  printf("PASS\n");
  fflush(stdout);
  if (argc > 2) sleep((unsigned)atoi(argv[2]));
  return 0;
}
