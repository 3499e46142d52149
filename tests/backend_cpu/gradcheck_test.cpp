// Ladder rung 1: every layer type's backward against finite differences, in fp64, through the
// whole model (each tensor's gradient is the end of a chain through every layer above it).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
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
  int kinks = 0;  // router samples that sat near a top-K tie, checked again at h/8
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
    // Rows spread from first to last, and columns spread too but in another order (a step k
    // coprime with n): a plain stride through a (16, 12) w13 hit columns 0, 11, 11, 11, 11, so
    // only one sample fell in its gate half, the half the ERC loss differentiates.
    int k = 1;
    for (int c : {3, 5, 7, 11, 13})
      if (std::gcd(c, n) == 1) {
        k = c;
        break;
      }
    for (int s = 0; s < n; ++s) {
      const int64_t row = n == 1 ? 0 : (t.rows - 1) * s / (n - 1);
      const int64_t col = n == 1 ? 0 : (t.cols - 1) * ((int64_t(s) * k) % n) / (n - 1);
      const int64_t i = t.offset + row * t.cols + col;
      const double keep = p[i];
      auto central = [&](double step) {  // fourth-order central difference at this step
        double f[4];
        const double steps[4] = {2 * step, step, -step, -2 * step};
        for (int q = 0; q < 4; ++q) {
          p[i] = keep + steps[q];
          f[q] = m.compute_gradients(in.data(), tg.data());
        }
        p[i] = keep;
        return (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * step);
      };
      const double an = analytic[i];
      auto rel_error = [&](double fd) {
        return std::abs(fd - an) / std::max({std::abs(fd), std::abs(an), 1e-5});
      };
      double fd = central(h);
      // A router weight within 2h of a top-K tie: the objective has a kink there (the choice
      // flips), the difference at h straddles it and says nothing of the gradient. At h/8 it
      // does not; a wrong gradient is wrong at every step.
      if (rel_error(fd) > 1e-6 && t.name.find("router") != std::string::npos) {
        fd = central(h / 8);
        ++st.kinks;
      }
      const double rel = rel_error(fd);
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
  CHECK(st.kinks <= 2);  // a tie is a rare sample, not the rule
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

TEST_CASE("gradient check: two MoE layers, drops and renormalised gates, every aux loss at α 1") {
  // Dropped slots still enter the renormalising sum (their p moves the kept gates); the aux
  // terms summed over two MoE layers; the ERC loss at its default α.
  Arch a = test::tiny_moe();
  a.layers = 3;
  ModelOptions o;
  o.capacity_factor = 0.75;
  o.renormalize_gates = true;
  o.load_balance = 0.05;
  o.z_loss = 0.01;
  o.erc_loss = 0.5;
  o.erc_alpha = 1.0;
  const StepResult r = run_check(a, o, "moe 2 layers, drops, renorm, aux");
  CHECK(r.dropped_assignments > 0);
  CHECK(r.aux_load_balance > 0);
  CHECK(r.aux_z > 0);
  CHECK(r.aux_erc > 0);  // some hinge terms active at α 1: the ERC gradient is checked
}

}  // namespace
}  // namespace moeplan::backend
