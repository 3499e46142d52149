// The CUDA path's own kernels (everything that is not a matrix product). One translation unit so
// that nvcc runs once. Rules: fp32 arithmetic, outputs that feed a matrix product written in the
// product's input type (OutT = float or bf16), and no float atomics: every reduction that decides
// a result runs in a fixed order, so two runs give the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "check.hpp"
#include "launch.cuh"
#include "moeplan/backend/cuda/kernels.hpp"
#include "warp.cuh"

namespace moeplan::backend::cuda::kernels {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void store(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void store(bf16* p, float x) {
  *p = __float2bfloat16(x);
}
__device__ __forceinline__ float load(const float* p) {
  return *p;
}
__device__ __forceinline__ float load(const bf16* p) {
  return __bfloat162float(*p);
}
// Two adjacent elements in one access (8 bytes fp32, 4 bytes bf16); p aligned to the pair.
__device__ __forceinline__ float2 load2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 load2(const bf16* p) {
  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
  return make_float2(__bfloat162float(v.x), __bfloat162float(v.y));
}
__device__ __forceinline__ void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
// Four adjacent elements: 16-byte fp32 accesses (p 16-byte aligned); bf16 as two pairs.
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const bf16* p) {  // p 8-byte aligned
  const float2 a = load2(p), b = load2(p + 2);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ void store4(bf16* p, float4 v) {
  store2(p, v.x, v.y);
  store2(p + 2, v.z, v.w);
}
// 16 bytes of T as floats and back: 4 fp32 or 8 bf16 elements (p 16-byte aligned).
template <class T>
inline constexpr int kPer16 = int(16 / sizeof(T));
__device__ __forceinline__ void load16(const float* p, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
__device__ __forceinline__ void load16(const bf16* p, float (&x)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __bfloat162float(h[i].x);
    x[2 * i + 1] = __bfloat162float(h[i].y);
  }
}
__device__ __forceinline__ void store16(float* p, const float (&x)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store16(bf16* p, const float (&x)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = v;
}
// VEC adjacent elements as floats and back, in accesses of up to 16 bytes: VEC 1 (any p), 4 (p
// aligned to the four: 16 bytes fp32, 8 bf16) or a whole number of 16-byte words (p 16-byte
// aligned).
template <int VEC, class T>
__device__ __forceinline__ void load_cols(const T* p, float (&x)[VEC]) {
  if constexpr (VEC == 1) {
    x[0] = load(p);
  } else if constexpr (VEC == 4) {
    const float4 v = load4(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    constexpr int W = kPer16<T>;
    static_assert(VEC % W == 0, "VEC: 1, 4 or whole 16-byte words");
#pragma unroll
    for (int i = 0; i < VEC; i += W) {
      float w[W];
      load16(p + i, w);
#pragma unroll
      for (int j = 0; j < W; ++j) x[i + j] = w[j];
    }
  }
}
template <int VEC, class T>
__device__ __forceinline__ void store_cols(T* p, const float (&x)[VEC]) {
  if constexpr (VEC == 1) {
    store(p, x[0]);
  } else if constexpr (VEC == 4) {
    store4(p, make_float4(x[0], x[1], x[2], x[3]));
  } else {
    constexpr int W = kPer16<T>;
    static_assert(VEC % W == 0, "VEC: 1, 4 or whole 16-byte words");
#pragma unroll
    for (int i = 0; i < VEC; i += W) {
      float w[W];
#pragma unroll
      for (int j = 0; j < W; ++j) w[j] = x[i + j];
      store16(p + i, w);
    }
  }
}
// Whether every pointer is 16-byte aligned (the float4 paths' condition, with sizes % 4 == 0).
template <class... P>
bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// Block-wide sum in a fixed tree (blockDim multiple of 32, ≤ 1024); every thread gets the result.
__device__ float block_sum(float x) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) part[warp] = x;
  __syncthreads();
  float t = lane < warps ? part[lane] : 0.f;
  t = warp_sum(t);
  return t;
}
__device__ float block_max(float x) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) part[warp] = x;
  __syncthreads();
  float t = lane < warps ? part[lane] : -INFINITY;
  return warp_max(t);
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}
// Whether out takes store4 in the product type mm (16 bytes fp32, 8 bytes bf16).
bool store4_aligned(const void* out, DType mm) {
  return reinterpret_cast<uintptr_t>(out) % (mm == DType::f32 ? 16 : 8) == 0;
}
// Threads for a block that walks a row of n items: enough warps for them, at most 256.
unsigned row_threads(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256));
}

// Dispatch a launch on the matrix-input type.
#define MOEPLAN_DISPATCH_MM(mm, ...) \
  do {                               \
    if ((mm) == DType::f32) {        \
      using OutT = float;            \
      __VA_ARGS__;                   \
    } else {                         \
      using OutT = bf16;             \
      __VA_ARGS__;                   \
    }                                \
  } while (0)

template <class OutT>
__global__ void cast_kernel(OutT* out, const float* in, int64_t n) {
  after_previous_grid();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store(out + i, in[i]);
}
// Four elements a thread (n % 4 == 0, aligned): a quarter of the instructions, 16-byte loads.
template <class OutT>
__global__ void cast4_kernel(OutT* out, const float* in, int64_t n4) {
  after_previous_grid();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n4) store4(out + 4 * i, load4(in + 4 * i));
}

// blockIdx.y is the group; each thread adds elements of its group in a grid-stride loop.
__global__ void grouped_accumulate_kernel(float* const* dst, const bf16* src, int64_t per_group) {
  after_previous_grid();
  float* d = dst[blockIdx.y];
  const bf16* s = src + int64_t(blockIdx.y) * per_group;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < per_group;
       i += int64_t(gridDim.x) * blockDim.x)
    d[i] += __bfloat162float(s[i]);
}

__global__ void embedding_forward_kernel(float* x, const float* emb, const int32_t* tokens,
                                         int64_t C) {
  after_previous_grid();
  const int64_t t = blockIdx.x;
  const float* row = emb + int64_t(tokens[t]) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) x[t * C + c] = row[c];
}

__global__ void embedding_backward_kernel(float* demb, const float* dx, const int32_t* ids,
                                          const int32_t* seg_start, const int32_t* positions,
                                          int64_t C) {
  after_previous_grid();
  const int64_t u = blockIdx.x;
  float* row = demb + int64_t(ids[u]) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = row[c];
    for (int32_t p = seg_start[u]; p < seg_start[u + 1]; ++p)
      s += dx[int64_t(positions[p]) * C + c];
    row[c] = s;
  }
}

// One warp per row; with VEC4 (C % 4 == 0, aligned rows) a lane takes four adjacent columns in
// one 16-byte access, a quarter of the instructions per element. With SLOTS > 0 (VEC4 and
// C ≤ 128·SLOTS) a lane keeps its columns of x in registers between the sum of squares and the
// output, where the loop reads x twice (two trips to memory a row, the second mostly to L2:
// about 45 % of bandwidth on an H200, run F). Every form does the same arithmetic in the same
// order.
template <class OutT, bool VEC4, int SLOTS = 0>
__global__ void rmsnorm_forward_kernel(OutT* out, float* rstd, const float* x, const float* w,
                                       int64_t T, int64_t C, float eps, float* copy) {
  after_previous_grid();
  static_assert(SLOTS == 0 || VEC4, "registers only with 16-byte accesses");
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* xr = x + t * C;
  float ss = 0.f;
  if constexpr (SLOTS > 0) {
    float4 v[SLOTS];
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const int64_t c = 4 * lane + 128 * j;
      if (c < C) {
        v[j] = load4(xr + c);
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
      }
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / float(C) + eps);
    if (lane == 0) rstd[t] = r;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const int64_t c = 4 * lane + 128 * j;
      if (c < C) {
        const float4 g = load4(w + c);
        store4(out + t * C + c,
               make_float4(v[j].x * r * g.x, v[j].y * r * g.y, v[j].z * r * g.z, v[j].w * r * g.w));
        if (copy) *reinterpret_cast<float4*>(copy + t * C + c) = v[j];
      }
    }
    return;
  }
  if constexpr (VEC4) {
    for (int64_t c = 4 * lane; c < C; c += 128) {
      const float4 v = load4(xr + c);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) ss += xr[c] * xr[c];
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(C) + eps);
  if (lane == 0) rstd[t] = r;
  if constexpr (VEC4) {
    for (int64_t c = 4 * lane; c < C; c += 128) {
      const float4 v = load4(xr + c), g = load4(w + c);
      store4(out + t * C + c,
             make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w));
      if (copy) *reinterpret_cast<float4*>(copy + t * C + c) = v;
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      store(out + t * C + c, xr[c] * r * w[c]);
      if (copy) copy[t * C + c] = xr[c];
    }
  }
}

// Four columns of the rmsnorm backward (x̂ = x·r): Σ w·dy·x̂, and dx + r·(w·dy − x̂·dot); shared
// by the dx kernel and the one-pass kernel, so both compute the same bits.
__device__ __forceinline__ float rms_dot4(float4 g, float4 d, float4 v, float r) {
  return g.x * d.x * v.x * r + g.y * d.y * v.y * r + g.z * d.z * v.z * r + g.w * d.w * v.w * r;
}
__device__ __forceinline__ float4 rms_dx4(float4 o, float4 g, float4 d, float4 v, float r,
                                          float dot) {
  o.x += r * (g.x * d.x - v.x * r * dot);
  o.y += r * (g.y * d.y - v.y * r * dot);
  o.z += r * (g.z * d.z - v.z * r * dot);
  o.w += r * (g.w * d.w - v.w * r * dot);
  return o;
}

// dx += r·(w·dy − x̂·mean(w·dy·x̂)); VEC4 as in the forward. dx_mm, unless null, receives the new
// dx in the product type (what a cast of dx would write).
template <bool VEC4, class OutT>
__global__ void rmsnorm_backward_dx_kernel(float* dx, OutT* dx_mm, const float* dy, const float* x,
                                           const float* w, const float* rstd, int64_t T,
                                           int64_t C) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* xr = x + t * C;
  const float* dyr = dy + t * C;
  float* dxr = dx + t * C;
  const float r = rstd[t];
  float dot = 0.f;  // Σ_c w·dy·x̂
  if constexpr (VEC4) {
    for (int64_t c = 4 * lane; c < C; c += 128) {
      dot += rms_dot4(load4(w + c), load4(dyr + c), load4(xr + c), r);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) dot += w[c] * dyr[c] * xr[c] * r;
  }
  dot = warp_sum(dot) / float(C);
  if constexpr (VEC4) {
    for (int64_t c = 4 * lane; c < C; c += 128) {
      const float4 v = rms_dx4(load4(dxr + c), load4(w + c), load4(dyr + c), load4(xr + c), r, dot);
      store4(dxr + c, v);
      if (dx_mm) store4(dx_mm + t * C + c, v);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) {
      const float xhat = xr[c] * r;
      dxr[c] += r * (w[c] * dyr[c] - xhat * dot);
      if (dx_mm) store(dx_mm + t * C + c, dxr[c]);
    }
  }
}

// Column sums in two fixed-order passes: kColChunks row chunks, then the chunks in order.
constexpr int kColChunks = 64;

__global__ void rmsnorm_dw_partial_kernel(float* partial, const float* dy, const float* x,
                                          const float* rstd, int64_t T, int64_t C) {
  after_previous_grid();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = (T + kColChunks - 1) / kColChunks;
  const int64_t t0 = blockIdx.y * chunk, t1 = min(T, t0 + chunk);
  float s = 0.f;
#pragma unroll 8  // loads in flight, sums in order
  for (int64_t t = t0; t < t1; ++t) s += dy[t * C + c] * x[t * C + c] * rstd[t];
  partial[blockIdx.y * C + c] = s;
}

__global__ void colsum_partial_kernel(float* partial, const float* x, int64_t T, int64_t C) {
  after_previous_grid();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = (T + kColChunks - 1) / kColChunks;
  const int64_t t0 = blockIdx.y * chunk, t1 = min(T, t0 + chunk);
  float s = 0.f;
#pragma unroll 8
  for (int64_t t = t0; t < t1; ++t) s += x[t * C + c];  // loads in flight, sums in order
  partial[blockIdx.y * C + c] = s;
}

// out (C) = scale·Σ_chunks partial + (accumulate ? out : 0). A block of kFinishWarps warps takes
// 32 columns, a lane a column: warp w adds the chunks w, w + kFinishWarps, … in order, then the
// warps' sums are added in warp order, so the result is the same bits every run. (A thread a
// column adding all the chunks in turn, as before 2026-12-04, was latency-bound: at 256 chunks of
// 768 columns, 6 blocks on 132 SMs, 13 µs a call and 0.32 ms of the dense step on an H200.)
constexpr int kFinishWarps = 8;
__global__ void colsum_finish_kernel(float* out, const float* partial, int64_t C, float scale,
                                     bool accumulate, int64_t chunks) {
  after_previous_grid();
  __shared__ float sums[kFinishWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  float s = 0.f;
  if (c < C) {
#pragma unroll 8  // loads in flight, sums in order
    for (int64_t k = warp; k < chunks; k += kFinishWarps) s += partial[k * C + c];
  }
  sums[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || c >= C) return;
  float t = sums[0][lane];
  for (int w = 1; w < kFinishWarps; ++w) t += sums[w][lane];
  out[c] = (accumulate ? out[c] : 0.f) + scale * t;
}
void colsum_finish(float* out, const float* partial, int64_t C, float scale, bool accumulate,
                   int64_t chunks) {
  launch_kernel(colsum_finish_kernel, {unsigned((C + 31) / 32), 32 * kFinishWarps}, out, partial, C,
                scale, accumulate, chunks);
}

// The rmsnorm backward in one pass over dy and x: dx as rmsnorm_backward_dx_kernel<true>, and
// this block's column sums of dy·x·rstd over its `rows` rows into partial[blockIdx.x] (the
// separate dw kernel read dy and x a second time, latency-bound: 25 µs a call at T 8192, C 768
// on an H200, against 46 µs for dx). Warp w of 8 takes the block's rows w, w + 8, …; each lane
// keeps the sums of its columns 4·lane + 128·j (j < SLOTS) in registers; the 8 warps' sums are
// then added in warp order through shared memory. A row's dy, x and dx are loaded together and
// kept in registers for its dx, one trip to memory a row (until 2026-12-06 dy and x were read
// again after the dot product, and dx only then: two trips, at 54 % of DRAM bandwidth in run D).
// C % 4 == 0, C ≤ 128·SLOTS, aligned rows.
// The most 128-column slots (four columns a lane) the rmsnorm kernels keep in registers: C ≤ 1024.
constexpr int kMaxRowSlots = 8;
// Rows a block of the one-pass rmsnorm backward sums: at least 32 (4 a warp), and no more than
// kDwMaxChunks blocks, so that the finish adds at most that many partial rows. (Blocks of 16
// rows, twice the warps an SM, measured no faster on an H200: 1.05 against 1.02 ms of the dense
// step, 2026-12-04, and doubled the finish's partial rows.)
constexpr int64_t kDwMinRows = 32, kDwMaxChunks = 512;
int64_t dw_rows(int64_t T) {
  const int64_t spread = (T + kDwMaxChunks - 1) / kDwMaxChunks;
  return std::max(kDwMinRows, (spread + 7) / 8 * 8);
}
template <class OutT, int SLOTS>
__global__ void __launch_bounds__(256)
    rmsnorm_backward_fused_kernel(float* dx, OutT* dx_mm, float* partial, const float* dy,
                                  const float* x, const float* w, const float* rstd, int64_t T,
                                  int64_t C, int64_t rows) {
  after_previous_grid();
  extern __shared__ float4 warp_sums[];  // [8][C/4]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * rows, t1 = min(T, t0 + rows);
  float4 acc[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t t = t0 + warp; t < t1; t += 8) {
    const float* xr = x + t * C;
    const float* dyr = dy + t * C;
    float* dxr = dx + t * C;
    const float r = rstd[t];
    float4 d[SLOTS], v[SLOTS], o[SLOTS];
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const int64_t c = 4 * lane + 128 * j;
      if (c < C) {
        d[j] = load4(dyr + c);
        v[j] = load4(xr + c);
        o[j] = load4(dxr + c);
      }
    }
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const int64_t c = 4 * lane + 128 * j;
      if (c < C) dot += rms_dot4(load4(w + c), d[j], v[j], r);
    }
    dot = warp_sum(dot) / float(C);
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      const int64_t c = 4 * lane + 128 * j;
      if (c < C) {
        o[j] = rms_dx4(o[j], load4(w + c), d[j], v[j], r, dot);
        store4(dxr + c, o[j]);
        if (dx_mm) store4(dx_mm + t * C + c, o[j]);
        acc[j].x += d[j].x * v[j].x * r;
        acc[j].y += d[j].y * v[j].y * r;
        acc[j].z += d[j].z * v[j].z * r;
        acc[j].w += d[j].w * v[j].w * r;
      }
    }
  }
  const int64_t C4 = C / 4;
#pragma unroll
  for (int j = 0; j < SLOTS; ++j)
    if (lane + 32 * j < C4) warp_sums[warp * C4 + lane + 32 * j] = acc[j];
  __syncthreads();
  for (int64_t c4 = threadIdx.x; c4 < C4; c4 += blockDim.x) {
    float4 s = warp_sums[c4];
    for (int v = 1; v < 8; ++v) {
      const float4 o = warp_sums[v * C4 + c4];
      s.x += o.x;
      s.y += o.y;
      s.z += o.z;
      s.w += o.w;
    }
    store4(partial + int64_t(blockIdx.x) * C + 4 * c4, s);
  }
}

// Block per token; a thread per pair (x_2i, x_2i+1) of a q or k head, rotated by the table
// cos_sin (S, Dh/2, 2) (Dh even with RoPE); v heads, and every element without RoPE, are only
// cast. Pairs of the row in one access when W is even (the row then starts pair-aligned); no
// 64-bit division per element.
template <class OutT>
__global__ void qkv_prepare_kernel(OutT* out, const float* qkv, const float* cos_sin, int64_t S,
                                   int heads_qk, int W, int Dh, bool backward) {
  after_previous_grid();
  const int64_t t = blockIdx.x;
  const float* x = qkv + t * W;
  OutT* o = out + t * W;
  if (cos_sin == nullptr) {
    if (W % 2 == 0) {
      for (int p = threadIdx.x; p < W / 2; p += blockDim.x) {
        const float2 v = load2(x + 2 * p);
        store2(o + 2 * p, v.x, v.y);
      }
    } else {
      for (int c = threadIdx.x; c < W; c += blockDim.x) store(o + c, x[c]);
    }
    return;
  }
  const int half = Dh / 2;
  const float* cs = cos_sin + (t % S) * int64_t(Dh);  // this position's (Dh/2, 2)
  for (int p = threadIdx.x; p < W / 2; p += blockDim.x) {
    const int head = p / half, i = p - head * half;
    const float2 v = load2(x + 2 * p);
    if (head >= heads_qk) {
      store2(o + 2 * p, v.x, v.y);
      continue;
    }
    const float c = cs[2 * i], sn = backward ? -cs[2 * i + 1] : cs[2 * i + 1];  // backward: R^T
    store2(o + 2 * p, v.x * c - v.y * sn, v.x * sn + v.y * c);
  }
}

// One block per (bh, query row i).
template <class OutT>
__global__ void attention_softmax_forward_kernel(OutT* P, const float* scores, const float* slopes,
                                                 int64_t H, int64_t S, float scale) {
  after_previous_grid();
  const int64_t row = blockIdx.x;  // bh·S + i
  const int64_t i = row % S;
  const int64_t h = (row / S) % H;
  const float slope = slopes ? slopes[h] : 0.f;
  const float* sr = scores + row * S;
  OutT* pr = P + row * S;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    mx = fmaxf(mx, scale * sr[j] - slope * float(i - j));
  mx = block_max(mx);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    sum += expf(scale * sr[j] - slope * float(i - j) - mx);
  sum = block_sum(sum);
  const float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    store(pr + j, j <= i ? expf(scale * sr[j] - slope * float(i - j) - mx) * inv : 0.f);
}

template <class OutT>
__global__ void attention_softmax_backward_kernel(OutT* dS, const float* dP, const OutT* P,
                                                  int64_t S, float scale) {
  after_previous_grid();
  const int64_t row = blockIdx.x;
  const int64_t i = row % S;
  const float* dpr = dP + row * S;
  const OutT* pr = P + row * S;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) dot += load(pr + j) * dpr[j];
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    store(dS + row * S + j, j <= i ? scale * load(pr + j) * (dpr[j] - dot) : 0.f);
}

// 2^x by the hardware's ex2 (ex2.approx.ftz: relative error about 2^-22, results below 2^-126
// flushed to 0), one instruction where expf takes about eight (its range reduction and
// scaling). The emulation computes exp2f and flushes alike.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2_approx(float x) {
#ifdef MOEPLAN_CUDA_EMULATION
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.f : y;
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// The logistic function 1 / (1 + e^-a) through ex2 and the fast reciprocal (__fdividef: 2 ulp;
// for e^-a past 2^126, where the exact logistic is below 1e-38, it gives 0). The SwiGLU kernels
// move 6 and 10 bytes an element; expf and an IEEE division took about twenty instructions an
// element, so they ran at 55-65 % of bandwidth (run F).
__device__ __forceinline__ float sigmoid(float a) {
  return __fdividef(1.f, 1.f + ex2_approx(-a * kLog2e));
}

// Row n per blockDim.x threads (blockDim.y rows a block, so that narrow rows, the routed
// experts' 128 columns, still fill the warps); a thread takes VEC adjacent columns in one access:
// 16 bytes (8 bf16, 4 fp32) where F and the rows allow, else 2 (F even), else 1. No 64-bit
// division per element (it cost the thread-per-element form about half its time).
template <class OutT, int VEC>
__global__ void swiglu_forward_kernel(OutT* h, const OutT* ab, int64_t N, int64_t F) {
  after_previous_grid();
  const int64_t n = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  const OutT* a = ab + n * 2 * F;
  const OutT* b = a + F;
  OutT* o = h + n * F;
  if constexpr (VEC == kPer16<OutT>) {
    for (int64_t f = VEC * int64_t(threadIdx.x); f < F; f += VEC * int64_t(blockDim.x)) {
      float x[VEC], y[VEC];
      load16(a + f, x);
      load16(b + f, y);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = x[j] * sigmoid(x[j]) * y[j];
      store16(o + f, x);
    }
  } else if constexpr (VEC == 2) {
    for (int64_t f = 2 * int64_t(threadIdx.x); f < F; f += 2 * int64_t(blockDim.x)) {
      const float2 x = load2(a + f), y = load2(b + f);
      store2(o + f, x.x * sigmoid(x.x) * y.x, x.y * sigmoid(x.y) * y.y);
    }
  } else {
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
      const float x = load(a + f);
      store(o + f, x * sigmoid(x) * load(b + f));
    }
  }
}

// d silu(a)/da = sig·(1 + a·(1 − sig)).
__device__ __forceinline__ void swiglu_grad(float g, float a, float b, float& da, float& db) {
  const float sig = sigmoid(a);
  da = g * b * sig * (1.f + a * (1.f - sig));
  db = g * a * sig;
}

template <class OutT, int VEC>
__global__ void swiglu_backward_kernel(OutT* dab, const OutT* dh, const OutT* ab, int64_t N,
                                       int64_t F) {
  after_previous_grid();
  const int64_t n = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (n >= N) return;
  const OutT* a = ab + n * 2 * F;
  const OutT* b = a + F;
  const OutT* g = dh + n * F;
  OutT* da = dab + n * 2 * F;
  OutT* db = da + F;
  if constexpr (VEC == kPer16<OutT>) {
    for (int64_t f = VEC * int64_t(threadIdx.x); f < F; f += VEC * int64_t(blockDim.x)) {
      float x[VEC], y[VEC], d[VEC];
      load16(a + f, x);
      load16(b + f, y);
      load16(g + f, d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) swiglu_grad(d[j], x[j], y[j], x[j], y[j]);
      store16(da + f, x);
      store16(db + f, y);
    }
  } else if constexpr (VEC == 2) {
    for (int64_t f = 2 * int64_t(threadIdx.x); f < F; f += 2 * int64_t(blockDim.x)) {
      const float2 x = load2(a + f), y = load2(b + f), d = load2(g + f);
      float da0, db0, da1, db1;
      swiglu_grad(d.x, x.x, y.x, da0, db0);
      swiglu_grad(d.y, x.y, y.y, da1, db1);
      store2(da + f, da0, da1);
      store2(db + f, db0, db1);
    }
  } else {
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
      float d0, d1;
      swiglu_grad(load(g + f), load(a + f), load(b + f), d0, d1);
      store(da + f, d0);
      store(db + f, d1);
    }
  }
}

// Experts a warp-per-token routing kernel holds per lane: E ≤ 32·kRouterSlots (256) take the
// warp kernels; more, the thread-per-token ones.
constexpr int kRouterSlots = 8;

// A probability's rank: a NaN (from non-finite logits) ranks last, as on the CPU. Compared as
// floats, a NaN is neither larger nor smaller, so lanes could disagree on the best expert and a
// token whose probabilities are all NaN chose none (idx -1, an out-of-range row later).
__device__ __forceinline__ float rank_key(float p) {
  return isnan(p) ? -INFINITY : p;
}

// (p, e) ← the larger probability of the two, the lower expert on equal ones (-1: none yet).
__device__ __forceinline__ void keep_best(float& p, int32_t& e, float p2, int32_t e2) {
  const float k = rank_key(p), k2 = rank_key(p2);
  if (e2 >= 0 && (e < 0 || k2 > k || (k2 == k && e2 < e))) {
    p = p2;
    e = e2;
  }
}

// A warp per token; lane j holds experts j, j + 32, … Softmax by warp reductions in a fixed
// order; top-K as K rounds of a warp arg-max (the larger probability, the lower expert on ties,
// as the CPU). Loads and stores of the token's row are coalesced (the thread-per-token kernel
// had each thread walk its own row, and took 61 µs a layer on an H200 at T 8192, E 66, K 5).
__global__ void router_topk_warp_kernel(float* probs, float* lse, int32_t* idx, float* gate,
                                        const float* logits, int64_t T, int E, int64_t K,
                                        bool renormalize) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;  // the whole warp: t is the warp's
  const float* l = logits + t * E;
  float x[kRouterSlots];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kRouterSlots; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, x[j]);
  }
  mx = warp_max(mx);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kRouterSlots; ++j)
    if (lane + 32 * j < E) {
      x[j] = expf(x[j] - mx);
      s += x[j];
    }
  s = warp_sum(s);
  if (lane == 0) lse[t] = mx + logf(s);
#pragma unroll
  for (int j = 0; j < kRouterSlots; ++j)
    if (lane + 32 * j < E) {
      x[j] = x[j] / s;
      probs[t * E + lane + 32 * j] = x[j];
    }
  unsigned taken = 0;  // bit j: expert lane + 32·j chosen
  float chosen_sum = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    float bp = -1.f;
    int32_t best = -1;
#pragma unroll
    for (int j = 0; j < kRouterSlots; ++j)
      if (lane + 32 * j < E && !((taken >> j) & 1u)) keep_best(bp, best, x[j], lane + 32 * j);
    for (int o = 16; o > 0; o >>= 1) {
      const float p2 = __shfl_xor_sync(0xffffffffu, bp, o);
      const int32_t e2 = __shfl_xor_sync(0xffffffffu, best, o);
      keep_best(bp, best, p2, e2);
    }
    if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
    if (lane == 0) {
      idx[t * K + k] = best;
      gate[t * K + k] = bp;
    }
    chosen_sum += bp;
  }
  if (renormalize && lane == 0)
    for (int64_t k = 0; k < K; ++k) gate[t * K + k] /= chosen_sum;
}

// Thread per token: E is small (≤ a few hundred), so a serial softmax and K selection passes.
__global__ void router_topk_kernel(float* probs, float* lse, int32_t* idx, float* gate,
                                   const float* logits, int64_t T, int64_t E, int64_t K,
                                   bool renormalize) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = fmaxf(mx, l[e]);
  float s = 0.f;
  for (int64_t e = 0; e < E; ++e) s += expf(l[e] - mx);
  lse[t] = mx + logf(s);
  for (int64_t e = 0; e < E; ++e) probs[t * E + e] = expf(l[e] - mx) / s;
  float chosen_sum = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    int32_t best = -1;
    float bp = -1.f;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= idx[t * K + j] == int32_t(e);
      const float p = probs[t * E + e];
      if (!taken && (best < 0 || rank_key(p) > rank_key(bp))) {  // strict: ties keep the lower
        bp = p;
        best = int32_t(e);
      }
    }
    idx[t * K + k] = best;
    gate[t * K + k] = bp;
    chosen_sum += bp;
  }
  if (renormalize)
    for (int64_t k = 0; k < K; ++k) gate[t * K + k] /= chosen_sum;
}

// The stable sort by expert in three passes over chunks of kSortChunk assignments (a thread
// each of a 1024-thread block): each chunk's count of every expert, those counts scanned into
// each chunk's start among every expert's assignments, then each chunk's placements. The work is
// O(T·K + chunks·E), where a block per expert scanning every assignment was O(E·T·K): 22 µs a
// layer on an H200 at T 8192, K 5, E 66 (ncu, 2026-12-04 run G), four times that at T 32768.
constexpr int kSortChunk = 1024;
constexpr int64_t kSortMaxExperts = 12288;  // E ints of shared memory a block (48 KiB)

// Chunk blockIdx.x's assignment a = chunk·1024 + threadIdx.x, of expert e (valid: a < N):
// returns how many of e's assignments came before it, from run[e] (shared, E ints: the count
// before this chunk) and the lower lanes of its warp; each warp, in order, adds its own count of
// e to run[e]. Every thread of the block must call it.
__device__ int chunk_rank(int* run, int e, bool valid) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1);
  const int leader = __ffs(int(peers)) - 1;
  int base = 0;
  __syncthreads();  // run[] set
  for (int w = 0; w < int(blockDim.x >> 5); ++w) {
    if (w == warp && lane == leader && valid) {
      base = run[e];
      run[e] = base + __popc(peers);
    }
    __syncthreads();
  }
  base = __shfl_sync(0xffffffffu, base, leader);
  return base + __popc(peers & ((1u << lane) - 1u));
}

// chunk_counts[e·chunks + c] = how many of chunk c's assignments chose expert e.
__global__ void chunk_count_kernel(int32_t* chunk_counts, const int32_t* idx, int64_t N,
                                   int64_t E) {
  after_previous_grid();
  extern __shared__ int run[];
  const int64_t c = blockIdx.x, chunks = gridDim.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) run[e] = 0;
  const int64_t a = c * kSortChunk + threadIdx.x;
  const int e = a < N ? idx[a] : -1;
  chunk_rank(run, e, e >= 0 && e < E);  // (router_topk gives 0 <= e < E; run[] stays in bounds)
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[e * chunks + c] = run[e];
}

// A warp per expert scans its chunk counts in place into each chunk's start (exclusive), and
// writes the expert's count raw[e] (every assignment) and kept[e] = min(raw, cap) where that is
// another buffer; then one thread writes offsets (E + 1) from the kept counts. One block.
__global__ void chunk_scan_kernel(int32_t* chunk_counts, int32_t* raw, int32_t* kept,
                                  int32_t* offsets, int64_t chunks, int64_t E, int32_t cap) {
  after_previous_grid();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t e = warp; e < E; e += warps) {
    int32_t* row = chunk_counts + e * chunks;
    int32_t carry = 0;
    for (int64_t c0 = 0; c0 < chunks; c0 += 32) {
      const int64_t c = c0 + lane;
      const int32_t n = c < chunks ? row[c] : 0;
      int32_t incl = n;
      for (unsigned o = 1; o < 32; o <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= int(o)) incl += up;
      }
      if (c < chunks) row[c] = carry + incl - n;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      raw[e] = carry;
      if (kept != raw) kept[e] = min(carry, cap);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t s = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = s;
      s += min(raw[e], cap);
    }
    offsets[E] = s;
  }
}

// No assignments: raw, kept and offsets all zero.
__global__ void exclusive_zero_kernel(int32_t* raw, int32_t* kept, int32_t* offsets, int64_t E) {
  after_previous_grid();
  for (int64_t e = threadIdx.x; e <= E; e += blockDim.x) {
    offsets[e] = 0;
    if (e < E) raw[e] = kept[e] = 0;
  }
}

// Each assignment to its slot: offsets[e] + its rank among e's assignments, in assignment order;
// an expert's assignments past its first `cap` are dropped (slot_of −1, not placed).
__global__ void chunk_place_kernel(int32_t* sorted, int32_t* slot_of, const int32_t* offsets,
                                   const int32_t* chunk_start, const int32_t* idx, int64_t N,
                                   int64_t E, int32_t cap) {
  after_previous_grid();
  extern __shared__ int run[];
  const int64_t c = blockIdx.x, chunks = gridDim.x;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) run[e] = chunk_start[e * chunks + c];
  const int64_t a = c * kSortChunk + threadIdx.x;
  const int e = a < N ? idx[a] : -1;
  const bool valid = e >= 0 && e < E;
  const int rank = chunk_rank(run, e, valid);
  if (a >= N) return;
  if (valid && rank < cap) {
    const int32_t slot = offsets[e] + rank;
    sorted[slot] = int32_t(a);
    slot_of[a] = slot;
  } else {
    slot_of[a] = -1;
  }
}

// VEC16: rows of a whole number of 16-byte words, aligned, copied a word a thread.
template <class T, bool VEC16>
__global__ void gather_rows_kernel(T* out, const T* in, const int32_t* sorted, int64_t K,
                                   int64_t C) {
  after_previous_grid();
  const int64_t i = blockIdx.x;
  const int64_t t = sorted[i] / K;
  if constexpr (VEC16) {
    const int64_t words = C * int64_t(sizeof(T)) / 16;
    const uint4* src = reinterpret_cast<const uint4*>(in + t * C);
    uint4* dst = reinterpret_cast<uint4*>(out + i * C);
    for (int64_t c = threadIdx.x; c < words; c += blockDim.x) dst[c] = src[c];
  } else {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[i * C + c] = in[t * C + c];
  }
}

__global__ void expert_pad_maps_kernel(int32_t* pad, int32_t* unpad, const int32_t* counts,
                                       const int32_t* offsets, int64_t E, int64_t cap) {
  after_previous_grid();
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= E * cap) return;
  const int64_t e = p / cap, j = p % cap;
  if (j < counts[e]) {
    pad[p] = int32_t(offsets[e] + j);
    unpad[offsets[e] + j] = int32_t(p);
  } else {
    pad[p] = -1;
  }
}

template <class T>
__global__ void copy_rows_kernel(T* dst, const T* src, const int32_t* map, int64_t C) {
  after_previous_grid();
  const int64_t r = blockIdx.x;
  const int64_t from = map[r];
  if (from >= 0)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[r * C + c] = src[from * C + c];
  else
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) store(dst + r * C + c, 0.f);
}

// y[t] += Σ_k gate·ys[slot] (GATED: the combine forward) or dx[t] += Σ_k dxs[slot] (the
// scatter-add of the routed rows' input gradients), k in order, dropped assignments (slot −1,
// over capacity) adding nothing; the routed rows in YT (the model's matrix type), y fp32. A
// token's row is blockDim.x threads of VEC columns an access (row_launch: narrow rows share a
// warp), blockDim.y tokens a block; every VEC gives the same sums. (A block per token with 8-byte
// bf16 accesses ran at about half the bandwidth on an H200: run F, 0.27 ms a MoE step each.)
template <int VEC, bool GATED, class YT>
__global__ void moe_combine_rows_kernel(float* y, const YT* ys, const float* gate,
                                        const int32_t* slot_of, int64_t T, int64_t K, int64_t C) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T) return;
  const int32_t* slots = slot_of + t * K;
  constexpr int kGroup = 4;  // routed rows loaded together: their loads in flight at once
  for (int64_t c = VEC * int64_t(threadIdx.x); c < C; c += VEC * int64_t(blockDim.x)) {
    float s[VEC];
    load_cols(y + t * C + c, s);
    for (int64_t k0 = 0; k0 < K; k0 += kGroup) {
      int32_t r[kGroup];  // the slots first (no branch between their loads), then the rows
#pragma unroll
      for (int u = 0; u < kGroup; ++u) r[u] = slots[min(k0 + u, K - 1)];
      float v[kGroup][VEC], g[kGroup];
      bool kept[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        kept[u] = k0 + u < K && r[u] >= 0;  // −1: dropped (over capacity)
        if (kept[u]) {
          load_cols(ys + int64_t(r[u]) * C + c, v[u]);
          g[u] = GATED ? gate[t * K + k0 + u] : 1.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {  // the sums in k order
        if (!kept[u]) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if constexpr (GATED)
            s[j] += g[u] * v[u][j];
          else
            s[j] += v[u][j];
        }
      }
    }
    store_cols(y + t * C + c, s);
  }
}

// One warp per assignment a = t·K + k, in token order, so that the K warps of token t read its dy
// row together (in the order of the routed rows, the sort by expert, each dy row was read K times
// far apart: at batch 32 × 1024 the 64 MB of dy outgrow the H200's 50 MB L2). Routed row
// i = slot_of[a]: dys[i] = gate[a]·dy[t], dgate[a] = dy[t]·ys[i] (each lane VEC columns an
// access, then the warp's sum; the sum's order depends on VEC, nothing else); a dropped
// assignment (slot −1) gets dgate 0 and no row. ys and dys in the model's matrix type. (One
// column a lane, 2-byte bf16 accesses, ran at about 35 % of bandwidth on an H200: run F, 0.48 ms
// a MoE step at batch 8.)
template <int VEC, class OutT>
__global__ void moe_combine_backward_kernel(OutT* dys, float* dgate, const float* dy,
                                            const OutT* ys, const float* gate,
                                            const int32_t* slot_of, int64_t TK, int64_t K,
                                            int64_t C) {
  after_previous_grid();
  const int64_t a = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (a >= TK) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = slot_of[a];
  if (i < 0) {  // dropped (over capacity)
    if (lane == 0) dgate[a] = 0.f;
    return;
  }
  const int64_t t = a / K;
  const float g = gate[a];
  float dot = 0.f;
  for (int64_t c = VEC * lane; c < C; c += 32 * VEC) {
    float d[VEC], v[VEC];
    load_cols(dy + t * C + c, d);
    load_cols(ys + i * C + c, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dot += d[j] * v[j];
      d[j] *= g;
    }
    store_cols(dys + i * C + c, d);
  }
  dot = warp_sum(dot);
  if (lane == 0) dgate[a] = dot;
}

// aux = {λ·E·Σ f_i·P_i, z·mean lse²}; one block of kAuxThreads, fixed order. Each thread sums
// its share of lse² (four at a time with VEC4) before the block's sum: one block of 256 threads
// walked 8192 tokens (batch 8 × 1024) in 32 dependent steps a thread, 128 at batch 32.
constexpr int kAuxThreads = 1024;
template <bool VEC4>
__global__ void router_aux_finish_kernel(float* aux, const float* p_mean, const float* lse,
                                         const int32_t* counts, int64_t T, int64_t E, int64_t K,
                                         float lb, float z) {
  after_previous_grid();
  float s = 0.f;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    s += (float(counts[e]) / float(T * K)) * p_mean[e];
  s = block_sum(s);
  float zs = 0.f;
  if constexpr (VEC4) {
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < T / 4; i += blockDim.x) {
      const float4 v = load4(lse + 4 * i);
      zs += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
#pragma unroll 8
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) zs += lse[t] * lse[t];  // in order
  }
  zs = block_sum(zs);
  if (threadIdx.x == 0) {
    aux[0] = lb * float(E) * s;
    aux[1] = z * zs / float(T);
  }
}

template <class OutT>
__global__ void router_backward_kernel(OutT* dlogits, const float* probs, const float* lse,
                                       const int32_t* idx, const float* gate, const float* dgate,
                                       const int32_t* counts, int64_t T, int64_t E, int64_t K,
                                       bool renormalize, float lb, float z) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* p = probs + t * E;
  // Σ_k dg_k·g_k, for the renormalised gates g_k = p_k / Σ_topK p.
  float chosen = 0.f, dg_dot_g = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    chosen += p[idx[t * K + k]];
    dg_dot_g += dgate[t * K + k] * gate[t * K + k];
  }
  // dp_e, then dlogit_e = p_e·(dp_e − Σ p·dp) + z-loss term.
  auto dp_of = [&](int64_t e) {
    float d = lb * float(E) * (float(counts[e]) / float(T * K)) / float(T);
    for (int64_t k = 0; k < K; ++k)
      if (idx[t * K + k] == int32_t(e))
        d += renormalize ? (dgate[t * K + k] - dg_dot_g) / chosen : dgate[t * K + k];
    return d;
  };
  float pdp = 0.f;
  for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp_of(e);
  const float zterm = z * 2.f * lse[t] / float(T);
  for (int64_t e = 0; e < E; ++e)
    store(dlogits + t * E + e, p[e] * (dp_of(e) - pdp) + zterm * p[e]);
}

// router_backward_kernel's arithmetic with a warp per token (lane j: experts j, j + 32, …), the
// token's rows read and written coalesced; Σ_e p·dp by a warp reduction.
template <class OutT>
__global__ void router_backward_warp_kernel(OutT* dlogits, const float* probs, const float* lse,
                                            const int32_t* idx, const float* gate,
                                            const float* dgate, const int32_t* counts, int64_t T,
                                            int E, int64_t K, bool renormalize, float lb, float z) {
  after_previous_grid();
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* p = probs + t * E;
  float chosen = 0.f, dg_dot_g = 0.f;  // every lane, in the kernel's order
  for (int64_t k = 0; k < K; ++k) {
    chosen += p[idx[t * K + k]];
    dg_dot_g += dgate[t * K + k] * gate[t * K + k];
  }
  float pe[kRouterSlots], dp[kRouterSlots];
  float pdp = 0.f;
#pragma unroll
  for (int j = 0; j < kRouterSlots; ++j) {
    const int e = lane + 32 * j;
    pe[j] = 0.f;
    dp[j] = 0.f;
    if (e < E) {
      float d = lb * float(E) * (float(counts[e]) / float(T * K)) / float(T);
      for (int64_t k = 0; k < K; ++k)
        if (idx[t * K + k] == e)
          d += renormalize ? (dgate[t * K + k] - dg_dot_g) / chosen : dgate[t * K + k];
      pe[j] = p[e];
      dp[j] = d;
      pdp += pe[j] * d;
    }
  }
  pdp = warp_sum(pdp);
  const float zterm = z * 2.f * lse[t] / float(T);
#pragma unroll
  for (int j = 0; j < kRouterSlots; ++j)
    if (lane + 32 * j < E)
      store(dlogits + t * E + lane + 32 * j, pe[j] * (dp[j] - pdp) + zterm * pe[j]);
}

// (m, s) ← the pair for the union of two sets with maxima m, m2 and sums of exp(x − max) s, s2.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

// Block-wide merge in a fixed tree; every thread gets the block's (max, sum).
__device__ void block_merge_max_sum(float& m, float& s) {
  __shared__ float pm[32], ps[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) {
    pm[warp] = m;
    ps[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < warps ? pm[lane] : -INFINITY;
    s = lane < warps ? ps[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1)
      merge_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) {
      pm[0] = m;
      ps[0] = s;
    }
  }
  __syncthreads();
  m = pm[0];
  s = ps[0];
}

// exp(x − shift) as one multiply-add and the hardware's ex2 (ex2.approx.ftz: relative error about
// 2^-22, results below 2^-126 flushed to 0): x in natural units, shift2 = shift·log2(e). Two
// instructions where expf takes about eight (its range reduction and scaling): the cross-entropy
// kernel takes two exponentials an element, which left it bound on instruction issue rather than
// on its 4 bytes an element of traffic (0.6 ms for the 8192 × 50,304 bf16 logits of a batch of 8
// on the H200, run F). The emulation computes exp2f and flushes alike.
__device__ __forceinline__ float exp_shifted(float x, float shift2) {
  return ex2_approx(__fmaf_rn(x, kLog2e, -shift2));
}

// Block per row: log-sum-exp and loss in one pass over the logits, the gradient in a second.
// Logits and gradient in T (fp32, or bf16 as the LM head's product wrote them), the arithmetic in
// fp32. STAGED: the row is first copied to shared memory (V·sizeof(T) bytes, up to the opt-in
// limit), so the second pass reads it there instead of from global memory: with hundreds of rows
// in flight a row does not stay in L2 between the passes. A staged row whose width and gradient
// row are whole 16-byte words is read and written 16 bytes a thread (8 bf16 or 4 fp32: an eighth
// of the element loop's instructions for the LM head's bf16 rows), its max and sum taken a word
// at a time. The gradient is grad_scale·p, less grad_scale at the target.
template <class T, bool STAGED>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int64_t V, float grad_scale) {
  after_previous_grid();
  const int64_t t = blockIdx.x;
  const T* l = logits + t * V;
  const int32_t target = targets[t];
  if (target < 0) {
    if (threadIdx.x == 0) losses[t] = 0.f;
    if (dlogits)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) store(dlogits + t * V + v, 0.f);
    return;
  }
  if constexpr (STAGED) {
    extern __shared__ __align__(16) unsigned char staged_row[];
    T* row = reinterpret_cast<T*>(staged_row);
    constexpr int64_t kVec = 16 / sizeof(T);  // elements a 16-byte copy
    if (V % kVec == 0 && reinterpret_cast<uintptr_t>(l) % 16 == 0) {
      // Every copy of the row in flight at once.
      for (int64_t v = threadIdx.x; v < V / kVec; v += blockDim.x)
        cp_async_16(row + kVec * v, l + kVec * v, 16);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) row[v] = l[v];
    }
    __syncthreads();
    l = row;
    constexpr int kW = kPer16<T>;
    T* g = dlogits ? dlogits + t * V : nullptr;
    if (V % kW == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      const int64_t words = V / kW;
      float mx = -INFINITY, s = 0.f;
      for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        float x[kW];
        load16(row + kW * w, x);
        float wm = x[0];
#pragma unroll
        for (int j = 1; j < kW; ++j) wm = fmaxf(wm, x[j]);
        if (wm > mx) {  // rescale the sum so far to the new max (0 while mx is −inf)
          s = mx == -INFINITY ? 0.f : s * expf(mx - wm);
          mx = wm;
        }
        const float shift2 = mx * kLog2e;
#pragma unroll
        for (int j = 0; j < kW; ++j) s += exp_shifted(x[j], shift2);
      }
      block_merge_max_sum(mx, s);
      const float lse = mx + logf(s);
      if (threadIdx.x == 0) losses[t] = lse - load(row + target);
      if (g) {
        const float shift2 = lse * kLog2e;
        for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
          float x[kW];
          load16(row + kW * w, x);
#pragma unroll
          for (int j = 0; j < kW; ++j) x[j] = grad_scale * exp_shifted(x[j], shift2);
          const int64_t at = target - kW * w;  // the target's place in this word, if it is here
          if (at >= 0 && at < kW)  // one word of the row: the unrolled test keeps x in registers
#pragma unroll
            for (int j = 0; j < kW; ++j)
              if (j == at) x[j] -= grad_scale;
          store16(g + kW * w, x);
        }
      }
      return;
    }
  }
  // One pass for the max and the sum (online: the sum is rescaled when the max grows), merged
  // across the block in a fixed order; a second pass writes the gradient.
  float mx = -INFINITY, shift2 = -INFINITY, s = 0.f;  // shift2 = mx·log2(e)
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = load(l + v);
    if (x > mx) {
      s = s * expf(mx - x) + 1.f;
      mx = x;
      shift2 = mx * kLog2e;
    } else {
      s += exp_shifted(x, shift2);
    }
  }
  block_merge_max_sum(mx, s);
  const float lse = mx + logf(s);
  if (threadIdx.x == 0) losses[t] = lse - load(l + target);
  if (dlogits) {
    const float shift2 = lse * kLog2e;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float p = grad_scale * exp_shifted(load(l + v), shift2);
      store(dlogits + t * V + v, v == target ? p - grad_scale : p);
    }
  }
}

__global__ void sum_double_kernel(double* out, const float* x, int64_t n) {
  after_previous_grid();
  __shared__ double part[1024];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(x[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = part[0];
}

constexpr int kNormBlocks = 1024, kNormThreads = 256;

__global__ void sumsq_partial_kernel(double* partial, const float* g, int64_t n) {
  after_previous_grid();
  __shared__ double part[kNormThreads];
  double s = 0;
#pragma unroll 8  // loads in flight, sums in order
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * double(g[i]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// One block of kFinishThreads: thread i adds partial[i], partial[i + kFinishThreads], … in order
// (a bucket's kNormBlocks sums each; about 14 a thread for a 12-layer model), then the block's
// tree in a fixed order.
constexpr int kFinishThreads = 1024;
__global__ void norm_finish_kernel(float* norm, const double* partial, int64_t n, float max_norm) {
  after_previous_grid();
  __shared__ double part[kFinishThreads];
  double s = 0;
#pragma unroll 8  // loads in flight, sums in order
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double nrm = sqrt(part[0]);
    norm[0] = float(nrm);
    // As the CPU reference: scale only when the norm exceeds the clip.
    norm[1] = (max_norm > 0 && nrm > double(max_norm)) ? float(double(max_norm) / nrm) : 1.f;
  }
}

// One parameter's AdamW step, the CPU reference's form: p −= lr·(m̂/(sqrt(v̂)+eps) + wd·p),
// m̂ = m·(1/bc1); returns the new weight. Every operation rounded on its own (no contraction
// into a fused multiply-add), so that each kernel that takes this step (the whole buffer, in
// fours, by rows) gives the same bits: nvcc could otherwise fuse a product into a sum
// differently in each, as the schedule falls.
struct AdamW {
  float scale, lr, b1, b2, eps, wd, bc1, bc2;  // scale: the clipping factor
  __device__ __forceinline__ float step(float& w, float& m, float& v, float g, bool decay) const {
    const float grad = __fmul_rn(g, scale);
    m = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(1.f - b1, grad));
    v = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(1.f - b2, grad), grad));
    const float mh = __fmul_rn(m, bc1), vh = __fmul_rn(v, bc2);
    const float dir =
        __fadd_rn(__fdiv_rn(mh, __fadd_rn(sqrtf(vh), eps)), __fmul_rn(decay ? wd : 0.f, w));
    w = __fsub_rn(w, __fmul_rn(lr, dir));
    return w;
  }
  // Parameter i, or the four from 4·i (every pointer 16-byte aligned, decay 4 and p_mm 8).
  __device__ __forceinline__ void one(float* p, bf16* p_mm, float* m, float* v, const float* g,
                                      const uint8_t* decay, int64_t i) const {
    float w = p[i], mi = m[i], vi = v[i];
    step(w, mi, vi, g[i], decay[i] != 0);
    m[i] = mi;
    v[i] = vi;
    p[i] = w;
    if (p_mm) p_mm[i] = __float2bfloat16(w);
  }
  __device__ __forceinline__ void four(float* p, bf16* p_mm, float* m, float* v, const float* g,
                                       const uint8_t* decay, int64_t i) const {
    float4 w = load4(p + 4 * i), mi = load4(m + 4 * i), vi = load4(v + 4 * i);
    const float4 gi = load4(g + 4 * i);
    const uint32_t d = *reinterpret_cast<const uint32_t*>(decay + 4 * i);  // 4 flags, in order
    step(w.x, mi.x, vi.x, gi.x, (d & 0xffu) != 0);
    step(w.y, mi.y, vi.y, gi.y, (d & 0xff00u) != 0);
    step(w.z, mi.z, vi.z, gi.z, (d & 0xff0000u) != 0);
    step(w.w, mi.w, vi.w, gi.w, (d & 0xff000000u) != 0);
    store4(m + 4 * i, mi);
    store4(v + 4 * i, vi);
    store4(p + 4 * i, w);
    if (p_mm) store4(p_mm + 4 * i, w);
  }
};

__global__ void adamw_kernel(float* p, bf16* p_mm, float* m, float* v, const float* g,
                             const uint8_t* decay, const float* norm, int64_t n, AdamW a) {
  after_previous_grid();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  a.scale = norm[1];
  a.one(p, p_mm, m, v, g, decay, i);
}

// Four parameters a thread (n4 groups): the same arithmetic in 16-byte accesses.
__global__ void adamw4_kernel(float* p, bf16* p_mm, float* m, float* v, const float* g,
                              const uint8_t* decay, const float* norm, int64_t n4, AdamW a) {
  after_previous_grid();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  a.scale = norm[1];
  a.four(p, p_mm, m, v, g, decay, i);
}

// Only the parameters of rows (row_len parameters each) whose flag equals `want`; with FOUR,
// four a thread (row_len a multiple of 4, so a group never straddles two rows).
template <bool FOUR>
__global__ void adamw_rows_kernel(float* p, bf16* p_mm, float* m, float* v, const float* g,
                                  const uint8_t* decay, const float* norm, int64_t n,
                                  int64_t row_len, const uint8_t* flag, uint8_t want, AdamW a) {
  after_previous_grid();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || flag[(FOUR ? 4 * i : i) / row_len] != want) return;
  a.scale = norm[1];
  if constexpr (FOUR)
    a.four(p, p_mm, m, v, g, decay, i);
  else
    a.one(p, p_mm, m, v, g, decay, i);
}

// ---- the expert-router coupling loss -------------------------------------------------------

// Block per router row i (blockDim a multiple of 32, ≤ 1024): each warp takes rows j in turn and
// finds its squared distance to row i (lanes over the columns, in double); the smallest over
// the warps is exact whatever the order. Then δ and rt.
__global__ void erc_noise_kernel(float* delta, float* rt, const float* router, const double* u,
                                 int64_t E, int64_t D) {
  after_previous_grid();
  const int64_t i = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const float* ri = router + i * D;
  double nearest = INFINITY, own = 0;
  for (int64_t j = warp; j < E; j += warps) {
    const float* rj = router + j * D;
    double s = 0;
    for (int64_t c = lane; c < D; c += 32) {
      const double d = double(ri[c]) - double(rj[c]);
      s += d * d;
    }
    s = warp_sum(s);
    if (j != i) nearest = fmin(nearest, s);
  }
  if (warp == 0) {
    for (int64_t c = lane; c < D; c += 32) own += double(ri[c]) * double(ri[c]);
    own = warp_sum(own);
  }
  __shared__ double part[32];
  __syncthreads();
  if (lane == 0) part[warp] = nearest;
  __syncthreads();
  __shared__ double eps_row;
  if (threadIdx.x == 0) {
    double n = INFINITY;
    for (int w = 0; w < warps; ++w) n = fmin(n, part[w]);
    const double norm = sqrt(own);
    eps_row = (E > 1 && norm > 0) ? sqrt(n) / (2.0 * norm) : 0.0;
  }
  __syncthreads();
  const double eps = eps_row;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const float dl = float(1.0 - eps + 2.0 * eps * u[i * D + c]);
    delta[i * D + c] = dl;
    rt[i * D + c] = ri[c] * dl;
  }
}

// A thread an element of wg (D, E·De): element (d, j·De + c) is element (d, c) of expert j's w13
// (D, 2·De).
__global__ void erc_gather_gate_kernel(float* wg, const float* w13, int64_t stride, int64_t E,
                                       int64_t D, int64_t De) {
  after_previous_grid();
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= D * E * De) return;
  const int64_t d = q / (E * De), r = q % (E * De), j = r / De, c = r % De;
  wg[q] = w13[j * stride + d * 2 * De + c];
}

// The way back: each gradient element is added to by one thread, so no order to fix.
__global__ void erc_scatter_gate_grad_kernel(float* dw13, const float* dwg, int64_t stride,
                                             int64_t E, int64_t D, int64_t De) {
  after_previous_grid();
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= D * E * De) return;
  const int64_t d = q / (E * De), r = q % (E * De), j = r / De, c = r % De;
  dw13[j * stride + d * 2 * De + c] += dwg[q];
}

// Warp per (i, j): the norm of one De-wide block of act's row i.
__global__ void erc_norms_kernel(float* m, const float* act, int64_t E, int64_t De) {
  after_previous_grid();
  const int64_t q = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (q >= E * E) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = q / E, j = q % E;
  const float* a = act + i * E * De + j * De;
  float s = 0.f;
  for (int64_t c = lane; c < De; c += 32) s += a[c] * a[c];
  s = warp_sum(s);
  if (lane == 0) m[q] = sqrtf(s);
}

// One block. Thread a owns row a of dm: the off-diagonal entries get w per active hinge they
// enter (at most two: against either end's diagonal), the diagonal w·α subtracted per active
// hinge of row a, in the CPU's order (j ascending, its [i,j] hinge before its [j,i] one). The
// loss: per-row sums in double, then the rows in order.
__global__ void erc_hinge_kernel(double* loss, float* dm, const float* m, int64_t E, double alpha,
                                 double coef, double grad_weight) {
  after_previous_grid();
  extern __shared__ double row_loss[];
  const double w = grad_weight * coef / double(E * E);
  const float wf = float(w), waf = float(w * alpha);
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
    const double diag = alpha * double(m[i * E + i]);
    double s = 0;
    float dd = 0.f;
    for (int64_t j = 0; j < E; ++j) {
      if (j == i) continue;
      const double a = double(m[i * E + j]) - diag, b = double(m[j * E + i]) - diag;
      if (a > 0) {
        s += a;
        dd -= waf;
      }
      if (b > 0) {
        s += b;
        dd -= waf;
      }
      const double dj = alpha * double(m[j * E + j]);  // entry [i,j] against row j's diagonal
      dm[i * E + j] = float(a > 0) * wf + float(double(m[i * E + j]) - dj > 0) * wf;
    }
    dm[i * E + i] = dd;
    row_loss[i] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int64_t i = 0; i < E; ++i) s += row_loss[i];
    *loss = coef * s / double(E * E);
  }
}

__global__ void erc_scale_kernel(float* act, const float* m, const float* dm, int64_t E,
                                 int64_t De) {
  after_previous_grid();
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= E * E * De) return;
  const int64_t ij = q / De;  // = i·E + j: act's row i, block j
  const float mv = m[ij];
  act[q] *= mv > 0.f ? dm[ij] / mv : 0.f;
}

__global__ void erc_router_grad_kernel(float* drouter, const float* drt, const float* delta,
                                       int64_t n) {
  after_previous_grid();
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q < n) drouter[q] += drt[q] * delta[q];
}

}  // namespace

void cast(void* out, DType mm, const float* in, int64_t n) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(in) && store4_aligned(out, mm))
    MOEPLAN_DISPATCH_MM(mm, launch_kernel(cast4_kernel<OutT>, {blocks_for(n / 4, 256), 256},
                                          static_cast<OutT*>(out), in, n / 4));
  else
    MOEPLAN_DISPATCH_MM(mm, launch_kernel(cast_kernel<OutT>, {blocks_for(n, 256), 256},
                                          static_cast<OutT*>(out), in, n));
  check_launch("cast");
}

void grouped_accumulate_bf16(float* const* dst, const uint16_t* src, int64_t per_group,
                             int64_t groups) {
  if (per_group == 0 || groups == 0) return;
  const unsigned bx = std::min(blocks_for(per_group, 256), 64u);
  launch_kernel(grouped_accumulate_kernel, {dim3(bx, unsigned(groups)), 256}, dst,
                reinterpret_cast<const bf16*>(src), per_group);
  check_launch("grouped_accumulate_bf16");
}

void embedding_forward(float* x, const float* emb, const int32_t* tokens, int64_t T, int64_t C) {
  launch_kernel(embedding_forward_kernel, {unsigned(T), 256}, x, emb, tokens, C);
  check_launch("embedding_forward");
}

void embedding_backward(float* demb, const float* dx, const int32_t* ids, const int32_t* seg_start,
                        const int32_t* positions, int64_t n_ids, int64_t C) {
  if (n_ids == 0) return;
  launch_kernel(embedding_backward_kernel, {unsigned(n_ids), 256}, demb, dx, ids, seg_start,
                positions, C);
  check_launch("embedding_backward");
}

namespace {
// launch(std::integral_constant<int, SLOTS>{}) with the fewest 128-column slots that hold C (4, 6
// or 8; C ≤ 128·kMaxRowSlots): registers for the slots a row uses, not for the widest.
template <class Launch>
void with_row_slots(int64_t C, Launch&& launch) {
  static_assert(kMaxRowSlots == 8);
  if (C <= 512)
    launch(std::integral_constant<int, 4>{});
  else if (C <= 768)
    launch(std::integral_constant<int, 6>{});
  else
    launch(std::integral_constant<int, 8>{});
}
}  // namespace

void rmsnorm_forward(void* out, DType mm, float* rstd, const float* x, const float* w, int64_t T,
                     int64_t C, float eps, float* copy) {
  const bool vec4 = C % 4 == 0 && aligned16(x, w) && store4_aligned(out, mm) &&
                    (copy == nullptr || aligned16(copy));
  MOEPLAN_DISPATCH_MM(mm, {
    auto* o = static_cast<OutT*>(out);
    if (vec4 && C <= 128 * kMaxRowSlots)
      with_row_slots(C, [&](auto slots) {
        launch_kernel(rmsnorm_forward_kernel<OutT, true, slots>, {blocks_for(T, 8), 256}, o, rstd,
                      x, w, T, C, eps, copy);
      });
    else if (vec4)
      launch_kernel(rmsnorm_forward_kernel<OutT, true>, {blocks_for(T, 8), 256}, o, rstd, x, w, T,
                    C, eps, copy);
    else
      launch_kernel(rmsnorm_forward_kernel<OutT, false>, {blocks_for(T, 8), 256}, o, rstd, x, w, T,
                    C, eps, copy);
  });
  check_launch("rmsnorm_forward");
}

int64_t rmsnorm_scratch_floats(int64_t T, int64_t C) {
  // Any T' ≤ T makes at most min(ceil(T'/32), 512) one-pass blocks.
  return std::max<int64_t>(kColChunks, std::min((T + kDwMinRows - 1) / kDwMinRows, kDwMaxChunks)) *
         C;
}
int64_t colsum_scratch_floats(int64_t C) {
  return kColChunks * C;
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t C, float* scratch, void* dx_mm,
                      DType mm, bool accumulate_dw) {
  if (T == 0) {  // no rows: dw's sum is empty
    if (!accumulate_dw) check_cuda(cudaMemsetAsync(dw, 0, size_t(C) * 4, nullptr), "memset dw");
    return;
  }
  const bool vec4 =
      C % 4 == 0 && aligned16(dx, dy, x, w) && (dx_mm == nullptr || store4_aligned(dx_mm, mm));
  if (vec4 && C <= 128 * kMaxRowSlots && aligned16(scratch)) {
    const int64_t rows = dw_rows(T), chunks = (T + rows - 1) / rows;
    MOEPLAN_DISPATCH_MM(mm, with_row_slots(C, [&](auto slots) {
                          launch_kernel(rmsnorm_backward_fused_kernel<OutT, slots>,
                                        {unsigned(chunks), 256, size_t(8 * C) * 4}, dx,
                                        static_cast<OutT*>(dx_mm), scratch, dy, x, w, rstd, T, C,
                                        rows);
                        }));
    check_launch("rmsnorm_backward_fused");
    colsum_finish(dw, scratch, C, 1.f, accumulate_dw, chunks);
    check_launch("colsum_finish");
    return;
  }
  MOEPLAN_DISPATCH_MM(mm, {
    auto* o = static_cast<OutT*>(dx_mm);
    if (vec4)
      launch_kernel(rmsnorm_backward_dx_kernel<true, OutT>, {blocks_for(T, 8), 256}, dx, o, dy, x,
                    w, rstd, T, C);
    else
      launch_kernel(rmsnorm_backward_dx_kernel<false, OutT>, {blocks_for(T, 8), 256}, dx, o, dy, x,
                    w, rstd, T, C);
  });
  check_launch("rmsnorm_backward_dx");
  launch_kernel(rmsnorm_dw_partial_kernel, {dim3(blocks_for(C, 128), kColChunks), 128}, scratch, dy,
                x, rstd, T, C);
  check_launch("rmsnorm_dw_partial");
  colsum_finish(dw, scratch, C, 1.f, accumulate_dw, kColChunks);
  check_launch("colsum_finish");
}

void qkv_prepare(void* out, DType mm, const float* qkv, const float* rope_cos_sin, int64_t B,
                 int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
  const int64_t W = (H + 2 * Hkv) * Dh, T = B * S;
  if (T == 0) return;
  MOEPLAN_DISPATCH_MM(mm, launch_kernel(qkv_prepare_kernel<OutT>, {unsigned(T), row_threads(W / 2)},
                                        static_cast<OutT*>(out), qkv, rope_cos_sin, S, int(H + Hkv),
                                        int(W), int(Dh), false));
  check_launch("qkv_prepare");
}

void qkv_prepare_backward(void* dqkv_mm, DType mm, const float* dqkv, const float* rope_cos_sin,
                          int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
  const int64_t W = (H + 2 * Hkv) * Dh, T = B * S;
  if (T == 0) return;
  MOEPLAN_DISPATCH_MM(mm, launch_kernel(qkv_prepare_kernel<OutT>, {unsigned(T), row_threads(W / 2)},
                                        static_cast<OutT*>(dqkv_mm), dqkv, rope_cos_sin, S,
                                        int(H + Hkv), int(W), int(Dh), true));
  check_launch("qkv_prepare_backward");
}

void attention_softmax_forward(void* P, DType mm, const float* scores, const float* alibi_slopes,
                               int64_t BH, int64_t H, int64_t S, float scale) {
  MOEPLAN_DISPATCH_MM(mm,
                      launch_kernel(attention_softmax_forward_kernel<OutT>, {unsigned(BH * S), 128},
                                    static_cast<OutT*>(P), scores, alibi_slopes, H, S, scale));
  check_launch("attention_softmax_forward");
}

void attention_softmax_backward(void* dS, DType mm, const float* dP, const void* P, int64_t BH,
                                int64_t S, float scale) {
  MOEPLAN_DISPATCH_MM(
      mm, launch_kernel(attention_softmax_backward_kernel<OutT>, {unsigned(BH * S), 128},
                        static_cast<OutT*>(dS), dP, static_cast<const OutT*>(P), S, scale));
  check_launch("attention_softmax_backward");
}

// The columns a thread takes in one access (the kernels' VEC): 16 bytes when F is a whole
// number of them and every row starts aligned (the buffers' bases are), else 2 when F is even;
// launch(std::integral_constant<int, VEC>{}) with that VEC, and rows of VEC-column accesses.
template <class OutT, class Launch>
void with_swiglu_vec(int64_t F, bool rows_aligned, Launch&& launch) {
  if (F % kPer16<OutT> == 0 && rows_aligned)
    launch(std::integral_constant<int, kPer16<OutT>>{});
  else if (F % 2 == 0)
    launch(std::integral_constant<int, 2>{});
  else
    launch(std::integral_constant<int, 1>{});
}
// The launch for rows of `accesses` accesses: a row's threads are the accesses rounded up to a
// power of two below 32 (two or more rows a warp), to whole warps above, at most 256; then as
// many rows a block as make up to 256 threads.
struct RowLaunch {
  dim3 grid, block;
};
RowLaunch row_launch(int64_t N, int64_t accesses) {
  unsigned x = 1;
  while (x < 32 && x < accesses) x *= 2;
  if (accesses > 32) x = row_threads(accesses);
  const unsigned y = 256 / x;
  return {dim3(unsigned((N + y - 1) / y)), dim3(x, y)};
}

void swiglu_forward(void* h, DType mm, const void* ab, int64_t N, int64_t F, void* stream) {
  if (N * F == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  MOEPLAN_DISPATCH_MM(mm, {
    auto* o = static_cast<OutT*>(h);
    const auto* in = static_cast<const OutT*>(ab);
    with_swiglu_vec<OutT>(F, aligned16(h, ab), [&](auto vec) {
      const RowLaunch l = row_launch(N, (F + vec - 1) / vec);
      launch_kernel(swiglu_forward_kernel<OutT, vec>, {l.grid, l.block, 0, st}, o, in, N, F);
    });
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(void* dab, DType mm, const void* dh, const void* ab, int64_t N, int64_t F,
                     void* stream) {
  if (N * F == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  MOEPLAN_DISPATCH_MM(mm, {
    auto* o = static_cast<OutT*>(dab);
    const auto* g = static_cast<const OutT*>(dh);
    const auto* in = static_cast<const OutT*>(ab);
    with_swiglu_vec<OutT>(F, aligned16(dab, dh, ab), [&](auto vec) {
      const RowLaunch l = row_launch(N, (F + vec - 1) / vec);
      launch_kernel(swiglu_backward_kernel<OutT, vec>, {l.grid, l.block, 0, st}, o, g, in, N, F);
    });
  });
  check_launch("swiglu_backward");
}

void router_topk(float* probs, float* lse, int32_t* topk_idx, float* topk_gate, const float* logits,
                 int64_t T, int64_t E, int64_t K, bool renormalize) {
  if (T == 0) return;
  if (E <= 32 * kRouterSlots)
    launch_kernel(router_topk_warp_kernel, {blocks_for(T, 8), 256}, probs, lse, topk_idx, topk_gate,
                  logits, T, int(E), K, renormalize);
  else
    launch_kernel(router_topk_kernel, {blocks_for(T, 32), 32}, probs, lse, topk_idx, topk_gate,
                  logits, T, E, K, renormalize);
  check_launch("router_topk");
}

int64_t sort_scratch_ints(int64_t T, int64_t K, int64_t E) {
  return (T * K + kSortChunk - 1) / kSortChunk * E;
}

void sort_by_expert(int32_t* counts, int32_t* offsets, int32_t* sorted, int32_t* slot_of,
                    const int32_t* topk_idx, int32_t* scratch, int64_t T, int64_t K, int64_t E,
                    int32_t* assigned, int64_t capacity) {
  const int64_t N = T * K;
  if (N >= int64_t(INT32_MAX) / 2)
    throw std::invalid_argument("sort_by_expert: at most 2^30 assignments");
  if (E < 1 || E > kSortMaxExperts)
    throw std::invalid_argument(
        "sort_by_expert: 1 to 12288 experts (a placement block's counters fill 48 KiB)");
  if (capacity > 0 && !assigned)
    throw std::invalid_argument("sort_by_expert: a capacity needs the assigned counts' buffer");
  int32_t* raw = capacity > 0 ? assigned : counts;
  const int32_t cap = capacity > 0 ? int32_t(std::min(capacity, N)) : int32_t(N);
  if (N == 0) {  // no chunk: every count 0, every offset 0
    launch_kernel(exclusive_zero_kernel, {1, 256}, raw, counts, offsets, E);
    check_launch("sort_by_expert (empty)");
    return;
  }
  const int64_t chunks = (N + kSortChunk - 1) / kSortChunk;
  const size_t smem = size_t(E) * sizeof(int);
  launch_kernel(chunk_count_kernel, {unsigned(chunks), kSortChunk, smem}, scratch, topk_idx, N, E);
  check_launch("chunk_count");
  launch_kernel(chunk_scan_kernel, {1, 1024}, scratch, raw, counts, offsets, chunks, E, cap);
  check_launch("chunk_scan");
  launch_kernel(chunk_place_kernel, {unsigned(chunks), kSortChunk, smem}, sorted, slot_of, offsets,
                scratch, topk_idx, N, E, cap);
  check_launch("chunk_place");
}

void gather_rows(void* out, const void* in, DType mm, const int32_t* sorted, int64_t N, int64_t K,
                 int64_t C) {
  if (N == 0) return;
  const int64_t bytes = C * (mm == DType::f32 ? 4 : 2);
  const bool vec = bytes % 16 == 0 && aligned16(out, in);
  MOEPLAN_DISPATCH_MM(mm, {
    auto* o = static_cast<OutT*>(out);
    const auto* src = static_cast<const OutT*>(in);
    if (vec)
      launch_kernel(gather_rows_kernel<OutT, true>, {unsigned(N), row_threads(bytes / 16)}, o, src,
                    sorted, K, C);
    else
      launch_kernel(gather_rows_kernel<OutT, false>, {unsigned(N), 128}, o, src, sorted, K, C);
  });
  check_launch("gather_rows");
}

void expert_pad_maps(int32_t* pad, int32_t* unpad, const int32_t* counts, const int32_t* offsets,
                     int64_t E, int64_t cap) {
  if (E * cap == 0) return;
  launch_kernel(expert_pad_maps_kernel, {blocks_for(E * cap, 256), 256}, pad, unpad, counts,
                offsets, E, cap);
  check_launch("expert_pad_maps");
}

void copy_rows(void* dst, const void* src, DType t, const int32_t* map, int64_t rows, int64_t C) {
  if (rows == 0) return;
  MOEPLAN_DISPATCH_MM(
      t, launch_kernel(copy_rows_kernel<OutT>, {unsigned(rows), 128}, static_cast<OutT*>(dst),
                       static_cast<const OutT*>(src), map, C));
  check_launch("copy_rows");
}

namespace {

// The columns a thread of the MoE row kernels takes in one access: 8 when C is a multiple of 8
// and every row 16-byte aligned (one 16-byte access of a bf16 row, two of an fp32 one), 4 when C
// is a multiple of 4 and `aligned4` (fp32 rows 16-byte aligned, bf16 rows 8-byte), else 1;
// launch(std::integral_constant<int, VEC>{}).
template <class Launch>
void with_row_vec(int64_t C, bool aligned8, bool aligned4, Launch&& launch) {
  if (C % 8 == 0 && aligned8)
    launch(std::integral_constant<int, 8>{});
  else if (C % 4 == 0 && aligned4)
    launch(std::integral_constant<int, 4>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// y += Σ gate·ys (gate non-null) or Σ ys over each token's routed rows.
void combine_rows(float* y, const void* ys, DType mm, const float* gate, const int32_t* slot_of,
                  int64_t T, int64_t K, int64_t C) {
  MOEPLAN_DISPATCH_MM(mm, {
    const OutT* rows = static_cast<const OutT*>(ys);
    with_row_vec(C, aligned16(y, ys), aligned16(y) && store4_aligned(ys, mm), [&](auto vec) {
      const RowLaunch l = row_launch(T, (C + vec - 1) / vec);
      if (gate)
        launch_kernel(moe_combine_rows_kernel<vec, true, OutT>, {l.grid, l.block}, y, rows, gate,
                      slot_of, T, K, C);
      else
        launch_kernel(moe_combine_rows_kernel<vec, false, OutT>, {l.grid, l.block}, y, rows,
                      nullptr, slot_of, T, K, C);
    });
  });
}

}  // namespace

void moe_combine_forward(float* y, const void* ys, DType mm, const float* gate,
                         const int32_t* slot_of, int64_t T, int64_t K, int64_t C) {
  if (T == 0) return;
  if (gate == nullptr) throw std::invalid_argument("moe_combine_forward: gate is null");
  combine_rows(y, ys, mm, gate, slot_of, T, K, C);
  check_launch("moe_combine_forward");
}

void moe_combine_backward(void* dys, DType mm, float* dgate, const float* dy, const void* ys,
                          const float* gate, const int32_t* slot_of, int64_t T, int64_t K,
                          int64_t C) {
  if (T * K == 0) return;
  MOEPLAN_DISPATCH_MM(mm, {
    auto* out = static_cast<OutT*>(dys);
    const auto* rows = static_cast<const OutT*>(ys);
    with_row_vec(C, aligned16(dy, ys, dys),
                 aligned16(dy) && store4_aligned(ys, mm) && store4_aligned(dys, mm), [&](auto vec) {
                   launch_kernel(moe_combine_backward_kernel<vec, OutT>,
                                 {blocks_for(T * K, 8), 256}, out, dgate, dy, rows, gate, slot_of,
                                 T * K, K, C);
                 });
  });
  check_launch("moe_combine_backward");
}

void moe_scatter_add(float* dx, const void* dxs, DType mm, const int32_t* slot_of, int64_t T,
                     int64_t K, int64_t C) {
  if (T == 0) return;
  combine_rows(dx, dxs, mm, nullptr, slot_of, T, K, C);
  check_launch("moe_scatter_add");
}

void router_aux_forward(float* aux, float* p_mean, const float* probs, const float* lse,
                        const int32_t* counts, int64_t T, int64_t E, int64_t K, float load_balance,
                        float z_loss, float* scratch) {
  launch_kernel(colsum_partial_kernel, {dim3(blocks_for(E, 128), kColChunks), 128}, scratch, probs,
                T, E);
  check_launch("colsum_partial");
  colsum_finish(p_mean, scratch, E, 1.f / float(T), false, kColChunks);
  check_launch("colsum_finish");
  if (T % 4 == 0 && aligned16(lse))
    launch_kernel(router_aux_finish_kernel<true>, {1, kAuxThreads}, aux, p_mean, lse, counts, T, E,
                  K, load_balance, z_loss);
  else
    launch_kernel(router_aux_finish_kernel<false>, {1, kAuxThreads}, aux, p_mean, lse, counts, T, E,
                  K, load_balance, z_loss);
  check_launch("router_aux_finish");
}

void router_backward(void* dlogits, DType mm, const float* probs, const float* lse,
                     const int32_t* topk_idx, const float* topk_gate, const float* dgate,
                     const int32_t* counts, int64_t T, int64_t E, int64_t K, bool renormalize,
                     float load_balance, float z_loss) {
  if (T == 0) return;
  if (E <= 32 * kRouterSlots)
    MOEPLAN_DISPATCH_MM(
        mm, launch_kernel(router_backward_warp_kernel<OutT>, {blocks_for(T, 8), 256},
                          static_cast<OutT*>(dlogits), probs, lse, topk_idx, topk_gate, dgate,
                          counts, T, int(E), K, renormalize, load_balance, z_loss));
  else
    MOEPLAN_DISPATCH_MM(
        mm, launch_kernel(router_backward_kernel<OutT>, {blocks_for(T, 32), 32},
                          static_cast<OutT*>(dlogits), probs, lse, topk_idx, topk_gate, dgate,
                          counts, T, E, K, renormalize, load_balance, z_loss));
  check_launch("router_backward");
}

namespace {

// The largest dynamic shared memory a block of this device may opt in to.
int max_shared_optin() {
  int device = 0, bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute (shared memory opt-in)");
  return bytes;
}

template <class OutT>
void launch_cross_entropy(float* losses, OutT* dlogits, const OutT* logits, const int32_t* targets,
                          int64_t T, int64_t V, float grad_scale) {
  // The kernel's static shared memory (block_merge_max_sum's pm and ps, 256 B by ptxas) counts
  // against the same opt-in: a row may take what is left. 1 KB is kept back, not 256 B, so that
  // what a compiler adds cannot turn the opt-in call into an error; a row just under the limit
  // takes the unstaged kernel instead, which is slower and as exact.
  constexpr int64_t kStaticReserve = 1024;
  static const int64_t optin = max_shared_optin() - kStaticReserve;
  const int64_t row_bytes = V * int64_t(sizeof(OutT));
  if (T == 0) return;
  if (row_bytes <= optin) {
    static int64_t allowed = 0;  // the opt-in already granted to this instance
    if (row_bytes > allowed) {
      check_cuda(cudaFuncSetAttribute(cross_entropy_kernel<OutT, true>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, int(row_bytes)),
                 "cudaFuncSetAttribute (cross-entropy row)");
      allowed = row_bytes;
    }
    launch_kernel(cross_entropy_kernel<OutT, true>, {unsigned(T), 512, size_t(row_bytes)}, losses,
                  dlogits, logits, targets, V, grad_scale);
  } else {
    launch_kernel(cross_entropy_kernel<OutT, false>, {unsigned(T), 512}, losses, dlogits, logits,
                  targets, V, grad_scale);
  }
}

}  // namespace

void sum_partials(float* out, const float* partial, int64_t n, int64_t chunks, bool accumulate) {
  colsum_finish(out, partial, n, 1.f, accumulate, chunks);
}

void cross_entropy(float* losses, void* dlogits, DType mm, const void* logits,
                   const int32_t* targets, int64_t T, int64_t V, float grad_scale) {
  MOEPLAN_DISPATCH_MM(
      mm, launch_cross_entropy(losses, static_cast<OutT*>(dlogits),
                               static_cast<const OutT*>(logits), targets, T, V, grad_scale));
  check_launch("cross_entropy");
}

void sum_double(double* out, const float* x, int64_t n) {
  launch_kernel(sum_double_kernel, {1, 1024}, out, x, n);
  check_launch("sum_double");
}

namespace {
std::atomic<bool> g_programmatic_launch{false};
}  // namespace

void set_programmatic_launch(bool on) {
  g_programmatic_launch.store(on, std::memory_order_relaxed);
}

bool programmatic_launch() {
  return g_programmatic_launch.load(std::memory_order_relaxed);
}

std::string code_load_error() {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, cast_kernel<float>);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not a sticky error: cleared, so the caller's next check is its own
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

int64_t grad_norm_scratch_doubles() {
  return kNormBlocks;
}

void grad_norm_partial(double* scratch, const float* grads, int64_t n, void* stream) {
  launch_kernel(sumsq_partial_kernel,
                {kNormBlocks, kNormThreads, 0, static_cast<cudaStream_t>(stream)}, scratch, grads,
                n);
  check_launch("sumsq_partial");
}

void grad_norm_finish(float* norm, const double* scratch, int64_t parts, float max_norm) {
  launch_kernel(norm_finish_kernel, {1, kFinishThreads}, norm, scratch, parts * kNormBlocks,
                max_norm);
  check_launch("norm_finish");
}

void adamw(float* params, uint16_t* params_mm, float* m, float* v, const float* grads,
           const uint8_t* decay, const float* norm, int64_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, float bias_correction1, float bias_correction2,
           void* stream) {
  if (n == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  const AdamW a{0.f, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2};
  bf16* mm = reinterpret_cast<bf16*>(params_mm);
  int64_t done = 0;  // the first 4·n4 in fours when the layout allows, the rest one by one
  if (aligned16(params, m, v, grads) && reinterpret_cast<uintptr_t>(decay) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(params_mm) % 8 == 0) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      launch_kernel(adamw4_kernel, {blocks_for(n4, 256), 256, 0, st}, params, mm, m, v, grads,
                    decay, norm, n4, a);
      check_launch("adamw");
    }
    done = 4 * n4;
  }
  if (done < n) {
    launch_kernel(adamw_kernel, {blocks_for(n - done, 256), 256, 0, st}, params + done,
                  mm ? mm + done : nullptr, m + done, v + done, grads + done, decay + done, norm,
                  n - done, a);
    check_launch("adamw");
  }
}

void adamw_rows(float* params, uint16_t* params_mm, float* m, float* v, const float* grads,
                const uint8_t* decay, const float* norm, int64_t n, int64_t row_len,
                const uint8_t* flag, uint8_t want, float lr, float beta1, float beta2, float eps,
                float weight_decay, float bias_correction1, float bias_correction2, void* stream) {
  if (n == 0) return;
  if (row_len <= 0) throw std::invalid_argument("adamw_rows: rows of at least one parameter");
  const auto st = static_cast<cudaStream_t>(stream);
  const AdamW a{0.f, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2};
  bf16* mm = reinterpret_cast<bf16*>(params_mm);
  if (n % 4 == 0 && row_len % 4 == 0 && aligned16(params, m, v, grads) &&
      reinterpret_cast<uintptr_t>(decay) % 4 == 0 &&
      reinterpret_cast<uintptr_t>(params_mm) % 8 == 0)
    launch_kernel(adamw_rows_kernel<true>, {blocks_for(n / 4, 256), 256, 0, st}, params, mm, m, v,
                  grads, decay, norm, n / 4, row_len, flag, want, a);
  else
    launch_kernel(adamw_rows_kernel<false>, {blocks_for(n, 256), 256, 0, st}, params, mm, m, v,
                  grads, decay, norm, n, row_len, flag, want, a);
  check_launch("adamw_rows");
}

void erc_noise(float* delta, float* rt, const float* router, const double* u, int64_t E,
               int64_t D) {
  if (E == 0) return;
  launch_kernel(erc_noise_kernel, {unsigned(E), 256}, delta, rt, router, u, E, D);
  check_launch("erc_noise");
}

void erc_gather_gate(float* wg, const float* w13, int64_t stride, int64_t E, int64_t D,
                     int64_t De) {
  if (D * E * De == 0) return;
  launch_kernel(erc_gather_gate_kernel, {blocks_for(D * E * De, 256), 256}, wg, w13, stride, E, D,
                De);
  check_launch("erc_gather_gate");
}

void erc_scatter_gate_grad(float* dw13, const float* dwg, int64_t stride, int64_t E, int64_t D,
                           int64_t De) {
  if (D * E * De == 0) return;
  launch_kernel(erc_scatter_gate_grad_kernel, {blocks_for(D * E * De, 256), 256}, dw13, dwg, stride,
                E, D, De);
  check_launch("erc_scatter_gate_grad");
}

void erc_norms(float* m, const float* act, int64_t E, int64_t De) {
  if (E == 0) return;
  launch_kernel(erc_norms_kernel, {blocks_for(E * E, 8), 256}, m, act, E, De);
  check_launch("erc_norms");
}

void erc_hinge(double* loss, float* dm, const float* m, int64_t E, double alpha, double coef,
               double grad_weight) {
  if (E > 6144)  // its row sums live in shared memory: 8 bytes an expert, at most 48 KB
    throw std::invalid_argument("erc_hinge: at most 6144 experts");
  launch_kernel(erc_hinge_kernel, {1, 256, size_t(std::max<int64_t>(E, 1)) * sizeof(double)}, loss,
                dm, m, E, alpha, coef, grad_weight);
  check_launch("erc_hinge");
}

void erc_scale(float* act, const float* m, const float* dm, int64_t E, int64_t De) {
  if (E * De == 0) return;
  launch_kernel(erc_scale_kernel, {blocks_for(E * E * De, 256), 256}, act, m, dm, E, De);
  check_launch("erc_scale");
}

void erc_router_grad(float* drouter, const float* drt, const float* delta, int64_t n) {
  if (n == 0) return;
  launch_kernel(erc_router_grad_kernel, {blocks_for(n, 256), 256}, drouter, drt, delta, n);
  check_launch("erc_router_grad");
}

}  // namespace moeplan::backend::cuda::kernels
