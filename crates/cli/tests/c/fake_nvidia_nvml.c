/* A stand-in for NVIDIA's libnvidia-ml.so.1 behind cumux's NVML in tests:
 * it knows any device by UUID (unless FAKE_NVML_KNOWS_NONE is set), one more
 * device outside the tenant's set at PCI bus id 0000:99:00.0, and answers a
 * temperature of 42 + the device's place and a utilization of 77 % / 33 %;
 * its memory figures are absurd, so a test sees if they ever reach the
 * program. Its per-process samples (for the cumux server) are the `pid sm`
 * lines of the file $FAKE_NVML_PROCESS_SAMPLES, each taken now. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

typedef struct { char uuid[96]; } device;
static device devices[8];
static int known = 1; /* devices[0] is the one outside the tenant's set */
static int inits = 0;

int nvmlInitWithFlags(unsigned flags) { (void)flags; inits++; return 0; }
int nvmlInit_v2(void) { inits++; return 0; }
int nvmlShutdown(void) { if (!inits) return 1; inits--; return 0; }

static int valid(device *d) { return d >= devices && d < devices + known; }

int nvmlDeviceGetHandleByUUID(const char *uuid, device **out) {
  if (!inits) return 1;
  if (getenv("FAKE_NVML_KNOWS_NONE")) return 6;
  for (int i = 1; i < known; i++)
    if (!strcmp(devices[i].uuid, uuid)) { *out = &devices[i]; return 0; }
  if (known == 8) return 6;
  strncpy(devices[known].uuid, uuid, sizeof devices[known].uuid - 1);
  *out = &devices[known++];
  return 0;
}

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, device **out) {
  if (!inits) return 1;
  if (strcmp(bus, "0000:99:00.0")) return 6;
  *out = &devices[0];
  return 0;
}

int nvmlDeviceGetTemperature(device *d, unsigned sensor, unsigned *out) {
  if (!inits) return 1;
  if (!valid(d) || sensor != 0) return 2;
  *out = 42 + (unsigned)(d - devices);
  return 0;
}

typedef struct { unsigned long long total, free, used; } memory;
int nvmlDeviceGetMemoryInfo(device *d, memory *m) {
  (void)d;
  m->total = m->free = m->used = 999;
  return 0;
}

int nvmlSystemGetDriverVersion(char *out, unsigned len) {
  if (len < 12) return 7;
  strcpy(out, "580.99.fake");
  return 0;
}

/* nvidia-smi's private table: entry 0 its size in bytes; every entry answers
 * 999 so that a test sees which ones cumux's NVML answers itself. */
static int untouched(void) { return 999; }
static void *table[256];
int nvmlInternalGetExportTable(const void **out, const unsigned char *guid) {
  static const unsigned char smi[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                        0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};
  if (memcmp(guid, smi, 16)) return 3;
  table[0] = (void *)sizeof table;
  for (int i = 1; i < 256; i++) table[i] = (void *)untouched;
  *out = table;
  return 0;
}

/* The whole device's utilization, as NVIDIA measures it. */
int nvmlDeviceGetUtilizationRates(device *d, unsigned *rates) {
  if (!inits) return 1;
  if (!valid(d)) return 2;
  rates[0] = 77;
  rates[1] = 33;
  return 0;
}

/* nvmlProcessUtilizationSample_t: one sample per line of the samples file,
 * taken now, where now is past `since`; 6 (NOT_FOUND) where there are none. */
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } sample;
int nvmlDeviceGetProcessUtilization(device *d, sample *out, unsigned *count,
                                    unsigned long long since) {
  if (!inits) return 1;
  if (!valid(d) || !count) return 2;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  unsigned long long now = tv.tv_sec * 1000000ULL + tv.tv_usec;
  const char *path = getenv("FAKE_NVML_PROCESS_SAMPLES");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f) return 6;
  unsigned pid, sm, n = 0;
  while (now > since && fscanf(f, "%u %u", &pid, &sm) == 2) {
    if (out && n < *count) {
      sample s = {pid, now, sm, 0, 0, 0};
      out[n] = s;
    }
    n++;
  }
  fclose(f);
  if (n == 0) return 6;
  if (!out || n > *count) { *count = n; return 7; }
  *count = n;
  return 0;
}
