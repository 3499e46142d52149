#include <cmath>
#include <string>

#include <doctest/doctest.h>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"

using namespace moeplan;

namespace {
// M = 1e6 FLOPs/token, N = 1e6, B·S = 8·128 = 1024 tokens a step, D̂ one window of 1024.
BudgetRequest small_request() {
  BudgetRequest q;
  q.flops_per_token = 1e6;
  q.total_params = 1'000'000;
  q.seq_len = 128;
  q.batch_seqs = 8;
  q.tokens_unique = 1024;
  return q;
}
}  // namespace

TEST_CASE("budget: integer steps, rounded C, unique windows, epochs") {
  // C = 1e15, M = 1e6, B·S = 8·128 = 1024 tokens: 1e9 / 1024 = 976,562.5 steps → 976,563
  // (llround, half away from zero); D = 976,563·1024 = 1,000,000,512; C' = 1.000000512e15.
  BudgetRequest q;
  q.compute = 1e15;
  q.flops_per_token = 1e6;
  q.total_params = 1'000'000;
  q.seq_len = 128;
  q.batch_seqs = 8;
  q.tokens_unique = 2.5e8;
  const Budget b = make_budget(q);
  CHECK(b.steps == 976'563);
  CHECK(b.tokens_consumed == 1'000'000'512);
  CHECK(b.compute == doctest::Approx(1.000000512e15));
  CHECK(b.compute_rel_diff == doctest::Approx(5.12e-7));
  // D̂ = 2.5e8 / 128 = 1,953,125 windows exactly.
  CHECK(b.tokens_unique == 250'000'000);
  CHECK(b.epochs == doctest::Approx(4.000000002));
  CHECK(b.tokens_per_param == doctest::Approx(1000.000512));
  // Loose reuse: 2 epochs → D̂ = D/2 rounded to windows: 500,000,256 / 128 = 3,906,252.
  q.reuse = Reuse::loose;
  q.epochs = 2;
  CHECK(make_budget(q).tokens_unique == 3'906'252 * 128);
}

TEST_CASE("budget: a compute budget below half a step is refused, not rounded up to a step") {
  // M = 1e6 FLOPs/token, B·S = 8·128 = 1024 tokens: one step costs 1.024e9 FLOPs.
  BudgetRequest q = small_request();
  q.compute = 0.6 * 1.024e9;  // 0.6 of a step rounds to one step: C' = 1.024e9, +66.7 %
  CHECK(make_budget(q).steps == 1);
  CHECK(make_budget(q).compute_rel_diff == doctest::Approx(1.0 / 0.6 - 1.0));
  q.compute = 0.3 * 1.024e9;  // 0.3 of a step would round to none
  try {
    make_budget(q);
    FAIL("a budget of 0.3 steps was accepted");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find("C = 3.072e+08") != std::string::npos);
    CHECK(what.find("0.3 of one training step") != std::string::npos);
    CHECK(what.find("costs 1.024e+09 FLOPs") != std::string::npos);
  }
}

TEST_CASE("budget: D beyond 64-bit token counts, and unique data under half a window, refused") {
  BudgetRequest q = small_request();
  // 2^62 tokens is the limit: C = 1e6 · 2^62 = 4.61e24 FLOPs. Twice that (D = 9.2e18, which
  // would wrap an int64 product of steps, batch and S) is refused, naming C, M, D and the limit.
  q.compute = 1e6 * 4611686018427387904.0 * 0.999;
  CHECK(make_budget(q).tokens_consumed > 0);
  q.compute = 1e6 * 9.2e18;
  CHECK_THROWS_WITH_AS(make_budget(q),
                       "compute C = 9.2e+24 FLOPs at M = 1e+06 FLOPs/token is D = 9.2e+18 tokens "
                       "consumed, above the 4.61e+18 moeplan counts (64-bit integers); give a "
                       "budget under 4.61e+24 FLOPs",
                       InputError);
  // Loose reuse: 10 steps of 1024 tokens over 200 epochs leave 51.2 unique tokens, under half of
  // S = 128; at most 10240/128 = 80 epochs keep a whole window.
  q.compute = 1e6 * 10240;
  q.reuse = Reuse::loose;
  q.epochs = 200;
  CHECK_THROWS_WITH_AS(make_budget(q),
                       "epochs = 200 leaves 51.2 unique tokens, under half a window of S = 128 "
                       "tokens; give at most 80 epochs (D = 10240 tokens consumed)",
                       InputError);
  q.epochs = 80;
  CHECK(make_budget(q).tokens_unique == 128);
  q.reuse = Reuse::strict;
  q.tokens_unique = 127;  // under one window of 128: a strict D̂ is a cap, not rounded up
  CHECK_THROWS_WITH_AS(make_budget(q),
                       "unique tokens D̂ = 127 is under one window of S = 128 tokens; give at "
                       "least one window of unique data",
                       InputError);
  q.tokens_unique = 128;
  CHECK(make_budget(q).tokens_unique == 128);
  // A cap between windows rounds down: 3 windows and 127 tokens hold 3 windows (llround gave 4,
  // 512 unique tokens from a corpus of 511).
  q.tokens_unique = 3 * 128 + 127;
  CHECK(make_budget(q).tokens_unique == 3 * 128);
}

TEST_CASE("budget: strict D̂ above what is consumed is every consumed token, however large") {
  // 10 steps of 8·128 tokens consume D = 10240 tokens, 80 windows. D̂ = 1e6 (above D) is D, one
  // epoch. D̂ = 1e30 is 7.8e27 windows, past int64: it is D as well, not a wrapped count of one
  // window (which planned 128 unique tokens, 80 epochs).
  BudgetRequest q = small_request();
  q.compute = 1e6 * 10240;
  q.reuse = Reuse::strict;
  for (const double asked : {10240.0, 1e6, 1.9e22, 1e30, 1e300}) {
    q.tokens_unique = asked;
    const Budget b = make_budget(q);
    CHECK_MESSAGE(b.tokens_unique == 10240, asked);
    CHECK_MESSAGE(b.epochs == 1.0, asked);
  }
}

TEST_CASE("effective data after repetition (Muennighoff et al. 2023)") {
  // U = 1e9, 3 epochs → R = 2: D' = 1e9·(1 + 15.4·(1 − e^(−2/15.4))) = 2.875574e9.
  CHECK(effective_data(1e9, 3.0) == doctest::Approx(2.875574e9).epsilon(1e-6));
  CHECK(effective_data(1e9, 1.0) == 1e9);
  // R → large: D' → U·(1 + R*) = 16.4·U.
  CHECK(effective_data(1e9, 1e6) == doctest::Approx(16.4e9));
}

TEST_CASE("token multiplier between architectures is the inverse ratio of M") {
  // Dense M 1.44e10 against MoE M 3.0e9: the MoE consumes 4.8x the tokens at equal C.
  CHECK(token_multiplier(1.44e10, 3.0e9) == doctest::Approx(4.8));
}

TEST_CASE("quantities as people write them") {
  CHECK(parse_quantity("2e9", "N") == 2e9);
  CHECK(parse_quantity("2.15B", "N") == doctest::Approx(2.15e9));
  CHECK(parse_quantity("346M", "N") == 346e6);
  CHECK(parse_quantity("65B", "D") == 65e9);
  CHECK(parse_quantity(" 1.5k ", "x") == 1500);
  CHECK(parse_quantity("0.2", "r_a") == 0.2);
  for (const char* bad : {"", "abc", "2e9x", "nan", "inf", "B", "1..2", "0x10"})
    CHECK_THROWS_AS(parse_quantity(bad, "N"), InputError);
  try {
    parse_quantity("two", "--N");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("--N: 'two' is not a number") != std::string::npos);
  }
  // An exponent and a suffix together are refused, not multiplied: "2e9k" is not 2e12, "2e9B" not
  // 2e18. One line naming the text and the two valid ways of writing it.
  for (const char* both : {"2e9k", "2e9B", "1.5E3M", "2e+3T", "2e-3G"}) {
    CAPTURE(both);
    std::string what;
    try {
      parse_quantity(both, "--N");
    } catch (const InputError& e) {
      what = e.what();
    }
    CHECK(what == std::string("--N: '") + both +
                      "' has both an exponent and a suffix; write one of them (e.g. 2e9 or 2B)");
  }
  // Below a double's range strtod gives 0: 1e-400 was read as 0 (a seed of 0, a capacity factor
  // of 0, dropless) without a word. Refused, as 1e400 is; 0 and the smallest normal still read.
  for (const char* tiny : {"1e-400", "-1e-400", "1e-310"}) {
    CAPTURE(tiny);
    std::string what;
    try {
      parse_quantity(tiny, "--train seed");
    } catch (const InputError& e) {
      what = e.what();
    }
    CHECK(what == std::string("--train seed: '") + tiny +
                      "' is below the smallest number a double holds (2.2e-308); write 0 if 0 "
                      "is meant");
  }
  CHECK(parse_quantity("0", "x") == 0);
  CHECK(parse_quantity("0e-400", "x") == 0);
  CHECK(parse_quantity("2.3e-308", "x") == 2.3e-308);
  // Either alone still reads: 2e9 = 2B = 2000M.
  CHECK(parse_quantity("2e9", "N") == parse_quantity("2B", "N"));
  CHECK(parse_quantity("2000M", "N") == 2e9);
  CHECK(human(2.15e9) == "2.15B");
  CHECK(human(3.46e8) == "346M");
  // Rounding to three digits carries into the next unit: 999.6M shows as 1B, not 1e+03M.
  CHECK(human(999.6e6) == "1B");
  CHECK(human(999.4e6) == "999M");
  CHECK(human(999.99e12) == "1.00e+15");
  // Ratios: fixed places while short, human form from 10^5 (a 1e14-scale budget's TPP).
  CHECK(ratio(20.4, 2) == "20.40");
  CHECK(ratio(99999.94, 1) == "99999.9");
  CHECK(ratio(49787234042553.2, 1) == "49.8T");
  CHECK(human(-999.7e3) == "-1M");
}

TEST_CASE("tolerances in percent: two places, more where two would read as zero") {
  CHECK(percent_text(0.005) == "0.50");
  CHECK(percent_text(0.01, 1) == "1.0");
  CHECK(percent_text(0.00001) == "0.001");  // --ra-tolerance 0.00001 printed "±0.00 points"
  CHECK(percent_text(0.000123) == "0.0123");
  CHECK(percent_text(0.0001, 1) == "0.01");
  CHECK(percent_text(0.25) == "25.00");
}

TEST_CASE("arch validation names the offending field") {
  Arch a;
  a.d_model = 64;
  a.layers = 2;
  a.dense_layers = 1;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 16;
  a.d_ffn = 128;
  a.seq_len = 32;
  a.vocab = 100;
  a.experts = 4;
  a.top_k = 2;
  a.d_expert = 32;
  CHECK_NOTHROW(validate(a, true));
  Arch bad = a;
  bad.top_k = 5;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("top_k = 5"), InputError);
  bad = a;
  bad.head_dim = 8;
  CHECK_NOTHROW(validate(bad));
  CHECK_THROWS_WITH_AS(validate(bad, true), doctest::Contains("must equal d_model = 64"),
                       InputError);
  bad = a;
  bad.kv_heads = 3;
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("kv_heads = 3"), InputError);
  bad = a;
  bad.vocab = 1;  // one token to predict: no language model
  CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains("vocab = 1 is invalid"), InputError);
  bad.vocab = 2;
  CHECK_NOTHROW(validate(bad));
  bad = a;
  bad.dense_layers = 2;  // no MoE layers left, yet experts are set
  CHECK_THROWS_AS(validate(bad), InputError);
}

TEST_CASE("percent_to_fraction: the decimal the percentage says, rounded once") {
  // 1.1 / 100 = 0.011000000000000001 in doubles; 1.1 % is the decimal 0.011.
  CHECK(moeplan::percent_to_fraction(1.1) == 0.011);
  CHECK(moeplan::percent_to_fraction(0.5) == 0.005);
  CHECK(moeplan::percent_to_fraction(1e-3) == 1e-5);
  CHECK(moeplan::percent_to_fraction(150) == 1.5);
  CHECK(moeplan::percent_to_fraction(7) == 0.07);
  CHECK(moeplan::percent_to_fraction(0) == 0);
}

TEST_CASE("bytes_text: MiB below a GiB, GiB below a TiB, TiB above") {
  CHECK(bytes_text(71827456) == "68.5 MiB");  // 68.5 x 2^20
  CHECK(bytes_text(double(1ull << 30)) == "1.00 GiB");
  CHECK(bytes_text(55190329753.0) == "51.40 GiB");  // 51.4 x 2^30, rounded down
  CHECK(bytes_text(1023.5 * double(1ull << 30)) == "1023.50 GiB");
  CHECK(bytes_text(4.5 * double(1ull << 40)) == "4.50 TiB");
}
