#pragma once
// Architecture solvers: the MoE layer for a target r_a on a given backbone, the MoE backbone
// from N alone, and the dense baseline of the same N. Pure arithmetic; rules in docs/planner.md.
#include <cstdint>
#include <string>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/planner/family.hpp"

namespace moeplan {

// The largest N the solvers take: parameters are counted in 64-bit integers (at most 9.2e18), and
// the shape searches count candidates of up to about 4·N.
inline constexpr double kMaxTotalParams = 1e18;

struct SolveOptions {
  double n_tolerance = 0.01;     // |N − N_target| / N_target allowed
  double ra_tolerance = 0.005;   // |r_a − target| allowed (absolute; 0.5 percentage points)
  int64_t expert_alignment = 0;  // d_expert multiple; 0 = alignment_for(d_model)
};

// What the backbone solvers may not choose themselves. 0 = the family's rule for this N.
struct BackboneOptions {
  int64_t vocab = 0;
  int64_t seq_len = 0;
  int64_t head_dim = 0;
  int64_t ffn_alignment = 0;  // d_ffn multiple; 0 = alignment_for(d_model)
  bool count_router = false;
  bool count_norms = false;
  bool tied_embeddings = false;
};

struct MoeSolution {
  Arch arch;  // backbone + experts, top_k, d_expert, d_shared
  int64_t total_params = 0;
  int64_t active_params = 0;
  double activation_rate = 0;
  bool reachable = true;  // r_a within ra_tolerance of the target
  std::string note;       // when not reachable: the nearest reachable r_a and why
};

// Solves the MoE part of one backbone for many r_a targets. The constructor does the per-backbone
// work once; solve() is a scan over aligned d_expert values with two top_k candidates each.
// Objective (docs/planner.md): first the r_a miss beyond tolerance, then the sum of the family
// cost (E outside [experts_lo, experts_hi], K = 1, K > topk_soft_max), 0.5 per ra_tolerance of
// r_a error and 0.1 per n_tolerance of N error. Candidates with N outside tolerance, E >
// experts_max or E < K are never chosen.
class MoeSolver {
 public:
  // `backbone`: every field but experts/top_k/d_expert/d_shared; needs at least one MoE layer.
  // Throws InputError when no MoE layer can reach n_target (N_target below the backbone's
  // attention + dense part, or so small that one expert of the minimum width overshoots it).
  MoeSolver(const Arch& backbone, double n_target, const FamilyRules& family,
            const SolveOptions& options = {});
  MoeSolution solve(double ra_target) const;
  const Arch& backbone() const { return backbone_; }
  int64_t alignment() const { return align_; }
  // Share of N that is always active (attention, dense FFN, counted norms): the r_a floor.
  double fixed_fraction() const { return double(base_) / n_target_; }

 private:
  Arch backbone_;
  FamilyRules family_;
  SolveOptions options_;
  double n_target_ = 0;
  int64_t base_ = 0;    // N of the backbone without experts
  int64_t unit_ = 0;    // moe_layers · d_model
  int64_t router_ = 0;  // 1 when the router is inside N
  int64_t align_ = 32;
  // One row per admissible d_expert, independent of r_a: E(K) = round(e_at_k0 − e_per_k·K),
  // top_k at most k_max (so that E >= K).
  struct WidthRow {
    int64_t d_expert;
    int64_t k_max;
    double e_at_k0, e_per_k;
  };
  std::vector<WidthRow> rows_;
};

// The family's MoE backbone for N (no experts yet): d_model a multiple of head_dim, one dense
// first layer, d_ffn = α·d_model aligned, (d_model, layers) chosen nearest to ζ(N) and µ.
Arch solve_moe_backbone(double n_target, const FamilyRules& family,
                        const BackboneOptions& options = {});

// The family's dense baseline of N: every layer dense, MHA, α ≈ ffn_ratio, ζ ≈ ζ(N), its own
// width and depth; d_ffn is the free integer that brings N within n_tolerance.
// Throws InputError when no shape within tolerance exists (N too small for two layers).
Arch solve_dense(double n_target, const FamilyRules& family, const BackboneOptions& options = {},
                 double n_tolerance = 0.01);

}  // namespace moeplan
