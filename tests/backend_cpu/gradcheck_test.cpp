// Ladder rung 1: every layer type's backward against finite differences, in fp64, through the
// whole model (each tensor's gradient is the end of a chain through every layer above it).
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

struct CheckStats {
  double worst_rel = 0;
  std::string worst_where;
  int checked = 0;
};

// Fourth-order central difference of the objective in each sampled parameter: truncation error
// O(h⁴) ≈ 1e-16 and round-off ≈ 1e-16·|f|/h ≈ 1e-12 at h = 2e-4 (a much larger h would let a
// perturbed router flip a top-K choice). Relative error |fd − an| / max(|fd|, |an|, 1e-5): below
// 1e-5 the FD round-off itself reaches 1e-7 relative, so entries that small are held to an
// absolute 1e-11 instead.
CheckStats check_model(Model<double>& m, const std::vector<int32_t>& in,
                       const std::vector<int32_t>& tg, int samples_per_tensor) {
  m.freeze_erc_noise(false);
  m.compute_gradients(in.data(), tg.data());
  m.freeze_erc_noise(true);  // every evaluation below sees the same ERC noise δ
  m.compute_gradients(in.data(), tg.data());
  const std::vector<double> analytic(m.gradients().begin(), m.gradients().end());
  auto p = m.parameters();
  CheckStats st;
  const double h = 2e-4;
  for (const TensorInfo& t : m.tensors()) {
    const int n = int(std::min<int64_t>(samples_per_tensor, t.size()));
    for (int s = 0; s < n; ++s) {
      // Spread the samples over the tensor (first, last and a stride through the middle).
      const int64_t i = t.offset + (n == 1 ? 0 : (t.size() - 1) * s / (n - 1));
      const double keep = p[i];
      double f[4];
      const double steps[4] = {2 * h, h, -h, -2 * h};
      for (int k = 0; k < 4; ++k) {
        p[i] = keep + steps[k];
        f[k] = m.compute_gradients(in.data(), tg.data());
      }
      p[i] = keep;
      const double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
      const double an = analytic[i];
      const double rel = std::abs(fd - an) / std::max({std::abs(fd), std::abs(an), 1e-5});
      ++st.checked;
      if (rel > st.worst_rel) {
        st.worst_rel = rel;
        st.worst_where =
            fmt::format("{}[{}] fd={:.12g} analytic={:.12g}", t.name, i - t.offset, fd, an);
      }
    }
  }
  return st;
}

StepResult run_check(const Arch& a, const ModelOptions& o, const std::string& what,
                     int64_t B = 2) {
  Model<double> m(a, o, 7, B);
  const auto in = test::tokens(B * a.seq_len, a.vocab, 1);
  auto tg = test::tokens(B * a.seq_len, a.vocab, 2);
  tg[3] = -1;  // one position bears no loss
  const CheckStats st = check_model(m, in, tg, 5);
  INFO(what, ": worst ", st.worst_where);
  CHECK(st.checked >= 5 * 10);
  CHECK(st.worst_rel < 1e-6);
  StepResult r;
  m.compute_gradients(in.data(), tg.data(), &r);
  return r;
}

TEST_CASE("gradient check: tiny dense model, GQA, ALiBi, untied head") {
  run_check(test::tiny_dense(), ModelOptions{}, "dense alibi");
}

TEST_CASE("gradient check: tiny dense model, MHA, RoPE, tied embeddings") {
  Arch a = test::tiny_dense();
  a.kv_heads = a.heads;
  a.tied_embeddings = true;
  ModelOptions o;
  o.positions = "rope";
  run_check(a, o, "dense rope tied");
}

TEST_CASE("gradient check: tiny MoE with shared expert, ALiBi, every aux loss on") {
  ModelOptions o;
  o.load_balance = 0.05;
  o.z_loss = 0.01;
  o.erc_loss = 0.5;
  o.erc_alpha = 0.6;  // α < 1 so some hinge terms of the ERC loss are active at init
  const StepResult r = run_check(test::tiny_moe(), o, "moe alibi aux");
  CHECK(r.aux_load_balance > 0);  // each aux term really contributes to the checked objective
  CHECK(r.aux_z > 0);
  CHECK(r.aux_erc > 0);
}

TEST_CASE("gradient check: gradients accumulated over passes of 2+1 sequences, aux losses on") {
  ModelOptions o;
  o.load_balance = 0.05;
  o.z_loss = 0.01;
  o.erc_loss = 0.5;
  o.erc_alpha = 0.6;
  o.micro_batch_seqs = 2;
  const StepResult r = run_check(test::tiny_moe(), o, "moe alibi aux, 2 passes", 3);
  CHECK(r.aux_load_balance > 0);
  CHECK(r.aux_z > 0);
  CHECK(r.loss_bearing_targets == 3 * test::tiny_moe().seq_len - 1);
}

TEST_CASE("gradient check: tiny MoE with shared expert, RoPE, renormalised gates, aux losses") {
  ModelOptions o;
  o.positions = "rope";
  o.renormalize_gates = true;
  o.load_balance = 0.05;
  o.z_loss = 0.01;
  o.erc_loss = 0.5;
  o.erc_alpha = 0.6;
  const StepResult r = run_check(test::tiny_moe(), o, "moe rope renorm aux");
  CHECK(r.aux_erc > 0);
}

TEST_CASE("gradient check: MoE without shared expert and with a capacity factor that drops") {
  Arch a = test::tiny_moe();
  a.d_shared = 0;
  a.layers = 3;
  ModelOptions o;
  o.capacity_factor = 0.75;
  const StepResult r = run_check(a, o, "moe capacity");
  CHECK(r.dropped_assignments > 0);  // the capacity path (dropped slots) is exercised
}

}  // namespace
}  // namespace moeplan::backend
