#pragma once
// The FLOP ledger: every matrix product adds 2·m·n·k to a (category, phase) counter.
// Element-wise work is kept apart and is never part of M.
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moeplan {

enum class FlopCategory : int {
  projection,      // Q, K, V, O
  attention_core,  // Q·K^T and P·V as executed (causal: only the unmasked keys)
  dense_ffn,
  expert,  // routed experts, by the tokens actually routed to each
  shared_expert,
  router,
  lm_head,
  aux_loss,  // e.g. the expert-router coupling loss
  recompute,
  padding,
};
inline constexpr int kFlopCategories = 10;

enum class Phase : int { forward, input_grad, weight_grad };
inline constexpr int kPhases = 3;

std::string_view name(FlopCategory c);  // "projection", "attention-core", ...
std::string_view name(Phase p);         // "forward", "input-grad", "weight-grad"
std::optional<FlopCategory> parse_flop_category(std::string_view s);
std::optional<Phase> parse_phase(std::string_view s);

// Counts are exact integers. int64 holds 9.2e18 FLOPs: a CPU run, or about 8 h of one H200, but
// not the 1e20–1e21 of published runs (their budgets are carried as double in Budget, not in a
// ledger). `moeplan run` refuses a point that would execute more than 2^62 (backend
// check_ledger_fits); measuring such runs needs a wider cumulative ledger.
struct FlopLedger {
  std::array<std::array<int64_t, kPhases>, kFlopCategories> flops{};
  int64_t elementwise = 0;  // informational; not part of any convention's M

  // One product C(m×n) = A(m×k)·B(k×n).
  void add_gemm(FlopCategory c, Phase p, int64_t m, int64_t n, int64_t k) {
    flops[int(c)][int(p)] += 2 * m * n * k;
  }
  int64_t at(FlopCategory c, Phase p) const { return flops[int(c)][int(p)]; }
  int64_t category(FlopCategory c) const;  // all phases
  int64_t phase(Phase p) const;            // all categories
  int64_t total() const;                   // all matrix products
  FlopLedger& operator+=(const FlopLedger& o);
  FlopLedger operator-(const FlopLedger& o) const;
  bool operator==(const FlopLedger&) const = default;
};

}  // namespace moeplan
