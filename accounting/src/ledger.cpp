#include "moeplan/accounting/ledger.hpp"

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

int64_t FlopLedger::category(FlopCategory c) const {
  int64_t s = 0;
  for (int64_t v : flops[int(c)]) s += v;
  return s;
}
int64_t FlopLedger::phase(Phase p) const {
  int64_t s = 0;
  for (const auto& row : flops) s += row[int(p)];
  return s;
}
int64_t FlopLedger::total() const {
  int64_t s = 0;
  for (const auto& row : flops)
    for (int64_t v : row) s += v;
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

}  // namespace moeplan
