#pragma once
// The manifest (sweep.toml, schema = 1): the contract of an experiment. Every point, the dense
// baseline, the tolerances, and how the points are to be trained. Reads back to the same plan.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/planner/plan.hpp"

namespace moeplan {

// How to train the points (the [train] table). Defaults are what `moeplan run` uses.
struct TrainSettings {
  std::string source = "builtin";   // "builtin", "text:PATH", "bytes:PATH", "shards:GLOB"
  uint64_t seed = 1234;             // model init and data order
  uint64_t data_seed = 1;           // built-in corpus generator seed
  std::string positions = "alibi";  // "alibi" | "rope"
  bool renormalize_gates = false;   // g_i = p_i (paper) unless true
  double capacity_factor = 0;       // 0 = dropless
  double load_balance = 0.01;       // λ of the load-balance loss
  double z_loss = 0;                // router z-loss coefficient (0 = off)
  double erc_loss = 0;              // expert-router coupling loss coefficient (0 = off)
  double erc_alpha = 1.0;
  int64_t eval_every = 0;        // steps between validation passes (0 = auto)
  int64_t eval_tokens = 0;       // validation tokens per pass (0 = auto)
  int64_t checkpoint_every = 0;  // steps between checkpoints (0 = auto)
  std::string device = "cpu";
  bool operator==(const TrainSettings&) const = default;
};

struct Manifest {
  int schema = 1;
  std::string family = "paper";
  std::string created_by;           // the command line that made it
  double n_target = 0;              // requested N
  double n_tolerance = 0.01;        // relative
  double ra_tolerance = 0.005;      // absolute (0.5 percentage points)
  double compute_tolerance = 0.01;  // relative spread of C allowed across points
  // The points are held to the equal-resource contract (ACCOUNTING.md): N within n_tolerance of
  // the baseline's, one C, one D̂ (strict) or one epoch count (loose), checked on read. false
  // only in a manifest written by hand to train models that are not one sweep (the backend's
  // tests; a shape study): it is then written out, and `show` says so first.
  bool equal_resources = true;
  TrainSettings train;
  Plan dense;                // the dense baseline
  std::vector<Plan> points;  // the MoE points
};

// What `grid`, `show` and `run` warn of a manifest whose [train] capacity_factor drops routed
// assignments (their FLOPs are planned, not spent); empty when it is dropless or not one
// equal-resource sweep.
std::string capacity_factor_warning(const Manifest& m);

// Whether `id` can be a point's id: it names the point's run folder (runs/<id>/) and stands on
// one line of every report. Non-empty, at most 255 bytes, not "." or "..", without '/', '\\', a
// control character, a leading or trailing space of any width (U+00A0, U+2000..U+200A, ...), or
// a character that draws nothing, breaks the line or reorders the text (zero-width, U+2028/2029,
// bidirectional controls).
bool is_point_id(std::string_view id);
// What is_point_id asks, in words (for an error message).
inline constexpr const char* kPointIdRule =
    "non-empty, at most 255 bytes, not '.' or '..', without '/', '\\', control characters, a "
    "leading or trailing space (of any width), or invisible, line-separator or "
    "bidirectional-control characters (e.g. \"moe-ra0.200\")";

}  // namespace moeplan
