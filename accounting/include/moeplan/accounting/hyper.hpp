#pragma once
// Hyper-parameter rules. Default `step-law` (Li et al. 2025, "Predictable Scale: Part I"):
// η = 1.79·N^−0.713·D^0.307, B = 0.58·D^0.571 tokens.
#include <cstdint>
#include <string>

namespace moeplan {

struct HyperParams {
  std::string rule = "step-law";
  double lr_peak = 0;        // η
  double lr_min = 1e-5;      // cosine floor (the planner lowers it to lr_peak when η is below)
  int64_t batch_seqs = 0;    // B in sequences
  int64_t batch_tokens = 0;  // B·S
  int64_t warmup_steps = 0;  // clip(0.01·steps, 200, 2000) or warmup_steps_share; <= steps
  double adam_beta1 = 0.9, adam_beta2 = 0.95, weight_decay = 0.1, grad_clip = 1.0;
};

double step_law_lr(double total_params, double tokens_consumed);
double step_law_batch_tokens(double tokens_consumed);
// Batch rounded to whole sequences and to a multiple of dp_width (at least dp_width).
int64_t step_law_batch_seqs(double tokens_consumed, int64_t seq_len, int64_t dp_width = 1);
int64_t warmup_steps(int64_t steps, int64_t floor = 200, int64_t ceil = 2000);
// The same share of every point's steps (--warmup-frac): round(fraction·steps), at least 1 when
// fraction > 0, never more than steps. Throws InputError for a fraction outside [0, 1).
int64_t warmup_steps_share(int64_t steps, double fraction);

}  // namespace moeplan
