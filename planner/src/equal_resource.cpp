#include "moeplan/planner/equal_resource.hpp"

#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/planner/point.hpp"

namespace moeplan {

namespace {

void check_budget(const BudgetSpec& b) {
  const char* what = b.kind == BudgetKind::compute        ? "compute"
                     : b.kind == BudgetKind::dense_tokens ? "dense-tokens"
                                                          : "dense-tpp";
  if (!(b.value > 0) || !std::isfinite(b.value))
    throw InputError(
        fmt::format("--{} = {} is invalid; it must be a positive number", what, b.value));
  if (b.reuse == Reuse::strict && b.tokens_unique < 0)
    throw InputError(
        fmt::format("--unique-tokens = {} is invalid; it must be > 0", b.tokens_unique));
  if (b.reuse == Reuse::loose && !(b.epochs >= 1))
    throw InputError(fmt::format("--epochs = {} is invalid; it must be >= 1", b.epochs));
}

}  // namespace

EqualResourcePlanner::Shapes EqualResourcePlanner::solve_shapes(const PlanRequest& r) {
  Shapes s;
  s.backbone =
      r.given_backbone ? *r.given_backbone : solve_moe_backbone(r.n_target, r.family, r.backbone);
  BackboneOptions o = r.backbone;
  // The baseline trains on the same data as the MoE points: same vocabulary and windows.
  o.vocab = s.backbone.vocab;
  o.seq_len = s.backbone.seq_len;
  // And N is counted the same way for both, and the embeddings tied alike: a backbone file's
  // count_router, count_norms or tied_embeddings reached only the MoE points, whose N then
  // counted what the baseline's did not (and the manifest was refused on reading).
  o.count_router = s.backbone.count_router;
  o.count_norms = s.backbone.count_norms;
  o.tied_embeddings = s.backbone.tied_embeddings;
  s.dense = solve_dense(r.n_target, r.family, o, r.solve.n_tolerance);
  return s;
}

EqualResourcePlanner::EqualResourcePlanner(const PlanRequest& request)
    : EqualResourcePlanner(request, solve_shapes(request)) {}

namespace {
// A failure to find an MoE shape names the N it aimed at: the baseline's, not the one asked for.
[[noreturn]] void rethrow_with_target(const InputError& e, const PlanRequest& r, double n_dense) {
  throw InputError(fmt::format(
      "{} (the MoE points are solved to the dense baseline's N, {}, for the N = {:.4g} asked "
      "for; a looser --n-tolerance than {:g} or another N may fit)",
      e.what(), int64_t(n_dense), r.n_target, r.solve.n_tolerance));
}
}  // namespace

MoeSolver EqualResourcePlanner::moe_solver(const PlanRequest& r, const Shapes& shapes) {
  const double n_dense = double(count_params(shapes.dense).total_params);
  try {
    return MoeSolver(shapes.backbone, n_dense, r.family, r.solve);
  } catch (const InputError& e) {
    rethrow_with_target(e, r, n_dense);
  }
}

// The MoE points are solved to the dense baseline's N, not to the N asked for: equal N is a claim
// against the baseline (ACCOUNTING.md, "The equal-resource contract"), and the baseline itself
// lands within the tolerance of the ask, on either side. Solving both to the ask would let a point
// at −0.5 % and a baseline at +0.8 % differ by 1.3 %, and fail the sweep's own audit.
EqualResourcePlanner::EqualResourcePlanner(const PlanRequest& request, const Shapes& shapes)
    : request_(request), solver_(moe_solver(request, shapes)) {
  check_budget(request.budget);
  const Arch& dense_arch = shapes.dense;
  const double dense_m = planned_flops_per_token(dense_arch, request.convention, request.mask);
  switch (request.budget.kind) {
    case BudgetKind::compute:
      compute_ = request.budget.value;
      break;
    case BudgetKind::dense_tokens:
      if (!(request.budget.value <= kMaxTokens))
        throw InputError(
            fmt::format("--dense-tokens = {:.4g} is above the {:.3g} tokens moeplan counts (64-bit "
                        "integers); give at most {:.3g}",
                        request.budget.value, kMaxTokens, kMaxTokens));
      compute_ = dense_m * request.budget.value;
      break;
    case BudgetKind::dense_tpp: {
      const double n_dense = double(count_params(dense_arch).total_params);
      // 1e300 tokens a parameter made C = inf, refused without the flag named.
      if (!(request.budget.value * n_dense <= kMaxTokens))
        throw InputError(fmt::format(
            "--dense-tpp = {:.4g} is D = {:.4g} tokens at the dense baseline's N = {}, above the "
            "{:.3g} tokens moeplan counts (64-bit integers); give at most {:.3g}",
            request.budget.value, request.budget.value * n_dense,
            count_params(dense_arch).total_params, kMaxTokens, kMaxTokens / n_dense));
      compute_ = dense_m * request.budget.value * n_dense;
      break;
    }
  }
  PointBudget pb{compute_,
                 request.convention,
                 request.mask,
                 request.budget.reuse,
                 request.budget.tokens_unique,
                 request.budget.epochs,
                 request.dp_width,
                 request.warmup_fraction,
                 request.lr_scale};
  dense_ = plan_for_arch(dense_arch, pb);
  dense_.id = "dense";
  dense_.role = "dense";
  dense_.activation_rate_target = 0;
  // Strict reuse fixes D̂ to the dense baseline's unique data as planned (ACCOUNTING.md, "Data,
  // epochs and reuse"): whole windows, and at most what the baseline consumes. A MoE point, with
  // its lower M, consumes more tokens; it repeats those D̂ rather than reading more unique ones,
  // or the sweep would not be equal in unique data.
  tokens_unique_ = request.budget.reuse == Reuse::strict ? double(dense_.budget.tokens_unique) : 0;
  const double asked = request.budget.tokens_unique;
  if (request.budget.reuse == Reuse::strict && asked > double(dense_.budget.tokens_consumed))
    dense_.note = fmt::format(  // notes_unique_tokens_cap() knows it by its first words
        "--unique-tokens {:.4g} is more than the dense baseline consumes ({} tokens); every point "
        "trains on the baseline's {} unique tokens (equal D̂). For no repetition in any point, "
        "use --epochs 1 (loose reuse) instead",
        asked, human(double(dense_.budget.tokens_consumed)),
        human(double(dense_.budget.tokens_unique)));
}

Plan EqualResourcePlanner::plan_point(double ra_target) const {
  MoeSolution sol;
  try {
    sol = solver_.solve(ra_target);
  } catch (const InputError& e) {
    if (!(ra_target > 0 && ra_target <= 1)) throw;  // the r_a itself, not the shape search
    rethrow_with_target(e, request_, double(dense_.counts.total_params));
  }
  PointBudget pb{
      compute_,         request_.convention,    request_.mask,     request_.budget.reuse,
      tokens_unique_,   request_.budget.epochs, request_.dp_width, request_.warmup_fraction,
      request_.lr_scale};
  Plan p = plan_for_arch(sol.arch, pb);
  p.id = fmt::format("moe-ra{:.3f}", ra_target);
  p.role = "moe";
  p.activation_rate_target = ra_target;
  p.reachable = sol.reachable;
  p.note = sol.note;
  // A point with a higher M than the baseline's consumes fewer tokens than the baseline's D̂:
  // it cannot read them all, and the sweep is then not equal in unique data. Say so.
  if (request_.budget.reuse == Reuse::strict &&
      p.budget.tokens_unique < dense_.budget.tokens_unique)
    p.note += fmt::format(
        "{}consumes D = {} tokens, fewer than the dense baseline's {} unique ones (its M {} is "
        "above the baseline's {}): it reads only {} of them, so its D̂ is not the baseline's",
        p.note.empty() ? "" : "; ", human(double(p.budget.tokens_consumed)),
        human(double(dense_.budget.tokens_unique)), human(p.flops_per_token),
        human(dense_.flops_per_token), human(double(p.budget.tokens_unique)));
  return p;
}

}  // namespace moeplan
