// Gradient accumulation (ModelOptions::micro_batch_seqs): a step run in passes of a few
// sequences is the step over the whole batch. Golden values are the one-pass model's (a separate
// Model with micro_batch_seqs 0) or the weighted sums written out below; fp64 throughout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

struct Grads {
  double objective = 0;
  StepResult r;
  std::vector<double> g;
};

Grads gradients_of(const Arch& a, ModelOptions o, int64_t micro, int64_t batch,
                   const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  o.micro_batch_seqs = micro;
  Model<double> m(a, o, 21, batch);
  Grads out;
  out.objective = m.compute_gradients(in.data(), tg.data(), &out.r);
  out.g.assign(m.gradients().begin(), m.gradients().end());
  return out;
}

// max |a − b| over max |a|
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(a[i]));
  }
  REQUIRE(scale > 1e-6);
  return worst / scale;
}

void check_equal_to_one_pass(const Arch& a, const ModelOptions& o) {
  const int64_t B = 5, S = a.seq_len;
  const auto in = test::tokens(B * S, a.vocab, 3);
  auto tg = test::tokens(B * S, a.vocab, 4);
  // The passes (2+2+1 sequences of 8) bear loss at 14 of 16, 15 of 16 and 4 of 8 targets.
  tg[3] = -1;
  tg[S + 5] = -1;
  tg[2 * S] = -1;
  for (int64_t t = 4 * S; t < 5 * S; ++t)
    if (t % 2 == 0) tg[size_t(t)] = -1;
  const Grads one = gradients_of(a, o, 0, B, in, tg);
  const Grads acc = gradients_of(a, o, 2, B, in, tg);
  CHECK(std::abs(acc.objective - one.objective) <= 1e-13 * std::abs(one.objective));
  CHECK(std::abs(acc.r.loss - one.r.loss) <= 1e-13 * one.r.loss);
  CHECK(rel_diff(one.g, acc.g) < 1e-12);
  CHECK(acc.r.loss_bearing_targets == one.r.loss_bearing_targets);
  CHECK(acc.r.loss_bearing_targets == B * S - 2 - 1 - 4);
  CHECK(acc.r.flops == one.r.flops);  // every product and element-wise count, summed over passes
  CHECK(acc.r.routed_per_moe_layer == one.r.routed_per_moe_layer);
}

TEST_CASE("gradient accumulation: passes of 2+2+1 sequences equal one pass of 5 (dense)") {
  check_equal_to_one_pass(test::tiny_dense(), ModelOptions{});
  Arch rope_tied = test::tiny_dense();
  rope_tied.tied_embeddings = true;
  ModelOptions o;
  o.positions = "rope";
  check_equal_to_one_pass(rope_tied, o);
}

TEST_CASE("gradient accumulation: passes equal one pass (MoE, aux losses off)") {
  ModelOptions o;
  o.load_balance = 0;
  check_equal_to_one_pass(test::tiny_moe(), o);
}

TEST_CASE("gradient accumulation: each pass's aux losses weigh by its share of the sequences") {
  // Every target bears loss, so a pass's share of the cross-entropy (its targets over the
  // batch's) equals its share of the sequences w_p = n_p/B, and the accumulated step must be
  // Σ_p w_p · (the step of a model that sees only pass p), objective and gradients alike.
  const Arch a = test::tiny_moe();
  ModelOptions o;
  o.load_balance = 0.05;
  o.z_loss = 0.01;
  o.renormalize_gates = true;
  const int64_t B = 5, S = a.seq_len;
  const auto in = test::tokens(B * S, a.vocab, 8);
  const auto tg = test::tokens(B * S, a.vocab, 9);
  const Grads acc = gradients_of(a, o, 2, B, in, tg);
  const int64_t first[3] = {0, 2, 4}, n[3] = {2, 2, 1};
  double objective = 0, lb = 0, z = 0;
  std::vector<double> g(acc.g.size(), 0.0);
  for (int p = 0; p < 3; ++p) {
    const std::vector<int32_t> pin(in.begin() + first[p] * S, in.begin() + (first[p] + n[p]) * S);
    const std::vector<int32_t> ptg(tg.begin() + first[p] * S, tg.begin() + (first[p] + n[p]) * S);
    const Grads one = gradients_of(a, o, 0, n[p], pin, ptg);
    const double w = double(n[p]) / double(B);
    objective += w * one.objective;
    lb += w * one.r.aux_load_balance;
    z += w * one.r.aux_z;
    for (size_t i = 0; i < g.size(); ++i) g[i] += w * one.g[i];
  }
  CHECK(acc.r.aux_load_balance > 0);
  CHECK(acc.r.aux_z > 0);
  CHECK(std::abs(acc.objective - objective) <= 1e-13 * objective);
  CHECK(std::abs(acc.r.aux_load_balance - lb) <= 1e-13 * lb);
  CHECK(std::abs(acc.r.aux_z - z) <= 1e-13 * z);
  CHECK(rel_diff(g, acc.g) < 1e-12);
  // And it is not the one-pass step: the load balance is not linear in the tokens.
  const Grads one = gradients_of(a, o, 0, B, in, tg);
  CHECK(std::abs(one.r.aux_load_balance - acc.r.aux_load_balance) > 1e-9);
}

TEST_CASE("gradient accumulation: training steps track the one-pass run; the options are checked") {
  const Arch a = test::tiny_moe();
  ModelOptions o;
  o.load_balance = 0;
  const int64_t B = 4, S = a.seq_len;
  const auto in = test::tokens(B * S, a.vocab, 12);
  const auto tg = test::tokens(B * S, a.vocab, 13);
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.total_steps = 5;
  ModelOptions micro = o;
  micro.micro_batch_seqs = 3;  // passes of 3 and 1
  Model<double> one(a, o, 5, B), acc(a, micro, 5, B);
  CHECK(acc.batch_seqs() == B);
  CHECK(acc.pass_seqs() == 3);
  CHECK(one.pass_seqs() == B);
  for (int64_t step = 0; step < 5; ++step) {
    const StepResult r1 = one.train_step(in.data(), tg.data(), step, cfg);
    const StepResult r2 = acc.train_step(in.data(), tg.data(), step, cfg);
    CHECK(std::abs(r1.loss - r2.loss) <= 1e-12 * r1.loss);
    CHECK(std::abs(r1.grad_norm - r2.grad_norm) <= 1e-11 * r1.grad_norm);
  }
  const std::vector<double> p1(one.parameters().begin(), one.parameters().end());
  const std::vector<double> p2(acc.parameters().begin(), acc.parameters().end());
  CHECK(rel_diff(p1, p2) < 1e-11);
  CHECK(one.ledger() == acc.ledger());
  // Evaluation runs in passes of pass_seqs too, with the same result.
  CHECK(std::abs(one.forward_loss(in.data(), tg.data(), B) -
                 acc.forward_loss(in.data(), tg.data(), B)) < 1e-12);

  ModelOptions bad = o;
  bad.micro_batch_seqs = -1;
  CHECK_THROWS_WITH_AS(Model<float>(a, bad, 1, 2),
                       "micro_batch_seqs -1 must be >= 0 (0: the whole batch in one pass)",
                       InputError);
  ModelOptions large = o;
  large.micro_batch_seqs = 9;  // more than the batch: one pass
  CHECK(Model<float>(a, large, 1, 2).pass_seqs() == 2);
}

}  // namespace
}  // namespace moeplan::backend
