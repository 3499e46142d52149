#include "moeplan/accounting/ledger.hpp"

#include <ostream>
#include <stdexcept>

namespace moeplan {

namespace {
constexpr std::string_view kCategoryNames[kFlopCategories] = {
    "projection", "attention-core", "dense-ffn", "expert",    "shared-expert",
    "router",     "lm-head",        "aux-loss",  "recompute", "padding"};
constexpr std::string_view kPhaseNames[kPhases] = {"forward", "input-grad", "weight-grad"};
}  // namespace

std::string_view name(FlopCategory c) {
  return kCategoryNames[int(c)];
}
std::string_view name(Phase p) {
  return kPhaseNames[int(p)];
}

std::optional<FlopCategory> parse_flop_category(std::string_view s) {
  for (int i = 0; i < kFlopCategories; ++i)
    if (kCategoryNames[i] == s) return FlopCategory(i);
  return std::nullopt;
}
std::optional<Phase> parse_phase(std::string_view s) {
  for (int i = 0; i < kPhases; ++i)
    if (kPhaseNames[i] == s) return Phase(i);
  return std::nullopt;
}

int64_t FlopCount::to_int64() const {
  if (!fits_int64())
    throw std::overflow_error(to_string(*this) + " FLOPs do not fit a 64-bit integer");
  return int64_t(v_);
}

std::string to_string(FlopCount c) {
  // The digits of |v| from the right, each from a remainder's magnitude, so that the most
  // negative value needs no negation.
  std::string digits;
  FlopCount::Wide v = c.v_;
  do {
    const int d = int(v % 10);
    digits.push_back(char('0' + (d < 0 ? -d : d)));
    v /= 10;
  } while (v != 0);
  if (c.v_ < 0) digits.push_back('-');
  return {digits.rbegin(), digits.rend()};
}

std::optional<FlopCount> parse_flop_count(std::string_view s) {
  const bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  FlopCount::Wide v = 0;  // accumulated negative when `negative`, so that -2^127 parses too
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    const int d = ch - '0';
    if (__builtin_mul_overflow(v, 10, &v) ||
        (negative ? __builtin_sub_overflow(v, d, &v) : __builtin_add_overflow(v, d, &v)))
      return std::nullopt;
  }
  return FlopCount::from_wide(v);
}

void FlopCount::overflow() {
  throw std::overflow_error("a FLOP count went beyond 128 bits (±1.7e38)");
}

std::ostream& operator<<(std::ostream& os, FlopCount c) {
  return os << to_string(c);
}

FlopCount FlopLedger::category(FlopCategory c) const {
  FlopCount s = 0;
  for (FlopCount v : flops[int(c)]) s += v;
  return s;
}
FlopCount FlopLedger::phase(Phase p) const {
  FlopCount s = 0;
  for (const auto& row : flops) s += row[int(p)];
  return s;
}
FlopCount FlopLedger::total() const {
  FlopCount s = 0;
  for (const auto& row : flops)
    for (FlopCount v : row) s += v;
  return s;
}
FlopCount FlopLedger::useful() const {
  FlopCount s = 0;
  for (int c = 0; c < kFlopCategories; ++c)
    if (!beyond_useful(FlopCategory(c))) s += category(FlopCategory(c));
  return s;
}
FlopLedger& FlopLedger::operator+=(const FlopLedger& o) {
  for (int c = 0; c < kFlopCategories; ++c)
    for (int p = 0; p < kPhases; ++p) flops[c][p] += o.flops[c][p];
  elementwise += o.elementwise;
  return *this;
}
FlopLedger FlopLedger::operator-(const FlopLedger& o) const {
  FlopLedger r = *this;
  for (int c = 0; c < kFlopCategories; ++c)
    for (int p = 0; p < kPhases; ++p) r.flops[c][p] -= o.flops[c][p];
  r.elementwise -= o.elementwise;
  return r;
}

FlopLedger FlopLedger::operator*(int64_t times) const {
  FlopLedger r = *this;
  for (auto& row : r.flops)
    for (FlopCount& v : row) v = v * times;
  r.elementwise = r.elementwise * times;
  return r;
}

}  // namespace moeplan
