#include "moeplan/accounting/params.hpp"

#include <initializer_list>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

namespace {

// The largest parameter count moeplan holds. The planner asks N <= 1e18 (planner/solve.hpp) and
// its shape searches count candidates of up to about 4·N: the bound sits above those, and a sum
// of two counts at the bound still fits a 64-bit integer (9.2e18).
constexpr double kMaxCount = 4e18;

// One component's count, a product of widths: an arch file of absurd widths is refused naming
// the component instead of wrapping to a negative count. The product is sized in long double
// first; under the bound, the exact one in integers cannot overflow (each factor is >= 1).
int64_t count(std::initializer_list<int64_t> factors, const char* component, const Arch& a) {
  long double size = 1;
  for (int64_t f : factors) {
    if (f == 0) return 0;
    size *= (long double)f;
  }
  if (size > kMaxCount || size < -kMaxCount)
    throw InputError(fmt::format(
        "arch: the {} would have {:.4g} parameters (vocab {}, d_model {}, layers {}), above the "
        "4e18 moeplan counts (64-bit integers); give smaller widths",
        component, double(size), a.vocab, a.d_model, a.layers));
  int64_t v = 1;
  for (int64_t f : factors) v *= f;
  return v;
}

}  // namespace

ParamCounts count_params(const Arch& a) {
  ParamCounts c;
  const int64_t L = a.layers, Le = a.moe_layers(), Ld = a.dense_layers, Dm = a.d_model;
  c.attention = count({2, L, Dm, a.heads, a.head_dim}, "attention (Q, O)", a) +
                count({2, L, Dm, a.kv_heads, a.head_dim}, "attention (K, V)", a);
  c.dense_ffn = count({Ld, 3, Dm, a.d_ffn}, "dense FFN", a);
  c.expert_total = count({Le, 3, Dm, a.experts, a.d_expert}, "routed experts", a);
  c.expert_active = count({Le, 3, Dm, a.top_k, a.d_expert}, "active experts", a);
  c.shared_expert = count({Le, 3, Dm, a.d_shared}, "shared expert", a);
  c.router = count({Le, Dm, a.experts}, "router", a);
  c.norms = count({2, L, Dm}, "RMSNorm scales", a) + Dm;
  c.embedding = count({a.vocab, Dm}, "token embedding", a);
  c.lm_head = a.tied_embeddings ? 0 : c.embedding;

  // The sums are sized first too: several components each under the bound can add past it.
  const auto always_of = [&](auto zero) {
    using T = decltype(zero);
    return T(c.attention) + T(c.dense_ffn) + T(c.shared_expert) +
           (a.count_router ? T(c.router) : zero) + (a.count_norms ? T(c.norms) : zero);
  };
  const long double total = always_of((long double)0) + (long double)c.expert_total;
  if (total > kMaxCount)
    throw InputError(fmt::format(
        "arch: N = {:.4g} parameters is above the 4e18 moeplan counts (64-bit integers); give "
        "smaller widths",
        double(total)));
  // Every trainable scalar (trainable(): what a backend allocates) fits the same bound: a vocab of
  // 1e15 made its sum wrap negative and pass the memory checks it feeds.
  const long double all = (long double)c.attention + c.dense_ffn + c.expert_total +
                          c.shared_expert + c.router + c.norms + c.embedding + c.lm_head;
  if (all > kMaxCount)
    throw InputError(fmt::format(
        "arch: {:.4g} trainable parameters (vocabulary, router and norms included) is above the "
        "4e18 moeplan counts (64-bit integers); give a smaller vocab or smaller widths",
        double(all)));
  const int64_t always = always_of(int64_t{0});
  c.total_params = always + c.expert_total;
  c.active_params = always + c.expert_active;
  return c;
}

}  // namespace moeplan
