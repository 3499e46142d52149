#include "moeplan/accounting/budget.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

double effective_data(double tokens_unique, double epochs, double r_star) {
  const double repeats = std::max(0.0, epochs - 1.0);
  return tokens_unique + tokens_unique * r_star * (1.0 - std::exp(-repeats / r_star));
}

Budget make_budget(const BudgetRequest& r) {
  if (!(r.compute > 0))
    throw InputError(fmt::format("budget: compute = {} must be > 0", r.compute));
  if (!(r.flops_per_token > 0))
    throw InputError(fmt::format("budget: flops_per_token = {} must be > 0", r.flops_per_token));
  if (r.seq_len <= 0 || r.batch_seqs <= 0)
    throw InputError(fmt::format("budget: seq_len = {} and batch_seqs = {} must be > 0", r.seq_len,
                                 r.batch_seqs));
  Budget b;
  b.compute_target = r.compute;
  b.flops_per_token = r.flops_per_token;
  b.seq_len = r.seq_len;
  b.batch_seqs = r.batch_seqs;
  b.reuse = r.reuse;
  const double step_tokens = double(r.batch_seqs) * double(r.seq_len);
  const double steps = r.compute / r.flops_per_token / step_tokens;
  // Fewer than half a step would round to none; planning one step anyway would train on several
  // times the budget and still call it equal.
  if (!(steps >= 0.5))
    throw InputError(fmt::format(
        "compute C = {:.4g} FLOPs is {:.2g} of one training step ({} x {} tokens at M = {:.4g} "
        "FLOPs/token costs {:.4g} FLOPs); give a budget of at least one step",
        r.compute, steps, r.batch_seqs, r.seq_len, r.flops_per_token,
        r.flops_per_token * step_tokens));
  if (!(steps * step_tokens <= kMaxTokens))
    throw InputError(fmt::format(
        "compute C = {:.4g} FLOPs at M = {:.4g} FLOPs/token is D = {:.4g} tokens consumed, above "
        "the {:.3g} moeplan counts (64-bit integers); give a budget under {:.3g} FLOPs",
        r.compute, r.flops_per_token, steps * step_tokens, kMaxTokens,
        kMaxTokens * r.flops_per_token));
  b.steps = std::llround(steps);
  b.tokens_consumed = b.steps * r.batch_seqs * r.seq_len;
  b.compute = r.flops_per_token * double(b.tokens_consumed);
  b.compute_rel_diff = (b.compute - r.compute) / r.compute;
  double unique = 0;
  if (r.reuse == Reuse::strict) {
    if (!(r.tokens_unique > 0))
      throw InputError(
          fmt::format("budget: tokens_unique = {} must be > 0 for strict reuse", r.tokens_unique));
    unique = r.tokens_unique;
  } else {
    if (!(r.epochs >= 1.0))
      throw InputError(fmt::format("budget: epochs = {} must be >= 1 for loose reuse", r.epochs));
    unique = double(b.tokens_consumed) / r.epochs;
  }
  // Whole windows, and never more unique tokens than are consumed. A strict D̂ is a cap (what the
  // corpus holds, or the baseline's whole windows): rounded down, never above it; a loose one
  // (D / epochs) to the nearest window.
  const bool strict = r.reuse == Reuse::strict;
  if (!(unique >= (strict ? 1.0 : 0.5) * double(r.seq_len)))
    throw InputError(
        strict ? fmt::format("unique tokens D̂ = {:.4g} is under one window of S = {} tokens; "
                             "give at least one window of unique data",
                             unique, r.seq_len)
               : fmt::format("epochs = {:.4g} leaves {:.4g} unique tokens, under half a window of "
                             "S = {} tokens; give at most {:.4g} epochs (D = {} tokens consumed)",
                             r.epochs, unique, r.seq_len,
                             double(b.tokens_consumed) / double(r.seq_len), b.tokens_consumed));
  // Clamped before rounding: llround of a D̂ past 2^63 tokens (--unique-tokens 1e30) is
  // undefined, and read as one window it would have planned 2k unique tokens.
  const int64_t max_windows = b.tokens_consumed / r.seq_len;
  const double asked_windows = unique / double(r.seq_len);
  int64_t windows = asked_windows >= double(max_windows)
                        ? max_windows
                        : std::max<int64_t>(1, strict ? int64_t(std::floor(asked_windows + 1e-9))
                                                      : std::llround(asked_windows));
  b.tokens_unique = windows * r.seq_len;
  b.epochs = double(b.tokens_consumed) / double(b.tokens_unique);
  b.tokens_per_param = r.total_params > 0 ? double(b.tokens_consumed) / double(r.total_params) : 0;
  b.effective_data = effective_data(double(b.tokens_unique), b.epochs);
  return b;
}

}  // namespace moeplan
