#pragma once
// Sweeps over the activation rate: parse the r_a axis, plan every point at equal resources and
// collect them, with the dense baseline, into a Manifest.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/planner/equal_resource.hpp"
#include "moeplan/sweeps/manifest.hpp"

namespace moeplan {

// The most points a range plans: each is a training run, and the planner's benchmark measures a
// grid of this many (bench/planner, about 0.1 s); 1e8 would take minutes to plan and never train.
inline constexpr int kMaxPoints = 10000;

// "0.05:0.4" -> `points` values (default 8), inclusive linspace (2 <= points <= kMaxPoints; 1
// gives A when A == B); "0.1,0.2,0.3" -> that list; "0.2" -> one value. Every value must be in
// (0, 1], a list may not repeat a value, a count outside [1, kMaxPoints] is refused whatever the
// text, and `points` is refused unless the text is a range (it would be ignored). Throws
// InputError naming the text and what is valid.
std::vector<double> parse_ra_spec(std::string_view text, std::optional<int> points = std::nullopt);

struct SweepRequest {
  PlanRequest plan;
  std::vector<double> activation_rates;
  std::string created_by;  // the command line, recorded in the manifest
  TrainSettings train;
  double compute_tolerance = 0.01;
};

// Rates that solve to one architecture make one point, for the rate nearest the r_a it reaches;
// its note names the others, and says which of them it does not reach within ra_tolerance (a rate
// below what attention and the dense layers alone are solves to the lowest reachable shape). Point
// ids are "moe-ra0.200": three decimals, more when the grid is finer, "-2", "-3" where distinct
// architectures still share one.
Manifest plan_sweep(const SweepRequest& request);

// The words a point's note begins its list of merged rates it does not reach with, and whether
// its note has that list: `show` and grid's header count such points beside the flagged ones.
inline constexpr std::string_view kMergedUnreachable = "also asked for ";
inline bool stands_for_unreachable_rates(const Plan& p) {
  return p.note.find(kMergedUnreachable) != std::string::npos;
}

// Largest |C_i − C_j| / C over the dense baseline and all points (step rounding only).
double compute_spread(const Manifest& manifest);

}  // namespace moeplan
