// Fused causal attention (see attention.hpp). Four warps per block; warp w owns rows
// [16w, 16w+16) of a 64-row tile. Products run on tensor cores through WMMA fragments of 16×16×16
// bf16 with fp32 accumulation; the softmax bookkeeping is fp32 in shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "attention_wgmma.hpp"
#include "check.hpp"
#include "launch.cuh"
#include "mma.cuh"
#include "moeplan/backend/cuda/attention.hpp"
#include "online_softmax.cuh"
#include "warp.cuh"

namespace moeplan::backend::cuda::attention {
namespace {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int BM = 64, BN = 64, kThreads = 128;
// Shared-memory row strides, padded so that the 16 rows a fragment load or store touches fall in
// different banks (unpadded, rows 128 or 256 bytes apart all hit the same banks). WMMA wants
// multiples of 8 (bf16) or 4 (fp32) elements.
template <int D>
constexpr int LDT = D + 8;   // q, k, v, dO tiles (bf16)
constexpr int LDP = BN + 8;  // P and dS (bf16)
constexpr int LDS = BN + 4;  // scores and dP (fp32)
template <int D>
constexpr int LDO = D + 4;  // fp32 output tiles (O, staged dQ/dK/dV)

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst [64][LDT] (bf16, shared) = rows row0.. of a bf16 matrix with row stride ld; rows past `valid`
// are zero. 16-byte vector loads (D and ld multiples of 8).
template <int D>
__device__ void load_tile(bf16* dst, const bf16* src, int row0, int valid, int64_t ld) {
  constexpr int V = D / 8;
  for (int idx = threadIdx.x; idx < 64 * V; idx += kThreads) {
    const int r = idx / V, c = (idx % V) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + int64_t(row0 + r) * ld + c);
    *reinterpret_cast<uint4*>(dst + r * LDT<D> + c) = v;
  }
}

// load_tile by cp.async: in flight until the caller's commit and wait (rows past `valid` are
// zero-filled by the copy itself). Thread x copies the 16 bytes at column (x % V)·8 of rows
// x / V + k·kThreads / V; a whole tile (every tile but a sequence's last partial one) takes one
// address step a copy, without the row's bounds test.
template <int D>
__device__ void load_tile_async(bf16* dst, const bf16* src, int row0, int valid, int64_t ld) {
  constexpr int V = D / 8, kStride = kThreads / V;  // rows a pass of the block covers
  static_assert(kThreads % V == 0 && 64 % kStride == 0, "whole passes over the tile");
  const int r0 = threadIdx.x / V, c = (threadIdx.x % V) * 8;
  if (valid >= 64) {
    const bf16* s = src + int64_t(row0 + r0) * ld + c;
    bf16* d = dst + r0 * LDT<D> + c;
#pragma unroll
    for (int r = 0; r < 64; r += kStride) cp_async_16(d + r * LDT<D>, s + r * ld, 16);
    return;
  }
#pragma unroll
  for (int r = r0; r < 64; r += kStride) {
    const bf16* s = src + int64_t(row0 + (r < valid ? r : 0)) * ld + c;
    cp_async_16(dst + r * LDT<D> + c, s, r < valid ? 16 : 0);
  }
}

// acc[n] (16×16, n < BN/16) = A (this warp's 16 rows, row-major [16][D]) · B^T where B is [64][D]
// row-major: the 16×64 score block of a warp.
template <int D>
__device__ void rows_times_tile_t(FragC (&acc)[BN / 16], const bf16* a, const bf16* b) {
#pragma unroll
  for (int n = 0; n < BN / 16; ++n) wmma::fill_fragment(acc[n], 0.f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, LDT<D>);
#pragma unroll
    for (int n = 0; n < BN / 16; ++n) {
      FragBt fb;
      wmma::load_matrix_sync(fb, b + n * 16 * LDT<D> + kk * 16, LDT<D>);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

template <int D>
struct FwdSmem {
  bf16 q[BM * LDT<D>], k[BN * LDT<D>], v[BN * LDT<D>], p[BM * LDP];
  float s[BM * LDS], o[BM * LDO<D>];
  float m[BM], l[BM], alpha[BM];
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(bf16* O, float* lse, const bf16* qkv, const float* slopes, int S, int H, int Hkv,
                   float scale) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  FwdSmem<D>& sm = *reinterpret_cast<FwdSmem<D>*>(raw);
  const int qb = blockIdx.y, bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / Hkv);
  const int64_t W = int64_t(H + 2 * Hkv) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int q0 = qb * BM, qvalid = min(BM, S - q0);
  const float slope = slopes ? slopes[h] : 0.f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<D>(sm.q, base + h * D, q0, qvalid, W);
  for (int i = threadIdx.x; i < BM * LDO<D>; i += kThreads) sm.o[i] = 0.f;
  if (threadIdx.x < BM) {
    sm.m[threadIdx.x] = -INFINITY;
    sm.l[threadIdx.x] = 0.f;
  }
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * BN, kvalid = min(BN, S - k0);
    load_tile<D>(sm.k, base + int64_t(H + kvh) * D, k0, kvalid, W);
    load_tile<D>(sm.v, base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
    __syncthreads();
    {
      FragC acc[BN / 16];
      rows_times_tile_t<D>(acc, sm.q + warp * 16 * LDT<D>, sm.k);
#pragma unroll
      for (int n = 0; n < BN / 16; ++n)
        wmma::store_matrix_sync(sm.s + warp * 16 * LDS + n * 16, acc[n], LDS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax: two lanes per row (16 rows at once), each over 32 columns, visited in a
    // lane-staggered order so the pair's reads fall in different banks.
    {
      const int row = warp * 16 + lane / 2, i = q0 + row, half = (lane & 1) * 32;
      const float* srow = sm.s + row * LDS + half;
      float mx = -INFINITY;
      for (int t = 0; t < 32; ++t) {
        const int c = (t + lane) & 31, j = k0 + half + c;
        if (j <= i && i < S) mx = fmaxf(mx, scale * srow[c] - slope * float(i - j));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = sm.m[row], m_new = fmaxf(m_old, mx);
      const bool live = m_new != -INFINITY;
      float sum = 0.f;
      bf16* prow = sm.p + row * LDP + half;
      for (int t = 0; t < 32; ++t) {
        const int c = (t + lane) & 31, j = k0 + half + c;
        float p = 0.f;
        if (live && j <= i && i < S) p = expf(scale * srow[c] - slope * float(i - j) - m_new);
        sum += p;
        prow[c] = __float2bfloat16(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float alpha = live ? expf(m_old - m_new) : 1.f;
      __syncwarp();
      if ((lane & 1) == 0) {
        sm.m[row] = m_new;
        sm.l[row] = sm.l[row] * alpha + sum;
        sm.alpha[row] = alpha;
      }
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * D; idx += 32) {
      const int row = warp * 16 + idx / D;
      sm.o[row * LDO<D> + idx % D] *= sm.alpha[row];
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, sm.o + warp * 16 * LDO<D> + n * 16, LDO<D>, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, sm.p + warp * 16 * LDP + kk * 16, LDP);
        wmma::load_matrix_sync(fb, sm.v + kk * 16 * LDT<D> + n * 16, LDT<D>);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sm.o + warp * 16 * LDO<D> + n * 16, acc, LDO<D>, wmma::mem_row_major);
    }
    __syncthreads();  // K/V are replaced next
  }
  const int64_t ldo = int64_t(H) * D;
  for (int idx = threadIdx.x; idx < BM * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    if (r < qvalid)
      O[(int64_t(b) * S + q0 + r) * ldo + h * D + c] =
          __float2bfloat16(sm.o[r * LDO<D> + c] / sm.l[r]);
  }
  if (int(threadIdx.x) < qvalid)
    lse[int64_t(bh) * S + q0 + threadIdx.x] = sm.m[threadIdx.x] + logf(sm.l[threadIdx.x]);
}

// ---- forward with register-resident softmax (mma.sync) ----------------------------------------
// The same tiles as forward_kernel and its results up to rounding (the softmax here is in base 2,
// below), but each warp keeps its 16 query rows' scores, running max/sum and output accumulators
// in registers, through PTX mma.m16n8k16 (bf16 in, fp32 accumulate; the fragment layouts are in
// mma.cuh). A thread owns rows g and g+8 of its warp's 16, and the score accumulators of two
// adjacent 8-key tiles are, element for element, the A fragment of P for the 16-key step of P·V:
// no shared-memory round trip for S, P or O.

// A fragments (16 rows × D, in steps of 16) of rows [row, row + 16) of a [..][LDT] tile: per step
// one ldmatrix.x4 (matrices: rows 0–7 low columns, rows 8–15 low, rows 0–7 high, rows 8–15 high).
template <int D>
__device__ void load_a_frags(uint32_t (&f)[D / 16][4], const bf16* tile, int row, int g, int t) {
  const int lane = 4 * g + t, mi = lane / 8;
  const bf16* rows = tile + (row + (mi % 2) * 8 + lane % 8) * LDT<D> + (mi / 2) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(f[kk], rows + kk * 16);
}

// acc[n] (16 × 8 per n, 64 columns) = A (this warp's 16 rows × D, fragments) · tile^T, tile a
// [64][LDT] row-major (its rows are the product's columns). The B fragment of column tile n and
// depth step kk is (row n·8+g, depths kk·16+2t, +1) and (…, kk·16+8+2t, +1): one ldmatrix.x4
// brings both for column tiles n and n+1 (matrices: n low, n high, n+1 low, n+1 high).
template <int D>
__device__ void rows_times_tile_t_mma(float (&acc)[BN / 8][4], const uint32_t (&a)[D / 16][4],
                                      const bf16* tile, int g, int t) {
  const int lane = 4 * g + t, mi = lane / 8;
  const bf16* rows = tile + ((mi / 2) * 8 + lane % 8) * LDT<D> + (mi % 2) * 8;
#pragma unroll
  for (int n = 0; n < BN / 8; n += 2) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    acc[n + 1][0] = acc[n + 1][1] = acc[n + 1][2] = acc[n + 1][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldsm_x4(b, rows + n * 8 * LDT<D> + kk * 16);
      mma16816(acc[n], a[kk], b[0], b[1]);
      mma16816(acc[n + 1], a[kk], b[2], b[3]);
    }
  }
}

// The same product with the A fragments read from shared memory as it goes (R row tiles of 16
// rows from row `row` of the [..][LDT] tile `a_tile`), depth step by depth step, so that only one
// step's A fragments are held: FlashAttention-2 rereads Q this way at head width 64 rather than
// keep it in registers. Each accumulator takes its depth steps in the same order: the same bits.
template <int D, int R>
__device__ void smem_rows_times_tile_t_mma(float (&acc)[R][BN / 8][4], const bf16* a_tile, int row,
                                           const bf16* tile, int g, int t) {
  const int lane = 4 * g + t, mi = lane / 8;
  const bf16* rows = tile + ((mi / 2) * 8 + lane % 8) * LDT<D> + (mi % 2) * 8;
  const bf16* arows = a_tile + (row + (mi % 2) * 8 + lane % 8) * LDT<D> + (mi / 2) * 8;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
      acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) ldsm_x4(a[r], arows + r * 16 * LDT<D> + kk * 16);
#pragma unroll
    for (int n = 0; n < BN / 8; n += 2) {
      uint32_t b[4];
      ldsm_x4(b, rows + n * 8 * LDT<D> + kk * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mma16816(acc[r][n], a[r], b[0], b[1]);
        mma16816(acc[r][n + 1], a[r], b[2], b[3]);
      }
    }
  }
}

// The lane's row address for ldmatrix.x4.trans B fragments of a [64][LDT] tile whose rows are
// the product's depth (see acc_times_tile_mma).
template <int D>
__device__ const bf16* depth_rows(const bf16* tile, int g, int t) {
  const int lane = 4 * g + t, mi = lane / 8;
  return tile + ((mi % 2) * 8 + lane % 8) * LDT<D> + (mi / 2) * 8;
}

// out[r] (16 × D) += a[r] (R A fragments, 16 rows × 16 depth each) · the tile's 16 depth rows
// from `rows` (depth_rows of the tile, moved to the step's first row): column tiles n and n+1 a
// load, which serves every row tile.
template <int D, int R>
__device__ void frag_times_rows_mma(float (&out)[R][D / 8][4], const uint32_t (&a)[R][4],
                                    const bf16* rows) {
#pragma unroll
  for (int n = 0; n < D / 8; n += 2) {
    uint32_t b[4];
    ldsm_x4_trans(b, rows + n * 8);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      mma16816(out[r][n], a[r], b[0], b[1]);
      mma16816(out[r][n + 1], a[r], b[2], b[3]);
    }
  }
}
template <int D>
__device__ void frag_times_rows_mma(float (&out)[D / 8][4], const uint32_t (&a)[4],
                                    const bf16* rows) {
  frag_times_rows_mma<D, 1>(reinterpret_cast<float(&)[1][D / 8][4]>(out),
                            reinterpret_cast<const uint32_t(&)[1][4]>(a), rows);
}

// out[r][n] (16 × 8 per n, D columns) += X_r (16 × 64, the accumulators x[r] as A fragments) ·
// tile, tile a [64][LDT] row-major whose rows are the product's depth. The B fragment of depth
// step s2 and column tile n is (rows s2·16+2t, +1 of column n·8+g) and (rows +8):
// ldmatrix.x4.trans brings both for column tiles n and n+1 (matrices: rows low n, rows high n,
// low n+1, high n+1).
template <int D, int R>
__device__ void acc_times_tile_mma(float (&out)[R][D / 8][4], const float (&x)[R][BN / 8][4],
                                   const bf16* tile, int g, int t) {
  const bf16* rows = depth_rows<D>(tile, g, t);
#pragma unroll
  for (int s2 = 0; s2 < BN / 16; ++s2) {
    uint32_t xf[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      xf[r][0] = pack_bf16(x[r][2 * s2][0], x[r][2 * s2][1]);
      xf[r][1] = pack_bf16(x[r][2 * s2][2], x[r][2 * s2][3]);
      xf[r][2] = pack_bf16(x[r][2 * s2 + 1][0], x[r][2 * s2 + 1][1]);
      xf[r][3] = pack_bf16(x[r][2 * s2 + 1][2], x[r][2 * s2 + 1][3]);
    }
    frag_times_rows_mma<D, R>(out, xf, rows + s2 * 16 * LDT<D>);
  }
}
template <int D>
__device__ void acc_times_tile_mma(float (&out)[D / 8][4], const float (&x)[BN / 8][4],
                                   const bf16* tile, int g, int t) {
  acc_times_tile_mma<D, 1>(reinterpret_cast<float(&)[1][D / 8][4]>(out),
                           reinterpret_cast<const float(&)[1][BN / 8][4]>(x), tile, g, t);
}

// R row tiles of 16 query rows a warp, 64·R query rows a block (R 1 or 2).
template <int D, int R>
struct MmaFwdSmem {
  bf16 q[R * BM * LDT<D>], k[2][BN * LDT<D>], v[2][BN * LDT<D>];  // K/V double-buffered
};

// The softmax runs in base 2: x = log2(e)·(scale·s − slope·(i − j)) and p = 2^(x − m), one
// multiply-add and one ex2 an element, with the row's log-sum-exp turned back to natural units
// when it is stored. Only the diagonal tile (and the last, partial one) needs the causal and
// end-of-sequence mask: every key of an earlier tile precedes every query of this one.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The query tile of launch index x (of n) when the heavy tiles (the most key tiles) are to start
// first, so that the last wave is the short tiles: tile n−1−x.
__device__ inline int heavy_first(int x, int n) {
  return n - 1 - x;
}

// R 1: warp w owns query rows [16w, 16w+16) of a 64-row block. R 2 ("wide"): warp w owns rows
// [32w, 32w+32) of a 128-row block as two row tiles, so that each K and V fragment loaded from
// shared memory feeds two mma instead of one and a warp has twice the independent products a
// step (FlashAttention-2 gives each warp 32 rows at head width 64 for the same reason). Either
// way a warp runs exactly the 64×64 tiles the R 1 grid runs for its rows: key tiles up to the
// diagonal of its 64-row half, none past it and none for a half wholly past the sequence's end,
// so the executed work (the ledger's `padding`) is the same, and so is every row's arithmetic
// in the same order: the same bits.
template <int D, int R>
__global__ void __launch_bounds__(kThreads)
    forward_mma_kernel(bf16* O, float* lse, const bf16* qkv, const float* slopes, int S, int H,
                       int Hkv, float scale) {
  after_previous_grid();
  static_assert(BM == BN && (R == 1 || R == 2), "64-row halves on 64-key tiles");
  constexpr int QM = R * BM;  // query rows a block
  extern __shared__ __align__(128) unsigned char raw[];
  MmaFwdSmem<D, R>& sm = *reinterpret_cast<MmaFwdSmem<D, R>*>(raw);
  const int qb = heavy_first(blockIdx.y, gridDim.y), bh = blockIdx.x, b = bh / H, h = bh % H,
            kvh = h / (H / Hkv);
  const int64_t W = int64_t(H + 2 * Hkv) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int q0 = qb * QM, qvalid = min(QM, S - q0), nk = (S + BN - 1) / BN;
  const float scale2 = scale * kLog2e, slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // This warp's first row in the block, and its 64-row half: the diagonal key tile hq. The block
  // runs key tiles up to its last half's diagonal (within the sequence).
  const int row0 = warp * 16 * R, hq = R == 1 ? qb : (q0 + row0) / BM,
            kb_end = R == 1 ? qb : min((q0 + QM - 1) / BN, nk - 1);
  auto issue_kv = [&](int kb, int buf) {  // K/V tile kb into buffer buf, one cp.async group
    const int k0 = kb * BN, kvalid = min(BN, S - k0);
    load_tile_async<D>(sm.k[buf], base + int64_t(H + kvh) * D, k0, kvalid, W);
    load_tile_async<D>(sm.v[buf], base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
    cp_async_commit();
  };
#pragma unroll
  for (int r = 0; r < R; ++r) {  // a half past the end: zeros, copied from the block's first row
    const int valid = qvalid - r * BM;
    load_tile_async<D>(sm.q + r * BM * LDT<D>, base + h * D, valid > 0 ? q0 + r * BM : q0,
                       max(valid, 0), W);
  }
  issue_kv(0, 0);  // one group: Q and the first K/V tile
  // R 1: this warp's Q rows as A fragments, one per 16-wide step of D, held for the whole loop
  // (R 2 rereads them from shared memory each step: 32 registers it has no room for).
  uint32_t qf[1][D / 16][4];
  float o[R][D / 8][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[r][n][0] = o[r][n][1] = o[r][n][2] = o[r][n][3] = 0.f;
  // Rows i0, i1 of each row tile: running max (base-2 units) and this thread's part of the sum.
  float m[R][2], l[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r) m[r][0] = m[r][1] = -INFINITY, l[r][0] = l[r][1] = 0.f;
  const int qref = (q0 + row0) / 32 * 32;  // the first row of this warp's 32-row group
  int rows_i[R];                           // this thread's first row of each row tile (absolute)
#pragma unroll
  for (int r = 0; r < R; ++r) rows_i[r] = q0 + row0 + r * 16 + g;
  // One key tile; kDiag: the diagonal tile, the only one that needs the mask.
  auto step = [&](auto diag, int kb, int buf) {
    constexpr bool kDiag = decltype(diag)::value;
    const int k0 = kb * BN;
    // S (16 × 64 a row tile) = Q · K^T: B fragment (d, key) = K[key][d], consecutive in d.
    float sc[R][BN / 8][4];
    if constexpr (R == 1)
      rows_times_tile_t_mma<D>(sc[0], qf[0], sm.k[buf], g, t);
    else
      smem_rows_times_tile_t_mma<D, R>(sc, sm.q, row0, sm.k[buf], g, t);
    // The ALiBi bias −slope·(i − j) is a row part, −slope·(i − qref), and a column part,
    // slope·(j − qref), with qref the first row of the 32-row group the warp's rows lie in (the
    // same row in either layout, R 1 or 2: the same bits). The row part is the same for every key
    // of a row, so it leaves the softmax unchanged and only comes back into the log-sum-exp when
    // that is stored; it stays under 32 slopes, so that x and the running max, which it cancels
    // out of, stay small near the diagonal. The column part is 16 values a thread (its columns),
    // shared by all its rows, where the distance form had a value a score (which the compiler
    // computed ahead of the product, holding 32 registers a row tile). Each value is an integer
    // under 2^24 times the slope, so one rounding as before. Per score: one multiply-add.
    float cj[BN / 8][2];
    const float c0 = float(k0 + 2 * t - qref);
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) cj[n][e] = slope2 * (c0 + float(n * 8 + e));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i0 = rows_i[r], i1 = i0 + 8;  // this thread's two query rows
      // Scaled scores and column bias (base 2), the mask on the diagonal; the tile's row maxima.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = c < 2 ? i0 : i1, j = k0 + n * 8 + 2 * t + (c & 1);
          float x = scale2 * sc[r][n][c] + cj[n][c & 1];
          if (kDiag && !(j <= i && j < S)) x = -INFINITY;
          sc[r][n][c] = x;
          if (c < 2)
            mx0 = fmaxf(mx0, x);
          else
            mx1 = fmaxf(mx1, x);
        }
      // The four threads of a group share the rows; a row with no key yet (only past the
      // sequence end) keeps m = −inf: no rescale, p = 0.
      const float2 a = online_max_step(m[r], mx0, mx1);
      const float a0 = a.x, a1 = a.y, mn0 = m[r][0], mn1 = m[r][1];
      l[r][0] *= a0;
      l[r][1] *= a1;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[r][n][0] *= a0;
        o[r][n][1] *= a0;
        o[r][n][2] *= a1;
        o[r][n][3] *= a1;
      }
      // Off the diagonal every score is finite and the max too, so 2^(x − m) needs no guard.
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float mr = c < 2 ? mn0 : mn1;
          const float p = kDiag && sc[r][n][c] == -INFINITY ? 0.f : exp2f(sc[r][n][c] - mr);
          sc[r][n][c] = p;
          l[r][c < 2 ? 0 : 1] += p;
        }
    }
    // O (16 × D a row tile) += P (16 × 64) · V (64 × D): P's A fragment for keys [16s, 16s+16)
    // is the score accumulators of key tiles 2s and 2s+1; B fragment (key, d) = V[key][d], two
    // rows of a column.
    acc_times_tile_mma<D, R>(o, sc, sm.v[buf], g, t);
  };
  // A warp whose half lies wholly past the sequence's end runs no tile (only R 2 has such).
  const bool live = R == 1 || hq < nk;
  for (int kb = 0, buf = 0; kb <= kb_end; ++kb, buf ^= 1) {
    // The next tile flies while this one is used; this tile (and Q) landed for every thread.
    begin_step(kb < kb_end, [&] { issue_kv(kb + 1, buf ^ 1); });
    if (R == 1 && kb == 0) load_a_frags<D>(qf[0], sm.q, row0, g, t);
    if (kb < hq && live)
      step(std::false_type{}, kb, buf);
    else if (R == 1 || (kb == hq && live))
      step(std::true_type{}, kb, buf);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  const int64_t ldo = int64_t(H) * D;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float l0 = l[r][0], l1 = l[r][1];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int i0 = q0 + row0 + r * 16 + g, i1 = i0 + 8;
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int col = h * D + n * 8 + 2 * t;
      if (i0 < S)
        *reinterpret_cast<__nv_bfloat162*>(O + (int64_t(b) * S + i0) * ldo + col) =
            __floats2bfloat162_rn(o[r][n][0] * inv0, o[r][n][1] * inv0);
      if (i1 < S)
        *reinterpret_cast<__nv_bfloat162*>(O + (int64_t(b) * S + i1) * ldo + col) =
            __floats2bfloat162_rn(o[r][n][2] * inv1, o[r][n][3] * inv1);
    }
    if (t == 0) {  // natural units, the row part of the bias back: ln 2 · (m − row + log2 l)
      const float bias0 = slope2 * float(i0 - qref), bias1 = slope2 * float(i1 - qref);
      if (i0 < S) lse[int64_t(bh) * S + i0] = kLn2 * (m[r][0] - bias0 + log2f(l0));
      if (i1 < S) lse[int64_t(bh) * S + i1] = kLn2 * (m[r][1] - bias1 + log2f(l1));
    }
  }
}

// delta (B·H·S) = rowsum(dO ∘ O), one warp per (b, h, i).
__global__ void delta_kernel(float* delta, const bf16* dO, const bf16* O, int64_t S, int H, int D,
                             int64_t rows) {
  after_previous_grid();
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = row / S, i = row % S, b = bh / H, h = bh % H;
  const int64_t off = (b * S + i) * int64_t(H) * D + h * D;
  float s = 0.f;
  for (int c = lane; c < D; c += 32)
    s += __bfloat162float(dO[off + c]) * __bfloat162float(O[off + c]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// The same rowsum with G = D/8 threads a row, each one 16-byte load of dO and of O (8 elements),
// the G partial sums added by shuffles within the group in a fixed order. Rows are taken in
// memory order (token, head): dO and O are (B, S, H, D), so a warp reads 512 contiguous bytes of
// each; delta is indexed (b·H + h)·S + i. The warp-a-row kernel above read 2 bytes a lane and
// ran at a fifth of the traffic's bandwidth (0.33 ms of the dense step on an H200, 2026-12-04).
template <int G>
__global__ void delta_vec_kernel(float* delta, const bf16* dO, const bf16* O, int64_t S, int H,
                                 int64_t rows) {
  after_previous_grid();
  const int64_t gid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = gid / G;  // (b·S + i)·H + h
  float s = 0.f;
  if (row < rows) {
    const uint4 a = *reinterpret_cast<const uint4*>(dO + gid * 8);
    const uint4 o = *reinterpret_cast<const uint4*>(O + gid * 8);
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 x = __bfloat1622float2(a2[k]), y = __bfloat1622float2(o2[k]);
      s += x.x * y.x;
      s += x.y * y.y;
    }
  }
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (row < rows && gid % G == 0) {
    const int64_t h = row % H, bi = row / H, b = bi / S, i = bi % S;
    delta[(b * H + h) * S + i] = s;
  }
}

template <int D>
struct BwdSmem {
  bf16 q[BM * LDT<D>], dO[BM * LDT<D>], k[BN * LDT<D>], v[BN * LDT<D>], p[BM * LDP], ds[BM * LDP];
  float s[BM * LDS], dp[BM * LDS];  // also the staging of the fp32 results at the end
  float lse[BM], delta[BM];
};
static_assert(2 * BM * LDS >= 64 * LDO<128>, "s and dp together stage a 64×128 fp32 tile");

// This warp's rows of P (bf16, into sm.p) and dS = scale·P∘(dP − delta) (bf16, into sm.ds) from
// the scores in sm.s and dP in sm.dp; rows past S and keys after the query are zero.
template <int D>
__device__ void softmax_backward_rows(BwdSmem<D>& sm, int warp, int lane, int q0, int k0, int S,
                                      float scale, float slope) {
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r, i = q0 + row;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int c = lane + 32 * t, j = k0 + c;
      float p = 0.f, ds = 0.f;
      if (j <= i && i < S) {
        p = expf(scale * sm.s[row * LDS + c] - slope * float(i - j) - sm.lse[row]);
        ds = scale * p * (sm.dp[row * LDS + c] - sm.delta[row]);
      }
      sm.p[row * LDP + c] = __float2bfloat16(p);
      sm.ds[row * LDP + c] = __float2bfloat16(ds);
    }
  }
}

// Scores and dP of this warp's 16 query rows against the key tile: into sm.s and sm.dp.
template <int D>
__device__ void scores_and_dp(BwdSmem<D>& sm, int warp) {
  FragC acc[BN / 16];
  rows_times_tile_t<D>(acc, sm.q + warp * 16 * LDT<D>, sm.k);
#pragma unroll
  for (int n = 0; n < BN / 16; ++n)
    wmma::store_matrix_sync(sm.s + warp * 16 * LDS + n * 16, acc[n], LDS, wmma::mem_row_major);
  rows_times_tile_t<D>(acc, sm.dO + warp * 16 * LDT<D>, sm.v);
#pragma unroll
  for (int n = 0; n < BN / 16; ++n)
    wmma::store_matrix_sync(sm.dp + warp * 16 * LDS + n * 16, acc[n], LDS, wmma::mem_row_major);
}

template <int D>
__device__ void load_rows_stats(BwdSmem<D>& sm, const float* lse, const float* delta, int64_t bh,
                                int S, int q0) {
  if (threadIdx.x < BM) {
    const int i = q0 + threadIdx.x;
    sm.lse[threadIdx.x] = i < S ? lse[bh * S + i] : 0.f;
    sm.delta[threadIdx.x] = i < S ? delta[bh * S + i] : 0.f;
  }
}

// Writes a [64][D] fp32 tile (staged in shared memory, row stride LDO) into dqkv rows row0.. at
// column col.
template <int D>
__device__ void store_rows(float* dqkv, const float* stage, int64_t row0, int valid, int64_t W,
                           int64_t col) {
  for (int idx = threadIdx.x; idx < 64 * D; idx += kThreads) {
    const int r = idx / D, c = idx % D;
    if (r < valid) dqkv[(row0 + r) * W + col + c] = stage[r * LDO<D> + c];
  }
}

// dK, dV of one key tile of one (sequence, kv head): all query heads of the group, every query
// tile on or below the diagonal, in a fixed order.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(float* dqkv, const bf16* dO, const float* lse, const float* delta, const bf16* qkv,
                const float* slopes, int S, int H, int Hkv, float scale) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  BwdSmem<D>& sm = *reinterpret_cast<BwdSmem<D>*>(raw);
  const int kb = blockIdx.y, b = blockIdx.x / Hkv, kvh = blockIdx.x % Hkv, group = H / Hkv;
  const int64_t W = int64_t(H + 2 * Hkv) * D, ldo = int64_t(H) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int k0 = kb * BN, kvalid = min(BN, S - k0), nq = (S + BM - 1) / BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<D>(sm.k, base + int64_t(H + kvh) * D, k0, kvalid, W);
  load_tile<D>(sm.v, base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
  FragC dk[D / 16], dv[D / 16];  // this warp's 16 key rows
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.f);
    wmma::fill_fragment(dv[n], 0.f);
  }
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    const int64_t bh = int64_t(b) * H + h;
    const float slope = slopes ? slopes[h] : 0.f;
    for (int qb = kb; qb < nq; ++qb) {
      const int q0 = qb * BM, qvalid = min(BM, S - q0);
      load_tile<D>(sm.q, base + int64_t(h) * D, q0, qvalid, W);
      load_tile<D>(sm.dO, dO + int64_t(b) * S * ldo + int64_t(h) * D, q0, qvalid, ldo);
      load_rows_stats<D>(sm, lse, delta, bh, S, q0);
      __syncthreads();
      scores_and_dp<D>(sm, warp);
      __syncwarp();
      softmax_backward_rows<D>(sm, warp, lane, q0, k0, S, scale, slope);
      __syncthreads();  // every query row's P and dS are in place
                        // dV += P^T·dO and dK += dS^T·Q for this warp's key rows [16w, 16w+16).
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
          FragAt pt, dst;
          FragB fdo, fq;
          wmma::load_matrix_sync(pt, sm.p + kk * 16 * LDP + warp * 16, LDP);
          wmma::load_matrix_sync(fdo, sm.dO + kk * 16 * LDT<D> + n * 16, LDT<D>);
          wmma::mma_sync(dv[n], pt, fdo, dv[n]);
          wmma::load_matrix_sync(dst, sm.ds + kk * 16 * LDP + warp * 16, LDP);
          wmma::load_matrix_sync(fq, sm.q + kk * 16 * LDT<D> + n * 16, LDT<D>);
          wmma::mma_sync(dk[n], dst, fq, dk[n]);
        }
      }
      __syncthreads();  // Q, dO, P, dS are replaced next
    }
  }
  float* stage = sm.s;  // [64][D] fp32 across s and dp
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(stage + warp * 16 * LDO<D> + n * 16, dk[n], LDO<D>,
                            wmma::mem_row_major);
  __syncthreads();
  store_rows<D>(dqkv, stage, int64_t(b) * S + k0, kvalid, W, int64_t(H + kvh) * D);
  __syncthreads();
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(stage + warp * 16 * LDO<D> + n * 16, dv[n], LDO<D>,
                            wmma::mem_row_major);
  __syncthreads();
  store_rows<D>(dqkv, stage, int64_t(b) * S + k0, kvalid, W, int64_t(H + Hkv + kvh) * D);
}

// dQ of one query tile of one (sequence, head): every key tile up to the diagonal, in order.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(float* dqkv, const bf16* dO, const float* lse, const float* delta, const bf16* qkv,
              const float* slopes, int S, int H, int Hkv, float scale) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  BwdSmem<D>& sm = *reinterpret_cast<BwdSmem<D>*>(raw);
  const int qb = blockIdx.y, bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / Hkv);
  const int64_t W = int64_t(H + 2 * Hkv) * D, ldo = int64_t(H) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int q0 = qb * BM, qvalid = min(BM, S - q0);
  const float slope = slopes ? slopes[h] : 0.f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<D>(sm.q, base + int64_t(h) * D, q0, qvalid, W);
  load_tile<D>(sm.dO, dO + int64_t(b) * S * ldo + int64_t(h) * D, q0, qvalid, ldo);
  load_rows_stats<D>(sm, lse, delta, bh, S, q0);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.f);
  for (int kb = 0; kb <= qb; ++kb) {
    const int k0 = kb * BN, kvalid = min(BN, S - k0);
    load_tile<D>(sm.k, base + int64_t(H + kvh) * D, k0, kvalid, W);
    load_tile<D>(sm.v, base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
    __syncthreads();
    scores_and_dp<D>(sm, warp);
    __syncwarp();
    softmax_backward_rows<D>(sm, warp, lane, q0, k0, S, scale, slope);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        FragA fds;
        FragB fk;
        wmma::load_matrix_sync(fds, sm.ds + warp * 16 * LDP + kk * 16, LDP);
        wmma::load_matrix_sync(fk, sm.k + kk * 16 * LDT<D> + n * 16, LDT<D>);
        wmma::mma_sync(dq[n], fds, fk, dq[n]);
      }
    }
    __syncthreads();  // K/V are replaced next
  }
  float* stage = sm.s;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(stage + warp * 16 * LDO<D> + n * 16, dq[n], LDO<D>,
                            wmma::mem_row_major);
  __syncthreads();
  store_rows<D>(dqkv, stage, int64_t(b) * S + q0, qvalid, W, int64_t(h) * D);
}

// ---- backward with register-resident tiles (mma.sync), head widths up to 64 ---------------------
// Five products a tile instead of seven: the dK/dV kernel (one block per key tile) recomputes S
// and dP once, and besides dV and dK it stores dS (bf16, the rounding the dQ product takes anyway)
// in a scratch of whole 64×64 tiles; the dQ kernel (one block per query tile) then only multiplies
// those tiles by K, in key-tile order. No float atomics: every sum has one fixed order. With the
// fragment layouts of forward_mma_kernel: a warp's 16 rows of S, dP, P and dS live in registers,
// and the accumulators of two adjacent 8-column tiles are the A fragment of the next product.
//
// dS scratch: per (sequence, head) bh, the tiles (qb, kb ≤ qb) at index qb·(qb+1)/2 + kb, each
// stored transposed, [key][query] (the dK/dV kernel's rows are keys), masked entries zero.

// dK/dV: K and V once; Q, dO and their rows' lse and delta double-buffered over the query tiles.
template <int D>
struct MmaDkdvSmem {
  bf16 k[BN * LDT<D>], v[BN * LDT<D>], q[2][BM * LDT<D>], dO[2][BM * LDT<D>];
  float lse[2][BM], delta[2][BM];
};

// dQ: the dS tile and the K tile of each step, double-buffered.
template <int D>
struct MmaDqSmem {
  bf16 ds[2][BN * LDT<BM>], k[2][BN * LDT<D>];
};

// The first element of dS tile (qb, kb) of head row bh (see above).
__device__ inline int64_t ds_tile(int bh, int nq, int qb, int kb) {
  return ((int64_t(bh) * nq * (nq + 1)) / 2 + qb * (qb + 1) / 2 + kb) * (BM * BN);
}

// Two adjacent columns: 8 bytes of fp32 or 4 of bf16 (rounded to nearest).
__device__ inline void store_pair(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ inline void store_pair(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// Rows row0 + (g, g+8) of a [rows][W] matrix (fp32 or bf16) at column col: this warp's 16 × D
// result.
template <int D, class OutT>
__device__ void store_acc(OutT* dqkv, const float (&acc)[D / 8][4], int64_t row0, int r0, int S,
                          int64_t W, int64_t col, int g, int t) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int64_t c = col + n * 8 + 2 * t;
    if (r0 + g < S) store_pair(dqkv + (row0 + g) * W + c, acc[n][0], acc[n][1]);
    if (r0 + g + 8 < S) store_pair(dqkv + (row0 + g + 8) * W + c, acc[n][2], acc[n][3]);
  }
}

// dK, dV of one key tile of one (sequence, kv head): warp w owns keys [16w, 16w+16). Per query
// tile, S^T = K·Q^T and dP^T = V·dO^T; then dV += P^T·dO and dK += dS^T·Q, and dS^T is stored
// for the dQ kernel.
//
// Without LEAN (the default) the kernel holds K's and V's A fragments and a tile's S^T and dP^T
// (8 × 4 fp32 each) for the whole step: 254 registers at D 64, two blocks an SM, 12 % occupancy
// and 0.26 instructions issued a cycle a scheduler on an H200 (Nsight Compute, 2026-12-04).
// LEAN (--kernels attention=fused_mma_lean) holds fewer registers at once, for three blocks an
// SM, with the same tiles, the same products and every accumulator's terms in the same order, so
// the same bits (dK, dV, dS): neither K's nor V's fragments are held; dP^T comes first, V's
// fragments read from shared memory as it goes (smem_rows_times_tile_t_mma); then, 16 queries at
// a time (s2), the two 8-query column tiles of S^T (K's fragments read again, a depth step at a
// time), P and dS for them, dS stored, and that 16-deep step of dV += P^T·dO and dK += dS^T·Q;
// dV's and dK's steps still run s2 = 0, 1, … in order, each as acc_times_tile_mma runs it.
// ptxas (CUDA 13.0, sm_90) at 3 blocks an SM: 168 registers and 8 bytes of spill at D 64, 165
// and 148 at D 32 and 16 without spill (at 4 blocks, 84 bytes of spill at D 64; 4 blocks' 55 KiB
// of shared memory would not fit an SM anyway). Not yet timed on a GPU (2026-12-04), so not the
// default. The default's PTX is the same as before LEAN was added (compared after the merge).
template <int D, class OutT, bool LEAN>
__global__ void __launch_bounds__(kThreads, LEAN ? 3 : 2)  // 2 blocks: no spills at D 32
    dkdv_mma_kernel(OutT* dqkv, bf16* ds_out, const bf16* dO, const float* lse, const float* delta,
                    const bf16* qkv, const float* slopes, int S, int H, int Hkv, float scale) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  MmaDkdvSmem<D>& sm = *reinterpret_cast<MmaDkdvSmem<D>*>(raw);
  const int kb = blockIdx.y, b = blockIdx.x / Hkv, kvh = blockIdx.x % Hkv, group = H / Hkv;
  const int64_t W = int64_t(H + 2 * Hkv) * D, ldo = int64_t(H) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int k0 = kb * BN, kvalid = min(BN, S - k0), nq = (S + BM - 1) / BM;
  const float scale2 = scale * kLog2e;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j0 = k0 + warp * 16 + g, j1 = j0 + 8;  // this thread's two keys
  // Steps: the query tiles kb..nq-1 of each query head of the group, in that order.
  const int per_head = nq - kb, steps = group * per_head;
  auto issue_q = [&](int it, int buf) {  // Q, dO, lse and delta of step it into buffer buf
    const int h = kvh * group + it / per_head, q0 = (kb + it % per_head) * BM;
    const int qvalid = min(BM, S - q0);
    const int64_t bh = int64_t(b) * H + h;
    load_tile_async<D>(sm.q[buf], base + int64_t(h) * D, q0, qvalid, W);
    load_tile_async<D>(sm.dO[buf], dO + int64_t(b) * S * ldo + int64_t(h) * D, q0, qvalid, ldo);
    if (threadIdx.x < BM) {
      // Base 2, with the query's part of the ALiBi bias, slope·(i − iref) (see step).
      const int i = q0 + threadIdx.x;
      const float slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
      sm.lse[buf][threadIdx.x] =
          i < S ? kLog2e * lse[bh * S + i] + slope2 * float(threadIdx.x % 16) : 0.f;
      sm.delta[buf][threadIdx.x] = i < S ? delta[bh * S + i] : 0.f;
    }
    cp_async_commit();
  };
  load_tile_async<D>(sm.k, base + int64_t(H + kvh) * D, k0, kvalid, W);
  load_tile_async<D>(sm.v, base + int64_t(H + Hkv + kvh) * D, k0, kvalid, W);
  issue_q(0, 0);  // one group: K, V and the first query tile
  uint32_t kf[D / 16][4], vf[D / 16][4];  // held without LEAN (else never set nor read)
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) dk[n][c] = dv[n][c] = 0.f;
  // One query tile of head h; kDiag: the diagonal tile or the last, partial one, which need the
  // mask.
  auto step_held = [&](auto diag, int h, int q0, float slope2, int buf) {
    constexpr bool kDiag = decltype(diag)::value;
    float st[BN / 8][4], dpt[BN / 8][4];
    rows_times_tile_t_mma<D>(st, kf, sm.q[buf], g, t);
    rows_times_tile_t_mma<D>(dpt, vf, sm.dO[buf], g, t);
    // The bias −slope·(i − j) as a key part, slope·(j − iref), and a query part,
    // −slope·(i − iref), already in the staged log-sum-exp: x = scale·s + key − lse'. iref is
    // the first query of i's group of 16, so the query part stays small (a larger one would
    // cancel against the key part in x and cost precision); the key part is then 8 values a
    // thread (2 keys, 4 groups) where the distance form had a value a score, which the compiler
    // computed ahead of the product. The rounding is pinned: the key part one product
    // (__fmul_rn, never fused), x one fma of it, so that the lean step below, whose code nvcc
    // schedules differently, gets the same bits: left to contract, nvcc fused scale·s + key as
    // fma(scale, s, key) here and as fma(slope, j − q0 − 16k, scale·s) there (H200, 2026-12-04:
    // the lean kernel's dS differed at S 200, the first shape with an unmasked tile at D 64).
    float r[BM / 16][2];
#pragma unroll
    for (int k = 0; k < BM / 16; ++k) {
      r[k][0] = __fmul_rn(slope2, float(j0 - q0 - 16 * k));
      r[k][1] = __fmul_rn(slope2, float(j1 - q0 - 16 * k));
    }
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = c < 2 ? j0 : j1, qi = n * 8 + 2 * t + (c & 1), i = q0 + qi;
        float p = 0.f, ds = 0.f;
        if (!kDiag || (j <= i && i < S)) {
          p = exp2f(__fmaf_rn(scale2, st[n][c], r[n / 2][c < 2 ? 0 : 1]) - sm.lse[buf][qi]);
          ds = scale * p * (dpt[n][c] - sm.delta[buf][qi]);
        }
        st[n][c] = p;
        dpt[n][c] = ds;
      }
    // dS^T rows (this thread's keys) of tile (q0/BM, kb): the bf16 pairs the dQ product reads.
    bf16* dst = ds_out + ds_tile(b * H + h, nq, q0 / BM, kb) + (warp * 16 + g) * BM + 2 * t;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + n * 8) = pack_bf16(dpt[n][0], dpt[n][1]);
      *reinterpret_cast<uint32_t*>(dst + 8 * BM + n * 8) = pack_bf16(dpt[n][2], dpt[n][3]);
    }
    acc_times_tile_mma<D>(dv, st, sm.dO[buf], g, t);  // dV += P^T · dO
    acc_times_tile_mma<D>(dk, dpt, sm.q[buf], g, t);  // dK += dS^T · Q
  };
  auto step_lean = [&](auto diag, int h, int q0, float slope2, int buf) {
    constexpr bool kDiag = decltype(diag)::value;
    const int lm = lane / 8;
    float dpt[1][BN / 8][4];
    smem_rows_times_tile_t_mma<D, 1>(dpt, sm.v, warp * 16, sm.dO[buf], g, t);  // dP^T = V·dO^T
    bf16* dst = ds_out + ds_tile(b * H + h, nq, q0 / BM, kb) + (warp * 16 + g) * BM + 2 * t;
    const bf16* q_rows = depth_rows<D>(sm.q[buf], g, t);
    const bf16* do_rows = depth_rows<D>(sm.dO[buf], g, t);
    // B fragments of S^T's column tiles n, n+1 (queries) as rows_times_tile_t_mma reads them.
    const bf16* qb_rows = sm.q[buf] + ((lm / 2) * 8 + lane % 8) * LDT<D> + (lm % 2) * 8;
    // K's A fragments as load_a_frags reads them (this warp's 16 keys), per depth step.
    const bf16* k_rows = sm.k + (warp * 16 + (lm % 2) * 8 + lane % 8) * LDT<D> + (lm / 2) * 8;
#pragma unroll
    for (int s2 = 0; s2 < BN / 16; ++s2) {
      const int n = 2 * s2;
      float st[2][4];
#pragma unroll
      for (int c = 0; c < 4; ++c) st[0][c] = st[1][c] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4], bq[4];
        ldsm_x4(ka, k_rows + kk * 16);
        ldsm_x4(bq, qb_rows + n * 8 * LDT<D> + kk * 16);
        mma16816(st[0], ka, bq[0], bq[1]);
        mma16816(st[1], ka, bq[2], bq[3]);
      }
      const float r0 = __fmul_rn(slope2, float(j0 - q0 - 16 * s2)),
                  r1 = __fmul_rn(slope2, float(j1 - q0 - 16 * s2));
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = c < 2 ? j0 : j1, qi = (n + m) * 8 + 2 * t + (c & 1), i = q0 + qi;
          float p = 0.f, ds = 0.f;
          if (!kDiag || (j <= i && i < S)) {
            p = exp2f(__fmaf_rn(scale2, st[m][c], c < 2 ? r0 : r1) - sm.lse[buf][qi]);
            ds = scale * p * (dpt[0][n + m][c] - sm.delta[buf][qi]);
          }
          st[m][c] = p;
          dpt[0][n + m][c] = ds;
        }
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        *reinterpret_cast<uint32_t*>(dst + (n + m) * 8) =
            pack_bf16(dpt[0][n + m][0], dpt[0][n + m][1]);
        *reinterpret_cast<uint32_t*>(dst + 8 * BM + (n + m) * 8) =
            pack_bf16(dpt[0][n + m][2], dpt[0][n + m][3]);
      }
      // This s2's step of dV += P^T·dO and dK += dS^T·Q (acc_times_tile_mma's fragments).
      const uint32_t pf[4] = {pack_bf16(st[0][0], st[0][1]), pack_bf16(st[0][2], st[0][3]),
                              pack_bf16(st[1][0], st[1][1]), pack_bf16(st[1][2], st[1][3])};
      frag_times_rows_mma<D>(dv, pf, do_rows + s2 * 16 * LDT<D>);
      const uint32_t sf[4] = {pack_bf16(dpt[0][n][0], dpt[0][n][1]),
                              pack_bf16(dpt[0][n][2], dpt[0][n][3]),
                              pack_bf16(dpt[0][n + 1][0], dpt[0][n + 1][1]),
                              pack_bf16(dpt[0][n + 1][2], dpt[0][n + 1][3])};
      frag_times_rows_mma<D>(dk, sf, q_rows + s2 * 16 * LDT<D>);
    }
  };
  auto step = [&](auto diag, int h, int q0, float slope2, int buf) {
    if constexpr (LEAN)
      step_lean(diag, h, q0, slope2, buf);
    else
      step_held(diag, h, q0, slope2, buf);
  };
  for (int it = 0, buf = 0; it < steps; ++it, buf ^= 1) {
    const int h = kvh * group + it / per_head, q0 = (kb + it % per_head) * BM;
    const float slope2 = (slopes ? slopes[h] : 0.f) * kLog2e;
    // The next query tile flies while this one is used; this one (and K, V) landed.
    begin_step(it + 1 < steps, [&] { issue_q(it + 1, buf ^ 1); });
    if constexpr (!LEAN) {
      if (it == 0) {
        load_a_frags<D>(kf, sm.k, warp * 16, g, t);
        load_a_frags<D>(vf, sm.v, warp * 16, g, t);
      }
    }
    if (q0 == k0 || q0 + BM > S)
      step(std::true_type{}, h, q0, slope2, buf);
    else
      step(std::false_type{}, h, q0, slope2, buf);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  const int64_t row0 = int64_t(b) * S + k0 + warp * 16;
  store_acc<D, OutT>(dqkv, dk, row0, k0 + warp * 16, S, W, int64_t(H + kvh) * D, g, t);
  store_acc<D, OutT>(dqkv, dv, row0, k0 + warp * 16, S, W, int64_t(H + Hkv + kvh) * D, g, t);
}

// out (16 × D) += dS (this warp's 16 query rows × 64 keys) · tile (64 keys × D, row-major), dS
// given as the stored dS^T tile [64 keys][LDT<BM>]. The A fragment of key step s2 is the
// transpose of four 8×8 blocks of dS^T: ldmatrix.x4.trans with matrices (keys low, queries low),
// (keys low, queries high), (keys high, queries low), (keys high, queries high). The B fragments
// as in acc_times_tile_mma.
template <int D>
__device__ void ds_times_tile_mma(float (&out)[D / 8][4], const bf16* dst, const bf16* tile,
                                  int warp, int g, int t) {
  const int lane = 4 * g + t, mi = lane / 8;
  const bf16* arows = dst + ((mi / 2) * 8 + lane % 8) * LDT<BM> + warp * 16 + (mi % 2) * 8;
  const bf16* brows = depth_rows<D>(tile, g, t);
#pragma unroll
  for (int s2 = 0; s2 < BN / 16; ++s2) {
    uint32_t a[4];
    ldsm_x4_trans(a, arows + s2 * 16 * LDT<BM>);
    frag_times_rows_mma<D>(out, a, brows + s2 * 16 * LDT<D>);
  }
}

// dQ of one query tile of one (sequence, head): warp w owns queries [16w, 16w+16). Per key tile
// in order, dQ += dS·K from the stored dS tile.
template <int D, class OutT>
__global__ void __launch_bounds__(kThreads)
    dq_mma_kernel(OutT* dqkv, const bf16* ds_in, const bf16* qkv, int S, int H, int Hkv) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  MmaDqSmem<D>& sm = *reinterpret_cast<MmaDqSmem<D>*>(raw);
  const int nq = gridDim.y, qb = heavy_first(blockIdx.y, nq), bh = blockIdx.x, b = bh / H,
            h = bh % H, kvh = h / (H / Hkv);
  const int64_t W = int64_t(H + 2 * Hkv) * D;
  const bf16* base = qkv + int64_t(b) * S * W;
  const int q0 = qb * BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto issue = [&](int kb, int buf) {  // dS tile (qb, kb) and K tile kb, one cp.async group
    const int k0 = kb * BN;
    load_tile_async<BM>(sm.ds[buf], ds_in + ds_tile(bh, nq, qb, kb), 0, BN, BM);
    load_tile_async<D>(sm.k[buf], base + int64_t(H + kvh) * D, k0, min(BN, S - k0), W);
    cp_async_commit();
  };
  issue(0, 0);
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  for (int kb = 0, buf = 0; kb <= qb; ++kb, buf ^= 1) {
    // The next tiles fly while these are used; these landed for every thread.
    begin_step(kb < qb, [&] { issue(kb + 1, buf ^ 1); });
    ds_times_tile_mma<D>(dq, sm.ds[buf], sm.k[buf], warp, g, t);  // dQ += dS · K
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  store_acc<D, OutT>(dqkv, dq, int64_t(b) * S + q0 + warp * 16, q0 + warp * 16, S, W,
                     int64_t(h) * D, g, t);
}

template <class Kernel>
void allow_smem(Kernel k, size_t bytes) {
  check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute (attention shared memory)");
}

// Every forward: one block per (sequence·head, query tile of `rows`).
template <class Kernel>
void launch_forward(Kernel kernel, size_t smem, int rows, const char* name, uint16_t* O, float* lse,
                    const uint16_t* qkv, const float* slopes, int64_t B, int64_t S, int64_t H,
                    int64_t Hkv, int64_t D) {
  allow_smem(kernel, smem);
  // x: sequence·head, y: query tile, so that the launch order runs through every head's tile
  // before the next tile (the mma forward takes the heaviest tiles first).
  const dim3 grid(unsigned(B * H), unsigned((S + rows - 1) / rows));
  launch_kernel(kernel, {grid, kThreads, smem}, reinterpret_cast<bf16*>(O), lse,
                reinterpret_cast<const bf16*>(qkv), slopes, int(S), int(H), int(Hkv),
                1.f / sqrtf(float(D)));
  check_launch(name);
}

template <int D>
void forward_t(uint16_t* O, float* lse, const uint16_t* qkv, const float* slopes, int64_t B,
               int64_t S, int64_t H, int64_t Hkv) {
  launch_forward(forward_kernel<D>, sizeof(FwdSmem<D>), BM, "attention::forward", O, lse, qkv,
                 slopes, B, S, H, Hkv, D);
}

// R row tiles a warp (forward_mma_kernel).
template <int D, int R>
void forward_mma_t(uint16_t* O, float* lse, const uint16_t* qkv, const float* slopes, int64_t B,
                   int64_t S, int64_t H, int64_t Hkv) {
  launch_forward(forward_mma_kernel<D, R>, sizeof(MmaFwdSmem<D, R>), R * BM,
                 R == 1 ? "attention::forward_mma" : "attention::forward_mma_wide", O, lse, qkv,
                 slopes, B, S, H, Hkv, D);
}

// delta (B·H·S) = rowsum(dO∘O), the first kernel of either backward.
void launch_delta(float* delta, const uint16_t* dO, const uint16_t* O, int64_t B, int64_t S,
                  int64_t H, int D) {
  const int64_t rows = B * H * S;
  const auto* d = reinterpret_cast<const bf16*>(dO);
  const auto* o = reinterpret_cast<const bf16*>(O);
  const bool vec =
      reinterpret_cast<uintptr_t>(dO) % 16 == 0 && reinterpret_cast<uintptr_t>(O) % 16 == 0;
  const unsigned blocks = unsigned((rows * D / 8 + 255) / 256);
  if (vec && D == 16)
    launch_kernel(delta_vec_kernel<2>, {blocks, 256}, delta, d, o, S, int(H), rows);
  else if (vec && D == 32)
    launch_kernel(delta_vec_kernel<4>, {blocks, 256}, delta, d, o, S, int(H), rows);
  else if (vec && D == 64)
    launch_kernel(delta_vec_kernel<8>, {blocks, 256}, delta, d, o, S, int(H), rows);
  else if (vec && D == 128)
    launch_kernel(delta_vec_kernel<16>, {blocks, 256}, delta, d, o, S, int(H), rows);
  else
    launch_kernel(delta_kernel, {unsigned((rows + 7) / 8), 256}, delta, d, o, S, int(H), D, rows);
  check_launch("attention::delta");
}

// The WMMA backward: delta = rowsum(dO∘O), then dK/dV per (sequence·kv head, key tile) and dQ per
// (sequence·head, query tile). Sequences·heads go on grid x (up to 2^31 − 1), tiles on y (at
// most S/64): on y, a pass of 1,024 sequences of 64 heads would exceed its 65,535.
template <class KernelKV, class KernelQ>
void launch_backward(KernelKV dkdv, KernelQ dq, size_t smem_kv, size_t smem_q, const char* name,
                     float* dqkv, float* delta, const uint16_t* dO, const uint16_t* O,
                     const float* lse, const uint16_t* qkv, const float* slopes, int64_t B,
                     int64_t S, int64_t H, int64_t Hkv, int D) {
  launch_delta(delta, dO, O, B, S, H, D);
  const float scale = 1.f / sqrtf(float(D));
  const unsigned tiles = unsigned((S + BM - 1) / BM);
  allow_smem(dkdv, smem_kv);
  launch_kernel(dkdv, {dim3(unsigned(B * Hkv), tiles), kThreads, smem_kv}, dqkv,
                reinterpret_cast<const bf16*>(dO), lse, delta, reinterpret_cast<const bf16*>(qkv),
                slopes, int(S), int(H), int(Hkv), scale);
  check_launch(name);
  allow_smem(dq, smem_q);
  launch_kernel(dq, {dim3(unsigned(B * H), tiles), kThreads, smem_q}, dqkv,
                reinterpret_cast<const bf16*>(dO), lse, delta, reinterpret_cast<const bf16*>(qkv),
                slopes, int(S), int(H), int(Hkv), scale);
  check_launch(name);
}

template <int D>
void backward_t(float* dqkv, float* delta, const uint16_t* dO, const uint16_t* O, const float* lse,
                const uint16_t* qkv, const float* slopes, int64_t B, int64_t S, int64_t H,
                int64_t Hkv) {
  launch_backward(dkdv_kernel<D>, dq_kernel<D>, sizeof(BwdSmem<D>), sizeof(BwdSmem<D>),
                  "attention::backward", dqkv, delta, dO, O, lse, qkv, slopes, B, S, H, Hkv, D);
}

template <int D, class OutT>
void backward_mma_t(OutT* dqkv, float* delta, uint16_t* ds, const uint16_t* dO, const uint16_t* O,
                    const float* lse, const uint16_t* qkv, const float* slopes, int64_t B,
                    int64_t S, int64_t H, int64_t Hkv, DkdvKernel kind) {
  launch_delta(delta, dO, O, B, S, H, D);
  const unsigned tiles = unsigned((S + BM - 1) / BM);
  bf16* dsb = reinterpret_cast<bf16*>(ds);
  if (kind == DkdvKernel::wgmma) {
    dkdv_wgmma(dqkv, std::is_same_v<OutT, bf16>, ds, dO, lse, delta, qkv, slopes, B, S, H, Hkv, D,
               1.f / sqrtf(float(D)));
  } else {
    const bool lean = kind == DkdvKernel::lean;
    const auto dkdv = lean ? dkdv_mma_kernel<D, OutT, true> : dkdv_mma_kernel<D, OutT, false>;
    allow_smem(dkdv, sizeof(MmaDkdvSmem<D>));
    // x: sequence·head, y: tile, so that every head's heaviest tiles (the most steps: the first
    // key tiles, the last query tiles) launch first.
    launch_kernel(dkdv, {dim3(unsigned(B * Hkv), tiles), kThreads, sizeof(MmaDkdvSmem<D>)}, dqkv,
                  dsb, reinterpret_cast<const bf16*>(dO), lse, delta,
                  reinterpret_cast<const bf16*>(qkv), slopes, int(S), int(H), int(Hkv),
                  1.f / sqrtf(float(D)));
    check_launch(lean ? "attention::backward_mma_lean" : "attention::backward_mma");
  }
  allow_smem(dq_mma_kernel<D, OutT>, sizeof(MmaDqSmem<D>));
  launch_kernel(dq_mma_kernel<D, OutT>,
                {dim3(unsigned(B * H), tiles), kThreads, sizeof(MmaDqSmem<D>)}, dqkv, dsb,
                reinterpret_cast<const bf16*>(qkv), int(S), int(H), int(Hkv));
  check_launch("attention::backward_mma");
}

}  // namespace

bool supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

int64_t tiles_per_head(int64_t S) {
  const int64_t nq = (S + kTile - 1) / kTile;
  return nq * (nq + 1) / 2;
}

// f(std::integral_constant<int, D>) at a head width with kernels; 0 at any other.
template <class F>
std::size_t at_width(int64_t head_dim, F f) {
  switch (head_dim) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return 0;
  }
}

std::size_t forward_shared_bytes(int64_t head_dim) {
  return at_width(head_dim, [](auto d) { return sizeof(FwdSmem<d()>); });
}

std::size_t forward_mma_shared_bytes(int64_t head_dim, bool wide) {
  if (wide && !forward_mma_wide_supported(head_dim)) return 0;
  return at_width(head_dim, [&](auto d) {
    return wide ? sizeof(MmaFwdSmem<d(), 2>) : sizeof(MmaFwdSmem<d(), 1>);
  });
}

std::size_t backward_shared_bytes(int64_t head_dim) {
  return at_width(head_dim, [](auto d) { return sizeof(BwdSmem<d()>); });
}

std::size_t backward_mma_shared_bytes(int64_t head_dim) {
  if (!backward_mma_supported(head_dim)) return 0;
  return at_width(
      head_dim, [](auto d) { return std::max(sizeof(MmaDkdvSmem<d()>), sizeof(MmaDqSmem<d()>)); });
}

bool backward_mma_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64;
}

bool backward_wgmma_supported(int64_t head_dim) {
  return dkdv_wgmma_supported(head_dim);
}

#define MOEPLAN_ATTN_DISPATCH(Dh, call)                                               \
  switch (Dh) {                                                                       \
    case 16:                                                                          \
      call(16);                                                                       \
      break;                                                                          \
    case 32:                                                                          \
      call(32);                                                                       \
      break;                                                                          \
    case 64:                                                                          \
      call(64);                                                                       \
      break;                                                                          \
    case 128:                                                                         \
      call(128);                                                                      \
      break;                                                                          \
    default:                                                                          \
      throw std::invalid_argument("fused attention: head_dim " + std::to_string(Dh) + \
                                  " has no kernel (16, 32, 64 or 128)");              \
  }

void forward(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
             int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
#define MOEPLAN_CALL(d) forward_t<d>(O, lse, qkv, alibi_slopes, B, S, H, Hkv)
  MOEPLAN_ATTN_DISPATCH(Dh, MOEPLAN_CALL)
#undef MOEPLAN_CALL
}

void forward_mma(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
                 int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
#define MOEPLAN_CALL(d) forward_mma_t<d, 1>(O, lse, qkv, alibi_slopes, B, S, H, Hkv)
  MOEPLAN_ATTN_DISPATCH(Dh, MOEPLAN_CALL)
#undef MOEPLAN_CALL
}

bool forward_mma_wide_supported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64;
}

void forward_mma_wide(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes,
                      int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh) {
  switch (Dh) {
    case 16:
      forward_mma_t<16, 2>(O, lse, qkv, alibi_slopes, B, S, H, Hkv);
      break;
    case 32:
      forward_mma_t<32, 2>(O, lse, qkv, alibi_slopes, B, S, H, Hkv);
      break;
    case 64:
      forward_mma_t<64, 2>(O, lse, qkv, alibi_slopes, B, S, H, Hkv);
      break;
    default:
      throw std::invalid_argument("attention::forward_mma_wide: head_dim " + std::to_string(Dh) +
                                  " has no kernel (16, 32 or 64)");
  }
}

void backward(float* dqkv, float* delta, const uint16_t* dO, const uint16_t* O, const float* lse,
              const uint16_t* qkv, const float* alibi_slopes, int64_t B, int64_t S, int64_t H,
              int64_t Hkv, int64_t Dh){
#define MOEPLAN_CALL(d) backward_t<d>(dqkv, delta, dO, O, lse, qkv, alibi_slopes, B, S, H, Hkv)
    MOEPLAN_ATTN_DISPATCH(Dh, MOEPLAN_CALL)
#undef MOEPLAN_CALL
}

int64_t backward_mma_scratch(int64_t B, int64_t S, int64_t H) {
  return B * H * tiles_per_head(S) * kTile * kTile;
}

template <class OutT>
void backward_mma_d(OutT* dqkv, float* delta, uint16_t* ds, const uint16_t* dO, const uint16_t* O,
                    const float* lse, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
                    int64_t S, int64_t H, int64_t Hkv, int64_t Dh, DkdvKernel kind) {
  if (kind == DkdvKernel::wgmma && !backward_wgmma_supported(Dh))
    throw std::invalid_argument("attention::backward_mma: the wgmma dK/dV kernel has head width " +
                                std::to_string(Dh) + " (valid: 64)");
  switch (Dh) {
    case 16:
      backward_mma_t<16>(dqkv, delta, ds, dO, O, lse, qkv, alibi_slopes, B, S, H, Hkv, kind);
      break;
    case 32:
      backward_mma_t<32>(dqkv, delta, ds, dO, O, lse, qkv, alibi_slopes, B, S, H, Hkv, kind);
      break;
    case 64:
      backward_mma_t<64>(dqkv, delta, ds, dO, O, lse, qkv, alibi_slopes, B, S, H, Hkv, kind);
      break;
    default:
      throw std::invalid_argument("attention::backward_mma: head_dim " + std::to_string(Dh) +
                                  " has no kernel (16, 32 or 64)");
  }
}

void backward_mma(void* dqkv, bool dqkv_bf16, float* delta, uint16_t* ds, const uint16_t* dO,
                  const uint16_t* O, const float* lse, const uint16_t* qkv,
                  const float* alibi_slopes, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                  int64_t Dh, DkdvKernel dkdv) {
  if (dqkv_bf16)
    backward_mma_d(static_cast<bf16*>(dqkv), delta, ds, dO, O, lse, qkv, alibi_slopes, B, S, H, Hkv,
                   Dh, dkdv);
  else
    backward_mma_d(static_cast<float*>(dqkv), delta, ds, dO, O, lse, qkv, alibi_slopes, B, S, H,
                   Hkv, Dh, dkdv);
}

}  // namespace moeplan::backend::cuda::attention
