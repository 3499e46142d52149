#pragma once
// The MoE layer's routing pieces, llm.c style (shapes explicit). Routed experts run as products
// over the tokens gathered per expert; the gather order is a stable counting sort by expert
// (token order, then slot order), so results never depend on threads.
#include <cstdint>

namespace moeplan::backend::cpu {

// logits (T,E) → probs (T,E) softmax in place; lse (T) = logsumexp(logits);
// idx (T,K) top-K experts by probability (ties: lower index), gate (T,K) = p (or p/Σ_topK p).
template <class S>
void router_forward(S* probs, S* lse, int32_t* idx, S* gate, int64_t T, int64_t E, int64_t K,
                    bool renormalize);

// The rows each expert keeps of T tokens' T·K assignments: ceil(capacity_factor·T·K/E), at most
// T·K; T·K (every one, dropless) when capacity_factor is 0. Both devices take it from here.
int64_t expert_capacity(double capacity_factor, int64_t T, int64_t K, int64_t E);

// Stable counting sort of the T·K assignments by expert. assigned (E) = assignments before any
// drop; offsets (E+1) = kept rows per expert in the sorted order; slot_row (T·K) = sorted row
// of each (token, slot) or −1 if dropped (beyond `capacity` per expert); row_token (T·K) = token
// of each sorted row; cursor (E) is scratch. Returns the number of dropped assignments.
int64_t dispatch(int64_t* assigned, int64_t* offsets, int64_t* cursor, int32_t* slot_row,
                 int32_t* row_token, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                 int64_t capacity);

// xg (R,C) = x (T,C) rows row_token[r]
template <class S>
void gather_rows(S* xg, const S* x, const int32_t* row_token, int64_t R, int64_t C);
// out (T,C) += Σ_k gate[t,k] · ye[slot_row[t,k]] (slots in order: deterministic)
template <class S>
void combine_forward(S* out, const S* ye, const S* gate, const int32_t* slot_row, int64_t T,
                     int64_t K, int64_t C);
// dye (R,C) = gate · dout[t]; dgate (T,K) = dout[t]·ye[row] (0 for dropped slots)
template <class S>
void combine_backward(S* dye, S* dgate, const S* dout, const S* ye, const S* gate,
                      const int32_t* slot_row, int64_t T, int64_t K, int64_t C);
// dx (T,C) += Σ_k dxg[slot_row[t,k]]
template <class S>
void scatter_add_rows(S* dx, const S* dxg, const int32_t* slot_row, int64_t T, int64_t K,
                      int64_t C);

// dlogits (T,E) from dgate (T,K) through the gates and the softmax, plus the load-balance term
// lb_dp (E) added to every dp[t,:] (λ·E·f_i/T) and the z-loss term z_scale·lse·p
// (z_scale = 2·z/T).
template <class S>
void router_backward(S* dlogits, const S* probs, const S* lse, const int32_t* idx, const S* gate,
                     const S* dgate, const double* lb_dp, double z_scale, int64_t T, int64_t E,
                     int64_t K, bool renormalize);

}  // namespace moeplan::backend::cpu
