// grid_3d: a three-dimensional grid of three-dimensional blocks. Every thread
// records its blockIdx, threadIdx, gridDim and blockDim, its linear rank inside
// the block and its lane, at the cell of a 3-D volume its global coordinates
// name. The host checks every cell was written once with the right values.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

struct Cell {
    unsigned block;   // blockIdx.x | y << 8 | z << 16
    unsigned thread;  // threadIdx.x | y << 8 | z << 16
    unsigned dims;    // gridDim.x | y << 8 | z << 16, blockDim likewise in `bdims`
    unsigned bdims;
    unsigned rank;    // linear thread index inside the block
    unsigned lane;    // rank % 32, read from the %laneid register
    unsigned writes;  // how many threads wrote this cell
};

__global__ void grid_3d(Cell* cells)
{
    unsigned gx = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned gy = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned gz = blockIdx.z * blockDim.z + threadIdx.z;
    unsigned width = gridDim.x * blockDim.x;
    unsigned height = gridDim.y * blockDim.y;
    Cell* c = &cells[(gz * height + gy) * width + gx];
    c->block = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
    c->thread = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
    c->dims = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
    c->bdims = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
    c->rank = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    c->lane = lane;
    atomicAdd(&c->writes, 1u);
}

int main()
{
    const dim3 grid(3, 4, 5), block(8, 4, 2);
    const unsigned width = grid.x * block.x, height = grid.y * block.y, depth = grid.z * block.z;
    const unsigned cells = width * height * depth;
    Cell* d_cells;
    CHECK(cudaMalloc(&d_cells, cells * sizeof(Cell)));
    CHECK(cudaMemset(d_cells, 0, cells * sizeof(Cell)));
    grid_3d<<<grid, block>>>(d_cells);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<Cell> out(cells);
    CHECK(cudaMemcpy(out.data(), d_cells, cells * sizeof(Cell), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_cells));

    int errors = 0;
    for (unsigned z = 0; z < depth; ++z) {
        for (unsigned y = 0; y < height; ++y) {
            for (unsigned x = 0; x < width; ++x) {
                const Cell& c = out[(z * height + y) * width + x];
                unsigned bx = x / block.x, by = y / block.y, bz = z / block.z;
                unsigned tx = x % block.x, ty = y % block.y, tz = z % block.z;
                unsigned rank = tx + block.x * (ty + block.y * tz);
                Cell want = {bx | by << 8 | bz << 16, tx | ty << 8 | tz << 16,
                             grid.x | grid.y << 8 | grid.z << 16,
                             block.x | block.y << 8 | block.z << 16, rank, rank % 32, 1};
                if (c.block != want.block || c.thread != want.thread || c.dims != want.dims ||
                    c.bdims != want.bdims || c.rank != want.rank || c.lane != want.lane ||
                    c.writes != 1) {
                    if (errors < 10) {
                        printf("grid_3d: cell (%u,%u,%u): block %06x thread %06x rank %u lane %u "
                               "writes %u; expected block %06x thread %06x rank %u lane %u\n",
                               x, y, z, c.block, c.thread, c.rank, c.lane, c.writes, want.block,
                               want.thread, want.rank, want.lane);
                    }
                    ++errors;
                }
            }
        }
    }
    if (errors) {
        printf("grid_3d: FAIL (%d of %u cells wrong)\n", errors, cells);
        return 1;
    }
    printf("grid_3d: PASS (grid %ux%ux%u block %ux%ux%u)\n", grid.x, grid.y, grid.z, block.x,
           block.y, block.z);
    return 0;
}
