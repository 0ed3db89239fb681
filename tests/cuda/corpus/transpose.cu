// transpose: out = in^T through a 32x33 shared tile (the extra column avoids
// shared-memory bank conflicts), 32x8 threads per tile, on a non-square matrix
// whose sides are not multiples of 32. Exact compare.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define TILE_DIM 32
#define BLOCK_ROWS 8

// in is rows x cols, out is cols x rows, both row-major.
__global__ void transpose(const float* in, float* out, int rows, int cols)
{
    __shared__ float tile[TILE_DIM][TILE_DIM + 1];

    int x = blockIdx.x * TILE_DIM + threadIdx.x;
    int y = blockIdx.y * TILE_DIM + threadIdx.y;
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS) {
        if (x < cols && y + j < rows) {
            tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * cols + x];
        }
    }
    __syncthreads();

    x = blockIdx.y * TILE_DIM + threadIdx.x;
    y = blockIdx.x * TILE_DIM + threadIdx.y;
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS) {
        if (x < rows && y + j < cols) {
            out[(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
        }
    }
}

int main()
{
    const int rows = 300, cols = 457;
    std::vector<float> in(rows * cols), out(rows * cols);
    for (int i = 0; i < rows * cols; ++i) in[i] = (float)i;

    float *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, in.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_out, out.size() * sizeof(float)));
    CHECK(cudaMemcpy(d_in, in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_out, 0xff, out.size() * sizeof(float)));

    dim3 block(TILE_DIM, BLOCK_ROWS);
    dim3 grid((cols + TILE_DIM - 1) / TILE_DIM, (rows + TILE_DIM - 1) / TILE_DIM);
    transpose<<<grid, block>>>(d_in, d_out, rows, cols);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));

    int errors = 0;
    for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
            float expected = in[r * cols + c];
            float got = out[c * rows + r];
            if (got != expected) {
                if (errors < 10) printf("transpose: out[%d][%d] = %g, expected %g\n", c, r, got, expected);
                ++errors;
            }
        }
    }
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    if (errors) {
        printf("transpose: FAIL (%d of %d wrong)\n", errors, rows * cols);
        return 1;
    }
    printf("transpose: PASS (%dx%d)\n", rows, cols);
    return 0;
}
