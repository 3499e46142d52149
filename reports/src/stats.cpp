#include "moeplan/reports/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace moeplan {

Stats stats_of(const std::vector<double>& values) {
  Stats s;
  s.n = int(values.size());
  if (values.empty()) return s;
  s.lo = *std::min_element(values.begin(), values.end());
  s.hi = *std::max_element(values.begin(), values.end());
  for (double x : values) s.mean += x;
  s.mean /= double(values.size());
  if (values.size() > 1) {
    double ss = 0;
    for (double x : values) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(values.size() - 1));
    s.has_sd = true;
  }
  return s;
}

namespace {

// The regularised incomplete beta function I_x(a, b) by its continued fraction (evaluated with
// the modified Lentz method). The fraction converges in few terms for x < (a + 1) / (a + b + 2);
// above, the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) keeps it there (the t tails this file needs
// come out the same without it, to 1e-7 at 1 to 10^6 degrees of freedom, but only by more terms).
double incomplete_beta(double x, double a, double b) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(1 - x, b, a);
  const double log_front =
      std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  constexpr double tiny = 1e-300;
  auto guard = [](double v) { return std::fabs(v) < tiny ? tiny : v; };
  double c = 1, d = 1 / guard(1 - (a + b) * x / (a + 1)), f = d;
  for (int m = 1; m <= 500; ++m) {
    // The even term m·(b − m)·x / ((a + 2m − 1)(a + 2m)), then the odd term.
    const double even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    d = 1 / guard(1 + even * d);
    c = guard(1 + even / c);
    f *= d * c;
    const double odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 / guard(1 + odd * d);
    c = guard(1 + odd / c);
    f *= d * c;
    if (std::fabs(d * c - 1) < 1e-15) break;
  }
  return std::exp(log_front) * f / a;
}

// P(|T| > t) for Student's t with `dof` degrees of freedom: I_{dof/(dof + t²)}(dof/2, 1/2).
double two_sided_tail(double t, int dof) {
  return incomplete_beta(dof / (dof + t * t), 0.5 * dof, 0.5);
}

}  // namespace

double student_t_critical(double level, int dof) {
  if (!(level > 0 && level < 1) || dof < 1)
    throw std::invalid_argument("student_t_critical: level in (0, 1) and dof >= 1");
  const double alpha = 1 - level;
  // The tail falls as t grows: bracket, then bisect to the last bit.
  double lo = 0, hi = 1;
  while (two_sided_tail(hi, dof) > alpha) {
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (two_sided_tail(mid, dof) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double student_t_two_sided_p(double t, int dof) {
  if (dof < 1 || std::isnan(t))
    throw std::invalid_argument("student_t_two_sided_p: dof >= 1 and t a number");
  return two_sided_tail(t, dof);
}

std::optional<Interval> mean_interval(const Stats& s, double level) {
  if (!s.has_sd) return std::nullopt;
  const double half = student_t_critical(level, s.n - 1) * s.sd / std::sqrt(double(s.n));
  return Interval{s.mean - half, s.mean + half};
}

std::optional<int> values_to_exclude_zero(const Stats& s, double level, int most) {
  if (!s.has_sd || s.mean == 0) return std::nullopt;
  for (int n = 2; n <= most; ++n)
    if (student_t_critical(level, n - 1) * s.sd / std::sqrt(double(n)) < std::fabs(s.mean))
      return n;
  return std::nullopt;
}

std::optional<double> mean_zero_p(const Stats& s) {
  if (!s.has_sd) return std::nullopt;
  if (s.sd == 0) return s.mean == 0 ? 1.0 : 0.0;
  return student_t_two_sided_p(s.mean / (s.sd / std::sqrt(double(s.n))), s.n - 1);
}

std::vector<bool> holm_rejects(const std::vector<double>& p, double alpha) {
  if (!(alpha > 0 && alpha < 1)) throw std::invalid_argument("holm_rejects: alpha in (0, 1)");
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<bool> rejected(p.size(), false);
  for (size_t k = 0; k < order.size(); ++k) {
    if (!(p[order[k]] <= alpha / double(order.size() - k))) break;
    rejected[order[k]] = true;
  }
  return rejected;
}

}  // namespace moeplan
