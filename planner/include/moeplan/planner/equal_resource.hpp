#pragma once
// Equal-resource planning (ACCOUNTING.md "The equal-resource contract"): one dense baseline and
// any number of MoE points at the same N, the same compute C and the same unique data D̂.
// The backbone, the dense baseline and C are solved once; each plan_point() is a cheap scan.
#include <optional>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/planner/family.hpp"
#include "moeplan/planner/plan.hpp"
#include "moeplan/planner/solve.hpp"

namespace moeplan {

// How C is fixed: directly, or as the dense baseline's M·D for D tokens (or D = TPP·N).
enum class BudgetKind { dense_tpp, dense_tokens, compute };

struct BudgetSpec {
  BudgetKind kind = BudgetKind::dense_tpp;
  double value = 20;  // TPP, tokens, or FLOPs (under the request's convention)
  Reuse reuse = Reuse::strict;
  double tokens_unique = 0;  // strict: D̂ for every point; 0 = the dense baseline's consumed D
  double epochs = 0;         // loose: every point repeats its data this many times
};

struct PlanRequest {
  double n_target = 0;
  FamilyRules family;
  SolveOptions solve;
  BackboneOptions backbone;            // vocab, seq_len, head_dim, counting readings
  std::optional<Arch> given_backbone;  // use this MoE backbone instead of the family's
  BudgetSpec budget;
  Convention convention = Convention::paper;
  AttentionMask mask = AttentionMask::causal;
  int64_t dp_width = 1;
  double warmup_fraction = -1;  // PointBudget::warmup_fraction
  double lr_scale = 1;          // PointBudget::lr_scale
};

// Whether the dense baseline's note says that a --unique-tokens above what it consumes was capped
// (the planner's note on it begins so; later notes, such as grid's on warm-up, follow it).
inline bool notes_unique_tokens_cap(const Plan& dense) {
  return dense.note.rfind("--unique-tokens ", 0) == 0;
}

class EqualResourcePlanner {
 public:
  explicit EqualResourcePlanner(const PlanRequest& request);
  const Plan& dense() const { return dense_; }
  const Arch& backbone() const { return solver_.backbone(); }
  const MoeSolver& solver() const { return solver_; }
  double compute_target() const { return compute_; }
  double tokens_unique() const { return tokens_unique_; }
  // One MoE point at r_a target, within the N tolerance of the dense baseline's N; id
  // "moe-ra0.200" (3 decimals).
  Plan plan_point(double ra_target) const;

 private:
  struct Shapes {
    Arch backbone, dense;
  };
  static Shapes solve_shapes(const PlanRequest& request);
  static MoeSolver moe_solver(const PlanRequest& request, const Shapes& shapes);
  EqualResourcePlanner(const PlanRequest& request, const Shapes& shapes);
  PlanRequest request_;
  Plan dense_;
  MoeSolver solver_;
  double compute_ = 0;
  double tokens_unique_ = 0;
};

}  // namespace moeplan
