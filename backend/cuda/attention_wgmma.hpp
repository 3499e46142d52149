#pragma once
// The attention backward's dK/dV kernel on Hopper's warpgroup MMA (attention_wgmma.cu, compiled
// for sm_90a alone), called by attention.cu's backward_mma in place of the mma.sync kernel. (The
// forward on wgmma, attention::forward_wgmma, is declared with the others in attention.hpp.)
#include <cstdint>

namespace moeplan::backend::cuda::attention {

// Whether the wgmma dK/dV kernel has code for this head width (64 only).
constexpr bool dkdv_wgmma_supported(int64_t head_dim) {
  return head_dim == 64;
}

// dK and dV of every (sequence, kv head, key tile) into dqkv (fp32, or bf16 with dqkv_bf16: each
// sum rounded once), and every tile's dS^T in bf16 into ds, as the mma.sync dK/dV kernel does
// (same layouts, same scratch), for the dQ kernel to read. delta: rowsum(dO∘O), already computed.
// qkv, dO: bf16. scale: 1/√64. Head width 64 only (a logic_error otherwise).
void dkdv_wgmma(void* dqkv, bool dqkv_bf16, uint16_t* ds, const uint16_t* dO, const float* lse,
                const float* delta, const uint16_t* qkv, const float* alibi_slopes, int64_t B,
                int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale);

}  // namespace moeplan::backend::cuda::attention
