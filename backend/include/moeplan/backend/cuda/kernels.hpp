#pragma once
// The hand-written kernels of the CUDA path, as host functions on device pointers (llm.c style:
// forward/backward pairs, shapes explicit, each buffer's shape in a comment). Every launch goes to
// the default stream (the SwiGLU kernels: the stream given) and is checked. `mm` buffers hold
// matrix-product inputs in DType `mm` (fp32 or bf16); everything else is fp32. Reductions that
// decide results run in a fixed order: no float atomics anywhere, so a run is bit-for-bit
// repeatable.
#include <cstdint>
#include <string>

#include "moeplan/backend/cuda/device.hpp"

namespace moeplan::backend::cuda::kernels {

// Whether the launches of backend/cuda/'s own kernels are programmatic dependent launches (each
// kernel's launch overlapping the end of the kernel before it in its stream; launch.cuh). Off
// unless set; process-wide, read at each launch. Needs compute capability 9.0 where it is on.
void set_programmatic_launch(bool on);
bool programmatic_launch();

// Empty when this build's kernels can run on the current device; else CUDA's error name and text
// from loading one of them (cudaErrorNoKernelImageForDevice where the build carries no code the
// device runs). The error is cleared.
std::string code_load_error();

// out (N) in `mm` = in (N) fp32
void cast(void* out, DType mm, const float* in, int64_t n);
// For g < groups: dst[g][i] += src[g·per_group + i], i < per_group. dst is a device array of
// device pointers (each an fp32 block of per_group elements); src is bf16.
void grouped_accumulate_bf16(float* const* dst, const uint16_t* src, int64_t per_group,
                             int64_t groups);

// ---- embedding -------------------------------------------------------------------------------
// x (T,C) = emb (V,C) rows of tokens (T)
void embedding_forward(float* x, const float* emb, const int32_t* tokens, int64_t T, int64_t C);
// demb (V,C) += Σ over positions: rows of dx (T,C). The positions are grouped by token id on the
// host: ids (n_ids), segment starts (n_ids+1) into positions (T), each segment in ascending order.
void embedding_backward(float* demb, const float* dx, const int32_t* ids, const int32_t* seg_start,
                        const int32_t* positions, int64_t n_ids, int64_t C);

// ---- RMSNorm: out = x·rstd·w, rstd = 1/sqrt(mean(x²)+eps) -------------------------------------
// out (T,C) in `mm`, rstd (T), x (T,C), w (C). copy (T,C), unless null, receives x as read (the
// residual stream carried on past the norm, without a second read of x).
void rmsnorm_forward(void* out, DType mm, float* rstd, const float* x, const float* w, int64_t T,
                     int64_t C, float eps, float* copy = nullptr);
// dx (T,C) += input gradient; dw (C) += Σ_t dy·x·rstd (= without accumulate_dw). scratch:
// rmsnorm_scratch_floats(T', C) floats for any T' ≥ T. dx_mm (T,C) in `mm`, unless null, receives
// the new dx as cast() would write it (for the products that read the residual gradient next).
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t C, float* scratch,
                      void* dx_mm = nullptr, DType mm = DType::f32, bool accumulate_dw = true);
int64_t rmsnorm_scratch_floats(int64_t T, int64_t C);

// ---- attention helpers (the products QK^T, PV and their gradients are cuBLAS calls) ----------
// qkv (T, W) fp32 from the fused projection, W = (H + 2·Hkv)·Dh, T = B·S, columns [q | k | v],
// head-major inside each. out (T, W) in `mm`: the same with RoPE applied to q and k when the
// table rope_cos_sin (S, Dh/2, 2) is given (pairs (2i, 2i+1), as the CPU reference).
void qkv_prepare(void* out, DType mm, const float* qkv, const float* rope_cos_sin, int64_t B,
                 int64_t S, int64_t H, int64_t Hkv, int64_t Dh);
// dqkv_mm (T, W) in `mm` = RoPE^T applied to dqkv (T, W) fp32 (plain cast for v, or no RoPE)
void qkv_prepare_backward(void* dqkv_mm, DType mm, const float* dqkv, const float* rope_cos_sin,
                          int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dh);
// P (BH, S, S) in `mm` = causal softmax over keys j <= i of scale·scores + bias; bias = −slope_h·
// (i − j) when alibi_slopes (H) is given. Masked entries are written as 0.
void attention_softmax_forward(void* P, DType mm, const float* scores, const float* alibi_slopes,
                               int64_t BH, int64_t H, int64_t S, float scale);
// dS (BH, S, S) in `mm` = scale·P⊙(dP − Σ_j P⊙dP) on the causal part, 0 above the diagonal.
// dP (BH, S, S) fp32, P in `mm`.
void attention_softmax_backward(void* dS, DType mm, const float* dP, const void* P, int64_t BH,
                                int64_t S, float scale);

// ---- SwiGLU: h = silu(a)⊙b, ab = [a | b] (N, 2F); every buffer in `mm` (bf16 in the bf16 path:
// the product that makes ab writes bf16, as PyTorch autocast does; arithmetic is fp32) ----------
// `stream`: a cudaStream_t (SideStream::handle()); nullptr, the default stream.
void swiglu_forward(void* h, DType mm, const void* ab, int64_t N, int64_t F,
                    void* stream = nullptr);
// dab (N, 2F) from dh (N, F) and ab
void swiglu_backward(void* dab, DType mm, const void* dh, const void* ab, int64_t N, int64_t F,
                     void* stream = nullptr);

// ---- routing ------------------------------------------------------------------------------
// logits (T,E) → probs (T,E) softmax, lse (T) log-sum-exp, topk_idx/topk_gate (T,K): the K
// largest probabilities (ties: lower expert first), gate = p or p/Σ_topK p (renormalize).
void router_topk(float* probs, float* lse, int32_t* topk_idx, float* topk_gate, const float* logits,
                 int64_t T, int64_t E, int64_t K, bool renormalize);
// Stable sort of the T·K assignments (a = t·K + k) by expert: counts (E), offsets (E+1),
// sorted (T·K) = assignment ids in (expert, a) order, slot_of (T·K) = where each assignment went.
// With a capacity > 0 (the CPU's dispatch): each expert keeps its first `capacity` assignments
// in assignment order; assigned (E) gets every expert's assignments, counts the kept ones,
// offsets and sorted cover the kept rows only (offsets[E] of them), and slot_of is −1 for a
// dropped assignment. scratch: sort_scratch_ints(T, K, E) ints of device memory. At most 12288
// experts.
void sort_by_expert(int32_t* counts, int32_t* offsets, int32_t* sorted, int32_t* slot_of,
                    const int32_t* topk_idx, int32_t* scratch, int64_t T, int64_t K, int64_t E,
                    int32_t* assigned = nullptr, int64_t capacity = 0);
int64_t sort_scratch_ints(int64_t T, int64_t K, int64_t E);
// The expert-padded layout of the routed rows (experts=batched): expert e's j-th row at e·cap + j,
// so that one strided-batched product covers every expert. pad[p] (p < E·cap) = offsets[e] + j
// for j < counts[e], -1 past the expert's rows; unpad[offsets[e] + j] = e·cap + j.
void expert_pad_maps(int32_t* pad, int32_t* unpad, const int32_t* counts, const int32_t* offsets,
                     int64_t E, int64_t cap);
// dst row r (C elements of type t: f32, or bf16 as `mm`) = src row map[r], or zeros where
// map[r] < 0; r < rows.
void copy_rows(void* dst, const void* src, DType t, const int32_t* map, int64_t rows, int64_t C);
// out (N, C) = rows of in (T, C) for token sorted[i] / K; both in `mm`
void gather_rows(void* out, const void* in, DType mm, const int32_t* sorted, int64_t N, int64_t K,
                 int64_t C);
// y (T,C) += Σ_k gate[t,k]·ys[slot_of[t·K+k]] in k order; ys (T·K, C) in `mm`; dropped slots
// (−1) add nothing
void moe_combine_forward(float* y, const void* ys, DType mm, const float* gate,
                         const int32_t* slot_of, int64_t T, int64_t K, int64_t C);
// For each assignment a = t·K + k of routed row i = slot_of[a]: dys[i] (C) in `mm` =
// gate[a]·dy[t], dgate[a] = dy[t]·ys[i], ys in `mm`; dgate[a] = 0 and no row for a dropped
// assignment (slot_of −1). Rows of dys that no assignment names are left alone.
void moe_combine_backward(void* dys, DType mm, float* dgate, const float* dy, const void* ys,
                          const float* gate, const int32_t* slot_of, int64_t T, int64_t K,
                          int64_t C);
// dx (T,C) fp32 += Σ_k dxs[slot_of[t·K+k]] in k order, dxs (T·K, C) in `mm`; dropped slots (−1)
// skipped
void moe_scatter_add(float* dx, const void* dxs, DType mm, const int32_t* slot_of, int64_t T,
                     int64_t K, int64_t C);
// aux (2) = {λ·E·Σ_i f_i·P_i, z·mean_t lse²}; f_i = counts_i/(T·K), P_i = mean_t probs. p_mean (E)
// receives P. scratch: colsum_scratch_floats(E).
void router_aux_forward(float* aux, float* p_mean, const float* probs, const float* lse,
                        const int32_t* counts, int64_t T, int64_t E, int64_t K, float load_balance,
                        float z_loss, float* scratch);
// dlogits (T,E) in `mm`: back through the gates (dgate (T·K)), the load-balance term (through P
// only; f is a count) and the z-loss, then through the softmax.
void router_backward(void* dlogits, DType mm, const float* probs, const float* lse,
                     const int32_t* topk_idx, const float* topk_gate, const float* dgate,
                     const int32_t* counts, int64_t T, int64_t E, int64_t K, bool renormalize,
                     float load_balance, float z_loss);
int64_t colsum_scratch_floats(int64_t C);
// out (n) = Σ_c partial[c·n + i] over c < chunks (+ out with accumulate), each element's sum in a
// fixed order: the finish of a product split by depth (the router's weight gradient).
void sum_partials(float* out, const float* partial, int64_t n, int64_t chunks, bool accumulate);

// ---- loss ---------------------------------------------------------------------------------
// ---- expert-router coupling (ERC) loss (BACKEND.md; the CPU's erc.hpp) ------------------------
// All fp32 (the products too: the loss compares norms, and its products are small). E router rows
// of width D, experts of width De; w13 points at expert 0's (D, 2·De) w13, expert j's is `stride`
// elements further (the gradients alike).
// Block per router row i: ε_i = ‖R_i − R_nearest‖/(2‖R_i‖) in double, δ (E,D) = 1 − ε_i + 2ε_i·u
// (u (E,D) uniforms in [0,1) drawn on the host, as the CPU draws them), rounded to fp32 as the
// CPU's; rt (E,D) = R ⊙ δ.
void erc_noise(float* delta, float* rt, const float* router, const double* u, int64_t E, int64_t D);
// wg (D, E·De): column block j = expert j's gate projection (the first De columns of its w13).
void erc_gather_gate(float* wg, const float* w13, int64_t stride, int64_t E, int64_t D, int64_t De);
// dw13 of expert j, first De columns, += column block j of dwg (D, E·De).
void erc_scatter_gate_grad(float* dw13, const float* dwg, int64_t stride, int64_t E, int64_t D,
                           int64_t De);
// m (E,E): m[i,j] = ‖act[i, j·De : (j+1)·De]‖ (act (E, E·De)).
void erc_norms(float* m, const float* act, int64_t E, int64_t De);
// The hinge: loss (1) = coef/E²·Σ_i Σ_{j≠i} [max(m[i,j] − α·m[i,i], 0) + max(m[j,i] − α·m[i,i], 0)]
// in double; dm (E,E) = grad_weight · d loss / d m, each diagonal entry summed in the CPU's order.
void erc_hinge(double* loss, float* dm, const float* m, int64_t E, double alpha, double coef,
               double grad_weight = 1);
// act[i, j·De + c] *= dm[i,j]/m[i,j] (0 where m[i,j] = 0): d loss / d act in place.
void erc_scale(float* act, const float* m, const float* dm, int64_t E, int64_t De);
// drouter (E,D) += drt ⊙ δ.
void erc_router_grad(float* drouter, const float* drt, const float* delta, int64_t n);

// losses (T) = lse − logit[target] (0 where target < 0); dlogits (T,V) =
// grad_scale·(softmax − onehot), zero rows where target < 0 (skipped when dlogits is null). Logits
// and dlogits in `mm` (the LM head's product writes bf16 logits in bf16 mode); fp32 arithmetic.
void cross_entropy(float* losses, void* dlogits, DType mm, const void* logits,
                   const int32_t* targets, int64_t T, int64_t V, float grad_scale);
// out (1) = Σ x in double, in a fixed order (one block).
void sum_double(double* out, const float* x, int64_t n);

// ---- optimizer ----------------------------------------------------------------------------
// The gradient norm over a vector in parts (the model's buckets: the embedding, each layer, the
// rest), each part's sums of squares made when it suits the caller (beside the backward, after an
// all-reduce, or on a data-parallel rank's share):
// - grad_norm_partial fills one part's grad_norm_scratch_doubles() doubles of scratch from
//   grads (n; 0 gives zeros), in double and a fixed order, on `stream` (a cudaStream_t; nullptr,
//   the default stream);
// - grad_norm_finish sums `parts` such parts in index order into norm (2) = {‖g‖₂, clip factor
//   max_norm/‖g‖ when ‖g‖ > max_norm else 1}.
// The same parts give the same bits whichever stream and order made them.
void grad_norm_partial(double* scratch, const float* grads, int64_t n, void* stream = nullptr);
void grad_norm_finish(float* norm, const double* scratch, int64_t parts, float max_norm);
int64_t grad_norm_scratch_doubles();
// AdamW with decoupled weight decay (where decay[i] != 0), gradients scaled by norm[1] (clip);
// bias_correction1/2 are the reciprocals 1/(1−β^t).
// params_mm (n, bf16) receives a copy of the updated weights when not null. On `stream` (a
// cudaStream_t; nullptr, the default stream).
void adamw(float* params, uint16_t* params_mm, float* m, float* v, const float* grads,
           const uint8_t* decay, const float* norm, int64_t n, float lr, float beta1, float beta2,
           float eps, float weight_decay, float bias_correction1, float bias_correction2,
           void* stream = nullptr);

// adamw of the parameters [0, n) whose row (row_len parameters a row: element i's row is
// i / row_len) has flag[row] == want, on `stream`; the others are left as they are. The same
// arithmetic as adamw, element by element: the two calls with want 1 and 0 together give
// adamw's bits. (The embedding's update split by the rows the next batch reads.)
void adamw_rows(float* params, uint16_t* params_mm, float* m, float* v, const float* grads,
                const uint8_t* decay, const float* norm, int64_t n, int64_t row_len,
                const uint8_t* flag, uint8_t want, float lr, float beta1, float beta2, float eps,
                float weight_decay, float bias_correction1, float bias_correction2,
                void* stream = nullptr);

}  // namespace moeplan::backend::cuda::kernels
