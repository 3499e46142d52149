#pragma once
// One planned sweep point: the architecture, its counts, M under a named convention, the budget
// and the hyper-parameters. Produced by the planner, carried by manifests, consumed by the backend.
#include <string>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/hyper.hpp"
#include "moeplan/accounting/params.hpp"

namespace moeplan {

struct Plan {
  std::string id;                     // stable point id: "dense", "moe-ra0.200", ...
  std::string role = "moe";           // "moe" | "dense"
  double activation_rate_target = 0;  // requested r_a (0 for the dense baseline)
  Arch arch;
  ParamCounts counts;  // from count_params(arch)
  Convention convention = Convention::paper;
  AttentionMask mask = AttentionMask::causal;  // used when convention == exact
  double flops_per_token = 0;  // M under `convention` (training, per consumed token)
  Budget budget;
  HyperParams hyper;
  bool reachable = true;  // false: the target r_a could not be met; see note
  std::string note;       // why, and the nearest reachable r_a
};

}  // namespace moeplan
