#pragma once
// The CPU reference layers, llm.c style: each layer is a forward/backward pair of plain functions
// with explicit shapes; every buffer's shape is given beside it. Buffers are row-major. Every
// matrix product records 2·m·n·k in the ledger from the shapes it is called with.
// Backward functions accumulate into weight gradients (zeroed once per step by the caller).
#include <cstdint>
#include <span>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/ledger.hpp"

namespace moeplan::backend::cpu {

// out (T,OC) = [out +] inp (T,C) · w (C,OC)
template <class S>
void matmul_forward(S* out, const S* inp, const S* w, int64_t T, int64_t C, int64_t OC,
                    bool accumulate, FlopLedger& ledger, FlopCategory cat);
// dinp (T,C) = [dinp +] dout (T,OC) · w^T (skipped if dinp is null); dw (C,OC) += inp^T · dout
template <class S>
void matmul_backward(S* dinp, bool accumulate_dinp, S* dw, const S* dout, const S* inp, const S* w,
                     int64_t T, int64_t C, int64_t OC, FlopLedger& ledger, FlopCategory cat);

// The same with the weight stored transposed, wt (OC,C): out = inp · wt^T (router, tied head).
template <class S>
void matmul_wt_forward(S* out, const S* inp, const S* wt, int64_t T, int64_t C, int64_t OC,
                       FlopLedger& ledger, FlopCategory cat);
// dinp (T,C) = [dinp +] dout · wt; dwt (OC,C) += dout^T · inp
template <class S>
void matmul_wt_backward(S* dinp, bool accumulate_dinp, S* dwt, const S* dout, const S* inp,
                        const S* wt, int64_t T, int64_t C, int64_t OC, FlopLedger& ledger,
                        FlopCategory cat);

// out (T,C) = inp / rms(inp) ⊙ weight (C); rstd (T) = 1/sqrt(mean(inp²) + 1e-5)
template <class S>
void rmsnorm_forward(S* out, S* rstd, const S* inp, const S* weight, int64_t T, int64_t C);
// dinp (T,C) += ...; dweight (C) += Σ_t dout ⊙ inp·rstd
template <class S>
void rmsnorm_backward(S* dinp, S* dweight, const S* dout, const S* inp, const S* weight,
                      const S* rstd, int64_t T, int64_t C);

// out (B·S,C) = wte[inputs] (V,C); inputs (B·S)
template <class S>
void embedding_forward(S* out, const int32_t* inputs, const S* wte, int64_t T, int64_t C);
// dwte (V,C) += scatter of dout (T,C) by token id (serial: deterministic)
template <class S>
void embedding_backward(S* dwte, const S* dout, const int32_t* inputs, int64_t T, int64_t C);

// act (T,D) = silu(h13[:, :D]) ⊙ h13[:, D:]; h13 (T,2D)
template <class S>
void swiglu_forward(S* act, const S* h13, int64_t T, int64_t D);
// dh13 (T,2D) = from dact (T,D)
template <class S>
void swiglu_backward(S* dh13, const S* dact, const S* h13, int64_t T, int64_t D);

// In place on the Q and K heads of qkv (B·S, (H+2·Hkv)·Dh): rotate pair (2i, 2i+1) of each head
// at position p by p·θ_i, θ_i = 10000^(−2i/Dh). cos_sin (S, Dh/2, 2).
template <class S>
void rope_forward(S* qkv, const S* cos_sin, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                  int64_t Dh);
// In place on dqkv: the inverse rotation (the transpose of the forward one).
template <class S>
void rope_backward(S* dqkv, const S* cos_sin, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                   int64_t Dh);

// Causal attention, executed row-wise (query i meets keys 0..i only):
// qkv (B·S, (H+2·Hkv)·Dh) → att (B,H,S,S) probabilities (lower triangle) → out (B·S, H·Dh).
// alibi_slopes (H) or null (no bias). Softmax scale 1/sqrt(Dh).
template <class S>
void attention_forward(S* out, S* att, const S* qkv, const S* alibi_slopes, int64_t B, int64_t seq,
                       int64_t H, int64_t Hkv, int64_t Dh, FlopLedger& ledger);
// dqkv (B·S, (H+2·Hkv)·Dh) = from dout (B·S, H·Dh); scratch (threads, S, S), one per thread.
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* att, S* scratch,
                        int scratch_threads, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                        int64_t Dh, FlopLedger& ledger);

// logits (T,V) → softmax probabilities in place; losses (T) = −log p[target] (0 where target<0).
// Returns the sum of losses in double.
template <class S>
double crossentropy_forward(S* logits, double* losses, const int32_t* targets, int64_t T,
                            int64_t V);
// probs (T,V) → dlogits in place: (p − onehot)·scale; rows with target<0 become 0.
template <class S>
void crossentropy_backward(S* probs, const int32_t* targets, double scale, int64_t T, int64_t V);

// ALiBi slopes of Press et al. for H heads (the geometric sequence, interleaved when H is not a
// power of two).
void alibi_slopes(double* slopes, int64_t H);

// Adds the FLOPs of one causal product over an S×S triangle (diagonal included) with inner or
// outer dimension Dh, `count` times: Dh·S·(S+1) each.
void add_causal_product(FlopLedger& ledger, Phase phase, int64_t count, int64_t S, int64_t Dh);

// Scalars the element-wise kernels produce in one pass over nb sequences (norms, RoPE, causal
// softmax, SwiGLU, router softmax, expert combine, the embedding and the cross-entropy); routed
// (one per MoE layer) holds each MoE layer's routed rows. Informational: the ledger keeps it apart
// from the matrix products and no convention counts it. Shared by the CPU and CUDA models so
// that both report one ledger.
int64_t elementwise_per_pass(const Arch& a, int64_t nb, bool rope, std::span<const int64_t> routed);

}  // namespace moeplan::backend::cpu
