#pragma once
// Fused causal attention for the bf16 path (our own kernels, tensor cores through WMMA): the S×S
// scores never leave the chip (but for backward_mma's dS tiles, below). Forward keeps a running max
// and sum per query row; backward recomputes the scores tile by tile, one kernel per key tile for
// dK/dV (the query heads of a grouped-query group summed inside, in order) and one per query tile
// for dQ, so no float atomics and bit-for-bit repeatable runs. Tiles are 64 queries × 64 keys; only
// tiles on or below the diagonal run, and the diagonal tiles are executed whole (the ledger books
// the masked part of them as padding, and the backward's recomputed products as recompute).
//
// Layouts as in the rest of the CUDA path: qkv (B·S, (H+2·Hkv)·Dh) bf16 with RoPE already applied
// to q and k; O and dO (B·S, H·Dh) bf16; lse and delta (B·H·S) fp32; dqkv (B·S, (H+2·Hkv)·Dh)
// fp32, every q, k and v column written (not accumulated). alibi_slopes (H) or null. Softmax scale
// 1/sqrt(Dh), the ALiBi bias −slope·(i−j) added after scaling, as in the CPU reference.
#include <cstddef>
#include <cstdint>

namespace moeplan::backend::cuda::attention {

constexpr int64_t kTile = 64;

// Head widths with a compiled kernel (multiples of 16 up to 128).
bool supported(int64_t head_dim);

// Per (sequence, head): how many 64×64 tiles run, nq·(nq+1)/2 with nq = ceil(S/64).
int64_t tiles_per_head(int64_t S);

void forward(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
             int64_t S, int64_t H, int64_t Hkv, int64_t Dh);

// The same contract as forward (same O and lse up to rounding), a different kernel: each warp
// keeps its rows' scores, softmax state and output in registers (PTX mma.sync m16n8k16) instead
// of WMMA fragments staged through shared memory.
void forward_mma(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
                 int64_t S, int64_t H, int64_t Hkv, int64_t Dh);

// forward_mma with 32 query rows a warp instead of 16 (128 a block), at head widths 16, 32 and 64
// (wider heads would spill registers): each K and V fragment feeds two mma.sync, and a warp has
// twice the independent products a step. The same tiles run and every row's arithmetic is the
// same, in the same order: the same O and lse, bit for bit.
bool forward_mma_wide_supported(int64_t head_dim);
void forward_mma_wide(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes,
                      int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh);

// forward_mma on Hopper's warpgroup MMA (attention_wgmma.cu, sm_90a code: compute capability 9.0
// only), head width 64 only (backward_wgmma_supported; a logic_error otherwise): the same tiles
// and softmax arithmetic, the products' depth sums in another order (held to forward_mma by
// tolerance).
void forward_wgmma(uint16_t* O, float* lse, const uint16_t* qkv, const float* alibi_slopes,
                   int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh);

// delta: scratch of B·H·S floats (rowsum dO·O).
void backward(float* dqkv, float* delta, const uint16_t* dO, const uint16_t* O, const float* lse,
              const uint16_t* qkv, const float* alibi_slopes, int64_t B, int64_t S, int64_t H,
              int64_t Hkv, int64_t Dh);

// The same contract as backward (same dqkv up to rounding), with register-resident tiles
// (mma.sync) for head widths 16, 32 and 64 (wider heads would spill registers), and five products
// a tile instead of seven: the dK/dV kernel (one block per key tile) also stores each tile's dS in
// bf16 (the rounding the dQ product takes in either form) into `ds`, and the dQ kernel (one block
// per query tile) multiplies those tiles by K in key order. `ds`: scratch of
// backward_mma_scratch(B, S, H) bf16 elements (B·H·tiles_per_head(S) tiles of 64×64). dqkv in
// fp32, or with dqkv_bf16 in bf16 (each sum rounded once, as a cast of the fp32 result would),
// for a model whose next step reads bf16 (no RoPE to undo). dkdv: its dK/dV kernel:
//  - held: mma.sync, K's and V's fragments held in registers for the whole block;
//  - lean: mma.sync holding fewer registers at once (three blocks an SM rather than two), the
//    same bits as held;
//  - wgmma: Hopper's warpgroup MMA (attention_wgmma.cu), head width 64 on compute capability 9.0
//    only (backward_wgmma_supported; sm_90a code), the depth sums in another order (held to the
//    CPU by tolerance). The dQ kernel is the same for all three.
enum class DkdvKernel { held, lean, wgmma };
bool backward_mma_supported(int64_t head_dim);
bool backward_wgmma_supported(int64_t head_dim);
int64_t backward_mma_scratch(int64_t B, int64_t S, int64_t H);
void backward_mma(void* dqkv, bool dqkv_bf16, float* delta, uint16_t* ds, const uint16_t* dO,
                  const uint16_t* O, const float* lse, const uint16_t* qkv,
                  const float* alibi_slopes, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                  int64_t Dh, DkdvKernel dkdv = DkdvKernel::held);

// Dynamic shared memory a block of each kernel asks, in bytes, at a supported head width (the
// opt-in a device must allow: 99 KiB on compute capability 8.6, 8.9 and 12.x, 163 KiB on 8.0,
// 227 KiB on 9.0). At widths up to 64 every kernel fits 99 KiB; at 128 the forward's (`forward`)
// and the backward's (`backward`) do not. forward_mma_shared_bytes(Dh, wide): forward_mma, or
// forward_mma_wide. backward_mma_shared_bytes: the larger of backward_mma's held/lean dK/dV and
// dQ kernels. 0 where the head width has no such kernel.
std::size_t forward_shared_bytes(int64_t head_dim);
std::size_t forward_mma_shared_bytes(int64_t head_dim, bool wide);
std::size_t backward_shared_bytes(int64_t head_dim);
std::size_t backward_mma_shared_bytes(int64_t head_dim);
// The larger of forward_wgmma's and the wgmma dK/dV kernel's (compute capability 9.0 only).
std::size_t wgmma_shared_bytes(int64_t head_dim);

}  // namespace moeplan::backend::cuda::attention
