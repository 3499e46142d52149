// Planner speed: a 10,000-point r_a grid at N = 2e9 (backbone, dense baseline and C solved once,
// then one MoE solve + budget per point), repeated; prints the median. Goal: < 1 s on one core.
// Ceiling: the accounting of the answers alone (count_params and M of every planned point, no
// search), the least any planner must do to state them; the ratio is what the search costs.
// Usage: bench_planner [points=10000] [repeats=7] [N=2e9]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/sweeps/grid.hpp"

using namespace moeplan;

namespace {
// CPU seconds of this thread: on a shared machine, wall time also counts other processes.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) try {
  const bench::Args args(argc, argv, "bench_planner [points=10000] [repeats=7] [N=2e9]", 3);
  const int points = int(args.integer(1, 10000, 2, 10000000));
  const int repeats = int(args.integer(2, 7, 1, 1000));
  const double n = args.real(3, 2e9, 1e5, 1e15);
  SweepRequest req;
  req.plan.n_target = n;
  req.activation_rates = parse_ra_spec("0.02:0.6", points);
  std::vector<double> seconds, cpu_seconds, ceiling_cpu;
  size_t flagged = 0;
  (void)plan_sweep(req);  // one untimed warm-up: the first repeat paid for cold caches
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    const Manifest m = plan_sweep(req);
    cpu_seconds.push_back(thread_cpu_seconds() - c0);
    // Wall time of the planner alone (the ceiling below is timed on its own).
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    // The ceiling: each answer's parameters and M, once (as many evaluations as rates asked:
    // merged rates share a point, and each rate's answer is still stated).
    double sink = 0;
    const double k0 = thread_cpu_seconds();
    for (int r = 0; r < points; ++r) {
      const Plan& p = m.points[size_t(r) % m.points.size()];
      sink += double(count_params(p.arch).total_params) +
              flops_per_token(p.arch, p.convention, p.mask).total;
    }
    ceiling_cpu.push_back(thread_cpu_seconds() - k0);
    if (sink < 0) fmt::print("impossible\n");  // keeps the loop
    flagged = 0;
    for (const Plan& p : m.points) flagged += !p.reachable;
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = bench::median(seconds);
  const double median_cpu = bench::median(cpu_seconds);
  const double median_ceiling = bench::median(ceiling_cpu);
  fmt::print(
      "bench_planner: grid N={:.3g} r_a 0.02:0.6, {} points (+ dense), {} repeats, one core\n", n,
      points, repeats);
  fmt::print("{:>10}  {:>10}  {:>10}  {:>12}  {:>12}  {:>8}  {:>6}\n", "min s", "median s", "max s",
             "median cpu s", "points/s", "flagged", "goal");
  fmt::print("{:>10.4f}  {:>10.4f}  {:>10.4f}  {:>12.4f}  {:>12.0f}  {:>8}  {:>6}\n",
             seconds.front(), median, seconds.back(), median_cpu, double(points) / median, flagged,
             "< 1 s");
  fmt::print(
      "ceiling (the answers' accounting alone, {} evaluations): median {:.4f} cpu s; the planner "
      "takes {:.1f}x it\n",
      points, median_ceiling, median_ceiling > 0 ? median_cpu / median_ceiling : 0.0);
  return 0;
} catch (const InputError& e) {
  std::fprintf(stderr, "bench_planner: %s\n", e.what());
  return 2;
}
