// The replicate report's statistics against published critical values and hand calculations.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "moeplan/reports/stats.hpp"

TEST_CASE("student_t_critical: the published two-sided 95 % critical values") {
  // NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2, "Critical values of the
  // Student's t distribution", upper-tail probability 0.025 (two-sided 95 %), printed to three
  // decimals.
  const struct {
    int dof;
    double t;
  } published[] = {{1, 12.706}, {2, 4.303},  {3, 3.182},  {4, 2.776},  {5, 2.571},
                   {10, 2.228}, {20, 2.086}, {30, 2.042}, {100, 1.984}};
  for (const auto& row : published) {
    CAPTURE(row.dof);
    CHECK(moeplan::student_t_critical(0.95, row.dof) ==
          doctest::Approx(row.t).epsilon(0.0005 / row.t));
  }
  // Same table, upper-tail 0.05 (two-sided 90 %): 6.314 at 1, 2.132 at 4.
  CHECK(moeplan::student_t_critical(0.90, 1) == doctest::Approx(6.314).epsilon(0.0005 / 6.314));
  CHECK(moeplan::student_t_critical(0.90, 4) == doctest::Approx(2.132).epsilon(0.0005 / 2.132));
}

TEST_CASE("student_t_critical: the closed forms at 1 and 2 degrees of freedom, to 1e-9") {
  // One degree of freedom is the Cauchy distribution: F(t) = 1/2 + atan(t)/π, so the two-sided
  // level-L value is tan(π·L/2). Two: F(t) = 1/2 + t / (2·√(t² + 2)), so with q = L (= 2F − 1),
  // t = q·√(2 / (1 − q²)).
  const double pi = std::acos(-1.0);
  for (double level : {0.5, 0.9, 0.95, 0.99}) {
    CAPTURE(level);
    CHECK(moeplan::student_t_critical(level, 1) ==
          doctest::Approx(std::tan(pi * level / 2)).epsilon(1e-9));
    CHECK(moeplan::student_t_critical(level, 2) ==
          doctest::Approx(level * std::sqrt(2 / (1 - level * level))).epsilon(1e-9));
  }
  // Many degrees of freedom: the normal's 1.959964 (two-sided 95 %).
  CHECK(moeplan::student_t_critical(0.95, 1000000) == doctest::Approx(1.959964).epsilon(1e-5));
  CHECK_THROWS_AS(moeplan::student_t_critical(1.0, 3), std::invalid_argument);
  CHECK_THROWS_AS(moeplan::student_t_critical(0.95, 0), std::invalid_argument);
}

TEST_CASE("stats_of and mean_interval, by hand") {
  // {1, 2, 3, 4}: mean 2.5, squares about it 2.25 + 0.25 + 0.25 + 2.25 = 5, sd √(5/3) = 1.290994.
  const moeplan::Stats s = moeplan::stats_of({1, 2, 3, 4});
  CHECK(s.n == 4);
  CHECK(s.mean == doctest::Approx(2.5));
  CHECK(s.has_sd);
  CHECK(s.sd == doctest::Approx(1.290994).epsilon(1e-6));
  CHECK(s.lo == 1);
  CHECK(s.hi == 4);
  // Margins -0.10, -0.12, -0.14: mean -0.12, sd 0.02, standard error 0.02/√3 = 0.011547; t at 2
  // degrees of freedom 4.302653 (the closed form above): half-width 0.049683.
  const auto ci = moeplan::mean_interval(moeplan::stats_of({-0.10, -0.12, -0.14}), 0.95);
  REQUIRE(ci);
  CHECK(ci->lo == doctest::Approx(-0.169683).epsilon(1e-5));
  CHECK(ci->hi == doctest::Approx(-0.070317).epsilon(1e-5));
  // One value has no spread, and so no interval.
  const moeplan::Stats one = moeplan::stats_of({0.3});
  CHECK_FALSE(one.has_sd);
  CHECK_FALSE(moeplan::mean_interval(one, 0.95));
  CHECK(moeplan::stats_of({}).n == 0);
}

TEST_CASE("values_to_exclude_zero: the fewest seeds whose interval would leave out 0") {
  // The main job's moe-ra0.500 over three seeds: margin mean -0.0378, sd 0.0231, |mean|/sd 1.636.
  // t/√n from the handbook's table: 12.706/√2 = 8.98, 4.303/√3 = 2.484, 3.182/2 = 1.591: 4.
  moeplan::Stats s;
  s.n = 3;
  s.mean = -0.0378;
  s.sd = 0.0231;
  s.has_sd = true;
  CHECK(moeplan::values_to_exclude_zero(s, 0.95) == 4);
  // Already clear at 2: |mean|/sd 10 > 8.98.
  s.mean = 0.231;
  CHECK(moeplan::values_to_exclude_zero(s, 0.95) == 2);
  // A mean of 0, no sd, or more than `most` values: none.
  s.mean = 0;
  CHECK_FALSE(moeplan::values_to_exclude_zero(s, 0.95));
  s.mean = -0.0378;
  CHECK_FALSE(moeplan::values_to_exclude_zero(s, 0.95, 3));
  s.has_sd = false;
  CHECK_FALSE(moeplan::values_to_exclude_zero(s, 0.95));
}

TEST_CASE("student_t_two_sided_p: the closed forms at 1 and 2 degrees of freedom; the handbook") {
  // One degree of freedom: P(|T| >= t) = 1 − (2/π)·atan(t). Two: 1 − t/√(2 + t²).
  const double pi = std::acos(-1.0);
  for (double t : {0.0, 0.5, 3.0, 10.0, 100.0}) {
    CAPTURE(t);
    CHECK(moeplan::student_t_two_sided_p(t, 1) ==
          doctest::Approx(1 - 2 / pi * std::atan(t)).epsilon(1e-9));
    CHECK(moeplan::student_t_two_sided_p(-t, 2) ==
          doctest::Approx(1 - t / std::sqrt(2 + t * t)).epsilon(1e-9));
  }
  // The handbook's two-sided 95 % values (table 1.3.6.7.2) give p 0.05 to their three decimals:
  // 4.303 at 2 (0.049993 by the closed form), 2.228 at 10, 1.984 at 100.
  CHECK(moeplan::student_t_two_sided_p(4.303, 2) == doctest::Approx(0.049993).epsilon(1e-4));
  CHECK(moeplan::student_t_two_sided_p(2.228, 10) == doctest::Approx(0.05).epsilon(0.002));
  CHECK(moeplan::student_t_two_sided_p(1.984, 100) == doctest::Approx(0.05).epsilon(0.002));
  CHECK_THROWS_AS(moeplan::student_t_two_sided_p(1.0, 0), std::invalid_argument);
}

TEST_CASE("mean_zero_p: the paired t test, by hand, and where the interval leaves out 0") {
  // Margins -0.10, -0.12, -0.14: t = -0.12 / (0.02/√3) = -10.392305, 2 degrees of freedom:
  // p = 1 − 10.392305/√(2 + 108) = 0.0091326. Margins -0.05, -0.08, -0.11: t = -4.618802,
  // p = 1 − 4.618802/√(2 + 21.333333) = 0.0438171.
  const auto p1 = moeplan::mean_zero_p(moeplan::stats_of({-0.10, -0.12, -0.14}));
  REQUIRE(p1);
  CHECK(*p1 == doctest::Approx(0.0091326).epsilon(1e-4));
  const auto p2 = moeplan::mean_zero_p(moeplan::stats_of({-0.05, -0.08, -0.11}));
  REQUIRE(p2);
  CHECK(*p2 == doctest::Approx(0.0438171).epsilon(1e-4));
  // p < 0.05 exactly where the 95 % interval leaves out 0, on either side of the boundary: mean
  // -0.08, sd = spread, the interval's top -0.08 + 4.302653·spread/√3 crosses 0 at 0.032204.
  for (double spread : {0.02, 0.032, 0.0323, 0.06}) {
    CAPTURE(spread);
    const moeplan::Stats s = moeplan::stats_of({-0.08 + spread, -0.08, -0.08 - spread});
    const auto ci = moeplan::mean_interval(s, 0.95);
    REQUIRE(ci);
    CHECK((*moeplan::mean_zero_p(s) < 0.05) == (ci->hi < 0));
  }
  // No spread: 0 for a margin other than 0, 1 for none; one value: no test.
  CHECK(moeplan::mean_zero_p(moeplan::stats_of({-0.1, -0.1})) == 0.0);
  CHECK(moeplan::mean_zero_p(moeplan::stats_of({0.0, 0.0})) == 1.0);
  CHECK_FALSE(moeplan::mean_zero_p(moeplan::stats_of({-0.1})));
}

TEST_CASE("holm_rejects: step-down bounds alpha/m, alpha/(m - 1), ..., by hand") {
  using V = std::vector<bool>;
  // 0.012 <= 0.05/4, 0.013 <= 0.05/3, 0.02 <= 0.05/2, 0.6 > 0.05: three told apart, where
  // Bonferroni (every p against 0.05/4 = 0.0125) tells apart only the first.
  CHECK(moeplan::holm_rejects({0.012, 0.013, 0.02, 0.6}, 0.05) == V{true, true, true, false});
  // Given in any order: the smallest is judged first.
  CHECK(moeplan::holm_rejects({0.6, 0.02, 0.013, 0.012}, 0.05) == V{false, true, true, true});
  // The steps stop at the first p above its bound: 0.02 > 0.0125, so none, although 0.02 is
  // under the third step's 0.025.
  CHECK(moeplan::holm_rejects({0.02, 0.02, 0.02, 0.02}, 0.05) == V(4, false));
  // A p equal to its bound is told apart (p <= alpha/(m − k)).
  CHECK(moeplan::holm_rejects({0.05, 0.025}, 0.05) == V{true, true});
  // The main job's four points over three seeds, p by hand from its table's margins (mean, sd):
  // 0.0082, 0.0336, 0.0494, 0.105. Each but the last is under 0.05 alone; together, one.
  CHECK(moeplan::holm_rejects({0.0082, 0.0336, 0.0494, 0.105}, 0.05) ==
        V{true, false, false, false});
  CHECK(moeplan::holm_rejects({}, 0.05).empty());
  CHECK_THROWS_AS(moeplan::holm_rejects({0.01}, 0.0), std::invalid_argument);
}
