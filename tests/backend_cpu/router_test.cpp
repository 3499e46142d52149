// The router's top-K against a reference written here: sort every expert by probability, the
// lower index first on ties, and take the first K. Logits are drawn from a few values so that
// ties are common; the probabilities come from a softmax in double precision.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "moe.hpp"

namespace moeplan::backend::cpu {
namespace {

void check_router(int64_t T, int64_t E, int64_t K, bool renormalize, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> level(0, 5);  // 6 distinct logits: many ties
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (float& x : logits) x = 0.5f * float(level(gen)) - 1.0f;
  std::vector<float> probs = logits, lse(static_cast<size_t>(T)), gate(static_cast<size_t>(T * K));
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  router_forward(probs.data(), lse.data(), idx.data(), gate.data(), T, E, K, renormalize);
  for (int64_t t = 0; t < T; ++t) {
    CAPTURE(t);
    const float* z = logits.data() + t * E;
    double mx = z[0], sum = 0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, double(z[e]));
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(z[e]) - mx);
    CHECK(lse[size_t(t)] == doctest::Approx(mx + std::log(sum)).epsilon(1e-6));
    // Equal logits give equal probabilities, so ordering by logit then index is the rule.
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [z](int32_t a, int32_t b) { return z[a] > z[b]; });
    double chosen = 0;
    for (int64_t k = 0; k < K; ++k) chosen += std::exp(double(z[order[size_t(k)]]) - mx) / sum;
    for (int64_t k = 0; k < K; ++k) {
      CAPTURE(k);
      const int32_t e = order[size_t(k)];
      REQUIRE(idx[size_t(t * K + k)] == e);
      const double p = std::exp(double(z[e]) - mx) / sum;
      CHECK(gate[size_t(t * K + k)] == doctest::Approx(renormalize ? p / chosen : p).epsilon(1e-5));
    }
  }
}

TEST_CASE("router top-K: the most probable experts in order, the lower index on ties") {
  check_router(64, 8, 2, false, 1);
  check_router(64, 8, 8, true, 2);      // K = E: every expert, ordered
  check_router(64, 149, 37, false, 3);  // sweep-tiny's r_a 0.5 point (as planned 2026-11-29)
  check_router(64, 149, 37, true, 4);
  check_router(200, 457, 1, false, 5);  // the 2B grid's r_a 0.05 point
  check_router(32, 3, 1, true, 6);
}

}  // namespace
}  // namespace moeplan::backend::cpu
