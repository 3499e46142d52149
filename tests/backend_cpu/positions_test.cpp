// Position encodings against references written here from their definitions: ALiBi (Press et
// al.) adds −m_h·(i − j) to the score of query i and key j ≤ i, m_h = 2^(−8h/H) for h = 1..H;
// RoPE (layers.hpp) rotates the pair (2i, 2i+1) of every query and key head at position p by
// p·θ_i, θ_i = 10000^(−2i/Dh). A gradient check cannot see a wrong sign or base: the backward
// still matches whatever the forward computes. fp64 throughout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "layers.hpp"
#include "moeplan/backend/model.hpp"
#include "tiny.hpp"

namespace moeplan::backend {
namespace {

std::vector<double> uniform(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(gen);
  return v;
}

// ALiBi slopes for a power-of-two H, straight from the definition: 2^(−8h/H), h = 1..H.
std::vector<double> alibi_reference(int64_t H) {
  std::vector<double> s(H);
  for (int64_t h = 0; h < H; ++h) s[h] = std::pow(2.0, -8.0 * double(h + 1) / double(H));
  return s;
}

TEST_CASE("ALiBi slopes: Press et al.'s geometric sequence, interleaved for H not a power of 2") {
  for (int64_t H : {1, 2, 4, 8}) {
    CAPTURE(H);
    std::vector<double> s(H);
    cpu::alibi_slopes(s.data(), H);
    const auto ref = alibi_reference(H);
    for (int64_t h = 0; h < H; ++h) CHECK(s[h] == doctest::Approx(ref[h]).epsilon(1e-15));
  }
  // H = 6: the 4-head slopes, then every other slope of the 8-head sequence (Press et al.'s
  // get_slopes): 2^−2, 2^−4, 2^−6, 2^−8, then 2^−1, 2^−3.
  std::vector<double> s(6);
  cpu::alibi_slopes(s.data(), 6);
  const double ref[6] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  for (int h = 0; h < 6; ++h) CHECK(s[h] == doctest::Approx(ref[h]).epsilon(1e-15));
}

// Causal attention of one sequence's heads, a scalar loop: qkv (S, (H+2Hkv)·Dh) laid out as
// [Q heads | K heads | V heads]; query head h reads kv head h/(H/Hkv). Fills probs (H,S,S)
// (lower triangle) and out (S, H·Dh).
void attention_reference(std::vector<double>& probs, std::vector<double>& out, const double* qkv,
                         const std::vector<double>& slopes, int64_t S, int64_t H, int64_t Hkv,
                         int64_t Dh) {
  const int64_t W = (H + 2 * Hkv) * Dh;
  probs.assign(H * S * S, 0.0);
  out.assign(S * H * Dh, 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / Hkv);
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> z(i + 1);
      double mx = -1e300;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < Dh; ++d)
          dot += qkv[i * W + h * Dh + d] * qkv[j * W + (H + g) * Dh + d];
        z[j] = dot / std::sqrt(double(Dh)) - slopes[h] * double(i - j);  // distant keys lose
        mx = std::max(mx, z[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(z[j] - mx);
      for (int64_t j = 0; j <= i; ++j) {
        const double pij = std::exp(z[j] - mx) / sum;
        probs[(h * S + i) * S + j] = pij;
        for (int64_t d = 0; d < Dh; ++d)
          out[i * H * Dh + h * Dh + d] += pij * qkv[j * W + (H + Hkv + g) * Dh + d];
      }
    }
  }
}

TEST_CASE("attention_forward with ALiBi equals the scalar definition (probabilities and output)") {
  const int64_t B = 2, S = 5, H = 4, Hkv = 2, Dh = 3, W = (H + 2 * Hkv) * Dh;
  const auto qkv = uniform(size_t(B * S * W), -1.5, 1.5, 11);
  std::vector<double> slopes(H);
  cpu::alibi_slopes(slopes.data(), H);
  std::vector<double> out(B * S * H * Dh), att(B * H * S * S, 0.0);
  FlopLedger lg;
  cpu::attention_forward(out.data(), att.data(), qkv.data(), slopes.data(), B, S, H, Hkv, Dh, lg);
  const auto ref_slopes = alibi_reference(H);
  double worst = 0, bias_effect = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> probs, ref_out, flat_probs, flat_out;
    attention_reference(probs, ref_out, qkv.data() + b * S * W, ref_slopes, S, H, Hkv, Dh);
    attention_reference(flat_probs, flat_out, qkv.data() + b * S * W, std::vector<double>(H, 0.0),
                        S, H, Hkv, Dh);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const size_t at = size_t((h * S + i) * S + j);
          worst = std::max(worst, std::abs(att[b * H * S * S + at] - probs[at]));
          bias_effect = std::max(bias_effect, std::abs(probs[at] - flat_probs[at]));
        }
    for (size_t k = 0; k < ref_out.size(); ++k)
      worst = std::max(worst, std::abs(out[b * S * H * Dh + k] - ref_out[k]));
  }
  CHECK(worst <= 1e-10);
  CHECK(bias_effect > 1e-2);  // the bias moves the probabilities far beyond the tolerance
}

// A one-layer dense model with its FFN output zero (W2 = 0), so the layer is x + attention:
// per-position losses against a forward pass written here, embedding → RMSNorm → QKV →
// [RoPE] → causal attention [+ ALiBi] → output projection → residual → final RMSNorm → head.
struct Reference {
  Arch a;
  std::vector<double> emb, norm1, wqkv, wo, normf, head;  // row-major, as the model holds them
  bool rope = false, alibi = false;

  static void rmsnorm(double* y, const double* x, const double* w, int64_t C) {
    double ss = 0;
    for (int64_t k = 0; k < C; ++k) ss += x[k] * x[k];
    const double r = 1.0 / std::sqrt(ss / double(C) + 1e-5);  // BACKEND.md: ε = 1e-5
    for (int64_t k = 0; k < C; ++k) y[k] = x[k] * r * w[k];
  }

  std::vector<double> losses(const std::vector<int32_t>& in, const std::vector<int32_t>& tg,
                             int64_t B) const {
    const int64_t S = a.seq_len, Dm = a.d_model, H = a.heads, Hkv = a.kv_heads, Dh = a.head_dim,
                  V = a.vocab, W = (H + 2 * Hkv) * Dh;
    std::vector<double> out(B * S);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> x(S * Dm), ln(S * Dm), qkv(S * W, 0.0);
      for (int64_t t = 0; t < S; ++t) {
        std::copy_n(emb.data() + in[b * S + t] * Dm, Dm, x.data() + t * Dm);
        rmsnorm(ln.data() + t * Dm, x.data() + t * Dm, norm1.data(), Dm);
        for (int64_t o = 0; o < W; ++o)
          for (int64_t k = 0; k < Dm; ++k) qkv[t * W + o] += ln[t * Dm + k] * wqkv[k * W + o];
        if (!rope) continue;
        for (int64_t h = 0; h < H + Hkv; ++h)  // query and key heads; values keep their place
          for (int64_t i = 0; i < Dh / 2; ++i) {
            const double angle = double(t) * std::pow(10000.0, -2.0 * double(i) / double(Dh));
            double* v = qkv.data() + t * W + h * Dh + 2 * i;
            const double x0 = v[0], x1 = v[1];
            v[0] = x0 * std::cos(angle) - x1 * std::sin(angle);
            v[1] = x0 * std::sin(angle) + x1 * std::cos(angle);
          }
      }
      std::vector<double> probs, atty;
      attention_reference(probs, atty, qkv.data(),
                          alibi ? alibi_reference(H) : std::vector<double>(H, 0.0), S, H, Hkv, Dh);
      for (int64_t t = 0; t < S; ++t) {
        double* xt = x.data() + t * Dm;
        for (int64_t o = 0; o < Dm; ++o)
          for (int64_t k = 0; k < H * Dh; ++k) xt[o] += atty[t * H * Dh + k] * wo[k * Dm + o];
        std::vector<double> lnf(Dm), logits(V, 0.0);
        rmsnorm(lnf.data(), xt, normf.data(), Dm);
        for (int64_t v = 0; v < V; ++v)
          for (int64_t k = 0; k < Dm; ++k) logits[v] += lnf[k] * head[k * V + v];
        const double mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double z : logits) sum += std::exp(z - mx);
        out[b * S + t] = mx + std::log(sum) - logits[tg[b * S + t]];
      }
    }
    return out;
  }
};

void check_positions(const std::string& positions) {
  Arch a;
  a.d_model = 8;
  a.layers = 1;
  a.dense_layers = 1;
  a.heads = 4;
  a.kv_heads = 2;  // GQA: query heads 0,1 read kv head 0; 2,3 read kv head 1
  a.head_dim = 8;  // θ = 1, 0.1, 0.01, 0.001: every pair turns at its own rate
  a.d_ffn = 4;
  a.seq_len = 6;
  a.vocab = 7;
  const int64_t B = 2, S = a.seq_len;
  ModelOptions o;
  o.positions = positions;
  Model<double> m(a, o, 5, B);
  // Weights of order 1 (the init's 0.02 would leave the attention nearly uniform and the
  // position terms nearly invisible in the loss); norm scales away from 1.
  Reference ref;
  ref.a = a;
  ref.rope = positions == "rope";
  ref.alibi = positions == "alibi";
  uint32_t seed = 100;
  auto fill = [&](const std::string& name, std::vector<double>* keep, double lo, double hi) {
    const TensorInfo& t = m.tensor(name);
    const auto v = uniform(size_t(t.size()), lo, hi, seed++);
    std::copy(v.begin(), v.end(), m.parameters().begin() + t.offset);
    if (keep) *keep = v;
  };
  fill("embedding", &ref.emb, -1, 1);
  fill("layer0.norm1", &ref.norm1, 0.5, 1.5);
  fill("layer0.qkv", &ref.wqkv, -1, 1);
  fill("layer0.attn_out", &ref.wo, -1, 1);
  fill("layer0.norm2", nullptr, 0.5, 1.5);
  fill("layer0.ffn.w13", nullptr, -1, 1);
  fill("layer0.ffn.w2", nullptr, 0, 0);  // the FFN adds exactly 0
  fill("final_norm", &ref.normf, 0.5, 1.5);
  fill("lm_head", &ref.head, -1, 1);

  const auto in = test::tokens(B * S, a.vocab, 3), tg = test::tokens(B * S, a.vocab, 4);
  std::vector<double> got(B * S);
  m.forward_loss(in.data(), tg.data(), B, got.data());
  const auto want = ref.losses(in, tg, B);
  Reference none = ref;  // the same model without any position term
  none.rope = none.alibi = false;
  const auto flat = none.losses(in, tg, B);
  double worst = 0, position_effect = 0;
  for (int64_t t = 0; t < B * S; ++t) {
    CAPTURE(t);
    CHECK(got[t] == doctest::Approx(want[t]).epsilon(1e-10));
    worst = std::max(worst, std::abs(got[t] - want[t]));
    position_effect = std::max(position_effect, std::abs(want[t] - flat[t]));
  }
  INFO(positions, ": worst |model − reference| ", worst);
  CHECK(worst <= 1e-10);
  CHECK(position_effect > 1e-2);  // the position term moves the losses far beyond the tolerance
}

TEST_CASE("model forward with ALiBi equals a scalar reference (bias −slope·(i−j))") {
  check_positions("alibi");
}
TEST_CASE("model forward with RoPE equals a scalar reference (pairs (2i,2i+1), base 10000)") {
  check_positions("rope");
}

}  // namespace
}  // namespace moeplan::backend
