#pragma once
// The unique window and epochs. D̂ = W·S tokens of the training region are cut into W disjoint
// windows; window w feeds inputs at corpus positions [w·S, w·S + S) and their targets, the next
// positions [w·S + 1, w·S + S + 1): each window reads S + 1 positions, the last target of window
// w is the first input of window w + 1, and the training region therefore holds D̂ + 1 tokens.
// "Unique" counts distinct input positions (D̂ when every window was fed).
//
// Order: epoch 0 is a seeded permutation of the W windows, every later epoch a fresh seeded
// permutation (seeded by (seed, epoch)). Batches run across epoch boundaries, so the plan's
// steps·batch_seqs windows are consumed exactly, the last epoch may be partial, and no tail is
// ever dropped (the ledger's `dropped` stays 0 and says so rather than hiding one).
#include <cstdint>
#include <vector>

#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/token_ledger.hpp"

namespace moeplan::backend {

class WindowOrder {
 public:
  WindowOrder() = default;
  WindowOrder(int64_t windows, uint64_t seed);
  int64_t next();  // the next window id; starts a new epoch when the current one is used up
  int64_t windows() const { return int64_t(perm_.size()); }
  int64_t epoch() const { return epoch_; }    // 0-based epoch of the next window
  int64_t cursor() const { return cursor_; }  // windows of this epoch already handed out
  uint64_t seed() const { return seed_; }
  const std::vector<int32_t>& permutation() const { return perm_; }
  // Checkpoint state: the permutation is stored as well, so a resume never depends on re-deriving.
  void restore(int64_t epoch, int64_t cursor, std::vector<int32_t> perm);
  static std::vector<int32_t> permutation_for(int64_t windows, uint64_t seed, int64_t epoch);
  bool operator==(const WindowOrder&) const = default;

 private:
  uint64_t seed_ = 0;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  std::vector<int32_t> perm_;
};

// Fills inputs/targets (batch_seqs, seq_len) row-major with the next batch_seqs windows and
// records them in the ledger. `train` must hold windows·seq_len + 1 tokens.
void fill_batch(const TokenStream& train, int64_t seq_len, int64_t batch_seqs, WindowOrder& order,
                TokenLedger& ledger, int32_t* inputs, int32_t* targets);

}  // namespace moeplan::backend
