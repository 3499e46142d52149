#include "moeplan/sweeps/grid.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/sweeps/manifest_io.hpp"

namespace moeplan {

namespace {

double parse_rate(std::string_view text, std::string_view whole) {
  double v = 0;
  try {
    v = parse_quantity(text, "--ra");
  } catch (const InputError& e) {
    // A number past a double's range, or one with an exponent and a suffix, keeps its reason.
    std::string_view why = e.what();
    if (why.starts_with("--ra: ")) why.remove_prefix(6);
    if (why.find("is not a number") == std::string_view::npos)
      throw InputError(fmt::format("--ra '{}': {}", whole, why));
    throw InputError(
        fmt::format("--ra '{}': '{}' is not a number; write a range A:B (e.g. 0.05:0.4) or a list "
                    "(e.g. 0.1,0.2,0.3) of activation rates in (0, 1]",
                    whole, text));
  }
  if (!(v > 0 && v <= 1))
    throw InputError(
        fmt::format("--ra '{}': r_a = {} is outside (0, 1]; activation rates are "
                    "fractions, e.g. 0.2 for 20 %",
                    whole, v));
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return out;
}

// Enough decimals that distinct targets get distinct ids (3 at least, 9 at most).
int id_decimals(std::vector<double> rates) {
  std::sort(rates.begin(), rates.end());
  double gap = 1;
  for (size_t i = 1; i < rates.size(); ++i)
    if (rates[i] > rates[i - 1]) gap = std::min(gap, rates[i] - rates[i - 1]);
  int decimals = 3;
  while (decimals < 9 && gap < 2 * std::pow(10.0, -decimals)) ++decimals;
  return decimals;
}

}  // namespace

std::vector<double> parse_ra_spec(std::string_view text, std::optional<int> points_given) {
  if (text.empty())
    throw InputError("--ra '': give a range A:B (e.g. 0.05:0.4) or a list (e.g. 0.1,0.2,0.3)");
  // The count first: a bad one is the error whatever --ra is (a single rate's refusal of --points
  // would otherwise suggest the same bad count with a range).
  if (points_given && (*points_given < 1 || *points_given > kMaxPoints))
    throw InputError(fmt::format(
        "--points {} is invalid; it must be in [1, {}] (each point is a training run)",
        *points_given, kMaxPoints));
  if (text.find(':') != std::string_view::npos) {
    const int points = points_given.value_or(8);
    const auto parts = split(text, ':');
    if (parts.size() != 2)
      throw InputError(fmt::format("--ra '{}' is not a range A:B (e.g. 0.05:0.4)", text));
    const double a = parse_rate(parts[0], text), b = parse_rate(parts[1], text);
    if (b < a)
      throw InputError(
          fmt::format("--ra '{}': the range end {} is below its start {}; write A:B "
                      "with A <= B",
                      text, b, a));
    if (a == b) {  // A:A is one rate, not --points copies of it: a count given is refused
      if (points_given && *points_given != 1)
        throw InputError(fmt::format(
            "--ra '{}' is one rate; --points {} would be ignored (give a range A:B with A < B, "
            "or drop --points)",
            text, *points_given));
      return {a};
    }
    if (points == 1)
      throw InputError(
          fmt::format("--ra '{}' with --points 1: a range needs at least 2 points", text));
    std::vector<double> out(static_cast<size_t>(points));
    // Rounded to 1e-12 so that 0.1:0.5 gives 0.3, not 0.30000000000000004, in ids and files.
    for (int i = 0; i < points; ++i)
      out[size_t(i)] = std::round((a + (b - a) * double(i) / double(points - 1)) * 1e12) / 1e12;
    out.back() = b;  // exactly the requested end
    return out;
  }
  // --points spaces a range; with a list or one rate it would be ignored.
  if (points_given)
    throw InputError(fmt::format(
        "--points {} applies to a range A:B only; --ra '{}' is a {}: drop --points, or give a "
        "range (e.g. --ra 0.1:0.4 --points {})",
        *points_given, text, text.find(',') == std::string_view::npos ? "single rate" : "list",
        std::max(*points_given, 2)));
  std::vector<double> out;
  for (std::string_view part : split(text, ',')) {
    const double v = parse_rate(part, text);
    // The same rate twice would plan the same point twice (ids moe-ra0.100 and moe-ra0.100-2).
    for (double seen : out)
      if (seen == v)
        throw InputError(fmt::format(
            "--ra '{}': r_a {} is listed twice; give each activation rate once", text, v));
    out.push_back(v);
  }
  return out;
}

namespace {
// The paper's warm-up, clip(0.01·steps, 200, 2000), is its 200-step floor in a short run: a third
// of a 600-step dense baseline's steps and a fifth of a MoE point's that trains twice as many.
// The sweep then differs in schedule beside architecture; the dense baseline's note says so.
void note_unequal_warmup(Manifest& m, double warmup_fraction) {
  if (warmup_fraction >= 0 || m.points.empty()) return;
  auto share = [](const Plan& p) { return double(p.hyper.warmup_steps) / double(p.budget.steps); };
  double lo = share(m.points.front()), hi = lo;
  for (const Plan& p : m.points) {
    lo = std::min(lo, share(p));
    hi = std::max(hi, share(p));
  }
  const double dense = share(m.dense);
  const double all_lo = std::min(lo, dense), all_hi = std::max(hi, dense);
  if (!(all_hi > 0.05 && all_hi > 1.2 * all_lo)) return;
  const std::string moe = lo == hi ? fmt::format("{:.1f}%", 100 * lo)
                                   : fmt::format("{:.1f}–{:.1f}%", 100 * lo, 100 * hi);
  m.dense.note += fmt::format(
      "{}warm-up (clip(0.01·steps, 200, 2000)) is {:.1f}% of the dense baseline's steps and {} "
      "of the MoE points': the points differ in schedule too; --warmup-frac F gives every point "
      "the same share",
      m.dense.note.empty() ? "" : "; ", 100 * dense, moe);
}
}  // namespace

Manifest plan_sweep(const SweepRequest& r) {
  if (r.activation_rates.empty()) throw InputError("--ra: the sweep has no activation rates");
  EqualResourcePlanner planner(r.plan);
  Manifest m;
  m.family = r.plan.family.name;
  m.created_by = r.created_by;
  m.n_target = r.plan.n_target;
  m.n_tolerance = r.plan.solve.n_tolerance;
  m.ra_tolerance = r.plan.solve.ra_tolerance;
  m.compute_tolerance = r.compute_tolerance;
  m.train = r.train;
  m.dense = planner.dense();
  const int decimals = id_decimals(r.activation_rates);
  // Rates the shape rules cannot tell apart (a grid finer than the expert granularity) solve to
  // one architecture: training it once per rate would spend the same compute on the same model.
  // Each architecture is planned once, for the rate nearest what it reaches; the note names the
  // other rates.
  struct Group {
    Plan plan;
    std::vector<double> also;  // the other rates that solved to plan.arch, in the order given
  };
  std::vector<Group> groups;
  for (double ra : r.activation_rates) {
    Plan p = planner.plan_point(ra);
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const Group& g) { return g.plan.arch == p.arch; });
    if (same == groups.end()) {
      groups.push_back({std::move(p), {}});
      continue;
    }
    const double reached = p.counts.activation_rate();
    if (std::fabs(reached - ra) < std::fabs(reached - same->plan.activation_rate_target)) {
      same->also.push_back(same->plan.activation_rate_target);
      same->plan = std::move(p);
    } else {
      same->also.push_back(ra);
    }
  }
  m.points.reserve(groups.size());
  std::map<std::string, int> seen;
  for (Group& g : groups) {
    Plan& p = g.plan;
    std::string id = fmt::format("moe-ra{:.{}f}", p.activation_rate_target, decimals);
    const int n = ++seen[id];
    if (n > 1) id += fmt::format("-{}", n);
    p.id = std::move(id);
    if (!g.also.empty()) {
      std::sort(g.also.begin(), g.also.end());
      const double reached = p.counts.activation_rate();
      std::vector<double> near, far;  // within the r_a tolerance of what the point reaches, or not
      for (double ra : g.also)
        (std::fabs(reached - ra) <= r.plan.solve.ra_tolerance + 1e-12 ? near : far).push_back(ra);
      // "r_a 0.020", "r_a 0.020 and 0.030", or past six "870 rates from r_a 0.0200 to 0.0705".
      auto listed = [&](const std::vector<double>& rates) {
        if (rates.size() > 6)
          return fmt::format("{} rates from r_a {:.{}f} to {:.{}f}", rates.size(), rates.front(),
                             decimals, rates.back(), decimals);
        std::string out = "r_a ";
        for (size_t i = 0; i < rates.size(); ++i)
          out += fmt::format("{}{:.{}f}",
                             i == 0                  ? ""
                             : i + 1 == rates.size() ? " and "
                                                     : ", ",
                             rates[i], decimals);
        return out;
      };
      if (!near.empty())
        p.note += fmt::format(
            "{}{} solve{} to this architecture too; planned once, for the target nearest its "
            "r_a {:.2f}%",
            p.note.empty() ? "" : "; ", listed(near), near.size() == 1 ? "s" : "", 100 * reached);
      if (!far.empty())
        p.note += fmt::format(
            "{}{}{}, not reachable within ±{} points: {} to this architecture, the nearest "
            "reachable (r_a {:.2f}%), planned once here",
            p.note.empty() ? "" : "; ", kMergedUnreachable, listed(far),
            percent_text(r.plan.solve.ra_tolerance), far.size() == 1 ? "it solves" : "they solve",
            100 * reached);
    }
    m.points.push_back(std::move(p));
  }
  note_unequal_warmup(m, r.plan.warmup_fraction);
  check_train_fits_points(m, "grid");
  return m;
}

double compute_spread(const Manifest& m) {
  double lo = m.dense.budget.compute, hi = lo;
  for (const Plan& p : m.points) {
    lo = std::min(lo, p.budget.compute);
    hi = std::max(hi, p.budget.compute);
  }
  return (hi - lo) / m.dense.budget.compute_target;
}

}  // namespace moeplan
