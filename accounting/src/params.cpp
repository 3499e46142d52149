#include "moeplan/accounting/params.hpp"

namespace moeplan {

ParamCounts count_params(const Arch& a) {
  ParamCounts c;
  const int64_t L = a.layers, Le = a.moe_layers(), Ld = a.dense_layers, Dm = a.d_model;
  c.attention = L * (2 * Dm * a.q_width() + 2 * Dm * a.kv_width());
  c.dense_ffn = Ld * 3 * Dm * a.d_ffn;
  c.expert_total = Le * 3 * Dm * a.experts * a.d_expert;
  c.expert_active = Le * 3 * Dm * a.top_k * a.d_expert;
  c.shared_expert = Le * 3 * Dm * a.d_shared;
  c.router = Le * Dm * a.experts;
  c.norms = L * 2 * Dm + Dm;
  c.embedding = a.vocab * Dm;
  c.lm_head = a.tied_embeddings ? 0 : a.vocab * Dm;

  const int64_t always = c.attention + c.dense_ffn + c.shared_expert +
                         (a.count_router ? c.router : 0) + (a.count_norms ? c.norms : 0);
  c.total_params = always + c.expert_total;
  c.active_params = always + c.expert_active;
  return c;
}

}  // namespace moeplan
