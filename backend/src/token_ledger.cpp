#include "moeplan/backend/token_ledger.hpp"

#include <stdexcept>

namespace moeplan::backend {

TokenLedger::TokenLedger(int64_t seq_len_, int64_t windows_total_)
    : seq_len(seq_len_),
      windows_total(windows_total_),
      touched(static_cast<size_t>((windows_total_ + 63) / 64)) {}

void TokenLedger::record_window(int64_t window) {
  if (window < 0 || window >= windows_total)
    throw std::logic_error("token ledger: window id outside the unique budget");
  uint64_t& word = touched[size_t(window / 64)];
  const uint64_t bit = uint64_t{1} << (window % 64);
  if (!(word & bit)) {
    word |= bit;
    ++windows_touched;
  }
  ++windows_consumed;
  consumed += seq_len;
  loss_bearing += seq_len;
}

}  // namespace moeplan::backend
