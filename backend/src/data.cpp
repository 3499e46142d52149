#include "moeplan/backend/data.hpp"

#include <numeric>
#include <stdexcept>
#include <vector>

#include "moeplan/backend/rng.hpp"

namespace moeplan::backend {

std::vector<int32_t> WindowOrder::permutation_for(int64_t windows, uint64_t seed, int64_t epoch) {
  std::vector<int32_t> p(static_cast<size_t>(windows));
  std::iota(p.begin(), p.end(), 0);
  SplitMix64 g(mix_seed(seed, uint64_t(epoch)));
  for (int64_t i = windows - 1; i > 0; --i) std::swap(p[size_t(i)], p[g.below(uint64_t(i) + 1)]);
  return p;
}

WindowOrder::WindowOrder(int64_t windows, uint64_t seed)
    : seed_(seed), perm_(permutation_for(windows, seed, 0)) {
  if (windows <= 0) throw std::invalid_argument("window order: no windows");
}

int64_t WindowOrder::next() {
  if (cursor_ == windows()) {
    ++epoch_;
    cursor_ = 0;
    perm_ = permutation_for(windows(), seed_, epoch_);
  }
  return perm_[size_t(cursor_++)];
}

void WindowOrder::restore(int64_t epoch, int64_t cursor, std::vector<int32_t> perm) {
  if (int64_t(perm.size()) != windows() || cursor < 0 || cursor > windows() || epoch < 0)
    throw std::runtime_error("checkpoint: data order state does not match the plan's windows");
  epoch_ = epoch;
  cursor_ = cursor;
  perm_ = std::move(perm);
}

void fill_batch(const TokenStream& train, int64_t seq_len, int64_t batch_seqs, WindowOrder& order,
                TokenLedger& ledger, int32_t* inputs, int32_t* targets) {
  if (train.size() < order.windows() * seq_len + 1)
    throw std::logic_error("fill_batch: training region shorter than D̂ + 1");
  std::vector<uint16_t> window(size_t(seq_len + 1));
  for (int64_t b = 0; b < batch_seqs; ++b) {
    const int64_t w = order.next();
    train.copy(w * seq_len, seq_len + 1, window.data());  // S inputs and the S targets after
    const uint16_t* src = window.data();
    for (int64_t i = 0; i < seq_len; ++i) {
      inputs[b * seq_len + i] = src[i];
      targets[b * seq_len + i] = src[i + 1];
    }
    ledger.record_window(w);
  }
}

}  // namespace moeplan::backend
