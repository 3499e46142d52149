#pragma once
// The token ledger (BACKEND.md): what training read, exactly. Unique counts come from a bitmap
// over window ids (windows are disjoint slices of D̂), never from an estimate.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moeplan::backend {

struct TokenLedger {
  int64_t seq_len = 0;
  int64_t windows_total = 0;      // W = D̂ / seq_len
  int64_t consumed = 0;           // input positions fed forward (repeats included) = D
  int64_t loss_bearing = 0;       // target positions that carried loss
  int64_t windows_consumed = 0;   // windows fed (repeats included)
  int64_t dropped = 0;            // positions read but not fed (a batch tail); see data.hpp
  std::vector<uint64_t> touched;  // bit w set once window w has been fed
  int64_t windows_touched = 0;    // popcount of `touched`

  TokenLedger() = default;
  TokenLedger(int64_t seq_len_, int64_t windows_total_);
  // One window of seq_len inputs with seq_len loss-bearing targets was fed.
  void record_window(int64_t window);
  bool was_touched(int64_t window) const {
    return (touched[size_t(window / 64)] >> (window % 64)) & 1u;
  }
  int64_t unique() const { return windows_touched * seq_len; }  // distinct input positions = D̂ read
  double epochs() const {  // D / D̂ over the plan's D̂ (all windows), not over what was touched
    return windows_total > 0 ? double(consumed) / double(windows_total * seq_len) : 0.0;
  }
  bool operator==(const TokenLedger&) const = default;
};

}  // namespace moeplan::backend
