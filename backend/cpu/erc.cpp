#include "erc.hpp"

#include <cmath>
#include <limits>

#include "eigen_types.hpp"

namespace moeplan::backend::cpu {

template <class S>
void erc_draw_noise(S* delta, const S* router, int64_t E, int64_t D, Rng& rng) {
  CMap<S> r(router, E, D);
  for (int64_t i = 0; i < E; ++i) {
    double nearest = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < E; ++j)
      if (j != i) nearest = std::min(nearest, double((r.row(i) - r.row(j)).norm()));
    const double norm = double(r.row(i).norm());
    const double eps = (E > 1 && norm > 0) ? nearest / (2.0 * norm) : 0.0;
    for (int64_t k = 0; k < D; ++k) delta[i * D + k] = S(1.0 - eps + 2.0 * eps * rng.uniform());
  }
}

template <class S>
double erc_forward_backward(S* drouter, S* const* dw13, const S* router, const S* const* w13,
                            const S* delta, S* rt, S* drt, S* act, S* m, S* dm, int64_t E,
                            int64_t D, int64_t De, double alpha, double coef, FlopLedger& ledger) {
  MMap<S> rtm(rt, E, D), drtm(drt, E, D), mm(m, E, E), dmm(dm, E, E);
  rtm = CMap<S>(router, E, D).cwiseProduct(CMap<S>(delta, E, D));
  for (int64_t j = 0; j < E; ++j) {  // A_j (E,De) = R̃ · W_g^j
    CSMap<S> wg(w13[j], D, De, Eigen::OuterStride<>(2 * De));
    SMap<S> a(act + j * De, E, De, Eigen::OuterStride<>(E * De));
    a.noalias() = rtm * wg;
    ledger.add_gemm(FlopCategory::aux_loss, Phase::forward, E, De, D);
    for (int64_t i = 0; i < E; ++i) mm(i, j) = a.row(i).norm();
  }
  const double w = coef / double(E * E);
  double loss = 0;
  dmm.setZero();
  for (int64_t i = 0; i < E; ++i) {
    const double diag = alpha * double(mm(i, i));
    for (int64_t j = 0; j < E; ++j) {
      if (j == i) continue;
      if (double(mm(i, j)) - diag > 0) {
        loss += double(mm(i, j)) - diag;
        dmm(i, j) += S(w);
        dmm(i, i) -= S(w * alpha);
      }
      if (double(mm(j, i)) - diag > 0) {
        loss += double(mm(j, i)) - diag;
        dmm(j, i) += S(w);
        dmm(i, i) -= S(w * alpha);
      }
    }
  }
  drtm.setZero();
  for (int64_t j = 0; j < E; ++j) {  // dA_j = dM[:,j] ⊙ A_j / M[:,j]
    CSMap<S> wg(w13[j], D, De, Eigen::OuterStride<>(2 * De));
    SMap<S> dwg(dw13[j], D, De, Eigen::OuterStride<>(2 * De));
    SMap<S> a(act + j * De, E, De, Eigen::OuterStride<>(E * De));
    for (int64_t i = 0; i < E; ++i) a.row(i) *= mm(i, j) > 0 ? dmm(i, j) / mm(i, j) : S(0);
    drtm.noalias() += a * wg.transpose();
    ledger.add_gemm(FlopCategory::aux_loss, Phase::input_grad, E, D, De);
    dwg.noalias() += rtm.transpose() * a;
    ledger.add_gemm(FlopCategory::aux_loss, Phase::weight_grad, D, De, E);
  }
  MMap<S>(drouter, E, D) += drtm.cwiseProduct(CMap<S>(delta, E, D));
  return coef * loss / double(E * E);
}

template void erc_draw_noise<float>(float*, const float*, int64_t, int64_t, Rng&);
template void erc_draw_noise<double>(double*, const double*, int64_t, int64_t, Rng&);
template double erc_forward_backward<float>(float*, float* const*, const float*,
                                            const float* const*, const float*, float*, float*,
                                            float*, float*, float*, int64_t, int64_t, int64_t,
                                            double, double, FlopLedger&);
template double erc_forward_backward<double>(double*, double* const*, const double*,
                                             const double* const*, const double*, double*, double*,
                                             double*, double*, double*, int64_t, int64_t, int64_t,
                                             double, double, FlopLedger&);

}  // namespace moeplan::backend::cpu
