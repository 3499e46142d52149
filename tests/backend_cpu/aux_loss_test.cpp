// The auxiliary losses' values against hand calculations. The gradient checks only show that each
// gradient is the derivative of the value the model computes; a wrong normalisation (a missing
// E, a mean over T·K instead of T, f_i after drops) would pass them. Here the values themselves
// are pinned:
// - the ERC loss of BACKEND.md on 2 experts whose activation matrix M is worked out below;
// - load balance and z-loss through the whole model, with the weights set so that every token
//   reaches the router with the same input: the router logits are then chosen numbers, and
//   λ·E·Σ f_i·P_i and mean_t lse² follow from them by hand.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "erc.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

TEST_CASE("ERC loss value: 2 experts, noise and the gate half of w13 by hand") {
  // E = 2, D = 2, De = 2. Router rows R_0 = (1, 0), R_1 = (0, 4); noise δ_0 = (1, 1),
  // δ_1 = (1, 0.5): proxies R̃_0 = (1, 0), R̃_1 = (0, 2).
  const std::vector<double> router = {1, 0, 0, 4}, delta = {1, 1, 1, 0.5};
  // w13 of each expert is (D, 2·De): the first De columns are the gate projection W_g. The up
  // half is filled with 100s; it must not enter the loss.
  //   W_g^0 = [[3, 0], [0, 4]]: R̃_0·W_g^0 = (3, 0), ‖·‖ 3;  R̃_1·W_g^0 = (0, 8), ‖·‖ 8
  //   W_g^1 = [[0, 1], [1, 0]]: R̃_0·W_g^1 = (0, 1), ‖·‖ 1;  R̃_1·W_g^1 = (2, 0), ‖·‖ 2
  // so M = [[3, 1], [8, 2]] (M[i][j] = ‖R̃_i·W_g^j‖).
  std::vector<double> w0 = {3, 0, 100, 100, 0, 4, 100, 100};
  std::vector<double> w1 = {0, 1, 100, 100, 1, 0, 100, 100};
  std::vector<double> g0(8, 0), g1(8, 0), drouter(4, 0);
  std::vector<double> rt(4), drt(4), act(2 * 2 * 2), m(4), dm(4);
  const double* w13[2] = {w0.data(), w1.data()};
  double* dw13[2] = {g0.data(), g1.data()};
  FlopLedger ledger;
  auto loss = [&](double alpha, double coef) {
    return cpu::erc_forward_backward(drouter.data(), dw13, router.data(), w13, delta.data(),
                                     rt.data(), drt.data(), act.data(), m.data(), dm.data(), 2, 2,
                                     2, alpha, coef, ledger);
  };
  // α = 0.5: i = 0 (α·M00 = 1.5): max(M01 − 1.5, 0) = 0, max(M10 − 1.5, 0) = 6.5;
  //          i = 1 (α·M11 = 1):   max(M10 − 1, 0) = 7,   max(M01 − 1, 0) = 0.
  // Sum 13.5; loss = coef·13.5/E² = 2·13.5/4.
  CHECK(loss(0.5, 2.0) == doctest::Approx(6.75).epsilon(1e-14));
  // α = 1: i = 0 (3): 0 and max(8 − 3, 0) = 5; i = 1 (2): max(8 − 2, 0) = 6 and 0. Sum 11.
  CHECK(loss(1.0, 1.0) == doctest::Approx(11.0 / 4.0).epsilon(1e-14));
  // α = 3: i = 1 (α·M11 = 6) still has max(M10 − 6, 0) = 2; loss 2/4. α = 5 clears every hinge.
  CHECK(loss(3.0, 1.0) == doctest::Approx(0.5).epsilon(1e-14));
  CHECK(loss(5.0, 1.0) == 0.0);
  // The products of each call: per expert j, the forward (E,D)·(D,De), its input-grad and its
  // weight-grad, 2·2·2·2 FLOPs each; four calls.
  CHECK(ledger.total().to_int64() == 4 * (2 * 3 * (2 * 2 * 2 * 2)));
}

// A tiny model in which every token reaches the one MoE layer's router with the same input v:
// every embedding row is v (ALiBi adds no position), the output projections of attention, the
// dense FFN and the experts are 0 (the residual stream stays v), and norm2's scale is 1. With
// mean(v²) = 1 the RMSNorm gives v/√(1 + 1e-5), and router row e = c_e·v/D gives logit c_e/√(1 +
// 1e-5) ≈ c_e.
struct SameInput {
  Arch a;
  ModelOptions o;
  std::vector<double> c;  // the logits, one per expert
};

StepResult step_of(const SameInput& s, int64_t B) {
  Model<double> model(s.a, s.o, 3, B);
  auto p = model.parameters();
  const int64_t D = s.a.d_model;
  auto fill = [&](const std::string& name, auto value) {
    const TensorInfo& t = model.tensor(name);
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t k = 0; k < t.cols; ++k) p[size_t(t.offset + r * t.cols + k)] = value(r, k);
  };
  auto v = [](int64_t k) { return k % 2 == 0 ? 1.0 : -1.0; };  // mean square exactly 1
  fill("embedding", [&](int64_t, int64_t k) { return v(k); });
  for (int l = 0; l < s.a.layers; ++l) {
    const std::string pre = fmt::format("layer{}.", l);
    fill(pre + "attn_out", [](int64_t, int64_t) { return 0.0; });
    if (l < s.a.dense_layers) {
      fill(pre + "ffn.w2", [](int64_t, int64_t) { return 0.0; });
    } else {
      fill(pre + "norm2", [](int64_t, int64_t) { return 1.0; });
      // The layer's output is 0 too, so a second MoE layer sees v as well.
      if (s.a.d_shared > 0) fill(pre + "shared.w2", [](int64_t, int64_t) { return 0.0; });
      for (int64_t e = 0; e < s.a.experts; ++e)
        fill(fmt::format("{}expert{}.w2", pre, e), [](int64_t, int64_t) { return 0.0; });
      fill(pre + "router", [&](int64_t e, int64_t k) { return s.c[size_t(e)] * v(k) / double(D); });
    }
  }
  const auto in = test::tokens(B * s.a.seq_len, s.a.vocab, 1);
  const auto tg = test::tokens(B * s.a.seq_len, s.a.vocab, 2);
  StepResult r;
  model.compute_gradients(in.data(), tg.data(), &r);
  return r;
}

TEST_CASE("load balance and z-loss values: hand calculations from chosen router logits") {
  SameInput s;
  s.a = test::tiny_moe();  // E = 4, K = 2, one dense layer then one MoE layer, D = 16, seq 8
  s.o.load_balance = 0.01;
  s.o.z_loss = 0.001;
  s.c = {2.0, 1.0, 0.0, -1.0};
  const double shrink = 1.0 / std::sqrt(1.0 + 1e-5);  // the RMSNorm's ε on a unit mean square
  double Z = 0;
  for (double c : s.c) Z += std::exp(c * shrink);
  const double p0 = std::exp(2.0 * shrink) / Z, p1 = std::exp(1.0 * shrink) / Z;
  // Every token picks experts 0 and 1: f_0 = f_1 = 1/2 (shares of the T·K assignments), f_2 =
  // f_3 = 0; P_i = p_i for every token. λ·E·Σ f_i·P_i = 0.01·4·(p0 + p1)/2.
  const double lb = 0.01 * 4 * (p0 + p1) / 2;          // ≈ 0.0176159 (p0 + p1 ≈ 0.8808)
  const double z = 0.001 * std::log(Z) * std::log(Z);  // mean_t lse², every lse = ln Z

  SUBCASE("one pass, dropless") {
    const StepResult r = step_of(s, 2);
    CHECK(r.aux_load_balance == doctest::Approx(lb).epsilon(1e-12));
    CHECK(r.aux_z == doctest::Approx(z).epsilon(1e-12));
    CHECK(r.aux_erc == 0.0);
    CHECK(r.dropped_assignments == 0);
  }
  SUBCASE("capacity drops do not change f_i: it counts assignments before drops") {
    // T = 16 tokens, K = 2: capacity ceil(1·16·2/4) = 8 rows an expert; experts 0 and 1 get 16
    // each and drop 8. Counted after drops, f_0 = f_1 = 8/32 and the loss would halve.
    s.o.capacity_factor = 1.0;
    const StepResult r = step_of(s, 2);
    CHECK(r.dropped_assignments == 16);
    CHECK(r.aux_load_balance == doctest::Approx(lb).epsilon(1e-12));
  }
  SUBCASE("renormalised gates do not change it: P_i is the router probability, not the gate") {
    s.o.renormalize_gates = true;
    CHECK(step_of(s, 2).aux_load_balance == doctest::Approx(lb).epsilon(1e-12));
  }
  SUBCASE("passes of 2 + 1 sequences: each pass's value weighs by its share, the sum is the same") {
    s.o.micro_batch_seqs = 2;
    const StepResult r = step_of(s, 3);
    CHECK(r.aux_load_balance == doctest::Approx(lb).epsilon(1e-12));
    CHECK(r.aux_z == doctest::Approx(z).epsilon(1e-12));
  }
  SUBCASE("summed over MoE layers: two MoE layers give twice the value") {
    s.a.layers = 3;  // dense, MoE, MoE
    const StepResult r = step_of(s, 2);
    CHECK(r.aux_load_balance == doctest::Approx(2 * lb).epsilon(1e-12));
    CHECK(r.aux_z == doctest::Approx(2 * z).epsilon(1e-12));
  }
  SUBCASE("K = 1: f_0 = 1, the value is λ·E·p0") {
    s.a.top_k = 1;
    CHECK(step_of(s, 2).aux_load_balance == doctest::Approx(0.01 * 4 * p0).epsilon(1e-12));
  }
  SUBCASE("uniform routing gives exactly λ, the loss's minimum") {
    s.c = {0.0, 0.0, 0.0, 0.0};  // p_i = 1/4; ties go to experts 0 and 1; λ·4·(2·½·¼) = λ
    const StepResult r = step_of(s, 2);
    CHECK(r.aux_load_balance == doctest::Approx(0.01).epsilon(1e-12));
    CHECK(r.aux_z == doctest::Approx(0.001 * std::log(4.0) * std::log(4.0)).epsilon(1e-12));
  }
}

}  // namespace
}  // namespace moeplan::backend
