#pragma once
// Command-line flags of `moeplan grid` / `moeplan plan`, as text, turned into a PlanRequest.
// Kept out of cli/ so that every rule about valid values is tested here, and so that both
// commands give the same one-line errors (naming the flag, the value and what is valid).
#include <cstdint>
#include <string>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/planner/equal_resource.hpp"

namespace moeplan {

struct PlanFlags {
  std::string n;  // --N (required)
  std::string family = "paper";
  std::string compute;        // --compute C           } at most one;
  std::string dense_tokens;   // --dense-tokens D      } none: --dense-tpp 20
  std::string dense_tpp;      // --dense-tpp T         }
  std::string unique_tokens;  // --unique-tokens U (strict)  } at most one; none: strict with
  std::string epochs;         // --epochs E (loose)          } the dense baseline's consumed D
  std::string convention = "paper";  // paper | exact | exact/causal | exact/full | megatron
  std::string n_tolerance = "0.01";
  std::string ra_tolerance = "0.005";
  bool count_router = false;
  bool count_norms = false;
  std::string vocab, seq_len, head_dim, alignment;  // empty = the family's rule for N
  std::string dp_width = "1";
  std::string warmup_frac;  // --warmup-frac F: every point warms up for F of its steps
  std::string lr_scale;     // --lr-scale F: every point's η is F times the step law's
  std::string backbone;  // --backbone FILE: solve the MoE layer on this backbone
};

PlanRequest make_plan_request(const PlanFlags& flags);

// --warmup-frac: "" = -1 (the paper's clip(0.01·steps, 200, 2000)); else a share in [0, 1).
double parse_warmup_fraction(const std::string& text);

// --lr-scale: "" = 1 (the step law's η); else a factor in (0, 100].
double parse_lr_scale(const std::string& text);

// "paper", "exact" (= exact/causal), "exact/causal", "exact/full", "megatron".
struct ConventionChoice {
  Convention convention = Convention::paper;
  AttentionMask mask = AttentionMask::causal;
};
ConventionChoice parse_convention_flag(const std::string& text);

// parse_quantity, then: > 0 (positive) / a whole number >= 1 (positive_integer).
double parse_positive(const std::string& text, const std::string& flag);
int64_t parse_positive_integer(const std::string& text, const std::string& flag);

}  // namespace moeplan
