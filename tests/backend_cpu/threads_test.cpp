// A model at or above the serial threshold (tokens × d_model ≥ 2^16, parallel.hpp) runs its
// threaded paths: per-expert tasks (E ≥ 2·threads), the chunked gradient-norm sum, one attention
// backward scratch per thread, the threaded element-wise loops and Eigen's products. On 2
// threads it must give what 1 thread gives, up to the order of sums (Eigen blocks products by
// its thread count, so not bit for bit): loss, gradients and the updated weights. fp64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <Eigen/Core>

#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace moeplan::backend {
namespace {

#ifdef _OPENMP
struct Outcome {
  std::vector<double> objective;
  std::vector<std::vector<double>> g;  // one per repeat
  StepResult r;
  std::vector<double> p;
};

// The model reads the OpenMP count when built (its attention scratch) and at each loop; Eigen
// keeps its own once set (training_test: the serial guard). Both are set, for the whole run.
// The gradients are computed `repeats` times on the same weights: a race shows only when both
// threads happen to run at once, which a loaded 2-core machine does not give every pass.
Outcome run_on(int threads, int repeats, const Arch& a, const ModelOptions& o, int64_t B) {
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  Model<double> m(a, o, 9, B);
  REQUIRE(m.threads() == threads);  // not the serial path
  const int64_t T = B * a.seq_len;
  const auto in = test::tokens(T, a.vocab, 61), tg = test::tokens(T, a.vocab, 62);
  Outcome out;
  for (int k = 0; k < repeats; ++k) {
    out.objective.push_back(m.compute_gradients(in.data(), tg.data(), &out.r));
    out.g.emplace_back(m.gradients().begin(), m.gradients().end());
  }
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 10;
  const StepResult s = m.train_step(in.data(), tg.data(), 0, cfg);
  out.r.grad_norm = s.grad_norm;
  out.p.assign(m.parameters().begin(), m.parameters().end());
  return out;
}

// max over entries of |a − b| / max(|a|, 1e-3·max|a|): relative, with a floor for entries that
// are near zero only by cancellation.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0, worst = 0;
  for (double x : a) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(a[i]), 1e-3 * scale));
  return worst;
}

void check_threads(const std::string& positions) {
  Arch a;
  a.d_model = 64;
  a.layers = 2;
  a.dense_layers = 1;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_dim = 16;
  a.d_ffn = 64;
  a.experts = 4;  // E ≥ 2·threads at 2 threads: the per-expert task path
  a.top_k = 2;
  a.d_expert = 32;
  a.d_shared = 32;
  a.seq_len = 128;
  a.vocab = 32;
  const int64_t B = 8;  // 8 · 128 · 64 = 65,536 = 2^16: just parallel
  ModelOptions o;
  o.positions = positions;
  o.z_loss = 1e-3;
  const int omp_before = omp_get_max_threads();
  const Outcome one = run_on(1, 1, a, o, B);
  const Outcome two = run_on(2, 4, a, o, B);
  omp_set_num_threads(omp_before);
  Eigen::setNbThreads(0);  // back to the OpenMP default for the other tests
  // Enough parameters that the gradient norm takes its threaded chunks.
  CHECK(one.g[0].size() > size_t(1) << 15);
  INFO(positions);
  for (size_t k = 0; k < two.g.size(); ++k) {
    CAPTURE(k);
    CHECK(two.objective[k] == doctest::Approx(one.objective[0]).epsilon(1e-5));
    CHECK(rel_diff(one.g[0], two.g[k]) <= 1e-5);
  }
  CHECK(two.r.loss == doctest::Approx(one.r.loss).epsilon(1e-5));
  CHECK(two.r.aux_load_balance == doctest::Approx(one.r.aux_load_balance).epsilon(1e-5));
  CHECK(two.r.aux_z == doctest::Approx(one.r.aux_z).epsilon(1e-5));
  CHECK(two.r.grad_norm == doctest::Approx(one.r.grad_norm).epsilon(1e-5));
  CHECK(two.r.routed_per_moe_layer == one.r.routed_per_moe_layer);
  CHECK(two.r.flops == one.r.flops);
  CHECK(rel_diff(one.p, two.p) <= 1e-5);
}
#endif

TEST_CASE("a model above the serial threshold: 1 and 2 threads agree (ALiBi, RoPE)") {
#ifdef _OPENMP
  if (std::thread::hardware_concurrency() < 2) {
    MESSAGE("skipped: fewer than 2 hardware threads");
    return;
  }
  check_threads("alibi");
  check_threads("rope");
#else
  MESSAGE("skipped: built without OpenMP, the model runs on one thread");
#endif
}

}  // namespace
}  // namespace moeplan::backend
