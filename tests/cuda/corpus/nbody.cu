// nbody: all-pairs gravitational n-body with softening. Positions are staged
// through shared memory one tile at a time; forces use rsqrtf. A few leapfrog
// steps; compared with a double-precision host simulation within a tolerance.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"

#define BLOCK 128
#define SOFTENING 0.01f

// pos: (x, y, z, mass); vel: (vx, vy, vz, unused). Updates velocities by dt.
__global__ void body_forces(const float4* pos, float4* vel, int n, float dt)
{
    __shared__ float4 tile[BLOCK];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float4 me = i < n ? pos[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ax = 0.0f, ay = 0.0f, az = 0.0f;

    for (int base = 0; base < n; base += BLOCK) {
        int j = base + threadIdx.x;
        tile[threadIdx.x] = j < n ? pos[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        __syncthreads();
        for (int k = 0; k < BLOCK; ++k) {
            float4 other = tile[k];
            float dx = other.x - me.x;
            float dy = other.y - me.y;
            float dz = other.z - me.z;
            float dist2 = dx * dx + dy * dy + dz * dz + SOFTENING * SOFTENING;
            float inv = rsqrtf(dist2);
            float s = other.w * inv * inv * inv;
            ax += dx * s;
            ay += dy * s;
            az += dz * s;
        }
        __syncthreads();
    }
    if (i < n) {
        float4 v = vel[i];
        v.x += ax * dt;
        v.y += ay * dt;
        v.z += az * dt;
        vel[i] = v;
    }
}

__global__ void integrate(float4* pos, const float4* vel, int n, float dt)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        pos[i].x += vel[i].x * dt;
        pos[i].y += vel[i].y * dt;
        pos[i].z += vel[i].z * dt;
    }
}

int main()
{
    const int n = 1024;
    const int steps = 3;
    const float dt = 0.001f;
    std::vector<float4> pos(n), vel(n);
    unsigned state = 99u;
    auto next = [&state]() {
        state = state * 1664525u + 1013904223u;
        return (float)(state >> 8) / (float)(1u << 24);
    };
    for (int i = 0; i < n; ++i) {
        pos[i] = make_float4(next() * 2.0f - 1.0f, next() * 2.0f - 1.0f, next() * 2.0f - 1.0f,
                             0.5f + next() / n);
        vel[i] = make_float4(next() - 0.5f, next() - 0.5f, next() - 0.5f, 0.0f);
    }

    float4 *d_pos, *d_vel;
    CHECK(cudaMalloc(&d_pos, n * sizeof(float4)));
    CHECK(cudaMalloc(&d_vel, n * sizeof(float4)));
    CHECK(cudaMemcpy(d_pos, pos.data(), n * sizeof(float4), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_vel, vel.data(), n * sizeof(float4), cudaMemcpyHostToDevice));
    int grid = (n + BLOCK - 1) / BLOCK;
    for (int s = 0; s < steps; ++s) {
        body_forces<<<grid, BLOCK>>>(d_pos, d_vel, n, dt);
        CHECK(cudaGetLastError());
        integrate<<<grid, BLOCK>>>(d_pos, d_vel, n, dt);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<float4> got_pos(n), got_vel(n);
    CHECK(cudaMemcpy(got_pos.data(), d_pos, n * sizeof(float4), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got_vel.data(), d_vel, n * sizeof(float4), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_pos));
    CHECK(cudaFree(d_vel));

    // Host reference in double.
    std::vector<double> px(n), py(n), pz(n), m(n), vx(n), vy(n), vz(n);
    for (int i = 0; i < n; ++i) {
        px[i] = pos[i].x; py[i] = pos[i].y; pz[i] = pos[i].z; m[i] = pos[i].w;
        vx[i] = vel[i].x; vy[i] = vel[i].y; vz[i] = vel[i].z;
    }
    const double eps2 = (double)SOFTENING * SOFTENING;
    for (int s = 0; s < steps; ++s) {
        for (int i = 0; i < n; ++i) {
            double ax = 0, ay = 0, az = 0;
            for (int j = 0; j < n; ++j) {
                double dx = px[j] - px[i], dy = py[j] - py[i], dz = pz[j] - pz[i];
                double inv = 1.0 / sqrt(dx * dx + dy * dy + dz * dz + eps2);
                double f = m[j] * inv * inv * inv;
                ax += dx * f; ay += dy * f; az += dz * f;
            }
            vx[i] += ax * dt; vy[i] += ay * dt; vz[i] += az * dt;
        }
        for (int i = 0; i < n; ++i) {
            px[i] += vx[i] * dt; py[i] += vy[i] * dt; pz[i] += vz[i] * dt;
        }
    }

    int errors = 0;
    double worst = 0.0;
    for (int i = 0; i < n; ++i) {
        double d[6] = {got_pos[i].x - px[i], got_pos[i].y - py[i], got_pos[i].z - pz[i],
                       got_vel[i].x - vx[i], got_vel[i].y - vy[i], got_vel[i].z - vz[i]};
        double ref[6] = {px[i], py[i], pz[i], vx[i], vy[i], vz[i]};
        for (int c = 0; c < 6; ++c) {
            double err = fabs(d[c]) / fmax(1.0, fabs(ref[c]));
            if (err > worst) worst = err;
            if (err > 2e-3) {
                if (errors < 10) printf("nbody: body %d component %d off by %g\n", i, c, d[c]);
                ++errors;
            }
        }
    }
    if (errors) {
        printf("nbody: FAIL (%d components wrong, worst relative error %g)\n", errors, worst);
        return 1;
    }
    printf("nbody: PASS (n=%d steps=%d worst=%.2e)\n", n, steps, worst);
    return 0;
}
