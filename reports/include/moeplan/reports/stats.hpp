#pragma once
// Summaries of a few replicates (seeds): mean, sample standard deviation, range, and the
// Student-t confidence interval of the mean that a reviewer asks for before calling a margin a
// win.
#include <optional>
#include <vector>

namespace moeplan {

struct Stats {
  int n = 0;
  double mean = 0, sd = 0, lo = 0, hi = 0;
  bool has_sd = false;  // n >= 2
};

Stats stats_of(const std::vector<double>& values);

// The t with P(|T| > t) = 1 - level for Student's t with `dof` >= 1 degrees of freedom: the
// two-sided critical value (12.71 at level 0.95 and 1 degree of freedom). level in (0, 1).
double student_t_critical(double level, int dof);

struct Interval {
  double lo = 0, hi = 0;
};

// The `level` confidence interval of the mean, mean ± t·sd/√n with n − 1 degrees of freedom;
// nullopt under 2 values.
std::optional<Interval> mean_interval(const Stats& s, double level);

// The fewest values (2 or more, at most `most`) whose `level` interval would leave out 0 if their
// mean and sd were s's: the smallest n with t(n − 1)·sd/√n < |mean|. A planning figure, not a
// promise (another n draws another mean and sd). nullopt for a mean of 0, no sd, or more than
// `most`.
std::optional<int> values_to_exclude_zero(const Stats& s, double level, int most = 1000);

}  // namespace moeplan
