// FlopCount: the ledger's 128-bit exact count. Golden values are powers of two and products
// worked by hand in the comments, not produced by the code under test.
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/ledger.hpp"

using namespace moeplan;

TEST_CASE("flop counts: decimal text both ways, exact past 64 bits") {
  CHECK(to_string(FlopCount(0)) == "0");
  CHECK(to_string(FlopCount(-42)) == "-42");
  CHECK(to_string(FlopCount(INT64_MAX)) == "9223372036854775807");
  CHECK(to_string(FlopCount(INT64_MIN)) == "-9223372036854775808");
  // 2^64 = 18446744073709551616; 2^100 = 1267650600228229401496703205376.
  const FlopCount two64 = FlopCount(int64_t(1) << 32) * (int64_t(1) << 32);
  CHECK(to_string(two64) == "18446744073709551616");
  CHECK(to_string(two64 * (int64_t(1) << 36)) == "1267650600228229401496703205376");
  CHECK(to_string(FlopCount(0) - two64) == "-18446744073709551616");
  // 2^127 = 170141183460469231731687303715884105728: the range is -2^127 .. 2^127 - 1.
  for (const char* s :
       {"0", "7", "-7", "9223372036854775808", "18446744073709551616",
        "170141183460469231731687303715884105727", "-170141183460469231731687303715884105728"}) {
    const auto c = parse_flop_count(s);
    REQUIRE_MESSAGE(c, s);
    CHECK(to_string(*c) == s);
  }
  for (const char* s : {"", "-", "+1", " 1", "1 ", "1e20", "1.0", "0x10", "12a",
                        "170141183460469231731687303715884105728",  // 2^127
                        "-170141183460469231731687303715884105729",
                        "1000000000000000000000000000000000000000"})  // 10^39
    CHECK_MESSAGE(!parse_flop_count(s), s);
  std::ostringstream os;
  os << two64;
  CHECK(os.str() == "18446744073709551616");
}

TEST_CASE("flop counts: order, conversion, and a 64-bit exit that refuses rather than wraps") {
  const FlopCount big = *parse_flop_count("9223372036854775808");  // 2^63
  CHECK(big > FlopCount(INT64_MAX));
  CHECK(FlopCount(INT64_MAX) < big);
  CHECK(big - 1 == FlopCount(INT64_MAX));
  CHECK(FlopCount(INT64_MAX).fits_int64());
  CHECK_FALSE(big.fits_int64());
  CHECK((big - 1).to_int64() == INT64_MAX);
  CHECK_THROWS_WITH_AS(big.to_int64(), "9223372036854775808 FLOPs do not fit a 64-bit integer",
                       std::overflow_error);
  CHECK(double(big) == 9223372036854775808.0);
  CHECK(double(FlopCount(-3)) == -3.0);
  // Past 2^127 - 1 arithmetic throws rather than wrapping negative.
  const FlopCount max = *parse_flop_count("170141183460469231731687303715884105727");
  CHECK_THROWS_WITH_AS(max + 1, "a FLOP count went beyond 128 bits (±1.7e38)", std::overflow_error);
  CHECK_THROWS_AS(FlopCount(0) - max - 2, std::overflow_error);
  CHECK(to_string(big * big) == "85070591730234615865843651857942052864");  // 2^126 fits
  CHECK_THROWS_AS(big * big * 2, std::overflow_error);                      // 2^127 does not
  CHECK(to_string(big * FlopCount(INT64_MIN) * -1) == "85070591730234615865843651857942052864");
  FlopLedger l;
  l.flops[0][0] = max;
  l.flops[0][1] = 1;
  CHECK_THROWS_AS(l.total(), std::overflow_error);
}

TEST_CASE("a ledger accumulates past 2^64 without wrapping") {
  // One product of 2^20 × 2^20 × 2^20 costs 2·2^60 = 2^61 FLOPs; 16 of them are 2^65 =
  // 36893488147419103232, which a 64-bit counter would have wrapped (to 0 unsigned, negative
  // signed after 2^63).
  FlopLedger step;
  const int64_t n = int64_t(1) << 20;
  step.add_gemm(FlopCategory::expert, Phase::forward, n, n, n);
  CHECK(to_string(step.total()) == "2305843009213693952");  // 2^61
  FlopLedger run;
  for (int i = 0; i < 16; ++i) run += step;
  CHECK(to_string(run.total()) == "36893488147419103232");
  CHECK(to_string(run.category(FlopCategory::expert)) == "36893488147419103232");
  CHECK(to_string(run.phase(Phase::forward)) == "36893488147419103232");
  CHECK(run == step * 16);
  CHECK((run - step * 15) == step);
  // A published-scale run: 5.5e20 FLOPs [exact/causal] as 10^5 steps of 5.5e15 each.
  FlopLedger s2;
  s2.flops[int(FlopCategory::projection)][int(Phase::forward)] = 5500000000000000;
  CHECK(to_string((s2 * 100000).total()) == "550000000000000000000");
}

TEST_CASE("one step's attention core is counted past 2^63 at long contexts, not wrapped") {
  // One layer, 150 heads of 128 (q width 19200), S = 10^7, one sequence. exact/full: forward
  // 2 products of 2·S·S·D_h per head = 4·150·128·10^14 = 7.68e18; backward 4 products =
  // 1.536e19, which is past 2^63 ≈ 9.22e18. Per token: (7.68e18 + 1.536e19) / 10^7 = 2.304e12
  // (= 12·S·q_width). Causal: each product is D_h·S·(S+1) per head, 6 products in all.
  Arch a;
  a.d_model = 19200;
  a.layers = 1;
  a.dense_layers = 1;
  a.heads = 150;
  a.kv_heads = 150;
  a.head_dim = 128;
  a.d_ffn = 1;
  a.seq_len = 10000000;
  a.vocab = 1;
  const FlopLedger full =
      exact_step_ledger(a, 1, ExactStepOptions{AttentionMask::full, false, std::nullopt});
  CHECK(to_string(full.at(FlopCategory::attention_core, Phase::forward)) == "7680000000000000000");
  CHECK(to_string(full.at(FlopCategory::attention_core, Phase::input_grad)) ==
        "15360000000000000000");
  const FlopLedger causal =
      exact_step_ledger(a, 1, ExactStepOptions{AttentionMask::causal, false, std::nullopt});
  // 6 · 150 · 128 · 10^7 · (10^7 + 1) = 115200 · 100000010000000 = 11520001152000000000.
  CHECK(to_string(causal.category(FlopCategory::attention_core)) == "11520001152000000000");
  const FlopsPerToken f = flops_per_token(a, Convention::exact, AttentionMask::full);
  CHECK(f.by_category[int(FlopCategory::attention_core)] == doctest::Approx(2.304e12));
  // Tokens a step past 2^63 are refused in one line, not wrapped into a negative count.
  CHECK_THROWS_AS(exact_step_ledger(a, int64_t(1) << 60, ExactStepOptions{}), InputError);
}
