// CUDA arrays, texture and surface objects through the runtime API, each
// checked against values computed on the host: a 2-D float array filled with
// cudaMemcpy2DToArray and read back; texture objects over it with point and
// linear filtering (normalized coordinates for the linear one); a surface
// written by a kernel and copied back (a partial box, into a wider pitch)
// with cudaMemcpy2DFromArray; a 3-D array with cudaMemcpy3D both ways and
// tex3D; a mipmapped array's level (cudaGetMipmappedArrayLevel,
// cudaArrayGetInfo, tex2DLod); textures over pitched and linear memory.
// Prints PASS.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "check.h"

// Reads texel (x, y) of a point-filtered, unnormalized texture.
__global__ void read_point(cudaTextureObject_t t, float *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

// Samples a linear-filtered, normalized texture halfway between texels x and x+1.
__global__ void read_linear(cudaTextureObject_t t, float *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, (x + 1.0f) / w, (y + 0.5f) / h);
}

__global__ void write_surface(cudaSurfaceObject_t s, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) surf2Dwrite(3.0f * x - y, s, x * (int)sizeof(float), y);
}

__global__ void read_3d(cudaTextureObject_t t, float *out, int w, int h, int d) {
  int x = threadIdx.x, y = blockIdx.x, z = blockIdx.y;
  if (x < w && y < h && z < d) out[(z * h + y) * w + x] = tex3D<float>(t, x + 0.5f, y + 0.5f, z + 0.5f);
}

// Level 1 of a mipmapped texture (normalized coordinates, point filtering).
__global__ void read_lod(cudaTextureObject_t t, float *out, int w, int h) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w && y < h) out[y * w + x] = tex2DLod<float>(t, (x + 0.5f) / w, (y + 0.5f) / h, 1.0f);
}

__global__ void read_linear_memory(cudaTextureObject_t t, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(t, i);
}

static cudaTextureDesc point_desc() {
  cudaTextureDesc td;
  memset(&td, 0, sizeof td);
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  td.normalizedCoords = 0;
  return td;
}

static cudaResourceDesc array_resource(cudaArray_t a) {
  cudaResourceDesc rd;
  memset(&rd, 0, sizeof rd);
  rd.resType = cudaResourceTypeArray;
  rd.res.array.array = a;
  return rd;
}

int main() {
  const int W = 64, H = 32;
  cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
  std::vector<float> host(W * H), back(W * H, -1.0f);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) host[y * W + x] = 16.0f * x + 1000.0f * y;  // exact in fp32
  float *d_out = nullptr;
  CHECK(cudaMalloc(&d_out, 64 * 64 * 4 * sizeof(float)));

  // A 2-D array: in, and back out.
  cudaArray_t arr = nullptr;
  CHECK(cudaMallocArray(&arr, &fdesc, W, H, cudaArraySurfaceLoadStore));
  CHECK(cudaMemcpy2DToArray(arr, 0, 0, host.data(), W * sizeof(float), W * sizeof(float), H,
                            cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float), H,
                              cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H; i++) REQUIRE(back[i] == host[i], "array round trip at %d: %f", i, back[i]);

  cudaChannelFormatDesc got;
  cudaExtent ext;
  unsigned int flags = 0;
  CHECK(cudaArrayGetInfo(&got, &ext, &flags, arr));
  REQUIRE(ext.width == W && ext.height == H && ext.depth == 0, "array info %zu x %zu x %zu", ext.width,
         ext.height, ext.depth);
  REQUIRE(got.x == 32 && got.f == cudaChannelFormatKindFloat, "array format %d/%d", got.x, (int)got.f);
  REQUIRE(flags & cudaArraySurfaceLoadStore, "array flags %#x", flags);

  // Point filtering, unnormalized coordinates: the texels themselves.
  cudaResourceDesc rd = array_resource(arr);
  cudaTextureDesc td = point_desc();
  cudaTextureObject_t tex_point = 0, tex_linear = 0;
  CHECK(cudaCreateTextureObject(&tex_point, &rd, &td, nullptr));
  read_point<<<dim3(1, H), W>>>(tex_point, d_out, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), d_out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H; i++) REQUIRE(back[i] == host[i], "point texture at %d: %f", i, back[i]);

  // Linear filtering, normalized coordinates: halfway between neighbours.
  td.filterMode = cudaFilterModeLinear;
  td.normalizedCoords = 1;
  CHECK(cudaCreateTextureObject(&tex_linear, &rd, &td, nullptr));
  read_linear<<<dim3(1, H), W>>>(tex_linear, d_out, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), d_out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W - 1; x++) {
      float want = 0.5f * (host[y * W + x] + host[y * W + x + 1]);
      // Neighbours differ by 16: a point sample would be 8 off.
      REQUIRE(fabsf(back[y * W + x] - want) < 0.5f, "linear texture at (%d, %d): %f, not %f", x, y,
             back[y * W + x], want);
    }
  CHECK(cudaDestroyTextureObject(tex_point));
  CHECK(cudaDestroyTextureObject(tex_linear));

  // A surface written by a kernel; a partial box copied back into a wider pitch.
  cudaArray_t surf_arr = nullptr;
  CHECK(cudaMallocArray(&surf_arr, &fdesc, W, H, cudaArraySurfaceLoadStore));
  cudaResourceDesc srd = array_resource(surf_arr);
  cudaSurfaceObject_t surf = 0;
  CHECK(cudaCreateSurfaceObject(&surf, &srd));
  write_surface<<<dim3(1, H), W>>>(surf, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const int X0 = 8, Y0 = 2, PITCH = W + 4;
  std::vector<float> boxed(PITCH * H, -7.0f);
  CHECK(cudaMemcpy2DFromArray(boxed.data(), PITCH * sizeof(float), surf_arr, X0 * sizeof(float), Y0,
                              (W - X0) * sizeof(float), H - Y0, cudaMemcpyDeviceToHost));
  for (int y = 0; y < H - Y0; y++)
    for (int x = 0; x < PITCH; x++) {
      float want = x < W - X0 ? 3.0f * (x + X0) - (y + Y0) : -7.0f;
      REQUIRE(boxed[y * PITCH + x] == want, "surface at (%d, %d): %f, not %f", x, y, boxed[y * PITCH + x],
             want);
    }
  CHECK(cudaDestroySurfaceObject(surf));

  // A 3-D array: cudaMemcpy3D in, tex3D, cudaMemcpy3D out.
  const int W3 = 16, H3 = 8, D3 = 4, N3 = W3 * H3 * D3;
  std::vector<float> vol(N3), vol_back(N3, -1.0f);
  for (int i = 0; i < N3; i++) vol[i] = 0.25f * i - 3.0f;
  cudaArray_t arr3 = nullptr;
  CHECK(cudaMalloc3DArray(&arr3, &fdesc, make_cudaExtent(W3, H3, D3)));
  cudaMemcpy3DParms in;
  memset(&in, 0, sizeof in);
  in.srcPtr = make_cudaPitchedPtr(vol.data(), W3 * sizeof(float), W3, H3);
  in.dstArray = arr3;
  in.extent = make_cudaExtent(W3, H3, D3);
  in.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&in));
  cudaResourceDesc rd3 = array_resource(arr3);
  cudaTextureDesc td3 = point_desc();
  cudaTextureObject_t tex3 = 0;
  CHECK(cudaCreateTextureObject(&tex3, &rd3, &td3, nullptr));
  read_3d<<<dim3(H3, D3), W3>>>(tex3, d_out, W3, H3, D3);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(vol_back.data(), d_out, N3 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < N3; i++) REQUIRE(vol_back[i] == vol[i], "tex3D at %d: %f", i, vol_back[i]);
  std::fill(vol_back.begin(), vol_back.end(), -1.0f);
  cudaMemcpy3DParms out3;
  memset(&out3, 0, sizeof out3);
  out3.srcArray = arr3;
  out3.dstPtr = make_cudaPitchedPtr(vol_back.data(), W3 * sizeof(float), W3, H3);
  out3.extent = make_cudaExtent(W3, H3, D3);
  out3.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&out3));
  for (int i = 0; i < N3; i++) REQUIRE(vol_back[i] == vol[i], "3-D round trip at %d: %f", i, vol_back[i]);
  CHECK(cudaDestroyTextureObject(tex3));

  // A mipmapped array: level 1 filled, described, read back and sampled.
  const int M = 32, L1 = M / 2;
  cudaMipmappedArray_t mip = nullptr;
  CHECK(cudaMallocMipmappedArray(&mip, &fdesc, make_cudaExtent(M, M, 0), 3));
  cudaArray_t level1 = nullptr;
  CHECK(cudaGetMipmappedArrayLevel(&level1, mip, 1));
  CHECK(cudaArrayGetInfo(&got, &ext, &flags, level1));
  REQUIRE(ext.width == L1 && ext.height == L1, "level 1 is %zu x %zu", ext.width, ext.height);
  std::vector<float> lvl(L1 * L1), lvl_back(L1 * L1, -1.0f);
  for (int i = 0; i < L1 * L1; i++) lvl[i] = 1000.0f + i;
  CHECK(cudaMemcpy2DToArray(level1, 0, 0, lvl.data(), L1 * sizeof(float), L1 * sizeof(float), L1,
                            cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy2DFromArray(lvl_back.data(), L1 * sizeof(float), level1, 0, 0, L1 * sizeof(float), L1,
                              cudaMemcpyDeviceToHost));
  for (int i = 0; i < L1 * L1; i++) REQUIRE(lvl_back[i] == lvl[i], "level round trip at %d: %f", i, lvl_back[i]);
  cudaResourceDesc mrd;
  memset(&mrd, 0, sizeof mrd);
  mrd.resType = cudaResourceTypeMipmappedArray;
  mrd.res.mipmap.mipmap = mip;
  cudaTextureDesc mtd = point_desc();
  mtd.normalizedCoords = 1;
  mtd.mipmapFilterMode = cudaFilterModePoint;
  mtd.maxMipmapLevelClamp = 2.0f;
  cudaTextureObject_t tex_mip = 0;
  CHECK(cudaCreateTextureObject(&tex_mip, &mrd, &mtd, nullptr));
  read_lod<<<L1, L1>>>(tex_mip, d_out, L1, L1);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(lvl_back.data(), d_out, L1 * L1 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < L1 * L1; i++) REQUIRE(lvl_back[i] == lvl[i], "tex2DLod at %d: %f", i, lvl_back[i]);
  CHECK(cudaDestroyTextureObject(tex_mip));

  // A texture over pitched linear memory, and one over plain linear memory.
  float *pitched = nullptr;
  size_t pitch = 0;
  CHECK(cudaMallocPitch((void **)&pitched, &pitch, W * sizeof(float), H));
  CHECK(cudaMemcpy2D(pitched, pitch, host.data(), W * sizeof(float), W * sizeof(float), H,
                     cudaMemcpyHostToDevice));
  cudaResourceDesc prd;
  memset(&prd, 0, sizeof prd);
  prd.resType = cudaResourceTypePitch2D;
  prd.res.pitch2D.devPtr = pitched;
  prd.res.pitch2D.desc = fdesc;
  prd.res.pitch2D.width = W;
  prd.res.pitch2D.height = H;
  prd.res.pitch2D.pitchInBytes = pitch;
  cudaTextureDesc ptd = point_desc();
  cudaTextureObject_t tex_pitch = 0;
  CHECK(cudaCreateTextureObject(&tex_pitch, &prd, &ptd, nullptr));
  std::fill(back.begin(), back.end(), -1.0f);
  read_point<<<dim3(1, H), W>>>(tex_pitch, d_out, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), d_out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H; i++) REQUIRE(back[i] == host[i], "pitched texture at %d: %f", i, back[i]);
  CHECK(cudaDestroyTextureObject(tex_pitch));

  float *linear = nullptr;
  CHECK(cudaMalloc(&linear, W * H * sizeof(float)));
  CHECK(cudaMemcpy(linear, host.data(), W * H * sizeof(float), cudaMemcpyHostToDevice));
  cudaResourceDesc lrd;
  memset(&lrd, 0, sizeof lrd);
  lrd.resType = cudaResourceTypeLinear;
  lrd.res.linear.devPtr = linear;
  lrd.res.linear.desc = fdesc;
  lrd.res.linear.sizeInBytes = W * H * sizeof(float);
  cudaTextureObject_t tex_lin = 0;
  CHECK(cudaCreateTextureObject(&tex_lin, &lrd, &ptd, nullptr));
  std::fill(back.begin(), back.end(), -1.0f);
  read_linear_memory<<<(W * H + 255) / 256, 256>>>(tex_lin, d_out, W * H);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), d_out, W * H * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H; i++) REQUIRE(back[i] == host[i], "linear-memory texture at %d: %f", i, back[i]);
  CHECK(cudaDestroyTextureObject(tex_lin));

  CHECK(cudaFree(linear));
  CHECK(cudaFree(pitched));
  CHECK(cudaFreeMipmappedArray(mip));
  CHECK(cudaFreeArray(arr3));
  CHECK(cudaFreeArray(surf_arr));
  CHECK(cudaFreeArray(arr));
  CHECK(cudaFree(d_out));
  printf("PASS\n");
  return 0;
}
