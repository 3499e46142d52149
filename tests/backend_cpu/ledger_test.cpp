// Ladder rung 3: the measured FLOP ledger equals the analytic `exact` count of the accounting
// library to the FLOP, every step, for whatever routing happened; and the `paper` lens of the
// ledger equals the planned paper M·tokens up to the documented convention differences.
#include <doctest/doctest.h>

#include <cmath>

#include "moe.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/model.hpp"
#include "moeplan/backend/run.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

Arch ledger_arch() {
  Arch a = test::tiny_moe();
  a.layers = 3;  // one dense, two MoE layers
  a.experts = 6;
  a.top_k = 2;
  a.seq_len = 16;
  return a;
}

// Skews the router of every MoE layer towards expert 0 and 1 so routing is unbalanced.
void skew_router(Model<float>& m) {
  for (int64_t l = m.arch().dense_layers; l < m.arch().layers; ++l) {
    const TensorInfo& r = m.tensor("layer" + std::to_string(l) + ".router");
    for (int64_t c = 0; c < r.cols; ++c) {
      m.parameters()[r.offset + 0 * r.cols + c] += 0.5f;
      m.parameters()[r.offset + 1 * r.cols + c] += 0.3f;
    }
  }
}

void run_and_compare(const ModelOptions& o, bool expect_drops) {
  const Arch a = ledger_arch();
  const int64_t B = 4, T = B * a.seq_len;
  Model<float> m(a, o, 3, B);
  skew_router(m);
  REQUIRE(m.trainable_params() == count_params(a).trainable());
  OptimConfig cfg;
  cfg.lr_peak = 3e-3;
  cfg.warmup_steps = 2;
  cfg.total_steps = 6;
  FlopLedger sum;
  int64_t dropped = 0;
  bool unbalanced_seen = false;
  for (int64_t step = 0; step < 6; ++step) {
    const auto in = test::tokens(T, a.vocab, 100 + step);
    const auto tg = test::tokens(T, a.vocab, 200 + step);
    const StepResult r = m.train_step(in.data(), tg.data(), step, cfg);
    ExactStepOptions eo;
    eo.erc_loss = o.erc_loss > 0;
    eo.routed_per_moe_layer = r.routed_per_moe_layer;
    const FlopLedger exact = exact_step_ledger(a, B, eo);
    CHECK(r.flops.flops == exact.flops);  // every matrix product; element-wise work is apart
    // The run loop's own check of the same (run_point calls it every step) passes, and fails on
    // one FLOP off, a routed count off, or ERC's products missing.
    CHECK_NOTHROW(check_step_ledger(a, B, o.erc_loss > 0, r, step + 1));
    StepResult off = r;
    off.flops.flops[int(FlopCategory::expert)][int(Phase::weight_grad)] += 1;
    CHECK_THROWS_WITH_AS(check_step_ledger(a, B, o.erc_loss > 0, off, step + 1),
                         doctest::Contains("the FLOP ledger's expert weight-grad is"),
                         std::logic_error);
    StepResult routed = r;
    routed.routed_per_moe_layer[0] -= 1;
    CHECK_THROWS_AS(check_step_ledger(a, B, o.erc_loss > 0, routed, step + 1), std::logic_error);
    if (o.erc_loss > 0)
      CHECK_THROWS_AS(check_step_ledger(a, B, false, r, step + 1), std::logic_error);
    // What a device executes beyond the model's products is not the model's count.
    StepResult padded = r;
    padded.flops.flops[int(FlopCategory::padding)][int(Phase::forward)] += 1000;
    padded.flops.flops[int(FlopCategory::recompute)][int(Phase::input_grad)] += 1000;
    CHECK_NOTHROW(check_step_ledger(a, B, o.erc_loss > 0, padded, step + 1));
    CHECK(r.flops.elementwise > 0);
    for (int c = 0; c < kFlopCategories; ++c)
      for (int p = 0; p < kPhases; ++p) {
        INFO("category ", name(FlopCategory(c)), " phase ", name(Phase(p)));
        CHECK(r.flops.flops[c][p] == exact.flops[c][p]);
      }
    for (int64_t routed : r.routed_per_moe_layer) {
      CHECK(routed + 0 <= T * a.top_k);
      unbalanced_seen |= routed < T * a.top_k;
    }
    dropped += r.dropped_assignments;
    sum += r.flops;
  }
  CHECK(m.ledger() == sum);
  CHECK(unbalanced_seen == expect_drops);
  CHECK((dropped > 0) == expect_drops);

  // The paper lens over the measured ledger: projections, FFNs and experts as 6·N_a, attention
  // rescaled from the executed causal (S+1)/2 keys to the full S, router and LM head left out.
  // Dropless, this is exactly flops_per_token(paper)·tokens.
  const double tokens = double(6 * T);
  const double paper_measured = lens(a, Convention::paper, AttentionMask::causal).apply(sum);
  const double paper_planned = flops_per_token(a, Convention::paper).total * tokens;
  if (!expect_drops) {
    CHECK(paper_measured == doctest::Approx(paper_planned).epsilon(1e-12));
  } else {
    // Dropped assignments are expert products not executed: the shortfall is exactly theirs.
    const double per_assignment = 6.0 * 3.0 * double(a.d_model * a.d_expert);
    CHECK(paper_planned - paper_measured ==
          doctest::Approx(per_assignment * double(dropped)).epsilon(1e-12));
  }
  // What the paper leaves out is exactly the router, the LM head, the ERC aux products and the
  // causal/full difference of attention (hand check of the residual).
  const double S = double(a.seq_len);
  const double attention = double(sum.category(FlopCategory::attention_core));
  const double residual = double(sum.total()) - paper_measured;
  const double explained =
      double(sum.category(FlopCategory::router)) + double(sum.category(FlopCategory::lm_head)) +
      double(sum.category(FlopCategory::aux_loss)) +
      attention * (1.0 - 2.0 * S / (S + 1.0) * double(a.d_model) / double(a.q_width()));
  CHECK(residual == doctest::Approx(explained).epsilon(1e-12));
}

TEST_CASE("ledger equals the exact count every step: dropless MoE with skewed routing") {
  ModelOptions o;
  run_and_compare(o, false);
}

TEST_CASE("ledger equals the exact count every step: capacity factor 1 drops, ERC on") {
  ModelOptions o;
  o.capacity_factor = 1.0;
  o.erc_loss = 0.1;
  run_and_compare(o, true);
}

TEST_CASE("expert capacity: ceil(cf·T·K/E), at most T·K; a huge factor is dropless") {
  // 8 tokens, top-2, 4 experts: 16 assignments, 4 an expert on average.
  CHECK(cpu::expert_capacity(0, 8, 2, 4) == 16);    // dropless
  CHECK(cpu::expert_capacity(1.0, 8, 2, 4) == 4);   // 16/4
  CHECK(cpu::expert_capacity(1.25, 8, 2, 4) == 5);  // ceil(5.0)
  CHECK(cpu::expert_capacity(1.3, 8, 2, 4) == 6);   // ceil(5.2)
  CHECK(cpu::expert_capacity(4.0, 8, 2, 4) == 16);  // 16: every assignment fits
  CHECK(cpu::expert_capacity(100, 8, 2, 4) == 16);  // capped at T·K
  // Past int64_t (9.2e18): 1e20 · 16 / 4 was converted before the cap, which x86 makes
  // INT64_MIN: a negative capacity that wrapped the dispatch's offsets.
  CHECK(cpu::expert_capacity(1e20, 8, 2, 4) == 16);
  CHECK(cpu::expert_capacity(1e300, 8, 2, 4) == 16);
}

TEST_CASE("a capacity factor no expert can reach trains as dropless: same loss, same ledger") {
  Arch a = ledger_arch();
  const int64_t B = 2, T = B * a.seq_len;
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 2;
  const auto in = test::tokens(T, a.vocab, 3);
  ModelOptions dropless, huge;
  huge.capacity_factor = 1e20;
  Model<float> m0(a, dropless, 1, B), m1(a, huge, 1, B);
  for (int step = 0; step < 2; ++step) {
    const StepResult r0 = m0.train_step(in.data(), in.data(), step, cfg);
    const StepResult r1 = m1.train_step(in.data(), in.data(), step, cfg);
    CHECK(r1.loss == r0.loss);
    CHECK(r1.flops == r0.flops);
    CHECK(r1.dropped_assignments == 0);
  }
}

TEST_CASE("ledger of a dense model equals the exact count; eval FLOPs go to the eval ledger") {
  Arch a = test::tiny_dense();
  a.seq_len = 16;
  const int64_t B = 2, T = B * a.seq_len;
  Model<float> m(a, ModelOptions{}, 1, B);
  OptimConfig cfg;
  cfg.lr_peak = 1e-3;
  cfg.total_steps = 1;
  const auto in = test::tokens(T, a.vocab, 1);
  const StepResult r = m.train_step(in.data(), in.data(), 0, cfg);
  CHECK(r.flops.flops == exact_step_ledger(a, B).flops);
  // Hand count of one causal attention product for this shape: D_h·S·(S+1) = 4·16·17 = 1088
  // FLOPs per sequence and head; forward has 2 of them, backward 4: 2 layers·2 seqs·4 heads.
  CHECK(r.flops.at(FlopCategory::attention_core, Phase::forward) == 2 * 2 * 4 * 2 * 1088);
  CHECK(r.flops.at(FlopCategory::attention_core, Phase::input_grad) == 2 * 2 * 4 * 4 * 1088);
  const auto in5 = test::tokens(5 * a.seq_len, a.vocab, 2);
  m.forward_loss(in5.data(), in5.data(), 5);  // 5 sequences: chunks of 2, 2, 1
  CHECK(m.eval_ledger().phase(Phase::forward) == exact_step_ledger(a, 5).phase(Phase::forward));
  CHECK(m.eval_ledger().phase(Phase::input_grad) == 0);
  CHECK(m.ledger() == r.flops);
}

}  // namespace
}  // namespace moeplan::backend
