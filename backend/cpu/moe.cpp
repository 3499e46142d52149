#include "moe.hpp"

#include "parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace moeplan::backend::cpu {

template <class S>
void router_forward(S* probs, S* lse, int32_t* idx, S* gate, int64_t T, int64_t E, int64_t K,
                    bool renormalize) {
#pragma omp parallel if (T * E * K >= kParallelWork)
  {
    std::vector<int32_t> order(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      S* p = probs + t * E;
      S mx = p[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, p[e]);
      S sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = std::exp(p[e] - mx);
        sum += p[e];
      }
      for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      lse[t] = mx + std::log(sum);
      // The K most probable experts in order, the lower index first on ties (a NaN, from
      // non-finite logits, ranks last): O(E log K) a token, not K passes over E.
      const auto key = [p](int32_t e) {
        return std::isnan(p[e]) ? -std::numeric_limits<S>::infinity() : p[e];
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&key](int32_t a, int32_t b) {
                          const S ka = key(a), kb = key(b);
                          return ka > kb || (ka == kb && a < b);
                        });
      int32_t* ix = idx + t * K;
      S* g = gate + t * K;
      S chosen = 0;
      for (int64_t k = 0; k < K; ++k) {
        ix[k] = order[size_t(k)];
        g[k] = p[ix[k]];
        chosen += g[k];
      }
      if (renormalize)
        for (int64_t k = 0; k < K; ++k) g[k] /= chosen;
    }
  }
}

int64_t expert_capacity(double capacity_factor, int64_t T, int64_t K, int64_t E) {
  if (capacity_factor <= 0 || E <= 0) return T * K;
  // Compared in double before the conversion: a factor of 1e20 ("no limit") is past int64_t,
  // where the conversion is undefined (x86 gives INT64_MIN, a negative capacity).
  const double cap = std::ceil(capacity_factor * double(T * K) / double(E));
  return cap >= double(T * K) ? T * K : int64_t(cap);
}

int64_t dispatch(int64_t* assigned, int64_t* offsets, int64_t* cursor, int32_t* slot_row,
                 int32_t* row_token, const int32_t* idx, int64_t T, int64_t E, int64_t K,
                 int64_t capacity) {
  std::fill_n(assigned, E, 0);
  for (int64_t a = 0; a < T * K; ++a) ++assigned[idx[a]];
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    offsets[e + 1] = offsets[e] + std::min(assigned[e], capacity);
    cursor[e] = offsets[e];
  }
  // (token, slot) order: the first `capacity` assignments of an expert are kept.
  int64_t dropped = 0;
  for (int64_t a = 0; a < T * K; ++a) {
    const int32_t e = idx[a];
    if (cursor[e] == offsets[e + 1]) {
      slot_row[a] = -1;
      ++dropped;
      continue;
    }
    slot_row[a] = int32_t(cursor[e]);
    row_token[cursor[e]++] = int32_t(a / K);
  }
  return dropped;
}

template <class S>
void gather_rows(S* xg, const S* x, const int32_t* row_token, int64_t R, int64_t C) {
#pragma omp parallel for schedule(static) if (R * C >= kParallelWork)
  for (int64_t r = 0; r < R; ++r) std::copy_n(x + int64_t(row_token[r]) * C, C, xg + r * C);
}

template <class S>
void combine_forward(S* out, const S* ye, const S* gate, const int32_t* slot_row, int64_t T,
                     int64_t K, int64_t C) {
#pragma omp parallel for schedule(static) if (T * K * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    S* o = out + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = slot_row[t * K + k];
      if (r < 0) continue;
      const S g = gate[t * K + k];
      const S* y = ye + int64_t(r) * C;
      for (int64_t i = 0; i < C; ++i) o[i] += g * y[i];
    }
  }
}

template <class S>
void combine_backward(S* dye, S* dgate, const S* dout, const S* ye, const S* gate,
                      const int32_t* slot_row, int64_t T, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static) if (T * K * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* d = dout + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = slot_row[t * K + k];
      if (r < 0) {
        dgate[t * K + k] = 0;
        continue;
      }
      const S g = gate[t * K + k];
      const S* y = ye + int64_t(r) * C;
      S* dy = dye + int64_t(r) * C;
      S dot = 0;
      for (int64_t i = 0; i < C; ++i) {
        dy[i] = g * d[i];
        dot += d[i] * y[i];
      }
      dgate[t * K + k] = dot;
    }
  }
}

template <class S>
void scatter_add_rows(S* dx, const S* dxg, const int32_t* slot_row, int64_t T, int64_t K,
                      int64_t C) {
#pragma omp parallel for schedule(static) if (T * K * C >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    S* o = dx + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = slot_row[t * K + k];
      if (r < 0) continue;
      const S* g = dxg + int64_t(r) * C;
      for (int64_t i = 0; i < C; ++i) o[i] += g[i];
    }
  }
}

template <class S>
void router_backward(S* dlogits, const S* probs, const S* lse, const int32_t* idx, const S* gate,
                     const S* dgate, const double* lb_dp, double z_scale, int64_t T, int64_t E,
                     int64_t K, bool renormalize) {
#pragma omp parallel for schedule(static) if (T * E * K >= kParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const S* p = probs + t * E;
    S* dp = dlogits + t * E;  // holds dL/dp first, then dL/dlogits
    for (int64_t e = 0; e < E; ++e) dp[e] = lb_dp ? S(lb_dp[e]) : S(0);
    const int32_t* ix = idx + t * K;
    const S* g = gate + t * K;
    const S* dg = dgate + t * K;
    if (renormalize) {  // g_k = p_k / s, s = Σ_topK p
      S s = 0, dg_dot_g = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += p[ix[k]];
        dg_dot_g += dg[k] * g[k];
      }
      for (int64_t k = 0; k < K; ++k) dp[ix[k]] += (dg[k] - dg_dot_g) / s;
    } else {
      for (int64_t k = 0; k < K; ++k) dp[ix[k]] += dg[k];
    }
    S dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    const S z = S(z_scale) * lse[t];
    for (int64_t e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot + z);
  }
}

#define MOEPLAN_INSTANTIATE(S)                                                                     \
  template void router_forward<S>(S*, S*, int32_t*, S*, int64_t, int64_t, int64_t, bool);          \
  template void gather_rows<S>(S*, const S*, const int32_t*, int64_t, int64_t);                    \
  template void combine_forward<S>(S*, const S*, const S*, const int32_t*, int64_t, int64_t,       \
                                   int64_t);                                                       \
  template void combine_backward<S>(S*, S*, const S*, const S*, const S*, const int32_t*, int64_t, \
                                    int64_t, int64_t);                                             \
  template void scatter_add_rows<S>(S*, const S*, const int32_t*, int64_t, int64_t, int64_t);      \
  template void router_backward<S>(S*, const S*, const S*, const int32_t*, const S*, const S*,     \
                                   const double*, double, int64_t, int64_t, int64_t, bool);

MOEPLAN_INSTANTIATE(float)
MOEPLAN_INSTANTIATE(double)
#undef MOEPLAN_INSTANTIATE

}  // namespace moeplan::backend::cpu
