#pragma once
// Budgets (ACCOUNTING.md "Data, epochs and reuse"): C, consumed D, unique D̂, epochs, rounding.
#include <cstdint>
#include <string>

namespace moeplan {

enum class Reuse { strict, loose };

struct Budget {
  double compute_target = 0;   // C asked for, FLOPs (convention of flops_per_token)
  double flops_per_token = 0;  // M used to plan
  int64_t seq_len = 0;
  int64_t batch_seqs = 0;  // sequences per optimizer step
  int64_t steps = 0;
  int64_t tokens_consumed = 0;  // D = steps·batch_seqs·seq_len (repeats included)
  int64_t tokens_unique = 0;    // D̂, a whole number of disjoint seq_len windows
  double epochs = 0;            // D / D̂
  double compute = 0;           // rounded C = M·D
  double compute_rel_diff = 0;  // (compute − compute_target) / compute_target
  double tokens_per_param = 0;  // D / N (consumed)
  double effective_data = 0;    // D' of Muennighoff et al. 2023 (unique + decayed repeats)
  Reuse reuse = Reuse::strict;
};

// Muennighoff et al. 2023: D' = U + U·R*·(1 − exp(−R/R*)), R = epochs − 1, R* = 15.4.
double effective_data(double tokens_unique, double epochs, double r_star = 15.4);

// Fill a budget from C and M. `tokens_unique_target` (strict) or `epochs_target` (loose; > 0).
// Steps are rounded to the nearest integer (at least 1); D̂ to whole windows, at most D.
struct BudgetRequest {
  double compute = 0;
  double flops_per_token = 0;
  int64_t total_params = 0;
  int64_t seq_len = 0;
  int64_t batch_seqs = 0;
  Reuse reuse = Reuse::strict;
  double tokens_unique = 0;  // strict
  double epochs = 0;         // loose
};
Budget make_budget(const BudgetRequest& req);

// D_b / D_a at equal C: consumed-token multiplier between two architectures = M_a / M_b.
inline double token_multiplier(double flops_per_token_a, double flops_per_token_b) {
  return flops_per_token_a / flops_per_token_b;
}

}  // namespace moeplan
