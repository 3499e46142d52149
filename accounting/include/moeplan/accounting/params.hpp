#pragma once
// Parameter counts (ACCOUNTING.md "Parameters"): N and N_a exclude embedding and LM head.
#include <cstdint>

#include "moeplan/accounting/arch.hpp"

namespace moeplan {

struct ParamCounts {
  // Breakdown, whole model (all layers).
  int64_t attention = 0;      // Q, K, V, O
  int64_t dense_ffn = 0;      // dense layers' SwiGLU
  int64_t expert_total = 0;   // all routed experts
  int64_t expert_active = 0;  // K routed experts per MoE layer
  int64_t shared_expert = 0;  // shared expert(s)
  int64_t router = 0;     // D_m·E per MoE layer (always reported; inside N only if count_router)
  int64_t norms = 0;      // 2·D_m per layer + D_m final (inside N only if count_norms)
  int64_t embedding = 0;  // V·D_m
  int64_t lm_head = 0;    // V·D_m, 0 when tied

  int64_t total_params = 0;   // N under the Arch's counting readings
  int64_t active_params = 0;  // N_a under the same readings
  double activation_rate() const {
    return total_params > 0 ? double(active_params) / double(total_params) : 0.0;
  }
  // Every trainable scalar, vocabulary and router and norms included (what the backend allocates).
  int64_t trainable() const {
    return attention + dense_ffn + expert_total + shared_expert + router + norms + embedding +
           lm_head;
  }
};

ParamCounts count_params(const Arch& arch);

}  // namespace moeplan
