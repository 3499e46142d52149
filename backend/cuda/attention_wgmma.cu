// The attention forward and the backward's dK/dV on Hopper's warpgroup MMA (wgmma.mma_async;
// sm_90a only: this file is compiled for that target alone, see CMakeLists.txt), head width 64.
// The forward (forward_wgmma_kernel) follows the dK/dV kernel, which does the same work as
// attention.cu's dkdv_mma_kernel: a block (one warpgroup, 128 threads) per (sequence, kv head,
// 64-key tile), walking the query tiles on and below the diagonal of every query head of the
// group in a fixed order; per query tile
//   S^T = K·Q^T and dP^T = V·dO^T   (64 keys × 64 queries, depth 64: four m64n64k16 each),
//   P^T and dS^T = scale·P^T∘(dP^T − delta) in registers (the mask and ALiBi as the mma.sync
//     kernels compute them), written to shared memory in bf16 (the operands of the next two
//     products) and dS^T on to the scratch the dQ kernel reads,
//   dV += P^T·dO and dK += dS^T·Q   (64 keys × 64, depth the 64 queries).
// The mma.sync kernel issues these products from registers a warp at a time and stalls on their
// latency (dK/dV 180 µs a layer of the dense benchmark model at batch 8 on an H200, about 27 % of
// compute, Nsight Compute 2026-12-04); here each is one asynchronous warpgroup product.
//
// Shared memory (65 KiB: three blocks an SM): K, V, two buffers of Q and dO (the next query
// tile's copies land while this one is used), P^T and dS^T, all 64 × 64 bf16 tiles in the
// no-swizzle core-matrix layout of wgmma.cuh: 16-byte chunk c of a tile holds row
// 8·(c / 64) + c % 8, columns 8·((c / 8) % 8) .. + 8. Read K-major (rows the product's M or N,
// columns its depth) that is LBO 128 bytes and SBO 1024; Q and dO are also the B operands of
// dK and dV, whose depth is the tile's rows: the same tile read MN-major, LBO 1024 and SBO 128
// (PTX ISA, canonical layouts; the reading expert_wgmma.cu uses and the GPU kernel test checks).
//
// The depth sums run in the hardware's order, so the results are held to the CPU by tolerance,
// not to the mma.sync kernel's bits; every block owns its output rows and walks the query tiles
// in one order, so a run repeats bit for bit.
#include "attention_wgmma.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "async_copy.cuh"
#include "check.hpp"
#include "launch.cuh"
#include "moeplan/backend/cuda/attention.hpp"
#include "online_softmax.cuh"
#include "pair_store.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(MOEPLAN_CUDA_EMULATION) && \
    !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_wgmma.cu uses wgmma: compile it for sm_90a only"
#endif

namespace moeplan::backend::cuda::attention {
namespace {

using bf16 = __nv_bfloat16;

constexpr int D = 64, BT = 64, kThreads = 128;  // head width, tile rows (keys, queries)
constexpr int kTile = BT * D;                   // elements of a tile
constexpr int kChunks = kTile / 8;              // its 16-byte chunks
constexpr int kPerThread = kChunks / kThreads;  // 4
constexpr float kLog2e = 1.4426950408889634f;

struct Smem {
  alignas(128) uint16_t k[kTile];
  alignas(128) uint16_t v[kTile];
  alignas(128) uint16_t q[2][kTile];
  alignas(128) uint16_t dO[2][kTile];
  alignas(128) uint16_t p[kTile];   // P^T (keys × queries)
  alignas(128) uint16_t ds[kTile];  // dS^T
  float lse[2][BT], delta[2][BT];
};
static_assert(sizeof(Smem) <= 227 * 1024 / 3, "three blocks an SM");

// Chunk c of a tile: its row and first column.
__device__ __forceinline__ int chunk_row(int c) {
  return (c / 64) * 8 + c % 8;
}
__device__ __forceinline__ int chunk_col(int c) {
  return ((c / 8) % 8) * 8;
}
// The element offset of (row r, column col) in a tile.
__device__ __forceinline__ int tile_at(int r, int col) {
  return 8 * ((r / 8) * 64 + (col / 8) * 8 + r % 8) + col % 8;
}

// The descriptors' byte steps: a tile read K-major and read MN-major.
struct Strides {
  uint32_t k_lbo, k_sbo, mn_lbo, mn_sbo;
};

// Rows row0.. of a bf16 matrix (row stride ld elements) into a tile by cp.async (uncommitted);
// rows past `valid` are zero-filled by the copy.
__device__ __forceinline__ void stage_tile(uint16_t* tile, const bf16* src, int row0, int valid,
                                           int64_t ld) {
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = int(threadIdx.x) + i * kThreads, r = chunk_row(c);
    const bool ok = r < valid;
    cp_async_16(tile + 8 * c, ok ? src + int64_t(row0 + r) * ld + chunk_col(c) : src, ok ? 16 : 0);
  }
}

// acc = A · B^T, A and B tiles read K-major (64 rows each, depth 64): S^T = K·Q^T, dP^T = V·dO^T.
__device__ __forceinline__ void tile_times_tile_t(float (&acc)[32], const uint16_t* a,
                                                  const uint16_t* b, const Strides& st) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // depth 16·kk: core-matrix columns 2kk, 2kk + 1
    const uint64_t da = smem_desc(a + 128 * kk, st.k_lbo, st.k_sbo);
    const uint64_t db = smem_desc(b + 128 * kk, st.k_lbo, st.k_sbo);
    wgmma_m64n64k16<0, 0>(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// acc += A · B, A a tile read K-major (64 rows, depth its 64 columns), B a tile read MN-major
// (depth its 64 rows, its 64 columns the product's): dV += P^T·dO, dK += dS^T·Q.
__device__ __forceinline__ void tile_times_tile(float (&acc)[32], const uint16_t* a,
                                                const uint16_t* b, const Strides& st) {
#pragma unroll
  for (int kk = 0; kk < BT / 16; ++kk) {  // depth rows 16·kk: row groups 2kk, 2kk + 1 of B
    const uint64_t da = smem_desc(a + 128 * kk, st.k_lbo, st.k_sbo);
    const uint64_t db = smem_desc(b + 1024 * kk, st.mn_lbo, st.mn_sbo);
    wgmma_m64n64k16<0, 1>(acc, da, db, 1);
  }
}

// Rows row0 + r (r < valid) of dqkv (row stride W) at column col: the warpgroup's 64 × 64 result,
// thread (warp w, lane 4g + t) holding row 16w + g + 8·((i/2)%2), column 8·(i/4) + 2t + i%2.
template <class OutT>
__device__ __forceinline__ void store_result(OutT* dqkv, const float (&acc)[32], int64_t row0,
                                             int valid, int64_t W, int64_t col) {
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * w + g + 8 * h;
    if (r >= valid) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      put2(dqkv + (row0 + r) * W + col + 8 * j + 2 * t, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1],
           false);
  }
}

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <class OutT>
__global__ void __launch_bounds__(kThreads, 3)
    dkdv_wgmma_kernel(OutT* dqkv, bf16* ds_out, const bf16* dO, const float* lse,
                      const float* delta, const bf16* qkv, const float* slopes, int S, int H,
                      int Hkv, float scale, Strides st) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  Smem& sm = *reinterpret_cast<Smem*>(raw);
  const int kb = blockIdx.y, b = blockIdx.x / Hkv, kvh = blockIdx.x % Hkv, group = H / Hkv;
  const int64_t W = int64_t(H + 2 * Hkv) * D, ldo = int64_t(H) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int k0 = kb * BT, kvalid = min(BT, S - k0), nq = (S + BT - 1) / BT;
  const float scale2 = scale * kLog2e;
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int j0 = k0 + 16 * w + g, j1 = j0 + 8;  // this thread's two keys
  // Steps: the query tiles kb..nq-1 of each query head of the group, in that order.
  const int per_head = nq - kb, steps = group * per_head;
  auto issue_q = [&](int it, int buf) {  // Q, dO, lse and delta of step it into buffer buf
    const int h = kvh * group + it / per_head, q0 = (kb + it % per_head) * BT;
    const int qvalid = min(BT, S - q0);
    const int64_t bh = int64_t(b) * H + h;
    stage_tile(sm.q[buf], base + int64_t(h) * D, q0, qvalid, W);
    stage_tile(sm.dO[buf], dO + int64_t(b) * S * ldo + int64_t(h) * D, q0, qvalid, ldo);
    if (threadIdx.x < BT) {
      // Base 2, with the query's part of the ALiBi bias, slope·(i − iref), iref the first query
      // of i's group of 16 (as the mma.sync kernels stage it).
      const int i = q0 + int(threadIdx.x);
      const float slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
      sm.lse[buf][threadIdx.x] =
          i < S ? kLog2e * lse[bh * S + i] + slope2 * float(threadIdx.x % 16) : 0.f;
      sm.delta[buf][threadIdx.x] = i < S ? delta[bh * S + i] : 0.f;
    }
    cp_async_commit();
  };
  stage_tile(sm.k, base + int64_t(H + kvh) * D, k0, kvalid, W);
  stage_tile(sm.v, base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
  issue_q(0, 0);  // one group: K, V and the first query tile
  float dk[32], dv[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = dv[i] = 0.f;
  for (int it = 0, buf = 0; it < steps; ++it, buf ^= 1) {
    const int h = kvh * group + it / per_head, q0 = (kb + it % per_head) * BT;
    const float slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
    // The next query tile flies while this one is used; this one (and K, V) landed, and is
    // visible to wgmma's reads.
    begin_wgmma_step(it + 1 < steps, [&] { issue_q(it + 1, buf ^ 1); });
    // Four groups of products, each issued as soon as its operands are in place: S^T and dP^T;
    // P^T from S^T while dP^T runs, then dV += P^T·dO while dS^T is made from P^T and dP^T, then
    // dK += dS^T·Q while dS^T is copied out.
    float s[32], dp[32];
    wgmma_fence();
    tile_times_tile_t(s, sm.k, sm.q[buf], st);
    wgmma_commit();
    tile_times_tile_t(dp, sm.v, sm.dO[buf], st);
    wgmma_commit();
    wgmma_wait<1>();  // S^T
    fence_accumulators(s);
    // P. The bias −slope·(i − j) as a key part, slope·(j − iref), and the query part already in
    // the staged log-sum-exp, rounded as the mma.sync kernels round it (one product, then one
    // fma). P^T goes to shared memory in bf16 as it is made (a warp's 32 words of one j and row
    // half land in 128 contiguous bytes: no bank conflict); s keeps it in fp32 for dS.
    const bool diag = q0 == k0 || q0 + BT > S;
    const float* lse_s = sm.lse[buf];
    const float* delta_s = sm.delta[buf];
    auto* p32 = reinterpret_cast<uint32_t*>(sm.p);
    auto* ds32 = reinterpret_cast<uint32_t*>(sm.ds);
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int key = hh ? j1 : j0;
        const float r = __fmul_rn(slope2, float(key - q0 - 16 * (j / 2)));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i_acc = 4 * j + 2 * hh + e, qi = 8 * j + 2 * t + e, i = q0 + qi;
          const bool keep = !diag || (key <= i && i < S);
          s[i_acc] = keep ? exp2f(__fmaf_rn(scale2, s[i_acc], r) - lse_s[qi]) : 0.f;
        }
        const int i_acc = 4 * j + 2 * hh;
        p32[tile_at(16 * w + g + 8 * hh, 8 * j + 2 * t) / 2] = pack2(s[i_acc], s[i_acc + 1]);
      }
    fence_proxy_async();
    __syncthreads();  // the whole P^T in place
    wgmma_fence();
    tile_times_tile(dv, sm.p, sm.dO[buf], st);  // dV += P^T · dO
    wgmma_commit();
    wgmma_wait<1>();  // dP^T (dV's products may still run)
    fence_accumulators(dp);
    // dS = scale·P∘(dP − delta): 0 wherever P is (the mask included).
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float d[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i_acc = 4 * j + 2 * hh + e, qi = 8 * j + 2 * t + e;
          d[e] = scale * s[i_acc] * (dp[i_acc] - delta_s[qi]);
        }
        ds32[tile_at(16 * w + g + 8 * hh, 8 * j + 2 * t) / 2] = pack2(d[0], d[1]);
      }
    fence_proxy_async();
    __syncthreads();  // the whole dS^T in place, for wgmma and for the copy out
    wgmma_fence();
    tile_times_tile(dk, sm.ds, sm.q[buf], st);  // dK += dS^T · Q
    wgmma_commit();
    // dS^T tile (q0/64, kb) of head row bh to the scratch, row-major [key][query], 16 bytes a
    // copy, while the products run (they only read sm.ds).
    bf16* dst =
        ds_out +
        ((int64_t(b) * H + h) * nq * (nq + 1) / 2 + (q0 / BT) * (q0 / BT + 1) / 2 + kb) * (BT * BT);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = int(threadIdx.x) + i * kThreads;
      *reinterpret_cast<uint4*>(dst + chunk_row(c) * BT + chunk_col(c)) =
          *reinterpret_cast<const uint4*>(sm.ds + 8 * c);
    }
    wgmma_wait<0>();
    fence_accumulators(dv);
    fence_accumulators(dk);
    __syncthreads();  // every thread's products done: P^T, dS^T and this buffer may be refilled
  }
  const int64_t row0 = int64_t(b) * S + k0;
  store_result(dqkv, dk, row0, kvalid, W, int64_t(H + kvh) * D);
  store_result(dqkv, dv, row0, kvalid, W, int64_t(H + Hkv + kvh) * D);
}

// ---- forward ------------------------------------------------------------------------------
// forward_mma_kernel's work and arithmetic on wgmma: a warpgroup per (sequence, head, 64-query
// tile), the key tiles up to the diagonal in order; per key tile S = Q·K^T (four m64n64k16, Q and
// K read K-major), the online softmax in registers exactly as forward_mma_kernel (R 1) computes
// it (warp w owns query rows 16w.., its thread (g, t) the columns 8j + 2t, +1 of rows g and g + 8:
// the mma.sync layout), P written to shared memory in bf16, then O += P·V (four m64n64k16, V
// read MN-major). 48 KiB of shared memory (Q, two buffers of K and V, P): four blocks an SM.

struct FwdSmem {
  alignas(128) uint16_t q[kTile];
  alignas(128) uint16_t k[2][kTile];
  alignas(128) uint16_t v[2][kTile];
  alignas(128) uint16_t p[kTile];
};
static_assert(sizeof(FwdSmem) <= 227 * 1024 / 4, "four blocks an SM");

constexpr float kLn2 = 0.6931471805599453f;

__global__ void __launch_bounds__(kThreads, 4)
    forward_wgmma_kernel(bf16* O, float* lse, const bf16* qkv, const float* slopes, int S, int H,
                         int Hkv, float scale, Strides st) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  FwdSmem& sm = *reinterpret_cast<FwdSmem*>(raw);
  // The heavy tiles (the most key tiles) first: tile n − 1 − y.
  const int qb = int(gridDim.y) - 1 - int(blockIdx.y), bh = blockIdx.x, b = bh / H, h = bh % H,
            kvh = h / (H / Hkv);
  const int64_t W = int64_t(H + 2 * Hkv) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int q0 = qb * BT, qvalid = min(BT, S - q0);
  const float scale2 = scale * kLog2e, slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
  const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  auto issue_kv = [&](int kb, int buf) {  // K/V tile kb into buffer buf, one cp.async group
    const int k0 = kb * BT, kvalid = min(BT, S - k0);
    stage_tile(sm.k[buf], base + int64_t(H + kvh) * D, k0, kvalid, W);
    stage_tile(sm.v[buf], base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
    cp_async_commit();
  };
  stage_tile(sm.q, base + int64_t(h) * D, q0, qvalid, W);
  issue_kv(0, 0);  // one group: Q and the first K/V tile
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  // Rows i0, i1: running max (base-2 units) and this thread's part of the sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int qref = (q0 + 16 * w) / 32 * 32;  // the first row of this warp's 32-row group
  const int i0 = q0 + 16 * w + g, i1 = i0 + 8;
  auto* p32 = reinterpret_cast<uint32_t*>(sm.p);
  for (int kb = 0, buf = 0; kb <= qb; ++kb, buf ^= 1) {
    begin_wgmma_step(kb < qb, [&] { issue_kv(kb + 1, buf ^ 1); });
    float sc[32];
    wgmma_fence();
    tile_times_tile_t(sc, sm.q, sm.k[buf], st);
    wgmma_commit();
    wgmma_wait<0>();  // (also the previous tile's O products)
    fence_accumulators(sc);
    fence_accumulators(o);
    const int k0 = kb * BT;
    const bool diag = kb == qb;
    // Scaled scores and the ALiBi column part (forward_mma_kernel's comment), the mask on the
    // diagonal; the tile's row maxima.
    const float c0 = float(k0 + 2 * t - qref);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = c < 2 ? i0 : i1, key = k0 + 8 * j + 2 * t + (c & 1);
        float x = scale2 * sc[4 * j + c] + slope2 * (c0 + float(8 * j + (c & 1)));
        if (diag && !(key <= i && key < S)) x = -INFINITY;
        sc[4 * j + c] = x;
        if (c < 2)
          mx0 = fmaxf(mx0, x);
        else
          mx1 = fmaxf(mx1, x);
      }
    const float2 a = online_max_step(m, mx0, mx1);
    const float a0 = a.x, a1 = a.y, mn0 = m[0], mn1 = m[1];
    l[0] *= a0;
    l[1] *= a1;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= a0;
      o[4 * j + 1] *= a0;
      o[4 * j + 2] *= a1;
      o[4 * j + 3] *= a1;
    }
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float mr = hh ? mn1 : mn0;
        float p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = sc[4 * j + 2 * hh + e];
          p[e] = diag && x == -INFINITY ? 0.f : exp2f(x - mr);
          l[hh] += p[e];
        }
        p32[tile_at(16 * w + g + 8 * hh, 8 * j + 2 * t) / 2] = pack2(p[0], p[1]);
      }
    fence_proxy_async();
    __syncthreads();  // the whole P in place
    wgmma_fence();
    tile_times_tile(o, sm.p, sm.v[buf], st);  // O += P · V
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(o);
    __syncthreads();  // P and this buffer may be refilled
  }
  const int64_t ldo = int64_t(H) * D;
  float l0 = l[0], l1 = l[1];
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int col = h * D + 8 * j + 2 * t;
    if (i0 < S)
      *reinterpret_cast<__nv_bfloat162*>(O + (int64_t(b) * S + i0) * ldo + col) =
          __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
    if (i1 < S)
      *reinterpret_cast<__nv_bfloat162*>(O + (int64_t(b) * S + i1) * ldo + col) =
          __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
  }
  if (t == 0) {  // natural units, the row part of the bias back: ln 2 · (m − row + log2 l)
    const float bias0 = slope2 * float(i0 - qref), bias1 = slope2 * float(i1 - qref);
    if (i0 < S) lse[int64_t(bh) * S + i0] = kLn2 * (m[0] - bias0 + log2f(l0));
    if (i1 < S) lse[int64_t(bh) * S + i1] = kLn2 * (m[1] - bias1 + log2f(l1));
  }
}

// The descriptors' strides, exchanged where MOEPLAN_WGMMA_SWAP says (wgmma.cuh).
Strides layout_strides() {
  Strides st{128, 1024, 1024, 128};
  wgmma_strides(false, st.k_lbo, st.k_sbo);
  wgmma_strides(true, st.mn_lbo, st.mn_sbo);
  return st;
}

template <class OutT>
void launch(OutT* dqkv, uint16_t* ds, const uint16_t* dO, const float* lse, const float* delta,
            const uint16_t* qkv, const float* slopes, int64_t B, int64_t S, int64_t H, int64_t Hkv,
            float scale) {
  opt_in_shared_memory<dkdv_wgmma_kernel<OutT>, sizeof(Smem)>(
      "cudaFuncSetAttribute (attention dK/dV wgmma shared memory)");
  // x: sequence·kv head, y: key tile (the heaviest, the first key tiles, launch first).
  const dim3 grid(unsigned(B * Hkv), unsigned((S + BT - 1) / BT));
  launch_kernel(dkdv_wgmma_kernel<OutT>, {grid, kThreads, sizeof(Smem)}, dqkv,
                reinterpret_cast<bf16*>(ds), reinterpret_cast<const bf16*>(dO), lse, delta,
                reinterpret_cast<const bf16*>(qkv), slopes, int(S), int(H), int(Hkv), scale,
                layout_strides());
}

}  // namespace

std::size_t wgmma_shared_bytes(int64_t head_dim) {
  if (!dkdv_wgmma_supported(head_dim)) return 0;
  return sizeof(Smem) > sizeof(FwdSmem) ? sizeof(Smem) : sizeof(FwdSmem);
}

void forward_wgmma(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes,
                   int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
  if (!dkdv_wgmma_supported(Dh))
    throw std::logic_error("attention::forward_wgmma: head width " + std::to_string(Dh) +
                           " has no kernel (64 only)");
  if (B * S == 0) return;
  opt_in_shared_memory<forward_wgmma_kernel, sizeof(FwdSmem)>(
      "cudaFuncSetAttribute (attention forward wgmma shared memory)");
  // x: sequence·head, y: query tile (launched heaviest first).
  const dim3 grid(unsigned(B * H), unsigned((S + BT - 1) / BT));
  launch_kernel(forward_wgmma_kernel, {grid, kThreads, sizeof(FwdSmem)}, reinterpret_cast<bf16*>(O),
                lse, reinterpret_cast<const bf16*>(qkv), alibi_slopes, int(S), int(H), int(Hkv),
                1.f / sqrtf(float(Dh)), layout_strides());
  check_launch("attention::forward_wgmma");
}

void dkdv_wgmma(void* dqkv, bool dqkv_bf16, uint16_t* ds, const uint16_t* dO, const float* lse,
                const float* delta, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
                int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale) {
  if (!dkdv_wgmma_supported(Dh))
    throw std::logic_error("attention::dkdv_wgmma: head width " + std::to_string(Dh) +
                           " has no kernel (64 only)");
  if (B * S == 0) return;
  if (dqkv_bf16)
    launch(static_cast<bf16*>(dqkv), ds, dO, lse, delta, qkv, alibi_slopes, B, S, H, Hkv, scale);
  else
    launch(static_cast<float*>(dqkv), ds, dO, lse, delta, qkv, alibi_slopes, B, S, H, Hkv, scale);
  check_launch("attention::backward_wgmma");
}

}  // namespace moeplan::backend::cuda::attention
