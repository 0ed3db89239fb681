// Activations crossing devices the way PyTorch's `tensor.to(other_device)`
// moves them (issue 24: one program on the devices of several servers): per
// step, a kernel on device 0, then for each next device a copy from the
// previous one on the source's stream, fenced both ways with events (the
// destination's stream ready before, the source's copy done after), and a
// kernel there; a step ends as a `loss.item()` does, with a 4-byte copy back
// and a synchronize. A second thread idles the whole run, as PyTorch's do (a
// process of one thread may wait differently). Prints each step's
// milliseconds, `hop_ms` (a step's median over its hops), and PASS when every
// device's buffer holds what the steps added.
//
//   pool_hops [STEPS [FLOATS]]        (defaults 20 steps, 524288 floats: 2 MiB)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

// CHECK: a failed runtime call prints FAIL with its error; main returns 1.
#include "../../tests/cuda/driver/check.h"

__global__ void add_one(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 20;
  int n = argc > 2 ? atoi(argv[2]) : 1 << 19;
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    printf("FAIL needs 2 devices, has %d\n", devices);
    return 1;
  }
  std::atomic<bool> done{false};
  std::thread idle([&] {
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  std::vector<float *> buf(devices);
  std::vector<cudaEvent_t> ready(devices), copied(devices);
  for (int d = 0; d < devices; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaMalloc(&buf[d], n * sizeof(float)));
    CHECK(cudaMemset(buf[d], 0, n * sizeof(float)));
    CHECK(cudaEventCreateWithFlags(&ready[d], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&copied[d], cudaEventDisableTiming));
  }
  int blocks = (n + 255) / 256;
  std::vector<double> step_ms;
  float last = 0;
  for (int s = 0; s < steps; s++) {
    auto t0 = std::chrono::steady_clock::now();
    CHECK(cudaSetDevice(0));
    add_one<<<blocks, 256>>>(buf[0], n);
    for (int dst = 1; dst < devices; dst++) {
      int src = dst - 1;
      CHECK(cudaSetDevice(dst));
      CHECK(cudaEventRecord(ready[dst], 0));
      CHECK(cudaSetDevice(src));
      CHECK(cudaStreamWaitEvent(0, ready[dst], 0));
      CHECK(cudaMemcpyAsync(buf[dst], buf[src], n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
      CHECK(cudaEventRecord(copied[src], 0));
      CHECK(cudaSetDevice(dst));
      CHECK(cudaStreamWaitEvent(0, copied[src], 0));
      add_one<<<blocks, 256>>>(buf[dst], n);
    }
    CHECK(cudaSetDevice(devices - 1));
    CHECK(cudaMemcpyAsync(&last, buf[devices - 1] + n - 1, sizeof(float), cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    printf("step %d ms %.3f last %.1f\n", s, step_ms.back(), last);
  }
  done = true;
  idle.join();
  // Device 0 counts the steps; each copy carries its count on and the next
  // device adds 1: device d holds steps + d.
  bool ok = true;
  std::vector<float> host(n);
  for (int d = 0; d < devices; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaMemcpy(host.data(), buf[d], n * sizeof(float), cudaMemcpyDeviceToHost));
    float want = float(steps + d);
    for (int i = 0; i < n; i += 997) ok &= host[i] == want;
    ok &= host[n - 1] == want;
  }
  std::vector<double> sorted(step_ms.begin() + std::min<size_t>(3, step_ms.size() - 1), step_ms.end());
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2];
  printf("devices: %d\nstep_ms: %.3f\nhop_ms: %.3f\n", devices, median, median / (devices - 1));
  printf(ok ? "pool_hops: PASS\n" : "pool_hops: FAIL (wrong values)\n");
  return ok ? 0 : 1;
}
