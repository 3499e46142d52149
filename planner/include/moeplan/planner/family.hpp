#pragma once
// Shape families: the rules that turn "N = 2e9" into a backbone, a dense baseline and an MoE
// layer. `paper` is the equal-resource paper's family (ACCOUNTING.md "Architecture rules"),
// extended down to tiny CPU models by the scaling rules documented in docs/planner.md.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeplan {

struct FamilyRules {
  std::string name = "paper";
  double aspect_ratio = 88.0;   // ζ = D_m / L at and above `full_scale_params`
  double ffn_ratio = 2.77;      // α = D_ffn / D_m (dense FFNs, MoE and dense models alike)
  double moe_width_ratio = 22;  // µ = (D_se + E·D_e) / D_m
  int64_t dense_first_layers = 1;
  int64_t shared_per_topk = 1;  // D_se = shared_per_topk · K · D_e (0 = no shared expert)
  int64_t experts_lo = 80, experts_hi = 90;  // fine-grained band the solver prefers
  int64_t experts_max = 512;                 // hard ceiling on E
  int64_t topk_soft_max = 32;                // K above this is penalised ("huge K")
  double topk1_penalty = 0.3;                // cost of K = 1 (the family avoids it where it can)
  int64_t max_head_dim = 128;
  int64_t min_head_dim = 8;
  int64_t min_layers = 2;
  double full_scale_params = 1e9;  // below this, ζ shrinks as N^aspect_exponent
  // The smallest N the scaled-down rules are made and tested for; some smaller N plan, not all
  // (a failure below it says so).
  double min_params = 1e5;
  double aspect_exponent = 0.14;   // ζ(3e5) ≈ 28, ζ(2e6) ≈ 37, ζ(1e8) ≈ 64
  // Default vocabulary / sequence length: the paper's 65536 / 2048; byte-level tiny models below.
  double tiny_params = 1e7;  // N <= this: vocab 256 (bytes), seq_len 256 (128 when N < 1e6)
};

// Known families: "paper". Returns nullopt for any other name.
std::optional<FamilyRules> family_by_name(std::string_view name);
// The names accepted by family_by_name, for error messages: "paper".
std::string family_names();

// ζ target for N: aspect_ratio at full scale, aspect_ratio·(N/full_scale)^exponent below it.
double aspect_ratio_for(const FamilyRules& f, double total_params);
// head_dim for a continuous width: the largest power of two <= d_model/4 (at least 4 heads),
// clamped to [min_head_dim, max_head_dim]. 1408 -> 128, 500 -> 64, 100 -> 16, 50 -> 8.
int64_t head_dim_for(const FamilyRules& f, double d_model);
// Alignment of d_expert and d_ffn: the largest power of two <= d_model/32, clamped to [8, 32].
// d_model >= 1024 -> 32 (the paper's), 512..1023 -> 16, below 512 -> 8.
int64_t alignment_for(int64_t d_model);
int64_t default_vocab(const FamilyRules& f, double total_params);
int64_t default_seq_len(const FamilyRules& f, double total_params);

}  // namespace moeplan
