// Claim checks: spread, bounds, baseline, strict reuse, duplicated runs, row selection.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>

#include "audit_test_util.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/audit_tables.hpp"
#include "moeplan/audit/claims.hpp"
#include "moeplan/audit/duplicates.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/audit/render.hpp"

using namespace moeplan;
using namespace moeplan::audit;
using namespace moeplan::audit::test;

TEST_CASE("an 'equal C' group with a 3 % spread fails and names the row that breaks it") {
  // C = 1.000e21, 1.005e21, 1.030e21: range (1.030 − 1.000)/1.000 = 3.0 % > 1 %.
  // Median 1.005e21; row 3 is farthest (+2.49 %); without it the range is 0.5 %: only row 3 breaks.
  const AuditSpec spec = load_spec(fixture("claims_fail.toml"));
  const AuditReport r = audit_tables(load_claim_tables({}, spec, fixture("")), spec);
  const ClaimVerdict* c = claim(r, "equal compute");
  REQUIRE(c);
  CHECK_FALSE(c->holds);
  REQUIRE(c->quantities.size() == 1);
  const QuantityVerdict& q = c->quantities[0];
  CHECK(q.min == doctest::Approx(1.000e21));
  CHECK(q.max == doctest::Approx(1.030e21));
  CHECK(q.rel_range == doctest::Approx(0.03));
  CHECK(q.max_row == "spread:3");
  REQUIRE(q.breaking == std::vector<std::string>{"spread:3"});
  const auto f = matching(r.findings, Severity::error, "spread", 3, "compute");
  REQUIRE(f.size() == 2);  // one per claim: the spread and the bound
  CHECK(*f[0]->expected == doctest::Approx(1.005e21));
  CHECK(*f[0]->rel_diff == doctest::Approx(1.030 / 1.005 - 1));

  SUBCASE("a bound claim that one row breaks") {
    // at_most 1.02e21: only row 3 (1.030e21) is above, by +0.98 %.
    const ClaimVerdict* b = claim(r, "C at most 1.02e21");
    REQUIRE(b);
    CHECK_FALSE(b->holds);
    CHECK(b->quantities[0].kind == "at_most");
    CHECK(b->quantities[0].breaking == std::vector<std::string>{"spread:3"});
    CHECK(*f[1]->expected == doctest::Approx(1.02e21));
    CHECK(*f[1]->rel_diff == doctest::Approx(1.030 / 1.020 - 1));
  }
  CHECK(exit_status(r) == 1);
}

TEST_CASE("outliers_to_remove removes the fewest, most outlying values") {
  CHECK(outliers_to_remove({1.0, 1.005, 1.03}, 0.01) == std::vector<size_t>{2});
  CHECK(outliers_to_remove({1.0, 1.001, 1.002}, 0.01).empty());
  // 0.9 and 1.1 are both 10 % from the median 1.0; 0.9 is found first, then 1.1.
  CHECK(outliers_to_remove({0.9, 1.0, 1.0, 1.1}, 0.01).size() == 2);
}

TEST_CASE("a duplicated run with different numbers, across two tables") {
  // Same shape (L, D_m, D_ffn, H), same D = 6.50e10, same η and B: the same run. BPC differs.
  const ClaimTable a = parse_claim_table(
      "N,D,L_layers,H,Dm,Dffn,eta,B,BPC\n2.15e9,6.50e10,28,17,2176,8848,8.44e-4,320,0.4921\n"
      "2.15e9,1.14e11,28,17,2176,8848,1.00e-3,448,0.4808\n",
      "a", "a.csv");
  const ClaimTable b = parse_claim_table(
      "D,L_layers,H,Dm,Dffn,eta,B,BPC\n1.14e11,28,17,2176,8848,1.00e-3,448,0.4808\n"
      "6.5e10,28,17,2176,8848,8.44e-4,320,0.4875\n",
      "b", "b.csv");
  const AuditSpec spec;
  const auto fs = find_duplicate_runs({a, b}, spec, 0.01);
  // b:1 equals a:2 in every shared quantity: nothing. b:2 is a:1 with BPC 0.4875 vs 0.4921.
  REQUIRE(fs.size() == 1);
  CHECK(fs[0].table == "b");
  CHECK(fs[0].row == 2);
  CHECK(fs[0].quantity == "val_bpc");
  CHECK(*fs[0].expected == doctest::Approx(0.4921));
  CHECK(*fs[0].found == doctest::Approx(0.4875));
  CHECK(*fs[0].rel_diff == doctest::Approx(0.4875 / 0.4921 - 1));
  CHECK(fs[0].message.find("a:1") != std::string::npos);
}

TEST_CASE("duplicated runs: M compares only between tables of one FLOP reading") {
  // The same dense run (L 28, D_m 2176, D_ffn 8848, H 17, S 2048) in a training table and a
  // forward table: M 1.438e10 training is 3 x 4.794e9 forward (paper: 6·N + 12·L·D_m·S vs a
  // third of it). Not a contradiction; the same M in both tables under one reading would be.
  const std::string shared = R"(
layers = 28
dense_layers = 28
d_model = 2176
d_ffn = 8848
heads = 17
seq_len = 2048
vocab = 65536
)";
  const ClaimTable trn = parse_claim_table("name,M,D\na,1.438e10,1.00e11\n", "trn", "trn.csv");
  const ClaimTable fwd = parse_claim_table("name,M,D\na,4.794e9,1.00e11\n", "fwd", "fwd.csv");
  const AuditSpec mixed = parse_spec("schema = 1\n[tables.trn]\n[tables.trn.shared]" + shared +
                                         "[tables.fwd]\nflops = \"forward\"\n"
                                         "[tables.fwd.shared]" + shared,
                                     "inline.toml");
  CHECK(find_duplicate_runs({trn, fwd}, mixed, 0.01).empty());
  const AuditSpec alike = parse_spec("schema = 1\n[tables.trn]\n[tables.trn.shared]" + shared +
                                         "[tables.fwd]\n[tables.fwd.shared]" + shared,
                                     "inline.toml");
  const auto fs = find_duplicate_runs({trn, fwd}, alike, 0.01);
  REQUIRE(fs.size() == 1);
  CHECK(fs[0].quantity == "flops_per_token");
  CHECK(fs[0].table == "fwd");
}

TEST_CASE("strict reuse: every row's unique data equals the baseline's") {
  // Dense baseline D̂ = D = 68B (1 epoch, shared). MoE rows: D̂ printed 68B; D/epochs =
  // 136B/2 = 68B; D̂ 60B breaks it by (60 − 68)/68 = −11.8 %.
  const ClaimTable dense = parse_claim_table("D,C\n68B,2.86e21\n", "dense", "dense.csv");
  const ClaimTable moe =
      parse_claim_table("D,D_hat,Epoch\n136B,68B,2\n136B,,2\n120B,60B,2\n", "moe", "moe.csv");
  const AuditSpec spec = parse_spec(R"(schema = 1
[tables.dense.shared]
epochs = 1
[[claims]]
name = "strict reuse"
rows = ["moe:*"]
baseline = "dense:1"
strict_reuse = true
)",
                                    "inline.toml");
  std::vector<Finding> fs;
  const auto cv = evaluate_claims({dense, moe}, spec, fs);
  REQUIRE(cv.size() == 1);
  CHECK_FALSE(cv[0].holds);
  REQUIRE(cv[0].quantities.size() == 1);
  CHECK(cv[0].quantities[0].quantity == "tokens_unique");
  CHECK(cv[0].quantities[0].breaking == std::vector<std::string>{"moe:3"});
  const auto f = matching(fs, Severity::error, "moe", 3, "tokens_unique");
  REQUIRE(f.size() == 1);
  CHECK(*f[0]->expected == doctest::Approx(68e9));
  CHECK(*f[0]->rel_diff == doctest::Approx(60.0 / 68.0 - 1));
}

TEST_CASE("row selection: lists, ranges, where filters") {
  const ClaimTable t =
      parse_claim_table("C,D\n1e21,1e10\n2e21,1e10\n1.005e21,2e10\n", "t", "t.csv");
  AuditSpec spec = parse_spec(R"(schema = 1
[[claims]]
name = "c"
rows = ["t:1-3"]
where = { compute = 1e21 }
equal = ["tokens_consumed"]
)",
                              "inline.toml");
  // compute within 1 % of 1e21: rows 1 and 3 (1.005e21 is +0.5 %).
  const auto rows = select_rows({t}, spec, spec.claims[0]);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].row == 1);
  CHECK(rows[1].row == 3);
  CHECK_THROWS_AS(parse_row_selector("t:0", "x"), InputError);
  CHECK_THROWS_AS(parse_row_selector("t:3-2", "x"), InputError);
  CHECK(parse_row_selector("t:2-4", "x").last == 4);
}

TEST_CASE("overlapping row selectors count each row once") {
  // N 1.000B, 1.005B, 1.020B, 0.980B: the median of the four is 1.0025B; at 1 % the fewest
  // outliers to remove are rows 3 (+1.7 %) and 4 (-2.2 %), as with every row listed once.
  const ClaimTable t =
      parse_claim_table("name,N\na,1.000B\nb,1.005B\nc,1.020B\nd,0.980B\n", "sp1", "sp1.csv");
  const AuditSpec spec = parse_spec(R"(schema = 1
[[claims]]
name = "dups"
rows = ["sp1:*", "sp1:3-4", "sp1:4"]
equal = ["total_params"]
)",
                                    "inline.toml");
  const auto rows = select_rows({t}, spec, spec.claims[0]);
  REQUIRE(rows.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(rows[size_t(i)].row == i + 1);
  std::vector<Finding> fs;
  const auto verdicts = evaluate_claims({t}, spec, fs);
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0].rows == std::vector<std::string>{"sp1:1", "sp1:2", "sp1:3", "sp1:4"});
  REQUIRE(verdicts[0].quantities.size() == 1);
  auto breaking = verdicts[0].quantities[0].breaking;
  std::sort(breaking.begin(), breaking.end());
  CHECK(breaking == std::vector<std::string>{"sp1:3", "sp1:4"});
}

TEST_CASE("a spec naming a missing table or a quantity no row has is unusable input") {
  const AuditSpec missing_table = load_spec(fixture("spec_missing_table.toml"));
  const auto tables = load_claim_tables({}, missing_table, fixture(""));
  CHECK_THROWS_WITH_AS(audit_tables(tables, missing_table), doctest::Contains("'nosuch'"),
                       InputError);
  const AuditSpec missing_col = load_spec(fixture("spec_missing_column.toml"));
  CHECK_THROWS_WITH_AS(audit_tables(load_claim_tables({}, missing_col, fixture("")), missing_col),
                       doctest::Contains("tokens_unique"), InputError);
  CHECK_THROWS_WITH_AS(parse_spec("schema = 1\n[[claims]]\nequal = [\"flops\"]\n", "s.toml"),
                       doctest::Contains("'flops'"), InputError);
  CHECK_THROWS_WITH_AS(parse_spec("schema = 2\n", "s.toml"), doctest::Contains("schema = 1"),
                       InputError);
}

TEST_CASE("a column of row names: label, id, name, run or model, in any case") {
  for (const char* h : {"label", "id", "name", "run", "model", "Model", "NAME"}) {
    CAPTURE(h);
    const ClaimTable t = parse_claim_table(
        std::string(h) + ",N,C\ndense-1b,1e9,1.2e20\nmoe-1b,1.01e9,1.2e20\n", "t", "t.csv");
    CHECK(t.labels == std::vector<std::string>{"dense-1b", "moe-1b"});
    CHECK(t.quantities[0].empty());
    CHECK(t.quantities[1] == "total_params");
  }
  CHECK_THROWS_WITH_AS(parse_claim_table("models,N\nx,1e9\n", "t", "t.csv"),
                       doctest::Contains("unknown column 'models'"), InputError);
}

TEST_CASE("CSV quoting: commas and doubled quotes inside a quoted field; an open quote refused") {
  const ClaimTable t = parse_claim_table(
      "name,N\n\"moe, k=2\",1e9\n\"say \"\"hi\"\"\",2e9\n  \"padded\" ,3e9\n", "q", "q.csv");
  CHECK(t.labels == std::vector<std::string>{"moe, k=2", "say \"hi\"", "padded"});
  CHECK(t.rows[2].at("total_params").value == 3e9);
  CHECK_THROWS_WITH_AS(parse_claim_table("name,N\n\"open,1e9\n", "q", "q.csv"),
                       "q.csv line 2: a quoted field is not closed (a \" is missing)", InputError);
  // A number written with a thousands comma inside quotes is one field, and not a number.
  CHECK_THROWS_WITH_AS(parse_claim_table("name,N\na,\"2,000\"\n", "q", "q.csv"),
                       doctest::Contains("'2,000' is not a number"), InputError);
}

TEST_CASE("markdown: a '|' in a claim name, a label or a message does not break the table") {
  const ClaimTable t = parse_claim_table("name,N\nmoe|k=2,1e9\nb,2e9\n", "p", "p.csv");
  AuditSpec spec = parse_spec(R"(schema = 1
[[claims]]
name = "N | C equal"
equal = ["total_params"]
)",
                              "inline.toml");
  const std::string md = render(audit_tables({t}, spec), ReportFormat::md);
  CAPTURE(md);
  // Every table line has as many unescaped '|' as its header line.
  size_t header_cells = 0;
  std::istringstream in(md);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    size_t bars = 0;
    for (size_t i = 0; i < line.size(); ++i) bars += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    if (line.find("verdict") != std::string::npos || line.find("severity") != std::string::npos)
      header_cells = bars;
    CHECK_MESSAGE(bars == header_cells, line);
  }
  CHECK(md.find("N \\| C equal") != std::string::npos);
  CHECK(md.find("p:1 moe\\|k=2") != std::string::npos);
}

TEST_CASE("specs: paper headers as quantities, a baseline by row label, bounds as given") {
  // dense-1b N 1e9, C 1e20; moe N 1.005e9 (+0.5 %), C 1e20; epochs 19.875 and 20.
  const ClaimTable t = parse_claim_table(
      "name,N,C,Epoch\ndense-1b,1e9,1e20,19.875\nmoe,1.005e9,1e20,20\n", "lab", "lab.csv");
  const AuditSpec spec = parse_spec(R"(schema = 1
[[claims]]
name = "equal"
equal = ["N", "C"]
baseline = "dense-1b"
[[claims]]
name = "epochs"
at_least = { Epoch = 19.875 }
)",
                                    "inline.toml");
  REQUIRE(spec.claims.size() == 2);
  CHECK(spec.claims[0].equal == std::vector<std::string>{"total_params", "compute"});
  CHECK(spec.claims[1].bounds[0].quantity == "epochs");
  const AuditReport r = audit_tables({t}, spec);
  const ClaimVerdict* eq = claim(r, "equal");
  REQUIRE(eq);
  CHECK(eq->holds);
  CHECK(eq->rows.front() == "lab:1");  // the labelled baseline leads
  // 19.875 is met exactly; the verdict line prints the bound as given, not rounded to 19.88.
  const std::string text = render(r, ReportFormat::table);
  CHECK(text.find("at least 19.875 -> holds") != std::string::npos);
  // A label no row carries, and [high, low] bounds, are refused.
  const AuditSpec missing = parse_spec(
      "schema = 1\n[[claims]]\nname = \"x\"\nequal = [\"N\"]\nbaseline = \"dense-2b\"\n", "m.toml");
  CHECK_THROWS_WITH_AS(audit_tables({t}, missing),
                       "claim 'x': baseline 'dense-2b' is no row's label (labels: dense-1b, moe); "
                       "name one row by its label or as table:row",
                       InputError);
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[[claims]]\nname = \"b\"\nbetween = { C = [2e21, 1e20] }\n",
                 "b.toml"),
      doctest::Contains("the low bound is above the high one"), InputError);
}

TEST_CASE("cells: a negative value is refused; an empty cell a claim needs is named as empty") {
  CHECK_THROWS_WITH_AS(parse_claim_table("name,N\na,-2B\n", "t", "t.csv"),
                       "t.csv data row 1 column N: '-2B' is negative; every quantity here is >= 0",
                       InputError);
  const ClaimTable t = parse_claim_table("name,N,C\na,1e9,1e20\nb,,1e20\n", "t", "t.csv");
  const AuditSpec spec =
      parse_spec("schema = 1\n[[claims]]\nname = \"n\"\nequal = [\"N\"]\n", "s.toml");
  CHECK_THROWS_WITH_AS(
      audit_tables({t}, spec),
      "claim 'n' needs total_params (N) of row t:2, whose cell is empty, no shared "
      "value in the spec, and nothing to derive it from",
      InputError);
}
