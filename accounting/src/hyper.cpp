#include "moeplan/accounting/hyper.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

double step_law_lr(double N, double D) {
  return 1.79 * std::pow(N, -0.713) * std::pow(D, 0.307);
}
double step_law_batch_tokens(double D) {
  return 0.58 * std::pow(D, 0.571);
}

int64_t step_law_batch_seqs(double D, int64_t seq_len, int64_t dp_width) {
  const double seqs = step_law_batch_tokens(D) / double(seq_len);
  const int64_t w = std::max<int64_t>(1, dp_width);
  return std::max<int64_t>(w, std::llround(seqs / double(w)) * w);
}

int64_t warmup_steps(int64_t steps, int64_t floor, int64_t ceil) {
  const int64_t w = std::clamp<int64_t>(std::llround(0.01 * double(steps)), floor, ceil);
  return std::min(w, steps);
}

int64_t warmup_steps_share(int64_t steps, double fraction) {
  if (!(fraction >= 0 && fraction < 1))
    throw InputError(
        fmt::format("warm-up fraction = {} is invalid; it must be in [0, 1)", fraction));
  const int64_t w = std::llround(fraction * double(steps));
  return std::min(steps, fraction > 0 ? std::max<int64_t>(1, w) : 0);
}

}  // namespace moeplan
