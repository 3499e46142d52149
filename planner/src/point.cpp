#include "moeplan/planner/point.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/hyper.hpp"
#include "moeplan/accounting/params.hpp"

namespace moeplan {

double planned_flops_per_token(const Arch& arch, Convention convention, AttentionMask mask) {
  return flops_per_token(arch, convention, mask).total;
}

Plan plan_for_arch(const Arch& arch, const PointBudget& pb) {
  validate(arch);
  if (!(pb.compute > 0) || !std::isfinite(pb.compute))
    throw InputError(
        fmt::format("compute = {} is invalid; it must be a positive number of FLOPs", pb.compute));
  Plan p;
  p.arch = arch;
  p.counts = count_params(arch);
  p.convention = pb.convention;
  const FlopsPerToken m = flops_per_token(arch, pb.convention, pb.mask);
  p.mask = m.mask;  // as the convention counts it: paper = full S, megatron = causal
  p.flops_per_token = m.total;
  const double tokens_est = pb.compute / p.flops_per_token;
  BudgetRequest req;
  req.compute = pb.compute;
  req.flops_per_token = p.flops_per_token;
  req.total_params = p.counts.total_params;
  req.seq_len = arch.seq_len;
  req.batch_seqs = step_law_batch_seqs(tokens_est, arch.seq_len, pb.dp_width);
  req.reuse = pb.reuse;
  req.tokens_unique = pb.tokens_unique > 0 ? pb.tokens_unique : tokens_est;
  req.epochs = pb.epochs;
  p.budget = make_budget(req);
  if (pb.reuse == Reuse::strict && !(pb.tokens_unique > 0)) {
    // One epoch of exactly what the rounded steps consume.
    req.tokens_unique = double(p.budget.tokens_consumed);
    p.budget = make_budget(req);
  }
  p.hyper.rule = pb.lr_scale == 1 ? "step-law" : fmt::format("step-law ×{:g}", pb.lr_scale);
  p.hyper.batch_seqs = p.budget.batch_seqs;
  p.hyper.batch_tokens = p.budget.batch_seqs * arch.seq_len;
  p.hyper.lr_peak =
      pb.lr_scale * step_law_lr(double(p.counts.total_params), double(p.budget.tokens_consumed));
  // The manifest reader (and AdamW) take η in (0, 1]: a plan past it would be written and then
  // refused by `show` and `run`. It takes a tiny N at a vast number of tokens per parameter.
  if (!(p.hyper.lr_peak <= 1))
    throw InputError(fmt::format(
        "the step law{} gives η = {:.4g} at N = {} and D = {} consumed tokens ({:.3g} tokens per "
        "parameter), above 1 (AdamW's range); plan fewer tokens per parameter or a larger N{}",
        pb.lr_scale == 1 ? "" : fmt::format(" ×{:g}", pb.lr_scale), p.hyper.lr_peak,
        p.counts.total_params, p.budget.tokens_consumed,
        double(p.budget.tokens_consumed) / double(p.counts.total_params),
        pb.lr_scale == 1 ? "" : ", or a smaller --lr-scale"));
  // The cosine floor is 1e-5, or η itself where the step law gives less (a tiny budget at a large
  // N): the schedule never rises at its end, and the manifest reads back (lr_min <= lr_peak).
  p.hyper.lr_min = std::min(p.hyper.lr_min, p.hyper.lr_peak);
  p.hyper.warmup_steps = pb.warmup_fraction >= 0
                             ? warmup_steps_share(p.budget.steps, pb.warmup_fraction)
                             : warmup_steps(p.budget.steps);
  return p;
}

}  // namespace moeplan
