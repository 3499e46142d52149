// Model::set_profiling: where a step's time goes, phase by phase (moeplan run --profile).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

TEST_CASE("profiling: phases partition each step; a mean a step; evaluations and off not timed") {
  const Arch a = test::tiny_moe();
  const int64_t B = 3, T = B * a.seq_len;
  Model<float> m(a, ModelOptions{}, 7, B);
  OptimConfig cfg;
  cfg.total_steps = 10;
  const std::vector<int32_t> in = test::tokens(T, a.vocab, 1), tg = test::tokens(T, a.vocab, 2);
  m.train_step(in.data(), tg.data(), 0, cfg);  // not profiled
  CHECK(m.profile_ms_per_step().empty());

  m.set_profiling(true);
  constexpr int kSteps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 1; s <= kSteps; ++s) m.train_step(in.data(), tg.data(), s, cfg);
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto phases = m.profile_ms_per_step();
  m.forward_loss(in.data(), tg.data(), B, nullptr);  // an evaluation adds to no phase
  CHECK(m.profile_ms_per_step() == phases);
  std::vector<std::string> names;
  double sum = 0;
  for (const auto& [name, ms] : phases) {
    names.push_back(name);
    CHECK_MESSAGE(ms >= 0, name);
    sum += ms;
  }
  // Each phase is a stretch of a step (one dense layer, then one MoE layer with a shared
  // expert), so their means a step add up to no more than a step's wall time.
  const std::vector<std::string> expected = {
      "zero grads",         "fwd embedding",        "fwd norm1 + qkv",
      "fwd attention core", "fwd out proj + norm2", "fwd dense ffn",
      "fwd router + sort",  "fwd routed experts",   "fwd moe rest",
      "fwd final norm",     "fwd lm head",          "cross-entropy",
      "bwd lm head",        "bwd final norm",       "bwd shared expert + combine",
      "bwd routed experts", "bwd moe rest",         "bwd norm2 + out proj",
      "bwd attention core", "bwd qkv + norm1",      "bwd dense ffn",
      "bwd embedding",      "grad norm + adamw"};
  CHECK(names == expected);
  CHECK(sum > 0);
  CHECK(sum <= wall_ms / kSteps);
  // Switched off: the steps after it add nothing, and on again starts a new count.
  m.set_profiling(false);
  m.train_step(in.data(), tg.data(), kSteps + 1, cfg);
  CHECK(m.profile_ms_per_step().empty());
}

}  // namespace
}  // namespace moeplan::backend
