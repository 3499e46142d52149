#pragma once
// One point in full: parameters per component, FLOPs per token per category under every
// convention (paper, exact/causal, exact/full, megatron), and the budget.
#include <string>

#include <nlohmann/json.hpp>

#include "moeplan/planner/plan.hpp"

namespace moeplan {

// Text; the budget block and the summary use the plan's own convention, always named.
std::string render_plan_breakdown(const Plan& plan);
// plan_to_json(plan) plus "params" (per component) and "flops_per_token_by_convention".
nlohmann::json plan_breakdown_json(const Plan& plan);

}  // namespace moeplan
