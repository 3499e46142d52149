// Ladder rung 2: a MoE layer with E = 1, K = 1 and no shared expert is the dense SwiGLU FFN
// with d_ffn = d_expert (softmax over one logit is exactly 1, so the gate is exactly 1).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

// The MoE model's name for a dense model's tensor.
std::string moe_name(const std::string& dense_name) {
  const auto dot = dense_name.find(".ffn.");
  if (dot == std::string::npos) return dense_name;
  return dense_name.substr(0, dot) + ".expert0." + dense_name.substr(dot + 5);
}

TEST_CASE("MoE with E=1, K=1, no shared expert equals the dense model (loss and gradients)") {
  Arch dense = test::tiny_dense();
  Arch moe = dense;
  moe.dense_layers = 0;
  moe.experts = 1;
  moe.top_k = 1;
  moe.d_expert = dense.d_ffn;
  moe.d_shared = 0;
  moe.d_ffn = 0;
  ModelOptions o;
  o.load_balance = 0;  // with E=1 it is the constant λ·1·1·1; it would only shift the loss
  const int64_t B = 3;
  Model<double> md(dense, o, 11, B), mm(moe, o, 99, B);
  for (const TensorInfo& t : md.tensors()) {  // the MoE model gets the dense model's weights
    const TensorInfo& u = mm.tensor(moe_name(t.name));
    REQUIRE(u.size() == t.size());
    std::copy_n(md.parameters().data() + t.offset, t.size(), mm.parameters().data() + u.offset);
  }
  const auto in = test::tokens(B * dense.seq_len, dense.vocab, 5);
  const auto tg = test::tokens(B * dense.seq_len, dense.vocab, 6);
  const double ld = md.compute_gradients(in.data(), tg.data());
  const double lm = mm.compute_gradients(in.data(), tg.data());
  CHECK(std::abs(ld - lm) <= 1e-13 * std::abs(ld));
  double worst = 0, scale = 0;
  for (const TensorInfo& t : md.tensors()) {
    const TensorInfo& u = mm.tensor(moe_name(t.name));
    for (int64_t i = 0; i < t.size(); ++i) {
      const double a = md.gradients()[t.offset + i], b = mm.gradients()[u.offset + i];
      worst = std::max(worst, std::abs(a - b));
      scale = std::max(scale, std::abs(a));
    }
  }
  CHECK(scale > 1e-3);
  CHECK(worst <= 1e-12 * scale);
  // The router's gradient is exactly zero: p ≡ 1 whatever its weights.
  for (int64_t l = 0; l < moe.layers; ++l) {
    const TensorInfo& r = mm.tensor("layer" + std::to_string(l) + ".router");
    for (int64_t i = 0; i < r.size(); ++i) CHECK(mm.gradients()[r.offset + i] == 0.0);
  }
}

}  // namespace
}  // namespace moeplan::backend

namespace moeplan::backend {
namespace {

TEST_CASE("initial_weights: the layout, weights and generator state of a full model, alone") {
  // What the CUDA model starts from; a full CPU model of the same arguments is the reference.
  Arch a = test::tiny_moe();
  ModelOptions o;
  o.positions = "rope";
  const Model<float> full(a, o, 11, 3);
  const auto w = Model<float>::initial_weights(a, o, 11);
  REQUIRE(w.tensors.size() == full.tensors().size());
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    CHECK(w.tensors[i].name == full.tensors()[i].name);
    CHECK(w.tensors[i].offset == full.tensors()[i].offset);
    CHECK(w.tensors[i].size() == full.tensors()[i].size());
  }
  REQUIRE(int64_t(w.params.size()) == full.trainable_params());
  CHECK(std::equal(w.params.begin(), w.params.end(), full.parameters().begin()));
  CHECK(w.rng_state == full.rng_state());
  // Another seed draws other weights; a bad option is refused as the constructor refuses it.
  CHECK(Model<float>::initial_weights(a, o, 12).params[0] != w.params[0]);
  a.head_dim = 3;
  a.heads = 4;
  CHECK_THROWS_AS(Model<float>::initial_weights(a, o, 11), InputError);
}

}  // namespace
}  // namespace moeplan::backend
