#include "moeplan/planner/solve.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"

namespace moeplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t round_to(double x, int64_t multiple) {
  return std::max<int64_t>(multiple, std::llround(x / double(multiple)) * multiple);
}

double sq(double x) {
  return x * x;
}

// Cost of (E, K) under the family's preferences; 0 inside the fine-grained band with 1 < K <= soft
// max.
double family_cost(const FamilyRules& f, int64_t experts, int64_t top_k) {
  double c = 0;
  if (experts < f.experts_lo) c += std::log(double(f.experts_lo) / double(experts));
  if (experts > f.experts_hi) c += std::log(double(experts) / double(f.experts_hi));
  if (top_k == 1) c += f.topk1_penalty;
  if (top_k > f.topk_soft_max) c += std::log(double(top_k) / double(f.topk_soft_max));
  return c;
}

// "1e5" for a power of ten (how the docs write the family's limits), else the shortest form.
std::string short_form(double v) {
  const double e = std::round(std::log10(v));
  return std::pow(10.0, e) == v ? fmt::format("1e{}", int(e)) : fmt::format("{:g}", v);
}

// `limit` is kMaxTotalParams for an N asked for; the MoE solver's target is a solved baseline's
// N, which may land above it by up to the tolerance (an ask of 1e18 solves to 1.0000000123e18).
void check_target(double n_target, const FamilyRules& f, double limit = kMaxTotalParams) {
  if (!(n_target > 0) || !std::isfinite(n_target))
    throw InputError(
        fmt::format("N = {} is invalid; it must be a positive number of parameters", n_target));
  // Under one parameter the width solve underflows and the layer count overflows int64.
  if (n_target < 1)
    throw InputError(fmt::format(
        "N = {:.4g} is less than one parameter (N counts parameters: 2e9 or 2B); ask for N >= {}",
        n_target, short_form(f.min_params)));
  if (n_target > limit)
    throw InputError(fmt::format(
        "N = {:.4g} is above the largest N moeplan plans, {} (parameters are counted in 64-bit "
        "integers); ask for N <= {}",
        n_target, short_form(kMaxTotalParams), short_form(kMaxTotalParams)));
}

// Appended to a failure to find a shape for N: below the family's smallest N, that is the fix.
std::string below_minimum(double n_target, const FamilyRules& f) {
  return n_target < f.min_params
             ? fmt::format(
                   "; N = {:.4g} is below the {} the {} family's rules are made for: ask "
                   "for N >= {}",
                   n_target, short_form(f.min_params), f.name, short_form(f.min_params))
             : std::string();
}

// Continuous width d_model for N: N = per_layer(d)·L(d) + fixed(d), L = max(min_layers, d/ζ).
template <class ParamsOf>
double continuous_width(double n_target, ParamsOf params_of) {
  double lo = 1, hi = 1e7;
  for (int i = 0; i < 200 && hi - lo > 1e-6 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (params_of(mid) < n_target ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Arch base_arch(int64_t d_model, int64_t layers, int64_t head_dim, int64_t seq_len, int64_t vocab,
               const BackboneOptions& o) {
  Arch a;
  a.d_model = d_model;
  a.layers = layers;
  a.heads = d_model / head_dim;
  a.kv_heads = a.heads;
  a.head_dim = head_dim;
  a.seq_len = seq_len;
  a.vocab = vocab;
  a.tied_embeddings = o.tied_embeddings;
  a.count_router = o.count_router;
  a.count_norms = o.count_norms;
  return a;
}

}  // namespace

MoeSolver::MoeSolver(const Arch& backbone, double n_target, const FamilyRules& family,
                     const SolveOptions& options)
    : backbone_(backbone), family_(family), options_(options), n_target_(n_target) {
  if (!(options.n_tolerance > 0))
    throw InputError(fmt::format("n_tolerance = {} is invalid; it must be > 0 (e.g. 0.01)",
                                 options.n_tolerance));
  check_target(n_target, family, kMaxTotalParams * (1 + std::min(options.n_tolerance, 0.5)));
  if (backbone_.moe_layers() <= 0)
    throw InputError(fmt::format("backbone: layers = {} with dense_layers = {} leaves no MoE layer",
                                 backbone_.layers, backbone_.dense_layers));
  if (!(options.ra_tolerance > 0))
    throw InputError(fmt::format("ra_tolerance = {} is invalid; it must be > 0 (e.g. 0.005)",
                                 options.ra_tolerance));
  backbone_.experts = backbone_.top_k = backbone_.d_expert = backbone_.d_shared = 0;
  base_ = count_params(backbone_).total_params;  // attention + dense FFN (+ norms if counted)
  unit_ = backbone_.moe_layers() * backbone_.d_model;
  router_ = backbone_.count_router ? 1 : 0;
  align_ =
      options.expert_alignment > 0 ? options.expert_alignment : alignment_for(backbone_.d_model);
  const int64_t s = family_.shared_per_topk;
  const double smallest = double(base_) + double(unit_) * double(3 * (s + 1) * align_ + router_);
  if (smallest > n_target * (1 + options.n_tolerance))
    throw InputError(fmt::format(
        "N = {:.4g} is too small for this backbone: attention and dense layers take {} "
        "parameters and one expert of width {} brings N to {:.4g}; ask for a larger N or a "
        "smaller backbone{}",
        n_target, base_, align_, smallest, below_minimum(n_target, family_)));
  const double avail = n_target - double(base_);
  const double tol_n = options.n_tolerance * n_target;
  const int64_t u = unit_, r = router_;
  for (int64_t de = align_;; de += align_) {
    // Smallest layer at this width (K = 1, E = 1) already overshoots N: wider is only worse.
    if (double(u) * double(3 * (s + 1) * de + r) > avail + tol_n) break;
    const double per_expert = double(u) * double(3 * de + r);
    WidthRow row{de, 0, avail / per_expert, 3.0 * double(u) * double(s * de) / per_expert};
    auto experts_for = [&](int64_t k) {
      return int64_t(std::floor(row.e_at_k0 - row.e_per_k * double(k) + 0.5));
    };
    // E(K) − K decreases with K: the largest K that keeps E >= K.
    row.k_max = int64_t(avail / (double(u) * double(3 * (s + 1) * de + r)));
    while (row.k_max >= 1 && experts_for(row.k_max) < row.k_max) --row.k_max;
    // E is smallest at k_max; if even that exceeds the ceiling, this width is too narrow.
    if (row.k_max < 1 || experts_for(row.k_max) > family_.experts_max) continue;
    rows_.push_back(row);
  }
}

MoeSolution MoeSolver::solve(double t) const {
  if (!(t > 0 && t <= 1))
    throw InputError(fmt::format("r_a = {} is invalid; it must be in (0, 1]", t));
  const int64_t s = family_.shared_per_topk, r = router_, u = unit_;
  const double tol_n = options_.n_tolerance * n_target_;
  const double tol_ra = options_.ra_tolerance;
  // Active expert-side parameters per unit (moe_layers·d_model) the target asks for.
  const double active_target = (t * n_target_ - double(base_)) / double(u);

  struct Pick {
    double miss = kInf, cost = kInf;
    int64_t experts = 0, top_k = 0, d_expert = 0, total = 0, active = 0;
  } best;
  // The r_a of the candidates nearest the target from below and from above: when none is within
  // tolerance they say why (the floor of r_a, its ceiling, or the step between shapes).
  double below = -kInf, above = kInf;
  // E is first the count nearest N for each (D_e, K); where no such pick reaches r_a, E's
  // neighbours within the N tolerance are tried too (at small N one expert more or less moves
  // r_a by points, and the nearest E can miss a target a neighbour meets).
  auto scan = [&](int64_t spread) {
    for (const WidthRow& row : rows_) {
      const int64_t de = row.d_expert;
      const double k_cont = (active_target - double(r) * row.e_at_k0) / double(3 * (s + 1) * de);
      // k_max is the largest K whose nearest E is still >= K; with E's neighbours tried, a K
      // above it can meet E = K within the N tolerance (r_a 1 at small N: E39 K39 at N 1e5).
      const int64_t k_hi = row.k_max + spread;
      const int64_t k_floor = std::clamp<int64_t>(int64_t(std::floor(k_cont)), 1, k_hi);
      const int64_t k_ceil = std::clamp<int64_t>(k_floor + 1, 1, k_hi);
      for (int64_t k = k_floor; k <= k_ceil; ++k) {
        const int64_t e_near = int64_t(std::floor(row.e_at_k0 - row.e_per_k * double(k) + 0.5));
        for (int64_t e = e_near - spread; e <= e_near + spread; ++e) {
          if (e < k || e > family_.experts_max) continue;
          const int64_t n = base_ + u * (3 * (s * k + e) * de + r * e);
          if (std::fabs(double(n) - n_target_) > tol_n) continue;
          const int64_t na = base_ + u * (3 * (s * k + k) * de + r * e);
          const double ra = double(na) / double(n);
          if (ra <= t)
            below = std::max(below, ra);
          else
            above = std::min(above, ra);
          const double err = std::fabs(ra - t);
          const double miss = std::max(0.0, err - tol_ra);
          if (miss > best.miss + 1e-15) continue;
          const double cost = family_cost(family_, e, k) + 0.5 * err / tol_ra +
                              0.1 * std::fabs(double(n) - n_target_) / tol_n;
          if (miss < best.miss - 1e-15 || cost < best.cost) best = {miss, cost, e, k, de, n, na};
        }
      }
    }
  };
  scan(0);
  if (best.miss > 0) scan(3);
  if (best.experts == 0)
    throw InputError(fmt::format(
        "no MoE layer on backbone '{}' brings N within {:.2g}% of {:.4g} with d_expert a "
        "multiple of {} and at most {} experts{}",
        describe(backbone_), 100 * options_.n_tolerance, n_target_, align_, family_.experts_max,
        below_minimum(n_target_, family_)));
  MoeSolution out;
  out.arch = backbone_;
  out.arch.experts = best.experts;
  out.arch.top_k = best.top_k;
  out.arch.d_expert = best.d_expert;
  out.arch.d_shared = s * best.top_k * best.d_expert;
  out.total_params = best.total;
  out.active_params = best.active;
  out.activation_rate = double(best.active) / double(best.total);
  out.reachable = best.miss == 0;
  if (!out.reachable) {
    // Why: below the always-active share nothing reaches; between that floor and r_a = 1 the
    // reachable r_a move in steps of one expert or one top_k, and at small N those steps can be
    // wider than the tolerance on both sides of the target.
    // The always-active share of this point's N, as its parameter table shows it (the floor test
    // uses the N asked for, which the point's N differs from by up to the N tolerance).
    const double fixed_share = double(base_) / double(best.total);
    std::string why;
    if (t < fixed_share)
      why = fmt::format("attention and dense layers alone are {:.2f}% of its N", 100 * fixed_share);
    else if (below == -kInf)
      why = fmt::format(
          "the lowest reachable r_a at this N: attention and dense layers are {:.2f}% of its N "
          "and the narrowest expert layer adds the rest",
          100 * fixed_share);
    else if (above == kInf)
      why = fmt::format("the highest r_a at this N is {:.2f}%", 100 * below);
    else
      why = fmt::format(
          "at this N one expert or one top_k more or less moves r_a from {:.2f}% to {:.2f}%, a "
          "step wider than the tolerance (expert granularity)",
          100 * below, 100 * above);
    out.note = fmt::format(
        "r_a {:.2f}% not reachable within ±{} points; nearest reachable {:.2f}% (E{} K{} "
        "De{}); {}",
        100 * t, percent_text(tol_ra), 100 * out.activation_rate, best.experts, best.top_k,
        best.d_expert, why);
  }
  return out;
}

Arch solve_moe_backbone(double n_target, const FamilyRules& f, const BackboneOptions& o) {
  check_target(n_target, f);
  const double zeta = aspect_ratio_for(f, n_target), mu = f.moe_width_ratio, alpha = f.ffn_ratio;
  const int64_t ld = f.dense_first_layers;
  const int64_t min_layers = std::max(f.min_layers, ld + 1);
  const double width = continuous_width(n_target, [&](double d) {
    const double layers = std::max(double(min_layers), d / zeta);
    return d * d * (layers * (4 + 3 * mu) + double(ld) * 3 * (alpha - mu));
  });
  const int64_t hd = o.head_dim > 0 ? o.head_dim : head_dim_for(f, width);
  const int64_t vocab = o.vocab > 0 ? o.vocab : default_vocab(f, n_target);
  const int64_t seq_len = o.seq_len > 0 ? o.seq_len : default_seq_len(f, n_target);
  Arch best;
  double best_score = kInf;
  const int64_t k_lo = std::max<int64_t>(1, int64_t(0.6 * width / double(hd)));
  const int64_t k_hi = std::max<int64_t>(k_lo, int64_t(std::ceil(1.6 * width / double(hd)))) + 1;
  for (int64_t k = k_lo; k <= k_hi; ++k) {
    const int64_t dm = k * hd;
    const int64_t align = o.ffn_alignment > 0 ? o.ffn_alignment : alignment_for(dm);
    const double l_cont = double(dm) / zeta;
    const int64_t l_lo = std::max<int64_t>(min_layers, int64_t(std::floor(l_cont)) - 2);
    const int64_t l_hi = std::max<int64_t>(l_lo, int64_t(std::ceil(l_cont)) + 2);
    for (int64_t layers = l_lo; layers <= l_hi; ++layers) {
      Arch a = base_arch(dm, layers, hd, seq_len, vocab, o);
      a.dense_layers = ld;
      a.d_ffn = ld > 0 ? round_to(alpha * double(dm), align) : 0;
      const double avail = n_target - double(count_params(a).total_params);
      const int64_t expert_align = alignment_for(dm);
      // The MoE layers must hold at least two experts' worth of aligned width.
      if (avail < double(a.moe_layers() * dm * 3 * 4 * expert_align)) continue;
      const double mu_got = avail / (3.0 * double(a.moe_layers()) * double(dm) * double(dm));
      const double score = sq(std::log(mu_got / mu)) + sq(std::log(double(dm) / layers / zeta));
      if (score < best_score) best_score = score, best = a;
    }
  }
  if (!(best_score < kInf)) {
    // With --head-dim given, a head wider than N affords is the cause when the rules' own
    // head_dim fits: say so, not "ask for N >= 1e5" to someone asking for 2e9.
    const int64_t rules_hd = head_dim_for(f, width);
    if (o.head_dim > 0 && o.head_dim > rules_hd && n_target >= f.min_params)
      throw InputError(fmt::format(
          "--head-dim {} is too wide for N = {:.4g}: a {}-family MoE backbone needs at least {} "
          "layers of d_model >= head_dim; give a smaller --head-dim (the rules take {} here)",
          o.head_dim, n_target, f.name, min_layers, rules_hd));
    throw InputError(fmt::format(
        "N = {:.4g} is too small for a {}-family MoE backbone (at least {} layers with head_dim "
        "{}); ask for N >= {}",
        n_target, f.name, min_layers, hd, short_form(f.min_params)));
  }
  return best;
}

Arch solve_dense(double n_target, const FamilyRules& f, const BackboneOptions& o,
                 double n_tolerance) {
  check_target(n_target, f);
  const double zeta = aspect_ratio_for(f, n_target), alpha = f.ffn_ratio;
  const double width = continuous_width(n_target, [&](double d) {
    return d * d * std::max(double(f.min_layers), d / zeta) * (4 + 3 * alpha);
  });
  const int64_t hd = o.head_dim > 0 ? o.head_dim : head_dim_for(f, width);
  const int64_t vocab = o.vocab > 0 ? o.vocab : default_vocab(f, n_target);
  const int64_t seq_len = o.seq_len > 0 ? o.seq_len : default_seq_len(f, n_target);
  const int64_t k_lo = std::max<int64_t>(1, int64_t(0.6 * width / double(hd)));
  const int64_t k_hi = std::max<int64_t>(k_lo, int64_t(std::ceil(1.6 * width / double(hd)))) + 1;
  // Coarse d_ffn steps can miss a 1% window on tiny models: halve the alignment until one fits.
  for (int64_t shrink = 1; shrink <= 32; shrink *= 2) {
    Arch best;
    double best_score = kInf;
    for (int64_t k = k_lo; k <= k_hi; ++k) {
      const int64_t dm = k * hd;
      const int64_t align = std::max<int64_t>(
          1, (o.ffn_alignment > 0 ? o.ffn_alignment : alignment_for(dm)) / shrink);
      const double l_cont = double(dm) / zeta;
      const int64_t l_lo = std::max<int64_t>(f.min_layers, int64_t(std::floor(l_cont)) - 2);
      const int64_t l_hi = std::max<int64_t>(l_lo, int64_t(std::ceil(l_cont)) + 2);
      for (int64_t layers = l_lo; layers <= l_hi; ++layers) {
        Arch a = base_arch(dm, layers, hd, seq_len, vocab, o);
        a.dense_layers = layers;
        const double rest = n_target - double(count_params(a).total_params);
        if (rest <= 0) continue;
        a.d_ffn = round_to(rest / (3.0 * double(dm) * double(layers)), align);
        const double n = double(count_params(a).total_params);
        if (std::fabs(n - n_target) > n_tolerance * n_target) continue;
        const double score = sq(std::log(double(a.d_ffn) / double(dm) / alpha)) +
                             sq(std::log(double(dm) / double(layers) / zeta)) +
                             0.01 * std::fabs(n - n_target) / (n_tolerance * n_target);
        if (score < best_score) best_score = score, best = a;
      }
    }
    if (best_score < kInf) return best;
  }
  if (const int64_t rules_hd = head_dim_for(f, width);
      o.head_dim > 0 && o.head_dim > rules_hd && n_target >= f.min_params)
    throw InputError(fmt::format(
        "--head-dim {} is too wide for N = {:.4g}: no dense {}-family shape of d_model >= "
        "head_dim has N within {:.2g}%; give a smaller --head-dim (the rules take {} here)",
        o.head_dim, n_target, f.name, 100 * n_tolerance, rules_hd));
  throw InputError(fmt::format(
      "no dense {}-family shape has N within {:.2g}% of {:.4g} (head_dim {}); ask for {}a looser "
      "--n-tolerance",
      f.name, 100 * n_tolerance, n_target, hd,
      n_target < f.min_params ? fmt::format("N >= {} or ", short_form(f.min_params)) : ""));
}

}  // namespace moeplan
