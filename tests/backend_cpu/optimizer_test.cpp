// The update of train_step against AdamW written out here (BACKEND.md: β 0.9/0.95, decoupled
// weight decay, none on norms, global gradient-norm clip): bias-corrected moments
// m̂ = m/(1−β1^t), v̂ = v/(1−β2^t), p ← p − lr·(m̂/(√v̂ + ε) + λ·p) with λ = 0 on RMSNorm scales,
// the gradient first scaled by clip/‖g‖ when its global norm ‖g‖ exceeds the clip. fp64.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

// BACKEND.md: no weight decay on norms. By name, not by TensorInfo::weight_decay, so that a
// wrong flag is caught too.
bool is_norm(const std::string& name) {
  return name.ends_with("norm1") || name.ends_with("norm2") || name == "final_norm";
}

TEST_CASE("AdamW by hand: two steps of a model whose only gradients have a closed form") {
  // One dense layer with every product weight zero: attention sees V = 0 and the FFN has
  // W13 = W2 = 0, so each layer passes the residual through unchanged and the only path from
  // input to loss is embedding → final RMSNorm → LM head. One sequence of one token (id 0,
  // target 1), d_model 4, vocab 2.
  Arch a;
  a.d_model = 4;
  a.layers = 1;
  a.dense_layers = 1;
  a.heads = 1;
  a.kv_heads = 1;
  a.head_dim = 4;
  a.d_ffn = 2;
  a.seq_len = 1;
  a.vocab = 2;
  Model<double> m(a, ModelOptions{}, 3, 1);
  auto p = m.parameters();
  std::fill(p.begin(), p.end(), 0.0);
  for (const TensorInfo& t : m.tensors()) {
    CHECK_MESSAGE(t.weight_decay == !is_norm(t.name), t.name);
    if (is_norm(t.name)) std::fill_n(p.data() + t.offset, t.size(), 1.0);
  }
  const int64_t emb = m.tensor("embedding").offset, head = m.tensor("lm_head").offset,
                fnorm = m.tensor("final_norm").offset;
  // Embedding row 0 = (c, 0, 0, 0), the input; row 1 is never read: its gradient stays zero and
  // only the decay moves it.
  const double c = 2.0;
  p[emb + 0] = c;
  const double row1[4] = {0.5, -0.5, 0.25, 1.0};
  std::copy_n(row1, 4, p.data() + emb + 4);
  const std::vector<double> p0(p.begin(), p.end());

  OptimConfig cfg;  // β1 0.9, β2 0.95 (the defaults), written out below
  cfg.lr_peak = 0.1;
  cfg.lr_min = 0.01;
  cfg.warmup_steps = 2;  // step 0 at lr 0.05, step 1 at 0.1: each step uses its own lr
  cfg.total_steps = 10;
  cfg.weight_decay = 0.1;
  cfg.grad_clip = 0.5;
  // ε of the order of |g|: with ε ≪ |g| Adam's first update is ±lr whatever the gradient's
  // scale, and a missing clip would not show.
  cfg.eps = 0.01;
  const double b1 = 0.9, b2 = 0.95, eps = 0.01, wd = 0.1, clip = 0.5, lr0 = 0.05, lr1 = 0.1;

  const int32_t in[1] = {0}, tg[1] = {1};
  const StepResult r0 = m.train_step(in, tg, 0, cfg);

  // Step 1. RMSNorm of x = (c,0,0,0): r = 1/√(c²/4 + 1e-5), x̂ = c·r (final_norm weight 1).
  // Logits 0 (LM head zero) → p = (½, ½); target 1 → dlogits = (½, −½). The only nonzero
  // gradient is the LM head's row 0: x̂·(½, −½) (its rows 1..3 meet x̂_k = 0, and dx̂ = dlogits·Wᵀ
  // = 0 so nothing reaches the norm or the embedding).
  const double r1 = 1.0 / std::sqrt(c * c / 4.0 + 1e-5), xh1 = c * r1;
  const double n1 = std::sqrt(2.0 * (xh1 / 2.0) * (xh1 / 2.0));  // ‖g‖ = x̂/√2 ≈ 1.414
  CHECK(r0.grad_norm == doctest::Approx(n1).epsilon(1e-12));
  CHECK(r0.lr == doctest::Approx(lr0).epsilon(1e-15));
  REQUIRE(n1 > clip);
  const double s1 = clip / n1;
  const double g1 = s1 * xh1 / 2.0;  // clipped |gradient| of head[0][0] and head[0][1]
  const double m1 = (1 - b1) * g1, v1 = (1 - b2) * g1 * g1;
  const double u1 = (m1 / (1 - b1)) / (std::sqrt(v1 / (1 - b2)) + eps);
  const double w = lr0 * u1;  // head row 0 is now (−w, +w) (it was 0: no decay to add)
  CHECK(p[head + 0] == doctest::Approx(-w).epsilon(1e-12));
  CHECK(p[head + 1] == doctest::Approx(w).epsilon(1e-12));
  CHECK(p[emb + 0] == doctest::Approx(c * (1 - lr0 * wd)).epsilon(1e-12));  // decay only

  const StepResult r1s = m.train_step(in, tg, 1, cfg);

  // Step 2. c' = c·(1 − lr0·λ); r' = 1/√(c'²/4 + 1e-5), x̂' = c'·r'. Logits x̂'·(−w, w):
  // p1 = 1/(1 + e^(−2x̂'w)), p0 = 1 − p1; dlogits = (p0, p1 − 1) = (p0, −p0).
  const double c2 = c * (1 - lr0 * wd);
  const double r2 = 1.0 / std::sqrt(c2 * c2 / 4.0 + 1e-5), xh2 = c2 * r2;
  const double q1 = 1.0 / (1.0 + std::exp(-2.0 * xh2 * w)), q0 = 1.0 - q1;
  // LM head row 0: x̂'·dlogits. dx̂_0 = dlogits·W[0,:] = −2·w·p0 (dx̂_k = 0 for k ≥ 1).
  const double gh = xh2 * q0, dy = -2.0 * w * q0;
  // Final norm weight 0: dy·x·r. Embedding [0][0], through the norm's backward
  // dx = r·w·dy − x·r³·(w·dy·x)/C with w = 1, C = 4, and unchanged through the layer.
  const double gf = dy * c2 * r2;
  const double ge = r2 * dy - c2 * (dy * c2 * r2 * r2 * r2 / 4.0);
  const double n2 = std::sqrt(2.0 * gh * gh + gf * gf + ge * ge);
  CHECK(r1s.grad_norm == doctest::Approx(n2).epsilon(1e-12));
  CHECK(r1s.lr == doctest::Approx(lr1).epsilon(1e-15));
  REQUIRE(n2 > clip);  // ≈ 0.67: clipped again
  const double s2 = clip / n2;
  // AdamW at t = 2 for an entry with clipped gradients ga (step 1), gb (step 2).
  auto adamw2 = [&](double p_before, double ga, double gb, double decay) {
    const double mm = b1 * ((1 - b1) * ga) + (1 - b1) * gb;
    const double vv = b2 * ((1 - b2) * ga * ga) + (1 - b2) * gb * gb;
    const double mh = mm / (1 - b1 * b1), vh = vv / (1 - b2 * b2);
    return p_before - lr1 * (mh / (std::sqrt(vh) + eps) + decay * p_before);
  };
  std::vector<double> expect(p0.size());
  for (const TensorInfo& t : m.tensors())  // zero gradient both steps: the decay alone
    for (int64_t i = t.offset; i < t.offset + t.size(); ++i)
      expect[i] = is_norm(t.name) ? p0[i] : p0[i] * (1 - lr0 * wd) * (1 - lr1 * wd);
  expect[head + 0] = adamw2(-w, g1, s2 * gh, wd);
  expect[head + 1] = adamw2(w, -g1, -s2 * gh, wd);
  expect[fnorm + 0] = adamw2(1.0, 0.0, s2 * gf, 0.0);  // a norm: no decay
  expect[emb + 0] = adamw2(c2, 0.0, s2 * ge, wd);
  double worst = 0;
  for (const TensorInfo& t : m.tensors())
    for (int64_t i = t.offset; i < t.offset + t.size(); ++i) {
      if (std::abs(p[i] - expect[i]) > 1e-12)
        FAIL_CHECK(fmt::format("{}[{}] = {:.17g}, by hand {:.17g}", t.name, i - t.offset, p[i],
                               expect[i]));
      worst = std::max(worst, std::abs(p[i] - expect[i]));
    }
  CHECK(worst <= 1e-12);
  CHECK(m.adam_steps() == 2);
  // Guards that the check is not vacuous: the norms really kept 1 where the decay would have
  // moved them, and the embedding's gradient reached Adam.
  CHECK(p[m.tensor("layer0.norm1").offset] == 1.0);
  CHECK(std::abs(ge) > 1e-9);
}

// AdamW over every parameter of a tiny MoE (embedding, attention, router, experts, norms, head)
// for two steps, against a scalar AdamW here. The step's gradients are read from
// compute_gradients on the same weights and batch just before each train_step (the step is
// deterministic, so they are the gradients train_step uses).
TEST_CASE("AdamW over a tiny MoE: two steps against a scalar reference, clipped, norms undecayed") {
  const Arch a = test::tiny_moe();
  const int64_t B = 2, T = B * a.seq_len;
  Model<double> m(a, ModelOptions{}, 17, B);
  OptimConfig cfg;
  cfg.lr_peak = 0.01;
  cfg.lr_min = 0.001;
  cfg.warmup_steps = 2;
  cfg.total_steps = 10;
  cfg.weight_decay = 0.1;
  cfg.grad_clip = 0.05;
  cfg.eps = 1e-4;
  const double b1 = 0.9, b2 = 0.95, eps = 1e-4, wd = 0.1, clip = 0.05;
  const double lrs[2] = {0.01 * 1 / 2, 0.01 * 2 / 2};  // warm-up: lr_peak·(step+1)/2

  const size_t n = size_t(m.trainable_params());
  std::vector<double> p(m.parameters().begin(), m.parameters().end()), mo(n, 0.0), ve(n, 0.0);
  std::vector<bool> decayed(n);
  for (const TensorInfo& t : m.tensors())
    for (int64_t i = t.offset; i < t.offset + t.size(); ++i) decayed[i] = !is_norm(t.name);
  for (int64_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    const auto in = test::tokens(T, a.vocab, 40 + step), tg = test::tokens(T, a.vocab, 50 + step);
    m.compute_gradients(in.data(), tg.data());
    const std::vector<double> g(m.gradients().begin(), m.gradients().end());
    double ss = 0;
    for (double x : g) ss += x * x;
    const double norm = std::sqrt(ss);
    REQUIRE(norm > clip);
    const double s = clip / norm, lr = lrs[step], t = double(step + 1);
    for (size_t i = 0; i < n; ++i) {
      const double gi = s * g[i];
      mo[i] = b1 * mo[i] + (1 - b1) * gi;
      ve[i] = b2 * ve[i] + (1 - b2) * gi * gi;
      const double mh = mo[i] / (1 - std::pow(b1, t)), vh = ve[i] / (1 - std::pow(b2, t));
      p[i] -= lr * (mh / (std::sqrt(vh) + eps) + (decayed[i] ? wd : 0.0) * p[i]);
    }
    const StepResult r = m.train_step(in.data(), tg.data(), step, cfg);
    CHECK(r.grad_norm == doctest::Approx(norm).epsilon(1e-12));
    CHECK(r.lr == doctest::Approx(lr).epsilon(1e-15));
    double worst = 0;
    std::string where;
    for (const TensorInfo& ti : m.tensors())
      for (int64_t i = ti.offset; i < ti.offset + ti.size(); ++i) {
        const double d = std::abs(m.parameters()[i] - p[i]);
        if (d > worst) {
          worst = d;
          where = ti.name + "[" + std::to_string(i - ti.offset) + "]";
        }
      }
    INFO("worst at ", where);
    CHECK(worst <= 1e-13);  // updates are ~lr = 1e-2; fp64 rounding is ~1e-18 of them
  }
}

}  // namespace
}  // namespace moeplan::backend
