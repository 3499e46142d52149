#pragma once
// Fill one architecture's plan: counts, M under a named convention, the integer-step budget for
// a compute target, and the step-law hyper-parameters (ACCOUNTING.md "Hyper-parameters").
#include <cstdint>
#include <string>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/planner/plan.hpp"

namespace moeplan {

struct PointBudget {
  double compute = 0;  // C target, FLOPs under `convention`
  Convention convention = Convention::paper;
  AttentionMask mask = AttentionMask::causal;  // for `exact`
  Reuse reuse = Reuse::strict;
  double tokens_unique = 0;  // strict: D̂; 0 = the point's own consumed tokens (one epoch)
  double epochs = 0;         // loose
  int64_t dp_width = 1;      // batch rounded to a multiple of this many sequences
  // Warm-up as a share of the point's steps (round(f·steps), at least 1 when f > 0); negative:
  // the paper's clip(0.01·steps, 200, 2000).
  double warmup_fraction = -1;
  // η as this multiple of the step law's (1: the rule itself): a learning-rate sweep around it,
  // to see whether each point, dense included, sits near its own best η.
  double lr_scale = 1;
};

// D ≈ C/M; batch B = step-law(D) in whole sequences (at least dp_width); steps = round(D/(B·S));
// η = step-law(N, D rounded); warm-up clip(0.01·steps, 200, 2000) or the budget's fraction.
// Validates the arch.
Plan plan_for_arch(const Arch& arch, const PointBudget& budget);

// Training FLOPs per consumed token of `arch` under the budget's convention.
double planned_flops_per_token(const Arch& arch, Convention convention, AttentionMask mask);

}  // namespace moeplan
