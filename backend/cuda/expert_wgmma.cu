// Routed-expert products on Hopper's warpgroup MMA (wgmma.mma_async; sm_90a only: this file is
// compiled for that target alone, see CMakeLists.txt). The same products as expert_gemm.cu's
// tiled kernels (expert_gemm.hpp), in block tiles of 128 rows × 128 columns: two warpgroups,
// each 64 rows × 128 columns of fp32 accumulators (64 registers a thread), walking the depth 64
// at a time. Each step's operand tiles are staged by cp.async from every thread of the block into
// one of three shared-memory buffers (32 KiB each, 96 KiB a block, two blocks an SM), one step
// ahead; the products of a step (four m64n128k16 a warpgroup) run asynchronously while the next
// step's copies land, and only the step before them is waited for. One barrier a step. Two other
// pipelines, for a GPU run to time against it (MOEPLAN_WGMMA_STAGES, pipeline() below): four
// buffers, two steps ahead, one block an SM; or three buffers two steps ahead, each step's
// products done before the next step begins.
//
// Tiles are staged in no-swizzle core matrices (wgmma.cuh): 16-byte chunk c of a stage's tile
// lies at byte 16·c, so consecutive threads write consecutive chunks (no bank conflicts), and
//   K-major tile (rows × 64 depth): chunk c holds row 8·(c / 64) + c % 8, depth 8·((c / 8) % 8):
//     LBO 128 bytes, SBO 1024;
//   MN-major tile (64 depth × 128 columns): chunk c holds depth row 8·(c / 128) + c % 8, columns
//     8·((c / 8) % 16): LBO 2048 bytes, SBO 128.
// The routed rows' tile and a transposed weight's are K-major; an untransposed weight's, and both
// operands of a weight gradient (whose depth is the routed rows), are MN-major.
//
// The depth sum's order differs from the mma.sync kernels' (the hardware's own order within a
// 16-deep product), so results are held to a double-precision reference by tolerance, not to
// the tiled kernels' bits. Every block still owns its output tile and walks the depth in a fixed
// order: repeatable, bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "async_copy.cuh"
#include "check.hpp"
#include "launch.cuh"
#include "moeplan/backend/cuda/expert_gemm.hpp"
#include "pair_store.cuh"
#include "wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(MOEPLAN_CUDA_EMULATION) && \
    !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "expert_wgmma.cu uses wgmma: compile it for sm_90a only"
#endif

namespace moeplan::backend::cuda::expert_gemm {
namespace {

using bf16 = __nv_bfloat16;

constexpr int TM = 128, TN = int(kCols), TK = int(kWgmmaDepth);  // block tile
constexpr int kThreads = 256;                                    // two warpgroups
constexpr int kChunks = TM * TK / 8;  // 16-byte chunks of a stage's tile (either operand)
static_assert(TN == 128 && TK == 64 && TM * TK == TK * TN, "both operand tiles 128 × 64");
static_assert(kChunks % kThreads == 0, "whole passes over a tile");
constexpr int kPerThread = kChunks / kThreads;  // 4

// S stages of both operand tiles: 3 (96 KiB, two blocks an SM; the default) or 4 (128 KiB, one
// block an SM, the copies two steps ahead; MOEPLAN_WGMMA_STAGES=4, a tuning variable).
template <int S>
struct Tiles {
  alignas(128) uint16_t a[S][TM * TK];
  alignas(128) uint16_t b[S][TK * TN];
};
static_assert(sizeof(Tiles<3>) == 96 * 1024, "two blocks an SM (227 KiB)");
static_assert(sizeof(Tiles<4>) == 128 * 1024, "one block an SM");
template <int S>
constexpr int kMinBlocks = S == 3 ? 2 : 1;

// A K-major tile's chunk c: row and depth (in elements) within the tile.
__device__ __forceinline__ int kmajor_row(int c) {
  return (c / TK) * 8 + c % 8;
}
__device__ __forceinline__ int kmajor_depth(int c) {
  return ((c / 8) % (TK / 8)) * 8;
}
// An MN-major tile's chunk c: depth row and first column within the tile.
__device__ __forceinline__ int mnmajor_depth(int c) {
  return (c / TN) * 8 + c % 8;
}
__device__ __forceinline__ int mnmajor_col(int c) {
  return ((c / 8) % (TN / 8)) * 8;
}

constexpr uint32_t kKMajorLBO = 128, kKMajorSBO = TK * 16;  // bytes
constexpr uint32_t kMNMajorLBO = TN * 16, kMNMajorSBO = 128;

// The descriptors' byte steps for the two operands (set by the host: layout_strides).
struct Strides {
  uint32_t a_lbo, a_sbo, b_lbo, b_sbo;
};

// This warpgroup's four products of a stage: acc += A (rows 64·wg.., 64 depth) · B (64 depth,
// 128 columns). A_MN / B_MN: the tile is MN-major.
template <bool A_MN, bool B_MN>
__device__ __forceinline__ void multiply_stage(float (&acc)[64], const uint16_t* a,
                                               const uint16_t* b, int wg, const Strides& st) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < TK; kk += 16) {
    // Element offsets of the first core matrix each operand's product starts at.
    const int a_off =
        A_MN ? ((kk / 8) * (TM / 8) + wg * 8) * 64 : (wg * 8 * (TK / 8) + kk / 8) * 64;
    const int b_off = B_MN ? (kk / 8) * (TN / 8) * 64 : (kk / 8) * 64;
    const uint64_t da = smem_desc(a + a_off, st.a_lbo, st.a_sbo);
    const uint64_t db = smem_desc(b + b_off, st.b_lbo, st.b_sbo);
    wgmma_m64n128k16<A_MN ? 1 : 0, B_MN ? 1 : 0>(acc, da, db, 1);
  }
  wgmma_commit();
}

// steps depth steps through S buffers: issue(step, buffer) stages a step's tiles by cp.async
// (one group a step, P = S − 1 − FLIGHT steps ahead), then the warpgroups multiply, and each
// waits until at most FLIGHT of its steps' products are still running (1: a step's products
// overlap the next step's issue; 0: they end first). At step s, after the barrier, every thread
// has waited for the products of step s − 1 − FLIGHT, so the buffer they read, (s + P) % S, is
// refilled with step s + P.
template <bool A_MN, bool B_MN, int S, int FLIGHT, class Issue>
__device__ __forceinline__ void mainloop(float (&acc)[64], Tiles<S>& t, int steps,
                                         const Strides& st, Issue&& issue) {
  static_assert(FLIGHT == 0 || FLIGHT == 1, "products in flight across a step: none or one");
  constexpr int P = S - 1 - FLIGHT;
  static_assert(P >= 1, "copies at least a step ahead");
  const int wg = int(threadIdx.x) / 128;
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  fence_accumulators(acc);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (p < steps) issue(p, p);
    cp_async_commit();
  }
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<P - 1>();  // this thread's copies of step s have landed
    fence_proxy_async();     // ... and are visible to wgmma's reads
    __syncthreads();         // everyone's; and every warpgroup is done with step s − 2's products
    if (s + P < steps) issue(s + P, (s + P) % S);
    cp_async_commit();
    multiply_stage<A_MN, B_MN>(acc, t.a[s % S], t.b[s % S], wg, st);
    wgmma_wait<FLIGHT>();  // step s − FLIGHT's products are done
    fence_accumulators(acc);
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
}

// Writes (or adds) the block's accumulators to C rows [0, valid_rows) × columns [0, valid_cols)
// of the tile at C (row stride ldc): thread (warpgroup wg, warp w in it, lane 4g + t) holds row
// 64·wg + 16·w + g + 8·((i/2)%2), column 8·(i/4) + 2t + i%2 as acc[i].
template <class OutT>
__device__ void store_tile(OutT* C, int64_t ldc, const float (&acc)[64], int valid_rows,
                           int valid_cols, bool accumulate) {
  const int wg = int(threadIdx.x) / 128, w = (int(threadIdx.x) / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wg * 64 + w * 16 + g + 8 * h;
    if (r >= valid_rows) continue;
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) {
      const int c = j * 8 + 2 * t;
      if (c >= valid_cols) continue;
      OutT* p = C + int64_t(r) * ldc + c;
      const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if (c + 1 < valid_cols)
        put2(p, v0, v1, accumulate);
      else
        put(p, v0, accumulate);
    }
  }
}

// Block (tile, column tile): C rows of the tile = A rows · op(W_e), as expert_gemm's rows_kernel.
// K and N are multiples of 8 and every operand 16-byte aligned (checked by the host).
template <bool TRANS_W, class OutT, bool GATHER, int S, int FLIGHT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<S>)
    wgmma_rows_kernel(OutT* C, const uint16_t* A, const int32_t* gather, int gather_div,
                      const uint16_t* const* W, const int32_t* map, const int32_t* n_tiles, int N,
                      int K, Strides st) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  Tiles<S>& t = *reinterpret_cast<Tiles<S>*>(raw);
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int e = map[3 * tile], row0 = map[3 * tile + 1], rows = map[3 * tile + 2];
  const int n0 = blockIdx.y * TN;
  const uint16_t* w = W[e];
  // This thread's A rows (the same at every depth step), found once: row kmajor_row(c) of the
  // tile for its chunks c = threadIdx.x + i·256.
  const uint16_t* mine[kPerThread];
  bool mine_valid[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int r = kmajor_row(int(threadIdx.x) + i * kThreads);
    mine_valid[i] = r < rows;
    const int64_t src = !mine_valid[i] ? 0 : GATHER ? gather[row0 + r] / gather_div : row0 + r;
    mine[i] = A + src * K;
  }
  auto issue = [&](int step, int buf) {
    const int k0 = step * TK;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = int(threadIdx.x) + i * kThreads;
      const int k = k0 + kmajor_depth(c);
      const bool ok = mine_valid[i] && k < K;
      cp_async_16(t.a[buf] + 8 * c, ok ? mine[i] + k : A, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = int(threadIdx.x) + i * kThreads;
      if constexpr (TRANS_W) {  // W_e stored (N, K): K-major, its rows the output columns
        const int n = n0 + kmajor_row(c), k = k0 + kmajor_depth(c);
        const bool ok = n < N && k < K;
        cp_async_16(t.b[buf] + 8 * c, ok ? w + int64_t(n) * K + k : w, ok ? 16 : 0);
      } else {  // W_e stored (K, N): N-major
        const int k = k0 + mnmajor_depth(c), n = n0 + mnmajor_col(c);
        const bool ok = k < K && n < N;
        cp_async_16(t.b[buf] + 8 * c, ok ? w + int64_t(k) * N + n : w, ok ? 16 : 0);
      }
    }
  };
  float acc[64];
  mainloop<false, !TRANS_W, S, FLIGHT>(acc, t, (K + TK - 1) / TK, st, issue);
  store_tile(C + int64_t(row0) * N + n0, N, acc, rows, N - n0, false);
}

// Block (output tile, expert): G_e tile (+)= Σ over the expert's rows of A^T · B, as
// expert_gemm's weight_grads_kernel. M and N multiples of 8, operands 16-byte aligned.
template <bool GATHER, int S, int FLIGHT>
__global__ void __launch_bounds__(kThreads, kMinBlocks<S>)
    wgmma_weight_grads_kernel(float* const* G, const uint16_t* A, const int32_t* gather,
                              int gather_div, const uint16_t* B, const int32_t* offsets, int M,
                              int N, int tiles_n, bool accumulate, Strides st) {
  after_previous_grid();
  extern __shared__ __align__(128) unsigned char raw[];
  Tiles<S>& t = *reinterpret_cast<Tiles<S>*>(raw);
  const int e = blockIdx.y;
  const int r0 = offsets[e], r1 = offsets[e + 1];
  if (r1 == r0 && accumulate) return;
  const int m0 = (blockIdx.x / tiles_n) * TM, n0 = (blockIdx.x % tiles_n) * TN;
  auto issue = [&](int step, int buf) {
    const int k0 = r0 + step * TK;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int c = int(threadIdx.x) + i * kThreads;
      const int r = k0 + mnmajor_depth(c), col = mnmajor_col(c);
      const bool row_ok = r < r1;
      // A rows [k0, k0 + 64) × columns [m0, m0 + 128): the M-major operand A^T
      const int m = m0 + col;
      const bool a_ok = row_ok && m < M;
      const int64_t src = !a_ok ? 0 : GATHER ? gather[r] / gather_div : r;
      cp_async_16(t.a[buf] + 8 * c, a_ok ? A + src * M + m : A, a_ok ? 16 : 0);
      const int n = n0 + col;
      const bool b_ok = row_ok && n < N;
      cp_async_16(t.b[buf] + 8 * c, b_ok ? B + int64_t(r) * N + n : B, b_ok ? 16 : 0);
    }
  };
  float acc[64];
  mainloop<true, true, S, FLIGHT>(acc, t, (r1 - r0 + TK - 1) / TK, st, issue);
  store_tile(G[e] + int64_t(m0) * N + n0, N, acc, M - m0, N - n0, accumulate);
}

// The descriptors' strides, exchanged where MOEPLAN_WGMMA_SWAP says (wgmma.cuh).
Strides layout_strides(bool a_mn, bool b_mn) {
  const auto pick = [&](bool mn, uint32_t& lbo, uint32_t& sbo) {
    lbo = mn ? kMNMajorLBO : kKMajorLBO;
    sbo = mn ? kMNMajorSBO : kKMajorSBO;
    wgmma_strides(mn, lbo, sbo);
  };
  Strides st{};
  pick(a_mn, st.a_lbo, st.a_sbo);
  pick(b_mn, st.b_lbo, st.b_sbo);
  return st;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void check_int(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) throw std::logic_error(std::string("expert_gemm (wgmma): ") + what);
}

// The pipeline, MOEPLAN_WGMMA_STAGES (a tuning variable for a GPU run that times each; it says
// so on stderr when set):
//   3 (the default): three stages (96 KiB, two blocks an SM), copies one step ahead, a step's
//     products still running while the next step's are issued;
//   4: four stages (128 KiB, one block an SM), copies two steps ahead, likewise;
//   3w0: three stages, copies two steps ahead, each step's products done before the next
//     step's barrier (the other warpgroups of the SM fill the gap).
enum class Pipe { s3, s4, s3w0 };
Pipe pipeline() {
  static const Pipe p = [] {
    const char* v = std::getenv("MOEPLAN_WGMMA_STAGES");
    const std::string s = v ? v : "";
    if (s.empty() || s == "3") return Pipe::s3;
    if (s != "4" && s != "3w0")
      throw std::invalid_argument("MOEPLAN_WGMMA_STAGES=" + s + " (valid: 3, 4, 3w0)");
    std::fprintf(stderr, "MOEPLAN_WGMMA_STAGES=%s: wgmma expert kernels with %s\n", s.c_str(),
                 s == "4" ? "4 stages" : "3 stages, copies two steps ahead");
    return s == "4" ? Pipe::s4 : Pipe::s3w0;
  }();
  return p;
}
// f(stages, products in flight) with the pipeline's constants.
template <class F>
void with_pipeline(F&& f) {
  switch (pipeline()) {
    case Pipe::s4:
      return f(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{});
    case Pipe::s3w0:
      return f(std::integral_constant<int, 3>{}, std::integral_constant<int, 0>{});
    case Pipe::s3:
      break;
  }
  f(std::integral_constant<int, 3>{}, std::integral_constant<int, 1>{});
}

template <bool TRANS_W, class OutT, bool GATHER>
void launch_rows(dim3 grid, OutT* C, const uint16_t* A, const int32_t* gather, int gather_div,
                 const uint16_t* const* W, const int32_t* map, const int32_t* n_tiles, int N,
                 int K) {
  with_pipeline([&](auto S, auto flight) {
    constexpr auto kernel = wgmma_rows_kernel<TRANS_W, OutT, GATHER, S, flight>;
    opt_in_shared_memory<kernel, sizeof(Tiles<S>)>(
        "cudaFuncSetAttribute (expert_gemm wgmma shared memory)");
    launch_kernel(kernel, {grid, kThreads, sizeof(Tiles<S>)}, C, A, gather, gather_div, W, map,
                  n_tiles, N, K, layout_strides(false, !TRANS_W));
  });
}

template <bool GATHER>
void launch_weight_grads(dim3 grid, float* const* G, const uint16_t* A, const int32_t* gather,
                         int gather_div, const uint16_t* B, const int32_t* offsets, int M, int N,
                         int tiles_n, bool accumulate, Strides st) {
  with_pipeline([&](auto S, auto flight) {
    constexpr auto kernel = wgmma_weight_grads_kernel<GATHER, S, flight>;
    opt_in_shared_memory<kernel, sizeof(Tiles<S>)>(
        "cudaFuncSetAttribute (expert_gemm wgmma shared memory)");
    launch_kernel(kernel, {grid, kThreads, sizeof(Tiles<S>)}, G, A, gather, gather_div, B, offsets,
                  M, N, tiles_n, accumulate, st);
  });
}

template <class OutT>
void launch_rows(dim3 grid, bool trans_w, OutT* C, const uint16_t* A, const int32_t* gather,
                 int gather_div, const uint16_t* const* W, const int32_t* map,
                 const int32_t* n_tiles, int N, int K) {
  if (gather && trans_w)
    throw std::logic_error("expert_gemm::rows_wgmma: gathered rows with a transposed W");
  if (gather)
    launch_rows<false, OutT, true>(grid, C, A, gather, gather_div, W, map, n_tiles, N, K);
  else if (trans_w)
    launch_rows<true, OutT, false>(grid, C, A, nullptr, 1, W, map, n_tiles, N, K);
  else
    launch_rows<false, OutT, false>(grid, C, A, nullptr, 1, W, map, n_tiles, N, K);
}

}  // namespace

void rows_wgmma(void* C, bool c_bf16, const uint16_t* A, const uint16_t* const* W, bool trans_w,
                const int32_t* tile_map, const int32_t* n_tiles, int64_t max_tiles, int64_t N,
                int64_t K, const int32_t* gather, int64_t gather_div) {
  if (max_tiles == 0 || N == 0) return;
  check_int(N, "N");
  check_int(K, "K");
  check_int(max_tiles, "tile count");
  check_int(gather_div - 1, "gather divisor");
  // C takes pair stores, which fall back to single ones where a pair is not aligned: any C will
  // do. A is read in 16-byte copies.
  if (K % 8 != 0 || N % 8 != 0 || !aligned16(A))
    throw std::logic_error("expert_gemm::rows_wgmma: K " + std::to_string(K) + " and N " +
                           std::to_string(N) + " must be multiples of 8, and A 16-byte aligned");
  const dim3 grid(unsigned(max_tiles), unsigned((N + TN - 1) / TN));
  const int n = int(N), k = int(K), gd = int(gather_div);
  if (c_bf16)
    launch_rows(grid, trans_w, static_cast<bf16*>(C), A, gather, gd, W, tile_map, n_tiles, n, k);
  else
    launch_rows(grid, trans_w, static_cast<float*>(C), A, gather, gd, W, tile_map, n_tiles, n, k);
  check_launch("expert_gemm::rows_wgmma");
}

void weight_grads_wgmma(float* const* G, const uint16_t* A, const uint16_t* B,
                        const int32_t* offsets, int64_t experts, int64_t M, int64_t N,
                        bool accumulate, const int32_t* gather, int64_t gather_div) {
  if (experts == 0 || M == 0 || N == 0) return;
  check_int(M, "M");
  check_int(N, "N");
  check_int(experts, "expert count");
  check_int(gather_div - 1, "gather divisor");
  if (M % 8 != 0 || N % 8 != 0 || !aligned16(A) || !aligned16(B))
    throw std::logic_error("expert_gemm::weight_grads_wgmma: M " + std::to_string(M) + " and N " +
                           std::to_string(N) +
                           " must be multiples of 8, and A and B 16-byte aligned");
  const int64_t tiles_n = (N + TN - 1) / TN, tiles = (M + TM - 1) / TM * tiles_n;
  const dim3 grid{unsigned(tiles), unsigned(experts)};
  const int gd = int(gather_div);
  const Strides st = layout_strides(true, true);
  if (gather)
    launch_weight_grads<true>(grid, G, A, gather, gd, B, offsets, int(M), int(N), int(tiles_n),
                              accumulate, st);
  else
    launch_weight_grads<false>(grid, G, A, nullptr, 1, B, offsets, int(M), int(N), int(tiles_n),
                               accumulate, st);
  check_launch("expert_gemm::weight_grads_wgmma");
}

}  // namespace moeplan::backend::cuda::expert_gemm
