// Row checks on hand-made tables of a tiny MoE shape, every expected value worked out by hand.
//
// Tiny shape (tests/audit/fixtures/tiny_spec.toml): L = 4 (1 dense + 3 MoE), D_m = 256, H = 4,
// D_h = 64, D_ffn = 512, E = 8, D_e = D_se = 128, S = 512, V = 1000.
//   attention      4·4·256²              = 1,048,576
//   dense FFN      1·3·256·512           =   393,216
//   routed, total  3·3·256·8·128         = 2,359,296
//   shared         3·3·256·128           =   294,912
//   router         3·256·8               =     6,144
//   N (router out) = 1,048,576 + 393,216 + 2,359,296 + 294,912 = 4,096,000
//   routed, active = 3·3·256·K·128 = 294,912·K
//   N_a(K) = 1,048,576 + 393,216 + 294,912 + 294,912·K = 1,736,704 + 294,912·K
//          K=1: 2,031,616   K=2: 2,326,528   K=3: 2,621,440   K=4: 2,916,352 (router in: +6,144)
//   r_a = N_a/N: 49.60 %, 56.80 %, 64.00 %, 71.20 %
//   paper M = 6·N_a + 12·L·D_m·S = 6·N_a + 12·4·256·512 = 6·N_a + 6,291,456
//          K=1: 18,481,152  K=2: 20,250,624  K=3: 22,020,096  K=4: 23,789,568
//   paper forward = 2·N_a + 4·4·256·512 = 2·N_a + 2,097,152; K=2: 6,750,208 (= M/3 exactly)
//   D = 4,096,000 consumed = 1000 iters · 8 seqs · 512; D̂ = 2,048,000 unique → 2 epochs;
//   D/N = 1.00; µ = (128 + 8·128)/256 = 4.5; C = M·D, K=4: 23,789,568·4,096,000 = 9.74421e13.
#include <doctest/doctest.h>

#include <cmath>

#include "audit_test_util.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/audit_tables.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/audit/row_checks.hpp"
#include "moeplan/audit/row_values.hpp"
#include "moeplan/audit/spec.hpp"

using namespace moeplan;
using namespace moeplan::audit;
using namespace moeplan::audit::test;

namespace {
AuditReport audit_fixture(const std::string& spec_name) {
  const AuditSpec spec = load_spec(fixture(spec_name));
  return audit_tables(load_claim_tables({}, spec, fixture("")), spec);
}
}  // namespace

TEST_CASE("a clean tiny table yields no error or warning findings and its claims hold") {
  const AuditReport r = audit_fixture("tiny_spec.toml");
  for (const Finding& f : r.findings) CHECK_MESSAGE(f.severity == Severity::info, f.message);
  CHECK(r.all_hold());
  // Every row prints N = 4,096,000 exactly: equal N spread 0.
  const ClaimVerdict* n = claim(r, "tiny sweep: equal N");
  REQUIRE(n);
  REQUIRE(n->quantities.size() == 1);
  CHECK(n->quantities[0].min == 4096000.0);
  CHECK(n->quantities[0].rel_range == 0.0);
}

TEST_CASE("each planted defect is reported once, at its row, with its size") {
  const AuditReport r = audit_fixture("tiny_defects_spec.toml");
  const auto& fs = r.findings;
  const std::string t = "tiny_defects";
  CHECK(matching(fs, Severity::error, t, 1, "flops_per_token").empty());  // row 1 is clean

  SUBCASE("forward M in a training-M column (row 2)") {
    // Printed 6,750,208 = paper forward for K=2; the claimed paper training value is 20,250,624.
    const auto f = matching(fs, Severity::error, t, 2, "flops_per_token");
    REQUIRE(f.size() == 1);
    CHECK(*f[0]->expected == doctest::Approx(20250624.0));
    CHECK(*f[0]->found == doctest::Approx(6750208.0));
    CHECK(*f[0]->rel_diff == doctest::Approx(-2.0 / 3.0));
    CHECK(f[0]->message.find("paper (router out) forward") != std::string::npos);
  }
  SUBCASE("router counted in one row and not in the others (row 3, N_a)") {
    // Row 3 prints N_a = 2,627,584 = 2,621,440 + 6,144 (router in); the other rows fit router out.
    const auto f = matching(fs, Severity::error, t, 3, "active_params");
    REQUIRE(f.size() == 1);
    CHECK(*f[0]->expected == doctest::Approx(2621440.0));
    CHECK(*f[0]->rel_diff == doctest::Approx(6144.0 / 2621440.0));  // +0.234 %: inside 1 %
    for (int row : {1, 2, 4, 5, 6})
      CHECK(matching(fs, Severity::error, t, row, "active_params").empty());
  }
  SUBCASE("C != M·D (row 4)") {
    // M·D = 23,789,568 · 4,096,000 = 9.74421e13; printed 9.50000e13: −2.506 %.
    const auto f = matching(fs, Severity::error, t, 4, "compute");
    REQUIRE(f.size() == 1);
    CHECK(*f[0]->expected == doctest::Approx(23789568.0 * 4096000.0));
    CHECK(*f[0]->rel_diff == doctest::Approx(9.5e13 / (23789568.0 * 4096000.0) - 1));
  }
  SUBCASE("epochs != D/D̂ (row 5)") {
    // D/D̂ = 8,192,000 / 2,048,000 = 4; printed 3.5: −12.5 %.
    const auto f = matching(fs, Severity::error, t, 5, "epochs");
    REQUIRE(f.size() == 1);
    CHECK(*f[0]->expected == doctest::Approx(4.0));
    CHECK(*f[0]->rel_diff == doctest::Approx(-0.125));
  }
  SUBCASE("wrong M, matching no convention (row 6)") {
    // 21,000,000 vs paper training 20,250,624 (N_a fits router out): +3.70 %. Nearest other
    // reading, paper with the router (+6·6,144 = 20,287,488), is +3.51 %; exact/full adds the LM
    // head 6·256·1000 and the router: 21,823,488 (−3.77 %). None within 1 %.
    const auto f = matching(fs, Severity::error, t, 6, "flops_per_token");
    REQUIRE(f.size() == 1);
    CHECK(*f[0]->expected == doctest::Approx(20250624.0));
    CHECK(*f[0]->rel_diff == doctest::Approx(21000000.0 / 20250624.0 - 1));
    CHECK(f[0]->message.find("matches no convention") != std::string::npos);
  }
  SUBCASE("nothing else is an error, and the table's consistency claim fails") {
    CHECK(count(fs, Severity::error) == 5);
    const ClaimVerdict* c = claim(r, "table tiny_defects: rows internally consistent");
    REQUIRE(c);
    CHECK_FALSE(c->holds);
    CHECK_FALSE(r.all_hold());
  }
}

TEST_CASE("without a spec: checks that need shared values are skipped, with one info line") {
  // The tiny table alone has no L, D_m or S: N/N_a/M cannot be recomputed; C = M·D still can.
  const std::string csv =
      "N,Na,M,D,C\n4096000,2326528,20250624,4096000,8.29466e13\n4096000,2326528,20250624,4096000,"
      "9.0e13\n";
  const ClaimTable t = parse_claim_table(csv, "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  // Row 2: C = 9.0e13 vs M·D = 8.29466e13: +8.50 %.
  const auto f = matching(fs, Severity::error, "t", 2, "compute");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->rel_diff == doctest::Approx(9.0e13 / 82946555904000.0 - 1));
  CHECK(count(fs, Severity::error) == 1);
  const auto skipped = matching(fs, Severity::info, "t", 0, "");
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0]->message.find("d_model") != std::string::npos);
}

TEST_CASE("r_a against the printed N_a / N, with no shape at all") {
  // Row 1: N_a/N = 4e8/2e9 = 20 %, printed 25 %: +25 % off. Row 2: 20.0 % printed: no finding.
  const ClaimTable t = parse_claim_table(
      "id,N,Na,ra_pct\na,2.00e9,4.00e8,25.0\nb,2.00e9,4.00e8,20.0\n", "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto f = matching(fs, Severity::error, "t", 1, "activation_rate");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->expected == doctest::Approx(0.2));
  CHECK(*f[0]->found == doctest::Approx(0.25));
  CHECK(count(fs, Severity::error) == 1);
}

TEST_CASE("N_a above N is an error: r_a = N_a / N is at most 1") {
  // Row 1: N_a 2e9 of N 1e9 (r_a 2). Row 2: N_a 1.004e9 of N 1.00e9 is within the two
  // roundings (±0.5 % and ±0.05 %): no finding.
  const ClaimTable t =
      parse_claim_table("id,N,Na\na,1.00e9,2.00e9\nb,1.00e9,1.004e9\n", "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto f = matching(fs, Severity::error, "t", 1, "active_params");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->found == doctest::Approx(2e9));
  CHECK(*f[0]->expected == doctest::Approx(1e9));
  CHECK(f[0]->message.find("is above N") != std::string::npos);
  CHECK(count(fs, Severity::error) == 1);
}

TEST_CASE("r_a against N_a / N with N from D / (D/N), never from N_a / r_a itself") {
  // Row b: N = D / (D/N) = 1e11 / 50 = 2e9, N_a/N = 4e8 / 2e9 = 20 %, printed 4 %: -80 % off.
  // N taken as N_a / r_a = 1e10 made r_a = N_a / (N_a / r_a) hold whatever was printed.
  const ClaimTable t = parse_claim_table(
      "label,Na,ra_pct,D,D_over_N\na,2.00e9,100,1.000e11,50.00\nb,4.00e8,4.00,1.000e11,50.00\n",
      "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto f = matching(fs, Severity::error, "t", 2, "activation_rate");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->expected == doctest::Approx(0.2));
  CHECK(*f[0]->found == doctest::Approx(0.04));
  CHECK(f[0]->message.find("N_a / N (N from D / (D/N))") != std::string::npos);
  CHECK(matching(fs, Severity::error, "t", 1, "activation_rate").empty());  // 2e9/2e9 = 100 %
}

TEST_CASE("M from a row's shape is read in the FLOP convention its table claims") {
  // The tiny shape at K = 2: paper training M = 20,250,624, forward 6,750,208 (header). A
  // megatron table's M from the shape was paper's too, so "equal M" set a printed megatron M
  // against a paper one.
  const ClaimTable t = parse_claim_table(
      "L_layers,L_dense,Dm,H,Dh,Dffn,E,K,De,Dse,S,V\n4,1,256,4,64,512,8,2,128,128,512,1000\n", "t",
      "t.csv");
  auto m = [&](const std::string& spec_text) {
    const AuditSpec spec = parse_spec("schema = 1\n[tables.t]\n" + spec_text, "s.toml");
    const auto v = RowView(t, 0, spec.table("t")).value_or_shape("flops_per_token");
    REQUIRE(v);
    return *v;
  };
  CHECK(m("").value == 20'250'624.0);
  CHECK(m("").source == "shape (paper training)");
  CHECK(m("flops = \"forward\"\n").value == 6'750'208.0);
  CHECK(m("flops = \"forward\"\n").source == "shape (paper forward)");
  const RowValue meg = m("convention = \"megatron\"\n");
  CHECK(meg.source == "shape (megatron training)");
  CHECK(meg.value != 20'250'624.0);
}

TEST_CASE("a row identity exactly at the tolerance is info, beyond it an error") {
  // C = 2.8886e21 vs M·D = 2.86e10 · 1e11 = 2.86e21: +1.000 % (0.010000000000000009 in
  // doubles), the tolerance itself; 2.8887e21 is +1.0035 %.
  const ClaimTable t = parse_claim_table(
      "label,M,D,C\nat,28600000000,100000000000,2888600000000000000000\n"
      "over,28600000000,100000000000,2888700000000000000000\n",
      "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  CHECK(matching(fs, Severity::error, "t", 1, "compute").empty());
  CHECK(matching(fs, Severity::info, "t", 1, "compute").size() == 1);
  CHECK(matching(fs, Severity::error, "t", 2, "compute").size() == 1);
}

TEST_CASE("a shape without S or V: N is still checked, M is skipped (parameters read neither)") {
  // Dense, L 2, D_m 64, H 4 (D_h 16), D_ffn 128: N = 2·(4·64² + 3·64·128) = 81,920. Row 2 prints
  // 90,000 (+9.86 %). No S, no V: M against the conventions is skipped with an info line.
  const ClaimTable t = parse_claim_table(
      "L_layers,Dm,H,Dffn,N,M\n2,64,4,128,81920,1e6\n2,64,4,128,90000,1e6\n", "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto f = matching(fs, Severity::error, "t", 2, "total_params");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->expected == doctest::Approx(81920.0));
  CHECK(count(fs, Severity::error) == 1);
  const auto skipped = matching(fs, Severity::info, "t", 0, "");
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0]->message.find("needs seq_len, vocab") != std::string::npos);
}

TEST_CASE("with a spec entry, a check missing a shared value is unusable input naming it") {
  const AuditSpec spec = load_spec(fixture("spec_missing_shared.toml"));
  const auto tables = load_claim_tables({}, spec, fixture(""));
  try {
    audit_tables(tables, spec);
    FAIL("expected InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("seq_len") != std::string::npos);
  }
}

TEST_CASE("without a spec: the step-law checks that cannot run are listed as skipped too") {
  // B is printed but there is no S to turn sequences into tokens; η is printed but neither N nor
  // a shape is: both checks are skipped, and the info line says so.
  const ClaimTable t = parse_claim_table("D,B,eta\n2e10,256,1e-3\n", "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto skipped = matching(fs, Severity::info, "t", 0, "");
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0]->message ==
        "skipped without a spec entry for this table: B against the step-law batch (needs "
        "seq_len); η against the step-law value (needs N or the shape)");
  CHECK(matching(fs, Severity::info, "t", 1, "batch_seqs").empty());
  CHECK(matching(fs, Severity::info, "t", 1, "lr_peak").empty());
}

namespace {
// The 2B dense shape of the equal-resource paper's Table 12 (L 28, D_m 2176, H 17 so D_h 128,
// D_ffn 8848, S 2048, V 65536), by hand:
//   N = 28·(4·2176² + 3·2176·8848) = 28·(18,939,904 + 57,759,744) = 2,147,590,144
//   paper M    = 6·N + 12·L·D_m·S = 12,885,540,864 + 1,497,366,528 = 14,382,907,392
//   megatron M = 6·(N + V·D_m) + 6·L·S·D_m (causal core, halved) = 6·2,290,196,480 + 748,683,264
//              = 14,489,862,144, 0.74 % above paper: inside a 1 % tolerance.
std::vector<Finding> audit_2b(const std::string& convention, const std::string& m) {
  const ClaimTable t = parse_claim_table(
      "N,M,L_layers,H,Dm,Dffn\n2.15e9," + m + ",28,17,2176,8848\n", "d2b", "d2b.csv");
  const AuditSpec spec = parse_spec("schema = 1\n[tables.d2b]\nconvention = \"" + convention +
                                        "\"\n[tables.d2b.shared]\nseq_len = 2048\nvocab = 65536\n",
                                    "s.toml");
  return check_table_rows(t, spec.table("d2b"), 0.01);
}
}  // namespace

TEST_CASE(
    "a table labelled with the wrong FLOP convention fails though the gap is inside tolerance") {
  // 1.44e10 is 1.435e10 .. 1.445e10: paper (1.4383e10) inside, megatron (1.4490e10) -0.62 %.
  const auto meg = audit_2b("megatron", "1.44e10");
  const auto f = matching(meg, Severity::error, "d2b", 1, "flops_per_token");
  REQUIRE(f.size() == 1);
  CHECK(f[0]->message.find("matches paper training = 1.438e10 inside the printed rounding, not "
                           "the claimed megatron training = 1.449e10 (-0.62%") !=
        std::string::npos);
  // 1.449e10 is 1.4485e10 .. 1.4495e10: megatron inside, paper +0.74 %.
  const auto pap = audit_2b("paper", "1.449e10");
  const auto g = matching(pap, Severity::error, "d2b", 1, "flops_per_token");
  REQUIRE(g.size() == 1);
  CHECK(g[0]->message.find("is the table's FLOP convention megatron training?") !=
        std::string::npos);
  // Each value under its own convention: nothing.
  CHECK(count(audit_2b("paper", "1.44e10"), Severity::error) == 0);
  CHECK(count(audit_2b("megatron", "1.449e10"), Severity::error) == 0);
  // 1.444e10 fits neither inside the rounding (±0.0005e10): within tolerance, info only.
  CHECK(count(audit_2b("paper", "1.444e10"), Severity::error) == 0);
  CHECK(
      matching(audit_2b("paper", "1.444e10"), Severity::info, "d2b", 1, "flops_per_token").size() ==
      1);
}

TEST_CASE("an M of the other router reading than the row's N_a is named with both readings") {
  // Tiny shape at K = 2 (header): N_a router in = 2,326,528 + 6,144 = 2,332,672, so the claimed
  // paper M reads router in: 6·2,332,672 + 6,291,456 = 20,287,488. The row prints router out's
  // 20,250,624 (-0.18 %).
  const ClaimTable t = parse_claim_table(
      "L_layers,L_dense,Dm,H,Dh,Dffn,E,K,De,Dse,S,V,Na,M\n"
      "4,1,256,4,64,512,8,2,128,128,512,1000,2332672,20250624\n",
      "t", "t.csv");
  const AuditSpec spec = parse_spec("schema = 1\n[tables.t]\nconvention = \"paper\"\n", "s.toml");
  const auto fs = check_table_rows(t, spec.table("t"), 0.01);
  const auto f = matching(fs, Severity::error, "t", 1, "flops_per_token");
  REQUIRE(f.size() == 1);
  CHECK(f[0]->message.find("matches paper (router out) training = 2.025e7") != std::string::npos);
  CHECK(f[0]->message.find("not the claimed paper (router in) training = 2.029e7") !=
        std::string::npos);
  CHECK(*f[0]->expected == 20'287'488.0);
}

TEST_CASE("unique tokens just above consumed, beyond both roundings, are an error") {
  // a: D̂ 1.005e9 rounds from at least 1.0045e9; D 1.000e9 from at most 1.0005e9: D̂ > D for
  // certain, though only by 0.5 %. b: D̂ 1.0004e9 (from 1.00035e9) can be D's rounding: clean.
  const ClaimTable t =
      parse_claim_table("label,D,D_hat\na,1.000e9,1.005e9\nb,1.000e9,1.0004e9\n", "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  CHECK(matching(fs, Severity::error, "t", 1, "tokens_unique").size() == 1);
  CHECK(matching(fs, Severity::error, "t", 2, "tokens_unique").empty());
}

TEST_CASE("unique tokens above consumed (epochs below 1) are an error: columns swapped?") {
  // a: D̂ 4e10 > D 2e10. b: D̂ = D / Epoch = 2e10 / 0.5 = 4e10. c: Epoch 0.5 without D.
  // d: D̂ = D (one epoch) and e: Epoch 0.99 printed as 1.0 (rounding reaches 1): clean.
  const ClaimTable t = parse_claim_table(
      "label,N,D,D_hat,Epoch\na,1e9,2e10,4e10,\nb,1e9,2e10,,0.5\nc,1e9,,,0.5\nd,1e9,2e10,2e10,\n"
      "e,1e9,,,1.0\n",
      "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto a = matching(fs, Severity::error, "t", 1, "tokens_unique");
  REQUIRE(a.size() == 1);
  CHECK(a[0]->message.find("D̂ = 4e10 unique tokens is above D = 2e10 consumed") !=
        std::string::npos);
  const auto b = matching(fs, Severity::error, "t", 2, "tokens_unique");
  REQUIRE(b.size() == 1);
  CHECK(b[0]->message.find("(D / epochs)") != std::string::npos);
  CHECK(matching(fs, Severity::error, "t", 3, "epochs").size() == 1);
  CHECK(count(fs, Severity::error) == 3);
}

TEST_CASE("a label two rows share is one warning naming the rows") {
  const ClaimTable t = parse_claim_table("label,N\na,1e9\na,1.5e9\nb,1e9\n", "dup", "dup.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto w = matching(fs, Severity::warning, "dup", 0, "");
  REQUIRE(w.size() == 1);
  CHECK(w[0]->message.find("label 'a' names 2 rows (dup:1, dup:2)") != std::string::npos);
}

TEST_CASE("a spec's shared values take the paper headers a column takes, once each") {
  const ClaimTable t = parse_claim_table("label,D\na,1e11\n", "t", "t.csv");
  // D_hat = 5e10 shared: 2 epochs. ra_pct = 20 is r_a 0.2, as in a column.
  const AuditSpec spec = parse_spec(
      "schema = 1\n[tables.t]\n[tables.t.shared]\nD_hat = 5e10\nra_pct = 20\n", "s.toml");
  const RowView r(t, 0, spec.table("t"));
  REQUIRE(r.value("tokens_unique"));
  CHECK(r.value("tokens_unique")->value == 5e10);
  CHECK(r.value("epochs")->value == 2.0);
  CHECK(r.value("activation_rate")->value == doctest::Approx(0.2));
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[tables.t]\n[tables.t.shared]\nD_hat = 5e10\ntokens_unique = 5e10\n",
                 "s.toml"),
      doctest::Contains("both give tokens_unique; keep one"), InputError);
}

TEST_CASE("error lines show the value as printed and a gap beyond tolerance as beyond it") {
  // 20.20100 against D/N = 20: +1.005 % (printed "20.2" before). C 2.8887e21 against
  // 2.86e21: +1.0035 %, printed "+1.00%" before, the tolerance itself.
  const ClaimTable t = parse_claim_table(
      "label,N,D,D_over_N,M,C\n"
      "a,1000000000,20000000000,20.20100,,\n"
      "b,,100000000000,,28600000000,2888700000000000000000\n",
      "t", "t.csv");
  const auto fs = check_table_rows(t, nullptr, 0.01);
  const auto a = matching(fs, Severity::error, "t", 1, "tokens_per_param");
  REQUIRE(a.size() == 1);
  CHECK(a[0]->message.find("D_over_N = 20.20100 but D / N = 20: +1.01% off") != std::string::npos);
  const auto b = matching(fs, Severity::error, "t", 2, "compute");
  REQUIRE(b.size() == 1);
  CHECK(b[0]->message.find("+1.003% off") != std::string::npos);
}

TEST_CASE("a dense row (experts 0) that gives MoE fields of its own is refused, naming them") {
  const std::string shape = "L_layers,Dm,H,Dffn,N,E,De\n";
  // N = 2·(4·64² + 3·64·128) = 81,920 (dense, D_h 16).
  CHECK_THROWS_WITH_AS(
      check_table_rows(parse_claim_table(shape + "2,64,4,128,81920,0,512\n", "t", "t.csv"), nullptr,
                       0.01),
      doctest::Contains("experts = 0 makes it a dense model, but it gives "
                        "d_expert = 512"),
      InputError);
  // The same row without MoE fields of its own is a dense model, though the spec shares the
  // table's MoE rows' d_expert and dense_layers.
  const ClaimTable t = parse_claim_table(shape + "2,64,4,128,81920,0,\n", "t", "t.csv");
  const AuditSpec spec = parse_spec(
      "schema = 1\n[tables.t]\n[tables.t.shared]\nd_expert = 32\ntop_k = 2\ndense_layers = 1\n",
      "s.toml");
  const auto fs = check_table_rows(t, spec.table("t"), 0.01);
  CHECK(count(fs, Severity::error) == 0);
  // Without a parameter column or a whole shape it is refused too: a row of M with top_k = 2
  // was read as a dense model in silence, and one of N and top_k held its claims.
  for (const char* table : {"label,C,L_layers,Dm,H,Dffn,E,K\na,2e21,24,2048,16,5464,0,2\n",
                            "label,M,L_layers,Dm,H,Dffn,E,K,S,V\na,4.21e10,24,2048,16,5464,0,2,"
                            "2048,65536\n",
                            "label,N,experts,top_k\na,2e9,0,2\n"}) {
    CAPTURE(table);
    CHECK_THROWS_WITH_AS(check_table_rows(parse_claim_table(table, "t", "t.csv"), nullptr, 0.01),
                         doctest::Contains("experts = 0 makes it a dense model, but it gives "
                                           "top_k = 2"),
                         InputError);
  }
  // A table without an experts column and no whole shape says nothing of the row's kind.
  CHECK_NOTHROW(
      check_table_rows(parse_claim_table("label,N,top_k\na,2e9,2\n", "t", "t.csv"), nullptr, 0.01));
}

TEST_CASE("a negative cell gets its quantity's own range") {
  CHECK_THROWS_WITH_AS(parse_claim_table("K\n-1\n", "t", "t.csv"),
                       doctest::Contains("top_k must be a whole number from 0 (none) to 10000"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("mu\n-1\n", "t", "t.csv"),
                       doctest::Contains("mu (µ) must be 0 or more"), InputError);
}
