// C = A × B (N×N, fp32, cuBLAS) from the host and back, on every device the
// program sees: each takes its share of A's rows and all of B (issue 24:
// whether 2 remote GPUs beat 1 local one, and from which N). Run natively on
// one GPU (CUDA_VISIBLE_DEVICES=0) and through cumux on the GPUs of two
// servers. Prints, per N, the median wall milliseconds of the whole product
// (copies in, sgemm, copies out) over ROUNDS, and checks each result
// against the first device's product of a few rows.
//
//   matmul_split "2048 4096 8192" [ROUNDS]
// Prints `n N devices D ms M` lines, then PASS.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>

// CHECK: a failed runtime call prints FAIL with its error; main returns 1.
#include "../../tests/cuda/driver/check.h"
#define BLAS(x)                                                       \
  do {                                                                \
    cublasStatus_t s = (x);                                           \
    if (s != CUBLAS_STATUS_SUCCESS) {                                 \
      printf("FAIL %s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)s); \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

struct Part {
  int rows, first;
  float *a, *b, *c;
  cublasHandle_t blas;
  cudaStream_t stream;
};

int main(int argc, char **argv) {
  std::vector<int> sizes;
  std::istringstream list(argc > 1 ? argv[1] : "2048 4096 8192");
  for (int n; list >> n;) sizes.push_back(n);
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  int nmax = *std::max_element(sizes.begin(), sizes.end());
  float *ha, *hb, *hc;  // pinned, as a program that streams data would have
  CHECK(cudaMallocHost(&ha, sizeof(float) * nmax * nmax));
  CHECK(cudaMallocHost(&hb, sizeof(float) * nmax * nmax));
  CHECK(cudaMallocHost(&hc, sizeof(float) * nmax * nmax));
  srand(1);
  for (long i = 0; i < (long)nmax * nmax; i++) {
    ha[i] = (rand() % 17 - 8) / 8.0f;
    hb[i] = (rand() % 13 - 6) / 6.0f;
  }
  bool ok = true;
  for (int n : sizes) {
    std::vector<Part> parts(devices);
    for (int d = 0; d < devices; d++) {
      Part &p = parts[d];
      p.first = (long)n * d / devices;
      p.rows = (long)n * (d + 1) / devices - p.first;
      CHECK(cudaSetDevice(d));
      CHECK(cudaMalloc(&p.a, sizeof(float) * p.rows * n));
      CHECK(cudaMalloc(&p.b, sizeof(float) * n * n));
      CHECK(cudaMalloc(&p.c, sizeof(float) * p.rows * n));
      CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
      BLAS(cublasCreate(&p.blas));
      BLAS(cublasSetStream(p.blas, p.stream));
    }
    std::vector<double> ms;
    for (int r = 0; r < rounds + 1; r++) {
      auto t0 = std::chrono::steady_clock::now();
      for (int d = 0; d < devices; d++) {
        Part &p = parts[d];
        CHECK(cudaSetDevice(d));
        CHECK(cudaMemcpyAsync(p.a, ha + (long)p.first * n, sizeof(float) * p.rows * n,
                              cudaMemcpyHostToDevice, p.stream));
        CHECK(cudaMemcpyAsync(p.b, hb, sizeof(float) * n * n, cudaMemcpyHostToDevice, p.stream));
        // Row-major C = A B is column-major Cᵀ = Bᵀ Aᵀ.
        const float one = 1, zero = 0;
        BLAS(cublasSgemm(p.blas, CUBLAS_OP_N, CUBLAS_OP_N, n, p.rows, n, &one, p.b, n, p.a, n, &zero,
                         p.c, n));
        CHECK(cudaMemcpyAsync(hc + (long)p.first * n, p.c, sizeof(float) * p.rows * n,
                              cudaMemcpyDeviceToHost, p.stream));
      }
      for (int d = 0; d < devices; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaStreamSynchronize(parts[d].stream));
      }
      double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) ms.push_back(t);  // the first round pays cuBLAS's start
    }
    // A few rows of every part against the host's product.
    for (int d = 0; d < devices; d++) {
      for (int k = 0; k < 2; k++) {
        int row = parts[d].first + (k ? parts[d].rows - 1 : 0);
        for (int col = 0; col < n; col += n / 7 + 1) {
          double want = 0;
          for (int i = 0; i < n; i++) want += (double)ha[(long)row * n + i] * hb[(long)i * n + col];
          double got = hc[(long)row * n + col];
          if (std::fabs(got - want) > 1e-3 * (std::fabs(want) + n)) {
            printf("FAIL n %d row %d col %d: %f, want %f\n", n, row, col, got, want);
            ok = false;
          }
        }
      }
    }
    std::sort(ms.begin(), ms.end());
    printf("n %d devices %d ms %.3f\n", n, devices, ms[ms.size() / 2]);
    fflush(stdout);
    for (int d = 0; d < devices; d++) {
      CHECK(cudaSetDevice(d));
      cublasDestroy(parts[d].blas);
      cudaFree(parts[d].a);
      cudaFree(parts[d].b);
      cudaFree(parts[d].c);
      cudaStreamDestroy(parts[d].stream);
    }
  }
  printf(ok ? "matmul_split: PASS\n" : "matmul_split: FAIL\n");
  return ok ? 0 : 1;
}
