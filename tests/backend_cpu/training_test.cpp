// Ladder: a tiny model can fit one batch (the whole step works end to end), and the step is
// deterministic: same seed and data give the same losses bit for bit, and a saved state resumes
// bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <Eigen/Core>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

Arch overfit_arch(bool moe) {
  Arch a;
  a.d_model = 32;
  a.layers = 2;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 8;
  a.seq_len = 16;
  a.vocab = 32;
  a.d_ffn = 64;
  a.dense_layers = moe ? 1 : 2;
  if (moe) {
    a.experts = 4;
    a.top_k = 2;
    a.d_expert = 32;
    a.d_shared = 32;
  }
  return a;
}

// Random targets carry no structure: only memorising the (unique) contexts lowers the loss, from
// about ln(32) = 3.47 at init.
void overfit(bool moe) {
  const Arch a = overfit_arch(moe);
  const int64_t B = 4, T = B * a.seq_len;
  Model<float> m(a, ModelOptions{}, 42, B);
  const auto in = test::tokens(T, a.vocab, 7);
  const auto tg = test::tokens(T, a.vocab, 8);
  OptimConfig cfg;
  cfg.lr_peak = 1e-2;
  cfg.lr_min = 1e-3;
  cfg.warmup_steps = 10;
  cfg.total_steps = 300;
  cfg.weight_decay = 0.0;
  double first = 0, last = 0;
  for (int64_t s = 0; s < cfg.total_steps; ++s) {
    const StepResult r = m.train_step(in.data(), tg.data(), s, cfg);
    if (s == 0) first = r.loss;
    last = r.loss;
    REQUIRE(std::isfinite(r.loss));
  }
  CHECK(first == doctest::Approx(std::log(32.0)).epsilon(0.05));
  CHECK(last < 0.1 * first);
  CHECK(m.forward_loss(in.data(), tg.data(), B) < 0.1 * first);
}

TEST_CASE("a tiny dense model overfits one fixed batch") {
  overfit(false);
}
TEST_CASE("a tiny MoE overfits one fixed batch") {
  overfit(true);
}

std::vector<double> losses(Model<float>& m, int64_t from, int64_t to, const OptimConfig& cfg) {
  const Arch& a = m.arch();
  const int64_t T = m.batch_seqs() * a.seq_len;
  std::vector<double> out;
  for (int64_t s = from; s < to; ++s) {
    const auto in = test::tokens(T, a.vocab, 1000 + s);
    const auto tg = test::tokens(T, a.vocab, 2000 + s);
    const StepResult r = m.train_step(in.data(), tg.data(), s, cfg);
    out.push_back(r.loss + r.aux_load_balance + r.aux_erc + r.aux_z);
    out.push_back(r.grad_norm);
  }
  return out;
}

TEST_CASE("same seed, same data: bit-identical losses; save/load resumes bit for bit") {
  Arch a = overfit_arch(true);
  ModelOptions o;
  o.erc_loss = 0.05;  // the ERC noise comes from the model's RNG, which the state carries
  o.z_loss = 1e-3;
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.warmup_steps = 3;
  cfg.total_steps = 12;
  Model<float> m1(a, o, 5, 2), m2(a, o, 5, 2);
  const auto l1 = losses(m1, 0, 12, cfg);
  const auto l2 = losses(m2, 0, 12, cfg);
  REQUIRE(l1.size() == l2.size());
  CHECK(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(double)) == 0);

  Model<float> m3(a, o, 5, 2);
  const auto head = losses(m3, 0, 6, cfg);
  std::vector<char> state;
  m3.save_state(state);
  Model<float> m4(a, o, 77, 2);  // another seed: everything must come from the state
  m4.load_state(state);
  CHECK(m4.adam_steps() == 6);
  CHECK(m4.ledger() == m3.ledger());
  const auto tail = losses(m4, 6, 12, cfg);
  std::vector<double> resumed = head;
  resumed.insert(resumed.end(), tail.begin(), tail.end());
  CHECK(std::memcmp(l1.data(), resumed.data(), l1.size() * sizeof(double)) == 0);
  CHECK(m4.ledger() == m1.ledger());

  Model<float> other(overfit_arch(false), o, 5, 2);
  CHECK_THROWS_AS(other.load_state(state), InputError);

  // A state written before the ledger counted in 128 bits ("MOEPCPU1": the two ledgers at the
  // end as 31 int64 counts each, where version 2 has 16-byte counts) still loads, ledgers and all.
  constexpr size_t kCounts = 2 * (kFlopCategories * kPhases + 1);
  REQUIRE(state.size() > kCounts * 16);
  std::vector<char> v1(state.begin(), state.end() - ptrdiff_t(kCounts * 16));
  v1[7] = '1';
  for (size_t i = 0; i < kCounts; ++i) {  // little-endian: the low 8 bytes come first
    const char* wide = state.data() + state.size() - kCounts * 16 + i * 16;
    v1.insert(v1.end(), wide, wide + 8);
  }
  Model<float> m5(a, o, 77, 2);
  m5.load_state(v1);
  CHECK(m5.ledger() == m3.ledger());
  CHECK(m5.ledger().total() > 0);
  CHECK(m5.eval_ledger() == m3.eval_ledger());
  v1[7] = '9';
  CHECK_THROWS_WITH_AS(m5.load_state(v1), "model state does not start with the CPU model's magic",
                       InputError);
}

TEST_CASE("a model below the parallel size runs on one thread whatever --threads set") {
  // --threads calls Eigen::setNbThreads, after which Eigen no longer reads the OpenMP count
  // that the serial guard lowered: a small model's products ran on 2 threads, ~190x slower a
  // step on a loaded 2-core machine. Residual stream 4 · 128 · 64 = 32,768 < 2^16: serial.
  Arch a = overfit_arch(true);
  a.d_model = 64;
  a.head_dim = 16;
  a.seq_len = 128;
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.warmup_steps = 2;
  cfg.total_steps = 4;
  Eigen::setNbThreads(1);
  Model<float> one(a, ModelOptions{}, 5, 4);
  const auto l1 = losses(one, 0, 4, cfg);
  Eigen::setNbThreads(2);
  Model<float> two(a, ModelOptions{}, 5, 4);
  CHECK(two.threads() == 1);
  const auto l2 = losses(two, 0, 4, cfg);
  CHECK(Eigen::nbThreads() == 2);  // the guard restores the count it lowered
  REQUIRE(l1.size() == l2.size());
  CHECK(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(double)) == 0);
  // At 2^16 and above the products run on Eigen's count, which a checkpoint records.
  Model<float> wide(a, ModelOptions{}, 5, 8);  // 8 · 128 · 64 = 65,536
  CHECK(wide.threads() == 2);
  Eigen::setNbThreads(0);  // back to the OpenMP default for the other tests
}

TEST_CASE("bad input names the value") {
  Arch a = overfit_arch(false);
  ModelOptions o;
  o.positions = "sinusoidal";
  CHECK_THROWS_WITH_AS(Model<float>(a, o, 1, 1),
                       "positions 'sinusoidal' is not one of: alibi, rope", InputError);
  Model<float> m(a, ModelOptions{}, 1, 1);
  std::vector<int32_t> in(a.seq_len, 3), tg(a.seq_len, 3);
  in[2] = 32;
  CHECK_THROWS_AS(m.forward_loss(in.data(), tg.data(), 1), InputError);
}

TEST_CASE("learning-rate schedule: warm-up then cosine to lr_min (hand values)") {
  OptimConfig c;
  c.lr_peak = 1.0;
  c.lr_min = 0.1;
  c.warmup_steps = 4;
  c.total_steps = 8;
  CHECK(scheduled_lr(c, 0) == doctest::Approx(0.25));  // (0+1)/4
  CHECK(scheduled_lr(c, 3) == doctest::Approx(1.0));
  CHECK(scheduled_lr(c, 4) == doctest::Approx(1.0));   // cos(0)
  CHECK(scheduled_lr(c, 6) == doctest::Approx(0.55));  // 0.1 + 0.5·(1+cos(π/2))·0.9
  CHECK(scheduled_lr(c, 8) == doctest::Approx(0.1));
  CHECK(scheduled_lr(c, 20) == doctest::Approx(0.1));
}

}  // namespace
}  // namespace moeplan::backend
