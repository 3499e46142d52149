#pragma once
// Summaries of a few replicates (seeds): mean, sample standard deviation, range, the Student-t
// confidence interval of the mean that a reviewer asks for before calling a margin a win, its
// paired t test's p-value, and Holm's step-down over several points' p-values.
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

// P(|T| >= |t|) for Student's t with `dof` >= 1 degrees of freedom: the two-sided p-value of a
// t statistic (0.05 at t = 4.303 and 2 degrees of freedom).
double student_t_two_sided_p(double t, int dof);

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

// The two-sided p-value of the t test that the values' mean is 0 (paired, where the values are
// differences): t = mean / (sd/√n) with n − 1 degrees of freedom. Under 1 − level exactly where
// mean_interval(s, level) leaves out 0. An sd of 0 gives 0 (a mean other than 0) or 1 (a mean of
// 0); nullopt under 2 values.
std::optional<double> mean_zero_p(const Stats& s);

// Holm's step-down at family-wise error `alpha` in (0, 1): the smallest of m p-values is judged
// against alpha/m, the next against alpha/(m − 1), and so on, stopping at the first above its
// bound. True for each p rejected (told apart from its null). The chance of rejecting any true
// null stays within alpha whatever the tests' dependence (a sweep's margins share their dense
// baseline), and it rejects all that Bonferroni's alpha/m does, and more.
std::vector<bool> holm_rejects(const std::vector<double>& p, double alpha);

}  // namespace moeplan
