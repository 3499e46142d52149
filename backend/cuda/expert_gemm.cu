// Tiled routed-expert products (see expert_gemm.hpp), in two tile heights BM: 64 rows (four warps
// as 2×2) or 128 rows (eight warps as 4×2). Warp w computes the 32×64 part (w/2, w%2) of the
// block's BM×128 output tile through PTX mma.sync m16n8k16 (bf16 in, fp32 accumulate; mma.cuh):
// per 16-deep step two A fragments and four ldmatrix.x4 of B fragments feed sixteen products, and
// the accumulators (2×8 tiles of 16×8) stay in registers until they are written. Operand tiles are
// staged in shared memory in the layout they have in global memory, a transposed operand read by
// ldmatrix.trans; a three-stage cp.async pipeline keeps two depth steps in flight while one
// multiplies.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "async_copy.cuh"
#include "check.hpp"
#include "launch.cuh"
#include "mma.cuh"
#include "moeplan/backend/cuda/expert_gemm.hpp"
#include "pair_store.cuh"

namespace moeplan::backend::cuda::expert_gemm {
namespace {

using bf16 = __nv_bfloat16;

constexpr int BN = int(kCols), BK = int(kDepth);
constexpr int kStages = 3;                // depth steps staged at once (two in flight)
constexpr int WM = 32, WN = BN / 2;       // a warp's part of the output tile
constexpr int FM = WM / 16, FN = WN / 8;  // its 16×8 accumulator tiles
static_assert(BK % 16 == 0 && FN % 2 == 0, "whole mma steps; B fragments in pairs");
// Threads of a block of tile height BM: BM/32 × 2 warps.
template <int BM>
constexpr int kThreads = 32 * (BM / WM) * 2;
// Blocks an SM is asked to hold (__launch_bounds__): two for the 128-row tiles, where ptxas then
// keeps 126–128 registers without spills (at three it spills 100–190 bytes a thread). 0 for the
// 64-row tiles leaves the bound out (no .minnctapersm in the PTX), as measured on the H200 since
// 2026-12-01: ptxas then takes 96 registers, where a bound of 1 lets it take 133–137.
template <int BM>
constexpr int kMinBlocks = BM == 128 ? 2 : 0;
// Shared-memory row strides padded by 8 elements (16 bytes), so the eight 16-byte rows an
// ldmatrix matrix reads fall on different banks (row strides of 80, 144 and 272 bytes) and every
// row stays 16-byte aligned for cp.async and ldmatrix.
constexpr int LD_RK = BK + 8;  // tiles stored [rows or columns][32 depth]
template <int BM>
constexpr int LD_KM = BM + 8;  // A tiles stored [32 depth][BM rows]
constexpr int LD_KN = BN + 8;  // B tiles stored [32 depth][128 columns]

using Acc = float[FM][FN][4];

// One 8-element chunk of a tile row into shared memory at d, from s: by cp.async when `vec` and
// the chunk is whole or the row past the end (zero-filled then, s only a readable address), in
// flight until the caller's commit and wait; else element by element at once, zeros past
// cols_left or for a row past the end.
__device__ __forceinline__ void copy_chunk(uint16_t* d, const uint16_t* s, bool row_valid,
                                           int cols_left, bool vec) {
  if (vec && (!row_valid || cols_left >= 8)) {
    cp_async_16(d, s, row_valid ? 16 : 0);
    return;
  }
  union {
    uint4 v;
    uint16_t h[8];
  } u;
  u.v = make_uint4(0, 0, 0, 0);
  if (row_valid) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (j < cols_left) u.h[j] = s[j];
  }
  *reinterpret_cast<uint4*>(d) = u.v;
}

// dst [ROWS][ld_dst] (shared) = src rows [0, ROWS) × columns [0, COLS) of a bf16 row-major
// matrix with row stride ld; entries at or past (valid_rows, valid_cols) are zero. When `vec`
// (ld a multiple of 8, src 16-byte aligned), whole 16-byte chunks go by cp.async (rows past the
// end zero-filled by it), in flight until the caller's commit and wait; the ragged edge and the
// unaligned case are stored element by element at once.
template <int ROWS, int COLS, int THREADS>
__device__ void load_tile(uint16_t* dst, int ld_dst, const uint16_t* src, int64_t ld,
                          int valid_rows, int valid_cols, bool vec) {
  constexpr int kChunks = COLS / 8, kStride = THREADS / kChunks;  // rows a pass covers
  static_assert(THREADS % kChunks == 0 && ROWS % kStride == 0, "whole passes over the tile");
  if (vec && valid_rows >= ROWS && valid_cols >= COLS) {  // a whole tile: one address step a copy
    const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
    const uint16_t* s = src + int64_t(r0) * ld + c;
    uint16_t* d = dst + r0 * ld_dst + c;
#pragma unroll
    for (int r = 0; r < ROWS; r += kStride) cp_async_16(d + r * ld_dst, s + r * ld, 16);
    return;
  }
  for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    copy_chunk(dst + r * ld_dst + c, r < valid_rows ? src + int64_t(r) * ld + c : src,
               r < valid_rows, valid_cols - c, vec);
  }
}

// load_tile with tile row r read at row(i) + c rather than at src + r·ld, where r is this
// thread's i-th row (r = threadIdx.x / (COLS/8) + i·stride, as load_tile's threads take them) and
// row(i) a row's first element of the tile's columns (any readable, 16-byte aligned address for
// r >= valid_rows). The same shared-memory contents as load_tile of those rows gathered first.
template <int ROWS, int COLS, int THREADS, class Row>
__device__ void load_tile_rows(uint16_t* dst, int ld_dst, Row&& row, int valid_rows, int valid_cols,
                               bool vec) {
  constexpr int kChunks = COLS / 8, kStride = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && ROWS % kStride == 0, "whole passes over the tile");
  const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
#pragma unroll
  for (int i = 0; i < ROWS / kStride; ++i) {
    const int r = r0 + i * kStride;
    copy_chunk(dst + r * ld_dst + c, row(i) + c, r < valid_rows, valid_cols - c, vec);
  }
}
// Rows a thread of load_tile_rows<ROWS, COLS, THREADS> takes.
template <int ROWS, int COLS, int THREADS>
constexpr int kRowsPerThread = ROWS / (THREADS / (COLS / 8));

// The block's operand tiles: A as [BM][32] (rows × depth) or transposed [32][BM]; B as [32][128]
// (depth × columns) or transposed [128][32]. Sized for the larger of each pair.
template <int BM>
struct Tiles {
  static constexpr int kA = (BK * LD_KM<BM> > BM * LD_RK) ? (BK * LD_KM<BM>) : (BM * LD_RK);
  static constexpr int kB = (BK * LD_KN > BN * LD_RK) ? (BK * LD_KN) : (BN * LD_RK);
  static_assert(kA * 2 % 128 == 0 && kB * 2 % 128 == 0,
                "every stage's tile stays 128-byte aligned");
  alignas(128) uint16_t a[kStages][kA];
  alignas(128) uint16_t b[kStages][kB];
};
// 64-row tiles: 46 KiB, within the 48 KiB a launch gets without asking. 128-row tiles: 60 KiB,
// so each of their kernels opts in (opt_in_shared_memory).
static_assert(sizeof(Tiles<64>) <= 48 * 1024, "the 64-row tiles need no opt-in");
// Within the 99 KiB a block may opt in to on compute capability 8.6, 8.9 and 12.x (the least of
// the GPUs a build has code for): no device the tiled paths can run on refuses them.
static_assert(sizeof(Tiles<128>) <= 99 * 1024, "within every 8.0-and-later device's opt-in");

// acc += A_tile · B_tile for this warp's 32×64 part (wm, wn). A_T: A staged [depth][rows];
// B_T: B staged [columns][depth]. Lane l addresses row l % 8 of ldmatrix matrix l / 8:
//   A [rows][depth]: matrices (rows 0–7, depth low), (rows 8–15, low), (0–7, high), (8–15, high),
//     read plain; A [depth][rows]: the same four as (depth, rows) blocks, read transposed;
//   B [columns][depth]: (columns j, depth low), (j, high), (j+1, low), (j+1, high), read plain;
//     B [depth][columns]: the same four as (depth, columns) blocks, read transposed;
// so that registers 0–3 are an A fragment, or the (b0, b1) pairs of column tiles j and j+1.
template <int BM, bool A_T, bool B_T>
__device__ void mma_tile(Acc& acc, const uint16_t* a_tile, const uint16_t* b_tile, int wm, int wn) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    uint32_t fa[FM][4];
#pragma unroll
    for (int i = 0; i < FM; ++i) {
      const int m = wm * WM + i * 16;
      if constexpr (A_T)
        ldsm_x4_trans(fa[i], a_tile + (kk + (mi / 2) * 8 + r) * LD_KM<BM> + m + (mi % 2) * 8);
      else
        ldsm_x4(fa[i], a_tile + (m + (mi % 2) * 8 + r) * LD_RK + kk + (mi / 2) * 8);
    }
#pragma unroll
    for (int j = 0; j < FN; j += 2) {
      const int n = wn * WN + j * 8;
      uint32_t fb[4];
      if constexpr (B_T)
        ldsm_x4(fb, b_tile + (n + (mi / 2) * 8 + r) * LD_RK + kk + (mi % 2) * 8);
      else
        ldsm_x4_trans(fb, b_tile + (kk + (mi % 2) * 8 + r) * LD_KN + n + (mi / 2) * 8);
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        mma16816(acc[i][j], fa[i], fb[0], fb[1]);
        mma16816(acc[i][j + 1], fa[i], fb[2], fb[3]);
      }
    }
  }
}

// steps depth steps through kStages buffers: issue(step, buffer) loads a step's tiles (cp.async
// or plain stores), multiply(buffer) consumes them. Every step commits one group (empty past the
// end), so that waiting for all but the last kStages − 2 groups means this step's tiles have
// landed; the barrier after it also says every warp is done with the buffer refilled next
// (the one the previous step read). One barrier a step.
template <class Issue, class Multiply>
__device__ __forceinline__ void pipeline(int steps, Issue&& issue, Multiply&& multiply) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s, s);
    cp_async_commit();
  }
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = s + kStages - 1;
    if (next < steps) issue(next, next % kStages);
    cp_async_commit();
    multiply(s % kStages);
  }
}

// Writes (or adds) this warp's part to C rows [0, valid_rows) × columns [0, valid_cols) of the
// tile at C (row stride ldc), straight from the accumulators: lane (g, t) holds rows g and g+8,
// columns 2t and 2t+1 of each 16×8 tile.
template <class OutT>
__device__ void store_part(OutT* C, int64_t ldc, const Acc& acc, int wm, int wn, int valid_rows,
                           int valid_cols, bool accumulate) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * WM + i * 16 + g + 8 * h;
      if (r >= valid_rows) continue;
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int c = wn * WN + j * 8 + 2 * t;
        if (c >= valid_cols) continue;
        OutT* p = C + int64_t(r) * ldc + c;
        if (c + 1 < valid_cols)
          put2(p, acc[i][j][2 * h], acc[i][j][2 * h + 1], accumulate);
        else
          put(p, acc[i][j][2 * h], accumulate);
      }
    }
}

__device__ inline void zero(Acc& acc) {
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
}

// Per expert e: tiles = ceil(c_e / BM); written at the exclusive prefix of those counts.
template <int BM>
__global__ void build_row_tiles_kernel(int32_t* map, int32_t* n_tiles, const int32_t* offsets,
                                       int experts) {
  after_previous_grid();
  extern __shared__ int32_t first_tile[];  // experts + 1
  for (int e = threadIdx.x; e < experts; e += blockDim.x)
    first_tile[e + 1] = (offsets[e + 1] - offsets[e] + BM - 1) / BM;
  __syncthreads();
  if (threadIdx.x == 0) {
    first_tile[0] = 0;
    for (int e = 0; e < experts; ++e) first_tile[e + 1] += first_tile[e];
    *n_tiles = first_tile[experts];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const int32_t row0 = offsets[e], end = offsets[e + 1];
    for (int32_t t = first_tile[e], r = row0; r < end; ++t, r += BM) {
      map[3 * t] = e;
      map[3 * t + 1] = r;
      map[3 * t + 2] = end - r < BM ? end - r : BM;
    }
  }
}

// Block (tile, column tile): C rows of the tile = A rows · op(W_e). GATHER: A's row i is row
// gather[i] / gather_div of A (the routed rows read where they lie, not copied first).
template <int BM, bool TRANS_W, class OutT, bool GATHER>
__global__ void __launch_bounds__(kThreads<BM>, kMinBlocks<BM>)
    rows_kernel(OutT* C, const uint16_t* A, const int32_t* gather, int gather_div,
                const uint16_t* const* W, const int32_t* map, const int32_t* n_tiles, int N, int K,
                bool vec_a, bool vec_w, bool accumulate) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  Tiles<BM>& t = *reinterpret_cast<Tiles<BM>*>(raw);
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = map[3 * tile], row0 = map[3 * tile + 1], rows = map[3 * tile + 2];
  const int n0 = blockIdx.y * BN;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  const uint16_t* a = A + int64_t(row0) * K;
  const uint16_t* w = W[e];
  // GATHER: this thread's A rows, found once (the same rows at every depth step).
  constexpr int kMine = kRowsPerThread<BM, BK, kThreads<BM>>;
  [[maybe_unused]] const uint16_t* mine[GATHER ? kMine : 1] = {};
  if constexpr (GATHER) {
#pragma unroll
    for (int i = 0; i < kMine; ++i) {
      const int r = int(threadIdx.x) / (BK / 8) + i * (kThreads<BM> / (BK / 8));
      mine[i] = r < rows ? A + int64_t(gather[row0 + r] / gather_div) * K : A;
    }
  }
  Acc acc;
  zero(acc);
  auto issue = [&](int step, int buf) {  // the tiles of depth step `step` into buffer buf
    const int k0 = step * BK;
    if constexpr (GATHER)
      load_tile_rows<BM, BK, kThreads<BM>>(
          t.a[buf], LD_RK, [&](int i) { return mine[i] + k0; }, rows, K - k0, vec_a);
    else
      load_tile<BM, BK, kThreads<BM>>(t.a[buf], LD_RK, a + k0, K, rows, K - k0, vec_a);
    if constexpr (TRANS_W)  // W_e stored (N, K): the tile [128 columns][32 depth]
      load_tile<BN, BK, kThreads<BM>>(t.b[buf], LD_RK, w + int64_t(n0) * K + k0, K, N - n0, K - k0,
                                      vec_w);
    else  // W_e stored (K, N): the tile [32 depth][128 columns]
      load_tile<BK, BN, kThreads<BM>>(t.b[buf], LD_KN, w + int64_t(k0) * N + n0, N, K - k0, N - n0,
                                      vec_w);
  };
  pipeline((K + BK - 1) / BK, issue,
           [&](int buf) { mma_tile<BM, false, TRANS_W>(acc, t.a[buf], t.b[buf], wm, wn); });
  store_part(C + int64_t(row0) * N + n0, N, acc, wm, wn, rows, N - n0, accumulate);
}

// Block (output tile, expert): G_e tile += Σ over the expert's rows of A^T · B, or = without
// accumulate (an expert without rows then gets zeros). GATHER: A's row i is row
// gather[i] / gather_div of A.
template <int BM, bool GATHER>
__global__ void __launch_bounds__(kThreads<BM>, kMinBlocks<BM>)
    weight_grads_kernel(float* const* G, const uint16_t* A, const int32_t* gather, int gather_div,
                        const uint16_t* B, const int32_t* offsets, int M, int N, int tiles_n,
                        bool vec_a, bool vec_b, bool accumulate) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  Tiles<BM>& t = *reinterpret_cast<Tiles<BM>*>(raw);
  const int e = blockIdx.y;
  const int r0 = offsets[e], r1 = offsets[e + 1];
  if (r1 == r0 && accumulate) return;
  const int m0 = (blockIdx.x / tiles_n) * BM, n0 = (blockIdx.x % tiles_n) * BN;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  Acc acc;
  zero(acc);
  auto issue = [&](int step, int buf) {
    const int k0 = r0 + step * BK;
    // A rows [k0, k0+32) × columns [m0, m0+BM): the transposed operand, staged [depth][rows]
    if constexpr (GATHER) {
      constexpr int kStride = kThreads<BM> / (BM / 8);
      const int r0 = int(threadIdx.x) / (BM / 8);
      load_tile_rows<BK, BM, kThreads<BM>>(
          t.a[buf], LD_KM<BM>,
          [&](int i) {
            const int r = k0 + r0 + i * kStride;
            return r < r1 ? A + int64_t(gather[r] / gather_div) * M + m0 : A;
          },
          r1 - k0, M - m0, vec_a);
    } else {
      load_tile<BK, BM, kThreads<BM>>(t.a[buf], LD_KM<BM>, A + int64_t(k0) * M + m0, M, r1 - k0,
                                      M - m0, vec_a);
    }
    load_tile<BK, BN, kThreads<BM>>(t.b[buf], LD_KN, B + int64_t(k0) * N + n0, N, r1 - k0, N - n0,
                                    vec_b);
  };
  pipeline((r1 - r0 + BK - 1) / BK, issue,
           [&](int buf) { mma_tile<BM, true, false>(acc, t.a[buf], t.b[buf], wm, wn); });
  store_part(G[e] + int64_t(m0) * N + n0, N, acc, wm, wn, M - m0, N - n0, accumulate);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int64_t ceil_to(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

void check_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) throw std::logic_error(std::string("expert_gemm: ") + what);
}

void check_tile_rows(int64_t tile_rows) {
  if (tile_rows != 64 && tile_rows != 128)
    throw std::logic_error("expert_gemm: tile rows " + std::to_string(tile_rows) +
                           " (valid: 64, 128)");
}

template <int BM, bool TRANS_W, class OutT, bool GATHER>
void launch_rows(dim3 grid, OutT* C, const uint16_t* A, const int32_t* gather, int gather_div,
                 const uint16_t* const* W, const int32_t* map, const int32_t* n_tiles, int N, int K,
                 bool vec_a, bool vec_w, bool accumulate) {
  opt_in_shared_memory<rows_kernel<BM, TRANS_W, OutT, GATHER>, sizeof(Tiles<BM>)>(
      "cudaFuncSetAttribute (expert_gemm shared memory)");
  launch_kernel(rows_kernel<BM, TRANS_W, OutT, GATHER>, {grid, kThreads<BM>, sizeof(Tiles<BM>)}, C,
                A, gather, gather_div, W, map, n_tiles, N, K, vec_a, vec_w, accumulate);
}

// Gathered A only with W untransposed (the forward's first product; none other reads routed
// rows where they lie): the instantiations a build needs.
template <int BM, class OutT>
void launch_rows(dim3 grid, bool trans_w, OutT* C, const uint16_t* A, const int32_t* gather,
                 int gather_div, const uint16_t* const* W, const int32_t* map,
                 const int32_t* n_tiles, int N, int K, bool vec_a, bool vec_w, bool accumulate) {
  if (gather && trans_w)
    throw std::logic_error("expert_gemm::rows: gathered rows with a transposed W");
  if (gather)
    launch_rows<BM, false, OutT, true>(grid, C, A, gather, gather_div, W, map, n_tiles, N, K, vec_a,
                                       vec_w, accumulate);
  else if (trans_w)
    launch_rows<BM, true, OutT, false>(grid, C, A, nullptr, 1, W, map, n_tiles, N, K, vec_a, vec_w,
                                       accumulate);
  else
    launch_rows<BM, false, OutT, false>(grid, C, A, nullptr, 1, W, map, n_tiles, N, K, vec_a, vec_w,
                                        accumulate);
}

template <int BM, bool GATHER>
void launch_weight_grads(float* const* G, const uint16_t* A, const int32_t* gather, int gather_div,
                         const uint16_t* B, const int32_t* offsets, int64_t experts, int64_t M,
                         int64_t N, bool vec_a, bool vec_b, bool accumulate) {
  const int64_t tiles_n = (N + BN - 1) / BN, tiles = (M + BM - 1) / BM * tiles_n;
  opt_in_shared_memory<weight_grads_kernel<BM, GATHER>, sizeof(Tiles<BM>)>(
      "cudaFuncSetAttribute (expert_gemm shared memory)");
  launch_kernel(weight_grads_kernel<BM, GATHER>,
                {dim3(unsigned(tiles), unsigned(experts)), kThreads<BM>, sizeof(Tiles<BM>)}, G, A,
                gather, gather_div, B, offsets, int(M), int(N), int(tiles_n), vec_a, vec_b,
                accumulate);
}

}  // namespace

int64_t max_row_tiles(int64_t routed_rows, int64_t experts, int64_t tile_rows) {
  check_tile_rows(tile_rows);
  return (routed_rows + (tile_rows - 1) * experts) / tile_rows;
}

void build_row_tiles(int32_t* tile_map, int32_t* n_tiles, const int32_t* offsets, int64_t experts,
                     int64_t tile_rows) {
  check_int(experts, "expert count");
  check_tile_rows(tile_rows);
  const size_t shared = size_t(experts + 1) * 4;
  if (tile_rows == 64)
    launch_kernel(build_row_tiles_kernel<64>, {1, 256, shared}, tile_map, n_tiles, offsets,
                  int(experts));
  else
    launch_kernel(build_row_tiles_kernel<128>, {1, 256, shared}, tile_map, n_tiles, offsets,
                  int(experts));
  check_launch("build_row_tiles");
}

void rows(void* C, bool c_bf16, const uint16_t* A, const uint16_t* const* W, bool trans_w,
          const int32_t* tile_map, const int32_t* n_tiles, int64_t max_tiles, int64_t N, int64_t K,
          int64_t tile_rows, const int32_t* gather, int64_t gather_div, bool accumulate) {
  check_tile_rows(tile_rows);
  if (max_tiles == 0 || N == 0) return;
  if (accumulate && c_bf16) throw std::logic_error("expert_gemm::rows: adding into a bf16 C");
  check_int(N, "N");
  check_int(K, "K");
  check_int(max_tiles, "tile count");
  check_int(gather_div - 1, "gather divisor");
  const int gd = int(gather_div);
  // The weight pointers are checked where their tables are built (the caller's job: every W_e
  // 16-byte aligned when its row length, K transposed or N, is a multiple of 8). A and W are
  // copied 16 bytes at a time each where its own rows allow (the router's products: rows of E
  // 66 logits on one side, of 512 on the other).
  const bool vec_a = K % 8 == 0 && aligned16(A), vec_w = (trans_w ? K : N) % 8 == 0;
  const dim3 grid(unsigned(max_tiles), unsigned((N + BN - 1) / BN));
  const int n = int(N), k = int(K);
  const bool r64 = tile_rows == 64;
  if (c_bf16) {
    bf16* c = static_cast<bf16*>(C);
    if (r64)
      launch_rows<64>(grid, trans_w, c, A, gather, gd, W, tile_map, n_tiles, n, k, vec_a, vec_w,
                      accumulate);
    else
      launch_rows<128>(grid, trans_w, c, A, gather, gd, W, tile_map, n_tiles, n, k, vec_a, vec_w,
                       accumulate);
  } else {
    float* c = static_cast<float*>(C);
    if (r64)
      launch_rows<64>(grid, trans_w, c, A, gather, gd, W, tile_map, n_tiles, n, k, vec_a, vec_w,
                      accumulate);
    else
      launch_rows<128>(grid, trans_w, c, A, gather, gd, W, tile_map, n_tiles, n, k, vec_a, vec_w,
                       accumulate);
  }
  check_launch("expert_gemm::rows");
}

void weight_grads(float* const* G, const uint16_t* A, const uint16_t* B, const int32_t* offsets,
                  int64_t experts, int64_t M, int64_t N, int64_t tile_rows, bool accumulate,
                  const int32_t* gather, int64_t gather_div) {
  check_tile_rows(tile_rows);
  if (experts == 0 || M == 0 || N == 0) return;
  check_int(M, "M");
  check_int(N, "N");
  check_int(experts, "expert count");
  check_int(gather_div - 1, "gather divisor");
  const int gd = int(gather_div);
  // A gathered reads rows of M at the gathered places: whole 16-byte copies need M % 8 there too.
  const bool vec_a = M % 8 == 0 && aligned16(A), vec_b = N % 8 == 0 && aligned16(B);
  if (tile_rows == 64 && gather)
    launch_weight_grads<64, true>(G, A, gather, gd, B, offsets, experts, M, N, vec_a, vec_b,
                                  accumulate);
  else if (tile_rows == 64)
    launch_weight_grads<64, false>(G, A, nullptr, 1, B, offsets, experts, M, N, vec_a, vec_b,
                                   accumulate);
  else if (gather)
    launch_weight_grads<128, true>(G, A, gather, gd, B, offsets, experts, M, N, vec_a, vec_b,
                                   accumulate);
  else
    launch_weight_grads<128, false>(G, A, nullptr, 1, B, offsets, experts, M, N, vec_a, vec_b,
                                    accumulate);
  check_launch("expert_gemm::weight_grads");
}

namespace {
void check_depth(int64_t depth) {
  if (depth != kDepth && depth != kWgmmaDepth)
    throw std::logic_error("expert_gemm: depth step " + std::to_string(depth) + " (valid: " +
                           std::to_string(kDepth) + ", " + std::to_string(kWgmmaDepth) + ")");
}
}  // namespace

int64_t executed_row_product_flops(const int32_t* counts, int64_t experts, int64_t N, int64_t K,
                                   int64_t tile_rows, int64_t depth) {
  check_tile_rows(tile_rows);
  check_depth(depth);
  int64_t rows = 0;
  for (int64_t e = 0; e < experts; ++e) rows += ceil_to(counts[e], tile_rows);
  return 2 * rows * ceil_to(N, BN) * ceil_to(K, depth);
}

int64_t executed_weight_grad_flops(const int32_t* counts, int64_t experts, int64_t M, int64_t N,
                                   int64_t tile_rows, int64_t depth) {
  check_tile_rows(tile_rows);
  check_depth(depth);
  int64_t walked = 0;
  for (int64_t e = 0; e < experts; ++e) walked += ceil_to(counts[e], depth);
  return 2 * ceil_to(M, tile_rows) * ceil_to(N, BN) * walked;
}

}  // namespace moeplan::backend::cuda::expert_gemm
