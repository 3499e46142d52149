#include "moeplan/sweeps/request.hpp"

#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/sweeps/arch_io.hpp"

namespace moeplan {

double parse_positive(const std::string& text, const std::string& flag) {
  const double v = parse_quantity(text, flag);
  if (!(v > 0))
    throw InputError(fmt::format("{} = {} is invalid; it must be a positive number", flag, text));
  return v;
}

int64_t parse_positive_integer(const std::string& text, const std::string& flag) {
  const double v = parse_quantity(text, flag);
  if (!(v >= 1) || v != std::floor(v) || v > 9e15)
    throw InputError(
        fmt::format("{} = {} is invalid; it must be a whole number from 1 to 9e15", flag, text));
  return int64_t(v);
}

ConventionChoice parse_convention_flag(const std::string& text) {
  if (text == "paper") return {Convention::paper, AttentionMask::full};
  if (text == "exact" || text == "exact/causal") return {Convention::exact, AttentionMask::causal};
  if (text == "exact/full") return {Convention::exact, AttentionMask::full};
  if (text == "megatron") return {Convention::megatron, AttentionMask::causal};
  throw InputError(fmt::format(
      "--convention '{}' is not known; use paper, exact (= exact/causal), exact/full or megatron",
      text));
}

double parse_warmup_fraction(const std::string& text) {
  if (text.empty()) return -1;
  const double f = parse_quantity(text, "--warmup-frac");
  if (!(f >= 0 && f < 1))
    throw InputError(fmt::format(
        "--warmup-frac = {} is invalid; it must be in [0, 1): the share of each point's steps "
        "spent warming up (0.01 is the paper's rule without its 200-step floor)",
        text));
  return f;
}

double parse_lr_scale(const std::string& text) {
  if (text.empty()) return 1;
  const double f = parse_quantity(text, "--lr-scale");
  if (!(f > 0 && f <= 100))
    throw InputError(fmt::format(
        "--lr-scale = {} is invalid; it must be in (0, 100]: the factor on each point's "
        "step-law η (0.5 and 2 bracket it)",
        text));
  return f;
}

namespace {
// A tolerance flag: a number or a percentage ("1%", as `audit --tolerance` takes it), in (0, hi);
// out of it, the line names the range (0 said only "must be a positive number").
double tolerance_flag(const std::string& text, const char* flag, double hi, const char* kind) {
  double v = 0;
  try {
    v = parse_quantity_or_percent(text, flag);
  } catch (const InputError&) {
    throw InputError(
        fmt::format("{} {}: not a tolerance; it is {}: give a number in (0, {:g}) "
                    "or a percentage",
                    flag, text, kind, hi));
  }
  if (!(v > 0 && v < hi))
    throw InputError(
        fmt::format("{} = {} is invalid; it is {} and must be in (0, {:g})", flag, text, kind, hi));
  return v;
}
}  // namespace

PlanRequest make_plan_request(const PlanFlags& f) {
  PlanRequest r;
  if (f.n.empty()) throw InputError("--N is required: the total parameters N (e.g. 2e9, 2B)");
  const double n = parse_quantity(f.n, "--N");
  if (!(n > 0))
    throw InputError(fmt::format(
        "--N = {} is invalid; N must be a positive number of parameters (e.g. 2e9, 2B, 3e5)", f.n));
  r.n_target = n;
  const auto family = family_by_name(f.family);
  if (!family)
    throw InputError(
        fmt::format("--family '{}' is not known; known families: {}", f.family, family_names()));
  r.family = *family;

  r.solve.n_tolerance =
      tolerance_flag(f.n_tolerance, "--n-tolerance", 0.5, "relative (0.01 or 1% = 1 % of N)");
  r.solve.ra_tolerance = tolerance_flag(f.ra_tolerance, "--ra-tolerance", 1,
                                        "absolute (0.005 or 0.5% = 0.5 points of r_a)");
  if (!f.alignment.empty())
    r.solve.expert_alignment = parse_positive_integer(f.alignment, "--alignment");

  r.backbone.count_router = f.count_router;
  r.backbone.count_norms = f.count_norms;
  if (!f.vocab.empty()) {
    r.backbone.vocab = parse_positive_integer(f.vocab, "--vocab");
    if (r.backbone.vocab < 2)
      throw InputError(
          fmt::format("--vocab = {} is invalid; it must be a whole number >= 2 (a "
                      "language model predicts one of several tokens)",
                      f.vocab));
  }
  if (!f.seq_len.empty()) r.backbone.seq_len = parse_positive_integer(f.seq_len, "--seq-len");
  if (!f.head_dim.empty()) r.backbone.head_dim = parse_positive_integer(f.head_dim, "--head-dim");
  r.dp_width = parse_positive_integer(f.dp_width, "--dp-width");
  r.warmup_fraction = parse_warmup_fraction(f.warmup_frac);
  r.lr_scale = parse_lr_scale(f.lr_scale);

  const int budgets = !f.compute.empty() + !f.dense_tokens.empty() + !f.dense_tpp.empty();
  if (budgets > 1)
    throw InputError("give at most one of --compute, --dense-tokens, --dense-tpp (they all fix C)");
  if (!f.compute.empty()) {
    r.budget.kind = BudgetKind::compute;
    r.budget.value = parse_positive(f.compute, "--compute");
  } else if (!f.dense_tokens.empty()) {
    r.budget.kind = BudgetKind::dense_tokens;
    r.budget.value = parse_positive(f.dense_tokens, "--dense-tokens");
  } else {
    r.budget.kind = BudgetKind::dense_tpp;
    r.budget.value = f.dense_tpp.empty() ? 20.0 : parse_positive(f.dense_tpp, "--dense-tpp");
  }
  if (!f.unique_tokens.empty() && !f.epochs.empty())
    throw InputError(
        "give at most one of --unique-tokens (strict reuse) and --epochs (loose reuse)");
  if (!f.epochs.empty()) {
    r.budget.reuse = Reuse::loose;
    r.budget.epochs = parse_quantity(f.epochs, "--epochs");
    if (!(r.budget.epochs >= 1))
      throw InputError(fmt::format("--epochs = {} is invalid; it must be >= 1", f.epochs));
  } else {
    r.budget.reuse = Reuse::strict;
    if (!f.unique_tokens.empty())
      r.budget.tokens_unique = parse_positive(f.unique_tokens, "--unique-tokens");
  }
  if (!f.backbone.empty()) {
    Arch b = read_backbone(f.backbone);
    b.count_router = b.count_router || f.count_router;
    b.count_norms = b.count_norms || f.count_norms;
    if (r.backbone.vocab > 0) b.vocab = r.backbone.vocab;
    if (r.backbone.seq_len > 0) b.seq_len = r.backbone.seq_len;
    if (!f.head_dim.empty())
      throw InputError("--head-dim cannot change a --backbone file's head_dim; edit the file");
    r.given_backbone = b;
  }
  const ConventionChoice c = parse_convention_flag(f.convention);
  r.convention = c.convention;
  r.mask = c.mask;
  return r;
}

}  // namespace moeplan
