#include "layers.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "eigen_types.hpp"
#include "parallel.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace moeplan::backend::cpu {

void add_causal_product(FlopLedger& ledger, Phase phase, int64_t count, int64_t S, int64_t Dh) {
  ledger.flops[int(FlopCategory::attention_core)][int(phase)] += count * Dh * S * (S + 1);
}

int64_t elementwise_per_pass(const Arch& a, int64_t nb, bool rope, std::span<const int64_t> routed) {
  const int64_t S = a.seq_len, T = nb * S, Dm = a.d_model, H = a.heads;
  int64_t n = T * (Dm + a.vocab);
  for (int64_t l = 0; l < a.layers; ++l) {
    n += 2 * T * Dm + nb * H * S * (S + 1) / 2 + (rope ? T * (H + a.kv_heads) * a.head_dim : 0);
    if (l < a.dense_layers) {
      n += T * a.d_ffn;
    } else {
      const int64_t R = routed[size_t(l - a.dense_layers)];
      n += T * a.experts + R * a.d_expert + T * a.d_shared + R * Dm;
    }
  }
  return n;
}

template <class S>
void matmul_forward(S* out, const S* inp, const S* w, int64_t T, int64_t C, int64_t OC,
                    bool accumulate, FlopLedger& ledger, FlopCategory cat) {
  if (T == 0) return;
  MMap<S> o(out, T, OC);
  if (accumulate)
    o.noalias() += CMap<S>(inp, T, C) * CMap<S>(w, C, OC);
  else
    o.noalias() = CMap<S>(inp, T, C) * CMap<S>(w, C, OC);
  ledger.add_gemm(cat, Phase::forward, T, OC, C);
}

template <class S>
void matmul_backward(S* dinp, bool accumulate_dinp, S* dw, const S* dout, const S* inp, const S* w,
                     int64_t T, int64_t C, int64_t OC, FlopLedger& ledger, FlopCategory cat) {
  if (T == 0) return;
  CMap<S> g(dout, T, OC);
  if (dinp) {
    MMap<S> di(dinp, T, C);
    if (accumulate_dinp)
      di.noalias() += g * CMap<S>(w, C, OC).transpose();
    else
      di.noalias() = g * CMap<S>(w, C, OC).transpose();
    ledger.add_gemm(cat, Phase::input_grad, T, C, OC);
  }
  MMap<S>(dw, C, OC).noalias() += CMap<S>(inp, T, C).transpose() * g;
  ledger.add_gemm(cat, Phase::weight_grad, C, OC, T);
}

template <class S>
void matmul_wt_forward(S* out, const S* inp, const S* wt, int64_t T, int64_t C, int64_t OC,
                       FlopLedger& ledger, FlopCategory cat) {
  if (T == 0) return;
  MMap<S>(out, T, OC).noalias() = CMap<S>(inp, T, C) * CMap<S>(wt, OC, C).transpose();
  ledger.add_gemm(cat, Phase::forward, T, OC, C);
}

template <class S>
void matmul_wt_backward(S* dinp, bool accumulate_dinp, S* dwt, const S* dout, const S* inp,
                        const S* wt, int64_t T, int64_t C, int64_t OC, FlopLedger& ledger,
                        FlopCategory cat) {
  if (T == 0) return;
  CMap<S> g(dout, T, OC);
  if (dinp) {
    MMap<S> di(dinp, T, C);
    if (accumulate_dinp)
      di.noalias() += g * CMap<S>(wt, OC, C);
    else
      di.noalias() = g * CMap<S>(wt, OC, C);
    ledger.add_gemm(cat, Phase::input_grad, T, C, OC);
  }
  MMap<S>(dwt, OC, C).noalias() += g.transpose() * CMap<S>(inp, T, C);
  ledger.add_gemm(cat, Phase::weight_grad, C, OC, T);
}

template <class S>
void rmsnorm_forward(S* out, S* rstd, const S* inp, const S* weight, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if (T * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* x = inp + t * C;
    S* y = out + t * C;
    S ss = 0;
    for (int64_t i = 0; i < C; ++i) ss += x[i] * x[i];
    const S r = S(1) / std::sqrt(ss / S(C) + S(1e-5));
    for (int64_t i = 0; i < C; ++i) y[i] = x[i] * r * weight[i];
    rstd[t] = r;
  }
}

template <class S>
void rmsnorm_backward(S* dinp, S* dweight, const S* dout, const S* inp, const S* weight,
                      const S* rstd, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if (T * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* x = inp + t * C;
    const S* dy = dout + t * C;
    S* dx = dinp + t * C;
    const S r = rstd[t];
    // y = x·r·w, r = (mean x² + eps)^(-1/2): dx = r·w⊙dy − x·r³·(Σ w⊙dy⊙x)/C
    S dot = 0;
    for (int64_t i = 0; i < C; ++i) dot += weight[i] * dy[i] * x[i];
    const S coef = dot * r * r * r / S(C);
    for (int64_t i = 0; i < C; ++i) dx[i] += r * weight[i] * dy[i] - x[i] * coef;
  }
  // Serial over tokens so the sum order never depends on the thread count.
  for (int64_t t = 0; t < T; ++t) {
    const S* x = inp + t * C;
    const S* dy = dout + t * C;
    const S r = rstd[t];
    for (int64_t i = 0; i < C; ++i) dweight[i] += dy[i] * x[i] * r;
  }
}

template <class S>
void embedding_forward(S* out, const int32_t* inputs, const S* wte, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if (T * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) std::copy_n(wte + int64_t(inputs[t]) * C, C, out + t * C);
}

template <class S>
void embedding_backward(S* dwte, const S* dout, const int32_t* inputs, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    S* d = dwte + int64_t(inputs[t]) * C;
    const S* g = dout + t * C;
    for (int64_t i = 0; i < C; ++i) d[i] += g[i];
  }
}

template <class S>
void swiglu_forward(S* act, const S* h13, int64_t T, int64_t D) {
#pragma omp parallel for schedule(static) if (T * D >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* h1 = h13 + t * 2 * D;
    const S* h3 = h1 + D;
    // Eigen's array exp is vectorised (libm's expf is not, without fast-math).
    AMap<S>(act + t * D, D) = CAMap<S>(h1, D) / (S(1) + (-CAMap<S>(h1, D)).exp()) * CAMap<S>(h3, D);
  }
}

template <class S>
void swiglu_backward(S* dh13, const S* dact, const S* h13, int64_t T, int64_t D) {
#pragma omp parallel for schedule(static) if (T * D >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* h1 = h13 + t * 2 * D;
    const S* h3 = h1 + D;
    const S* da = dact + t * D;
    S* d1 = dh13 + t * 2 * D;
    S* d3 = d1 + D;
    CAMap<S> x(h1, D), g(da, D);
    AMap<S> sig(d1, D);  // d1 holds sigmoid(h1) first
    sig = S(1) / (S(1) + (-x).exp());
    AMap<S>(d3, D) = g * x * sig;
    sig = g * CAMap<S>(h3, D) * sig * (S(1) + x * (S(1) - sig));
  }
}

namespace {
template <class S, bool kInverse>
void rope_apply(S* qkv, const S* cos_sin, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                int64_t Dh) {
  const int64_t W = (H + 2 * Hkv) * Dh, half = Dh / 2, rotated_heads = H + Hkv;
#pragma omp parallel for schedule(static) if (B * seq * W >= kParallelWork)
  for (int64_t t = 0; t < B * seq; ++t) {
    const S* cs = cos_sin + (t % seq) * half * 2;
    for (int64_t h = 0; h < rotated_heads; ++h) {
      S* v = qkv + t * W + h * Dh;
      for (int64_t i = 0; i < half; ++i) {
        const S c = cs[2 * i], s = kInverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        const S x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
      }
    }
  }
}
}  // namespace

template <class S>
void rope_forward(S* qkv, const S* cos_sin, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                  int64_t Dh) {
  rope_apply<S, false>(qkv, cos_sin, B, seq, H, Hkv, Dh);
}
template <class S>
void rope_backward(S* dqkv, const S* cos_sin, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                   int64_t Dh) {
  rope_apply<S, true>(dqkv, cos_sin, B, seq, H, Hkv, Dh);
}

template <class S>
void attention_forward(S* out, S* att, const S* qkv, const S* alibi_slopes, int64_t B, int64_t seq,
                       int64_t H, int64_t Hkv, int64_t Dh, FlopLedger& ledger) {
  const int64_t W = (H + 2 * Hkv) * Dh, group = H / Hkv;
  const S scale = S(1) / std::sqrt(S(Dh));
#pragma omp parallel for schedule(static) if (B * H * seq * seq * Dh >= kParallelWork)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, kvh = h / group;
    const S* base = qkv + b * seq * W;
    CSMap<S> q(base + h * Dh, seq, Dh, Eigen::OuterStride<>(W));
    CSMap<S> k(base + (H + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    CSMap<S> v(base + (H + Hkv + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    MMap<S> p(att + bh * seq * seq, seq, seq);
    p.template triangularView<Eigen::Lower>() = q * k.transpose();  // only j <= i is computed
    const S slope = alibi_slopes ? alibi_slopes[h] : S(0);
    for (int64_t i = 0; i < seq; ++i) {
      S* row = p.data() + i * seq;
      S mx = -std::numeric_limits<S>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = row[j] * scale - slope * S(i - j);
        mx = std::max(mx, row[j]);
      }
      AMap<S> r(row, i + 1);
      r = (r - mx).exp();
      r *= S(1) / r.sum();
    }
    SMap<S> o(out + b * seq * H * Dh + h * Dh, seq, Dh, Eigen::OuterStride<>(H * Dh));
    o.noalias() = p.template triangularView<Eigen::Lower>() * v;
  }
  add_causal_product(ledger, Phase::forward, 2 * B * H, seq, Dh);  // Q·K^T and P·V
}

template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* att, S* scratch,
                        int scratch_threads, int64_t B, int64_t seq, int64_t H, int64_t Hkv,
                        int64_t Dh, FlopLedger& ledger) {
  const int64_t W = (H + 2 * Hkv) * Dh, group = H / Hkv;
  const S scale = S(1) / std::sqrt(S(Dh));
#ifdef _OPENMP
  const int team = std::min(scratch_threads, omp_get_max_threads());
#else
  const int team = 1;
  (void)scratch_threads;
#endif
  // One task per (sequence, kv head): the query heads of a group add into the same dK, dV.
#pragma omp parallel for schedule(static) \
    num_threads(team) if (B * Hkv * seq * seq * Dh >= kParallelWork)
  for (int64_t bk = 0; bk < B * Hkv; ++bk) {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    const int64_t b = bk / Hkv, kvh = bk % Hkv;
    const S* base = qkv + b * seq * W;
    S* dbase = dqkv + b * seq * W;
    CSMap<S> k(base + (H + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    CSMap<S> v(base + (H + Hkv + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    SMap<S> dk(dbase + (H + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    SMap<S> dv(dbase + (H + Hkv + kvh) * Dh, seq, Dh, Eigen::OuterStride<>(W));
    dk.setZero();
    dv.setZero();
    MMap<S> dp(scratch + int64_t(tid) * seq * seq, seq, seq);
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      CSMap<S> q(base + h * Dh, seq, Dh, Eigen::OuterStride<>(W));
      SMap<S> dq(dbase + h * Dh, seq, Dh, Eigen::OuterStride<>(W));
      CSMap<S> d_o(dout + b * seq * H * Dh + h * Dh, seq, Dh, Eigen::OuterStride<>(H * Dh));
      CMap<S> p(att + (b * H + h) * seq * seq, seq, seq);
      dp.template triangularView<Eigen::Lower>() = d_o * v.transpose();             // dP = dO·V^T
      dv.noalias() += p.transpose().template triangularView<Eigen::Upper>() * d_o;  // P^T·dO
      for (int64_t i = 0; i < seq; ++i) {  // softmax backward; the scale folds into dS
        const S* pr = p.data() + i * seq;
        S* dr = dp.data() + i * seq;
        S dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
        for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
      }
      dq.noalias() = dp.template triangularView<Eigen::Lower>() * k;               // dS·K
      dk.noalias() += dp.transpose().template triangularView<Eigen::Upper>() * q;  // dS^T·Q
    }
  }
  add_causal_product(ledger, Phase::input_grad, 4 * B * H, seq, Dh);
}

template <class S>
double crossentropy_forward(S* logits, double* losses, const int32_t* targets, int64_t T,
                            int64_t V) {
#pragma omp parallel for schedule(static) if (T * V >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    S* row = logits + t * V;
    S mx = row[0];
    for (int64_t i = 1; i < V; ++i) mx = std::max(mx, row[i]);
    AMap<S> r(row, V);
    r = (r - mx).exp();
    r *= S(1) / r.sum();
    losses[t] = targets[t] >= 0 ? -std::log(double(row[targets[t]])) : 0.0;
  }
  double total = 0;
  for (int64_t t = 0; t < T; ++t) total += losses[t];
  return total;
}

template <class S>
void crossentropy_backward(S* probs, const int32_t* targets, double scale, int64_t T, int64_t V) {
  const S sc = S(scale);
#pragma omp parallel for schedule(static) if (T * V >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    S* row = probs + t * V;
    if (targets[t] < 0) {
      std::fill_n(row, V, S(0));
      continue;
    }
    row[targets[t]] -= S(1);
    for (int64_t i = 0; i < V; ++i) row[i] *= sc;
  }
}

void alibi_slopes(double* slopes, int64_t H) {
  auto power_of_two = [](int64_t n, std::vector<double>& out) {
    const double start = std::pow(2.0, -8.0 / double(n));
    for (int64_t i = 0; i < n; ++i) out.push_back(std::pow(start, double(i + 1)));
  };
  int64_t closest = 1;
  while (closest * 2 <= H) closest *= 2;
  std::vector<double> s;
  power_of_two(closest, s);
  if (closest < H) {
    std::vector<double> extra;
    power_of_two(2 * closest, extra);
    for (int64_t i = 0; int64_t(s.size()) < H; i += 2) s.push_back(extra[i]);
  }
  std::copy_n(s.begin(), H, slopes);
}

#define MOEPLAN_INSTANTIATE(S)                                                                     \
  template void matmul_forward<S>(S*, const S*, const S*, int64_t, int64_t, int64_t, bool,         \
                                  FlopLedger&, FlopCategory);                                      \
  template void matmul_backward<S>(S*, bool, S*, const S*, const S*, const S*, int64_t, int64_t,   \
                                   int64_t, FlopLedger&, FlopCategory);                            \
  template void matmul_wt_forward<S>(S*, const S*, const S*, int64_t, int64_t, int64_t,            \
                                     FlopLedger&, FlopCategory);                                   \
  template void matmul_wt_backward<S>(S*, bool, S*, const S*, const S*, const S*, int64_t,         \
                                      int64_t, int64_t, FlopLedger&, FlopCategory);                \
  template void rmsnorm_forward<S>(S*, S*, const S*, const S*, int64_t, int64_t);                  \
  template void rmsnorm_backward<S>(S*, S*, const S*, const S*, const S*, const S*, int64_t,       \
                                    int64_t);                                                      \
  template void embedding_forward<S>(S*, const int32_t*, const S*, int64_t, int64_t);              \
  template void embedding_backward<S>(S*, const S*, const int32_t*, int64_t, int64_t);             \
  template void swiglu_forward<S>(S*, const S*, int64_t, int64_t);                                 \
  template void swiglu_backward<S>(S*, const S*, const S*, int64_t, int64_t);                      \
  template void rope_forward<S>(S*, const S*, int64_t, int64_t, int64_t, int64_t, int64_t);        \
  template void rope_backward<S>(S*, const S*, int64_t, int64_t, int64_t, int64_t, int64_t);       \
  template void attention_forward<S>(S*, S*, const S*, const S*, int64_t, int64_t, int64_t,        \
                                     int64_t, int64_t, FlopLedger&);                               \
  template void attention_backward<S>(S*, const S*, const S*, const S*, S*, int, int64_t, int64_t, \
                                      int64_t, int64_t, int64_t, FlopLedger&);                     \
  template double crossentropy_forward<S>(S*, double*, const int32_t*, int64_t, int64_t);          \
  template void crossentropy_backward<S>(S*, const int32_t*, double, int64_t, int64_t);

MOEPLAN_INSTANTIATE(float)
MOEPLAN_INSTANTIATE(double)
#undef MOEPLAN_INSTANTIATE

}  // namespace moeplan::backend::cpu
