#pragma once
// The FLOP ledger: every matrix product adds 2·m·n·k to a (category, phase) counter.
// Element-wise work is kept apart and is never part of M.
#include <array>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

namespace moeplan {

enum class FlopCategory : int {
  projection,      // Q, K, V, O
  attention_core,  // Q·K^T and P·V as executed (causal: only the unmasked keys)
  dense_ffn,
  expert,  // routed experts, by the tokens actually routed to each
  shared_expert,
  router,
  lm_head,
  aux_loss,  // e.g. the expert-router coupling loss
  recompute,
  padding,
};
inline constexpr int kFlopCategories = 10;
// What a device executes beyond the model's useful work (padding, products computed again): in
// the ledger's total, in no convention's C, and in no analytic count.
constexpr bool beyond_useful(FlopCategory c) {
  return c == FlopCategory::padding || c == FlopCategory::recompute;
}

enum class Phase : int { forward, input_grad, weight_grad };
inline constexpr int kPhases = 3;

std::string_view name(FlopCategory c);  // "projection", "attention-core", ...
std::string_view name(Phase p);         // "forward", "input-grad", "weight-grad"
std::optional<FlopCategory> parse_flop_category(std::string_view s);
std::optional<Phase> parse_phase(std::string_view s);

// An exact FLOP count, 128 bits wide. 64 bits hold 9.2e18 FLOPs, about 8 h of one H200: less
// than the 1e20–1e21 FLOPs of the published equal-resource runs. This holds ±1.7e38 (2^127 − 1),
// so a run's cumulative ledger does not overflow; one product's 2·m·n·k is computed in it too.
// A count that must leave as a 64-bit integer (NCCL, a JSON number) says so with to_int64, which
// refuses what does not fit rather than wrapping.
class FlopCount {
 public:
  constexpr FlopCount() = default;
  constexpr FlopCount(int64_t v) : v_(v) {}  // implicit: every product count is an int64
  // Arithmetic is checked: past ±1.7e38 it throws std::overflow_error rather than wrap.
  constexpr FlopCount& operator+=(FlopCount o) {
    if (__builtin_add_overflow(v_, o.v_, &v_)) overflow();
    return *this;
  }
  constexpr FlopCount& operator-=(FlopCount o) {
    if (__builtin_sub_overflow(v_, o.v_, &v_)) overflow();
    return *this;
  }
  friend constexpr FlopCount operator+(FlopCount a, FlopCount b) { return a += b; }
  friend constexpr FlopCount operator-(FlopCount a, FlopCount b) { return a -= b; }
  friend constexpr FlopCount operator*(FlopCount a, FlopCount b) {
    if (__builtin_mul_overflow(a.v_, b.v_, &a.v_)) overflow();
    return a;
  }
  friend constexpr bool operator==(FlopCount a, FlopCount b) { return a.v_ == b.v_; }
  friend constexpr bool operator<(FlopCount a, FlopCount b) { return a.v_ < b.v_; }
  friend constexpr bool operator>(FlopCount a, FlopCount b) { return b < a; }
  friend constexpr bool operator<=(FlopCount a, FlopCount b) { return !(b < a); }
  friend constexpr bool operator>=(FlopCount a, FlopCount b) { return !(a < b); }
  explicit constexpr operator double() const { return static_cast<double>(v_); }
  constexpr bool fits_int64() const { return v_ >= kMin64 && v_ <= kMax64; }
  int64_t to_int64() const;  // throws std::overflow_error naming the count when it does not fit

 private:
  __extension__ typedef __int128 Wide;
  static constexpr Wide kMax64 = Wide(INT64_MAX), kMin64 = Wide(INT64_MIN);
  static constexpr FlopCount from_wide(Wide w) {
    FlopCount c;
    c.v_ = w;
    return c;
  }
  [[noreturn]] static void overflow();
  Wide v_ = 0;
  friend std::string to_string(FlopCount c);
  friend std::optional<FlopCount> parse_flop_count(std::string_view s);
};

std::string to_string(FlopCount c);  // exact decimal digits, '-' first when negative
// Decimal digits with an optional leading '-'; nullopt for anything else, or beyond ±(2^127 − 1).
std::optional<FlopCount> parse_flop_count(std::string_view s);
std::ostream& operator<<(std::ostream& os, FlopCount c);

struct FlopLedger {
  std::array<std::array<FlopCount, kPhases>, kFlopCategories> flops{};
  FlopCount elementwise = 0;  // informational; not part of any convention's M

  // One product C(m×n) = A(m×k)·B(k×n).
  void add_gemm(FlopCategory c, Phase p, int64_t m, int64_t n, int64_t k) {
    flops[int(c)][int(p)] += FlopCount(2) * m * n * k;
  }
  FlopCount at(FlopCategory c, Phase p) const { return flops[int(c)][int(p)]; }
  FlopCount category(FlopCategory c) const;  // all phases
  FlopCount phase(Phase p) const;            // all categories
  FlopCount total() const;                   // all matrix products
  FlopCount useful() const;  // total less what is beyond_useful: C [exact] of the products
  FlopLedger& operator+=(const FlopLedger& o);
  FlopLedger operator-(const FlopLedger& o) const;
  FlopLedger operator*(int64_t times) const;  // `times` repeats of the same work (e.g. steps)
  bool operator==(const FlopLedger&) const = default;
};

}  // namespace moeplan
