#pragma once
// The routed experts' matrix products as our own tiled kernels (bf16 inputs, fp32 accumulation on
// tensor cores through PTX mma.sync), reading the per-expert row ranges from the device: no host
// wait for the routed counts, no pointer tables per step, results written straight in their final
// type (bf16, fp32, or added to fp32 weight gradients), and one shape per launch whatever the
// routing.
//
// The rows are the routed assignments sorted by expert (kernels::sort_by_expert): expert e owns
// rows [offsets[e], offsets[e+1]). Every block owns its output tile and walks the depth in a fixed
// order: no atomics, bit-for-bit repeatable.
//
// Tiles: 64 or 128 rows (tile_rows below) × 128 columns × 32 depth. The 64-row tiles (4 warps,
// 46 KiB of shared memory) are the default, measured on an H200; the 128-row tiles (8 warps,
// 60 KiB, opted in per kernel) halve the operand traffic per product where Nsight Compute found
// the 64-row kernels bound by L2 (2026-12-04) and are chosen with --kernels experts=tiled128. The
// ledger books the products' own shapes under `expert` (as the CPU does) and what the tiles
// execute beyond them (rows of an expert's last tile, depth past the last routed row of a weight
// gradient) under `padding`, from the counts read after the step: executed_*_flops below.
#include <cstdint>

#include "moeplan/backend/cuda/device.hpp"

namespace moeplan::backend::cuda::expert_gemm {

// Rows (or weight-gradient output rows) of a block tile: every function below takes one of
// these as tile_rows (anything else is a logic_error); a layer's tile map and its products use
// the same.
constexpr int64_t kTileRows[] = {64, 128};
constexpr int64_t kCols = 128;  // output columns of a block tile
constexpr int64_t kDepth = 32;  // depth step

// Tiles a row product launches over, at most: with t tile rows, Σ_e ceil(c_e/t) ≤ (R + (t−1)·E)/t.
// The 64-row bound is the larger; a buffer sized for it serves both.
int64_t max_row_tiles(int64_t routed_rows, int64_t experts, int64_t tile_rows);

// tile_map (3·max_tiles int32: expert, first row, rows) and n_tiles (1 int32), from offsets
// (E+1, device). Built once per MoE layer and step; every row product of the layer uses it.
void build_row_tiles(int32_t* tile_map, int32_t* n_tiles, const int32_t* offsets, int64_t experts,
                     int64_t tile_rows);

// C (R, N) = A (R, K) · op(W_e) for the rows of every expert. A bf16 row-major (ld K); W: device
// array of E device pointers to bf16 matrices, (K, N) row-major, or with trans_w (N, K) row-major
// (the product uses its transpose); C row-major (ld N), bf16 when c_bf16 else fp32, overwritten.
// With `gather` (device, R int32; W untransposed only): A's row i is row gather[i] / gather_div
// of A, e.g. the routed rows read from the tokens' rows (sort_by_expert's sorted, divided by
// top-K) instead of a gathered copy: the same products, the same bits. With `accumulate` (fp32
// C only) the products are added to C instead (the router's input gradient, added to dln).
// Any K and N: a side whose rows are not whole 16-byte words (the router's E logits) is staged
// element by element.
void rows(void* C, bool c_bf16, const uint16_t* A, const uint16_t* const* W, bool trans_w,
          const int32_t* tile_map, const int32_t* n_tiles, int64_t max_tiles, int64_t N, int64_t K,
          int64_t tile_rows, const int32_t* gather = nullptr, int64_t gather_div = 1,
          bool accumulate = false);

// G_e (M, N) fp32 row-major += A_e^T · B_e for every expert e with rows: A (R, M) and B (R, N)
// bf16 row-major; G: device array of E device pointers. Experts without rows are not touched.
// Without accumulate, G_e = A_e^T · B_e for every expert, zeros for one without rows (the step's
// first writer of the gradients: nothing zeroes them before).
// With `gather`, A's row i is row gather[i] / gather_div of A (as in rows).
void weight_grads(float* const* G, const uint16_t* A, const uint16_t* B, const int32_t* offsets,
                  int64_t experts, int64_t M, int64_t N, int64_t tile_rows, bool accumulate = true,
                  const int32_t* gather = nullptr, int64_t gather_div = 1);

// The same two products on Hopper's warpgroup MMA (wgmma, expert_wgmma.cu): tiles of 128 rows
// (the tile map built with tile_rows 128) × 128 columns × 64 depth, two warpgroups a block, the
// operands staged by cp.async. Compiled for sm_90a alone, so they run on compute capability 9.0
// only (wgmma_supported). Their depth sums run in another order than the mma.sync kernels', so
// the results agree with rows/weight_grads within rounding, not bit for bit. K (or M) and N
// must be multiples of 8 and A, B 16-byte aligned (a logic_error otherwise).
constexpr int64_t kWgmmaDepth = 64;
constexpr bool wgmma_supported(int compute_major, int compute_minor) {
  return compute_major == 9 && compute_minor == 0;
}
void rows_wgmma(void* C, bool c_bf16, const uint16_t* A, const uint16_t* const* W, bool trans_w,
                const int32_t* tile_map, const int32_t* n_tiles, int64_t max_tiles, int64_t N,
                int64_t K, const int32_t* gather = nullptr, int64_t gather_div = 1);
void weight_grads_wgmma(float* const* G, const uint16_t* A, const uint16_t* B,
                        const int32_t* offsets, int64_t experts, int64_t M, int64_t N,
                        bool accumulate = true, const int32_t* gather = nullptr,
                        int64_t gather_div = 1);

// What the kernels execute (2 FLOPs per multiply-add, zero-filled tile parts included), from the
// routed row count of each expert, with t tile rows and a depth step of d (kDepth for the
// mma.sync kernels, kWgmmaDepth for the wgmma ones). Row product: 2·Σ_e ceil_t(c_e)·ceil128(N)·
// ceil_d(K).
int64_t executed_row_product_flops(const int32_t* counts, int64_t experts, int64_t N, int64_t K,
                                   int64_t tile_rows, int64_t depth = kDepth);
// Weight gradient: 2·ceil_t(M)·ceil128(N)·Σ_e ceil_d(c_e).
int64_t executed_weight_grad_flops(const int32_t* counts, int64_t experts, int64_t M, int64_t N,
                                   int64_t tile_rows, int64_t depth = kDepth);

}  // namespace moeplan::backend::cuda::expert_gemm
