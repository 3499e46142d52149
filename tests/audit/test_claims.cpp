// Claim checks: spread, bounds, baseline, strict reuse, duplicated runs, row selection.
#include <doctest/doctest.h>
#include <fmt/format.h>

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
  // 0.9 and 1.1 are both 10 % from the median 1.0: both go, the two 1.0 stay.
  auto removed = outliers_to_remove({0.9, 1.0, 1.0, 1.1}, 0.01);
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<size_t>{0, 3});
  // By hand: without 1.0000 the rest span (1.0192 - 1.0095) / 1.0095 = 0.96 % <= 1 %: one row
  // to blame. Greedy removal from the median (1.0095) dropped both 1.0192 rows instead.
  CHECK(outliers_to_remove({1.0000, 1.0095, 1.0095, 1.0192, 1.0192}, 0.01) ==
        std::vector<size_t>{0});
  // Two groups as large: 1.00, 1.005 and 1.10, 1.105 around the median 1.0525 tie; the lower
  // is kept.
  CHECK(outliers_to_remove({1.10, 1.00, 1.105, 1.005}, 0.01) == std::vector<size_t>{2, 0});
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

TEST_CASE("duplicated runs: GQA, another vocabulary or reused data make another run") {
  // MHA vs GQA of one 7B shape: N = 32·(2·4096² + 2·4096·1024 + 3·4096·11008) = 5.671e9 with 8
  // KV heads, 6.476e9 with 32: both rows correct, and two runs, not one run printed twice.
  const ClaimTable gqa = parse_claim_table(
      "label,N,L_layers,H,H_kv,Dm,Dffn,D,BPC\nmha,6.48e9,32,32,32,4096,11008,6.80e10,0.4736\n"
      "gqa,5.67e9,32,32,8,4096,11008,6.80e10,0.4790\n",
      "gqa", "gqa.csv");
  CHECK(find_duplicate_runs({gqa}, AuditSpec{}, 0.01).empty());
  const ClaimTable voc = parse_claim_table(
      "label,L_layers,H,Dm,Dffn,V,D,BPC\na,32,32,4096,11008,65536,6.80e10,0.4736\n"
      "b,32,32,4096,11008,151936,6.80e10,0.4712\n",
      "voc", "voc.csv");
  CHECK(find_duplicate_runs({voc}, AuditSpec{}, 0.01).empty());
  // The paper's strict-reuse comparison: one D, fresh data (D̂ = D) or 4.65 epochs of less.
  const ClaimTable reuse = parse_claim_table(
      "label,L_layers,H,Dm,Dffn,D,D_hat,Epoch,BPC\nfresh,32,32,4096,11008,3.16e11,3.16e11,1.00,"
      "0.4590\nreuse,32,32,4096,11008,3.16e11,6.80e10,4.65,0.4650\n",
      "reuse", "reuse.csv");
  CHECK(find_duplicate_runs({reuse}, AuditSpec{}, 0.01).empty());
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

TEST_CASE("a spec's tolerances: a fraction or a percentage, as --tolerance takes them") {
  const AuditSpec spec = parse_spec(R"(schema = 1
tolerance = "2%"
[tables.t]
tolerance = 0.005
[[claims]]
name = "c"
rows = ["t:1-2"]
equal = ["compute"]
tolerance = "0.5%"
)",
                                    "inline.toml");
  CHECK(spec.tolerance == doctest::Approx(0.02));
  REQUIRE(spec.tables.size() == 1);
  CHECK(*spec.tables[0].tolerance == doctest::Approx(0.005));
  CHECK(*spec.claims[0].tolerance == doctest::Approx(0.005));
  for (const char* bad : {"tolerance = \"150%\"", "tolerance = 1.5", "tolerance = \"abc\"",
                          "tolerance = 0", "tolerance = true"})
    CHECK_THROWS_WITH_AS(parse_spec(std::string("schema = 1\n") + bad + "\n", "s.toml"),
                         doctest::Contains("s.toml: tolerance"), InputError);
  // Numbers toml11 reads as others are refused as in a manifest: 1e-400 was a bound of 0 that
  // every row held, 99999999999999999999 a bound of 2^63 - 1.
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[[claims]]\nname = \"e\"\nat_least = { epochs = 1e-400 }\n",
                 "s.toml"),
      doctest::Contains("s.toml: key 'claims[0].at_least.epochs' = 1e-400 is below the smallest "
                        "number a double holds"),
      InputError);
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[[claims]]\nname = \"e\"\nat_most = { epochs = "
                 "99999999999999999999 }\n",
                 "s.toml"),
      doctest::Contains("s.toml: key 'claims[0].at_most.epochs' = 99999999999999999999 is past "
                        "the 64-bit integers"),
      InputError);
  // nan is not a tolerance: the line offered sizes ("e.g. 2048, 2.86e21 or \"65B\"").
  CHECK_THROWS_WITH_AS(parse_spec("schema = 1\ntolerance = nan\n", "s.toml"),
                       doctest::Contains("s.toml: tolerance = nan must be a fraction in (0, 1) "
                                         "such as 0.01, or a percentage such as \"1%\""),
                       InputError);
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

TEST_CASE("claims are told apart by name: an empty or repeated name is refused") {
  const std::string claim = "[[claims]]\nequal = [\"N\"]\n";
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n" + claim + "name = \"a\"\n" + claim + "name = \"a\"\n", "s.toml"),
      "s.toml: claims[2] name = 'a' is claims[1]'s name too; give each claim its own name",
      InputError);
  // An unnamed claim is "claim 2"; a named one may not take that name from it.
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n" + claim + claim + claim + "name = \"claim 2\"\n", "s.toml"),
      "s.toml: claims[3] name = 'claim 2' is claims[2]'s name too; give each claim its own name",
      InputError);
  CHECK_THROWS_WITH_AS(parse_spec("schema = 1\n" + claim + "name = \" \"\n", "s.toml"),
                       doctest::Contains("claims[1] name = ' ' is empty"), InputError);
  // Distinct names, and unnamed claims numbered apart, are read.
  const AuditSpec ok = parse_spec(
      "schema = 1\n" + claim + "name = \"a\"\n" + claim + "name = \"b\"\n" + claim + claim,
      "s.toml");
  REQUIRE(ok.claims.size() == 4);
  CHECK(ok.claims[2].name == "claim 3");
  CHECK(ok.claims[3].name == "claim 4");
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
  // What a paper prints for a missing value, a separator or a percent: the fix is said.
  CHECK_THROWS_WITH_AS(parse_claim_table("name,N\na,\"2,000\"\n", "q", "q.csv"),
                       doctest::Contains("write it without thousands separators"), InputError);
  for (const char* missing : {"\xE2\x80\x94", "n/a", "-", "NA"})
    CHECK_THROWS_WITH_AS(
        parse_claim_table(std::string("name,N,C\na,1e9,") + missing + "\n", "q", "q.csv"),
        doctest::Contains("leave the cell blank if the value is not published"), InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("name,ra_pct\na,20%\n", "q", "q.csv"),
                       doctest::Contains("write it without the '%'"), InputError);
}

TEST_CASE("CSV records: a line break inside quotes, old-Mac CR endings, UTF-8 only, one label") {
  // A multi-line cell (as spreadsheets write one) stays in its row; line numbers stay physical.
  const ClaimTable t = parse_claim_table(
      "label,N,C\nbase,1.00e9,1.00e20\n\"moe\n(top-2)\",1.05e9,1.00e20\n", "nl", "nl.csv");
  // Its label is one line (a finding's line in the terminal stayed broken in two).
  CHECK(t.labels == std::vector<std::string>{"base", "moe (top-2)"});
  CHECK(t.rows[1].at("total_params").value == 1.05e9);
  CHECK_THROWS_WITH_AS(parse_claim_table("label,N\n\"a\nb\",1e9\nx,1e9,2\n", "nl", "nl.csv"),
                       "nl.csv: data row 2 (line 4) has 3 fields, the header has 2", InputError);
  // A quote inside an unquoted cell is a character (7 inches), as split_fields reads it: it
  // opens nothing that would swallow the next lines.
  const ClaimTable inch = parse_claim_table(
      "label,N\nsmall 7\" run,1.00e9\nbig,2.00e9\nthird,3.00e9\n", "in", "in.csv");
  CHECK(inch.labels == std::vector<std::string>{"small 7\" run", "big", "third"});
  // A file of CR line ends only.
  const ClaimTable cr =
      parse_claim_table("label,N,C\rbase,1.00e9,1.00e20\rmoe,1.05e9,1.00e20\r", "cr", "cr.csv");
  CHECK(cr.labels == std::vector<std::string>{"base", "moe"});
  CHECK(cr.rows[1].at("compute").value == 1e20);
  // CR line ends with a multi-line cell holding an LF (Excel for Mac's CSV): the file's line end
  // is its first one outside quotes; any LF anywhere made it one garbled header line.
  const ClaimTable mac = parse_claim_table(
      "label,N,C\r\"base\",1.2e9,2e20\r\"moe\nk=2\",1.2e9,2.1e20\r", "mac", "mac.csv");
  CHECK(mac.labels == std::vector<std::string>{"base", "moe k=2"});
  CHECK(mac.rows[1].at("compute").value == 2.1e20);
  // A quoted header field ("label") opens and closes before the CR that ends the line.
  const ClaimTable quoted_cr =
      parse_claim_table("\"label\",N\r\"a\nb\",1e9\rc,2e9\r", "qc", "qc.csv");
  CHECK(quoted_cr.labels == std::vector<std::string>{"a b", "c"});
  // Latin-1 (0xE9 is é there) is no UTF-8: refused naming its line, not a crash of the JSON
  // report later. Well-formed UTF-8 (é as C3 A9, a 4-byte emoji) is kept.
  CHECK_THROWS_WITH_AS(
      parse_claim_table("label,N\nbase,1e9\nMixtral-\xe9,1e9\n", "l1", "l1.csv"),
      "l1.csv line 3: byte 0xE9 is not UTF-8; save the table as UTF-8 (Excel: CSV UTF-8)",
      InputError);
  CHECK_THROWS_AS(parse_claim_table("label,N\n\xed\xa0\x80,1e9\n", "s", "s.csv"),
                  InputError);  // a UTF-16 surrogate
  CHECK_THROWS_AS(parse_claim_table("label,N\n\xc0\xaf,1e9\n", "s", "s.csv"),
                  InputError);  // an overlong '/'
  CHECK(parse_claim_table("label,N\ncaf\xc3\xa9 \xf0\x9f\x98\x80,1e9\n", "u", "u.csv").labels[0] ==
        "caf\xc3\xa9 \xf0\x9f\x98\x80");
  // Two columns of row names: --baseline would match one of them only.
  CHECK_THROWS_WITH_AS(parse_claim_table("model,run,N\nmoe-a,r1,1e9\n", "mr", "mr.csv"),
                       "mr.csv: columns 'model' and 'run' both name the rows; keep one as the "
                       "label and list the other under the table's ignore = [...] in a spec, or "
                       "rename it",
                       InputError);
  CHECK(parse_claim_table("model,run,N\nmoe-a,r1,1e9\n", "mr", "mr.csv", {"run"}).labels[0] ==
        "moe-a");
}

TEST_CASE("markdown: a '|' in a claim name, a label or a message does not break the table") {
  const ClaimTable t = parse_claim_table("name,N\nmoe|k=2,2e9\nb,1e9\nc,1e9\n", "p", "p.csv");
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
  // '<', '>' and '&' are raw HTML to a Markdown renderer: escaped as entities.
  spec.claims[0].name = "<script>alert(1)</script> & co";
  const std::string md2 = render(audit_tables({t}, spec), ReportFormat::md);
  CHECK(md2.find("<script>") == std::string::npos);
  CHECK(md2.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; co") != std::string::npos);
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
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[[claims]]\nname = \"b\"\nequal = [\"N\", \"total_params\"]\n",
                 "b.toml"),
      "b.toml: claim 'b'.equal names total_params twice ('N' and 'total_params'); give each "
      "quantity once",
      InputError);
  // TOML's nan and inf are refused wherever a number is read: a NaN bound compares false both
  // ways, so "at least nan" held for every row, and where = { C = nan } ended in "stoi".
  for (const char* claim :
       {"at_least = { tokens_per_param = nan }", "at_most = { epochs = nan }",
        "between = { C = [nan, 1e21] }", "at_least = { C = inf }",
        "equal = [\"N\"]\nwhere = { compute = nan }", "equal = [\"N\"]\nwhere = { N = [0, inf] }"})
    CHECK_THROWS_WITH_AS(
        parse_spec(fmt::format("schema = 1\n[[claims]]\nname = \"b\"\n{}\n", claim), "b.toml"),
        doctest::Contains("must be a finite number"), InputError);
}

TEST_CASE("a spec may name r_a as ra_pct, in percent, as tables and --equal do") {
  // ra_pct 19.9 and 20.1: r_a 0.199 and 0.201, a range of 1.005 %; at least 15 % holds, 25 %
  // does not. The spec refused "ra_pct" as an unknown quantity.
  const ClaimTable t = parse_claim_table("label,ra_pct\na,19.9\nb,20.1\n", "t", "t.csv");
  auto verdict = [&](const std::string& claim_text) {
    const AuditSpec spec =
        parse_spec("schema = 1\n[[claims]]\nname = \"r\"\n" + claim_text + "\n", "s.toml");
    return *claim(audit_tables({t}, spec), "r");
  };
  CHECK(verdict("at_least = { ra_pct = 15 }").holds);
  CHECK_FALSE(verdict("at_least = { ra_pct = 25 }").holds);
  CHECK(verdict("between = { ra_pct = [19, 21] }").holds);
  const ClaimVerdict eq = verdict("equal = [\"ra_pct\"]\ntolerance = 0.02");
  CHECK(eq.holds);
  CHECK(eq.quantities[0].quantity == "activation_rate");
}

TEST_CASE("bounds on a derived value allow exactly the range its inputs' rounding allows") {
  // D = 3e11 (±0.5e11), D̂ = 1e11 (±0.5e11): epochs = D / D̂ is 3, and anywhere in
  // [2.5e11 / 1.5e11, 3.5e11 / 0.5e11] = [1.667, 7] as printed. Adding relative bands (1/6 + 1/2)
  // allowed [1, 5]: "at most 1.5 epochs" held.
  const ClaimTable t = parse_claim_table("label,D,D_hat\nx,3e11,1e11\n", "ep", "ep.csv");
  auto holds = [&](const std::string& bound) {
    const AuditSpec spec =
        parse_spec("schema = 1\n[[claims]]\nname = \"b\"\n" + bound + "\n", "s.toml");
    return claim(audit_tables({t}, spec), "b")->holds;
  };
  CHECK_FALSE(holds("at_most = { epochs = 1.5 }"));
  CHECK(holds("at_most = { epochs = 1.7 }"));
  CHECK(holds("at_least = { epochs = 6.9 }"));
  CHECK_FALSE(holds("at_least = { epochs = 7.1 }"));
}

TEST_CASE("cells: a negative value is refused; an empty cell a claim needs is named as empty") {
  CHECK_THROWS_WITH_AS(parse_claim_table("name,N\na,-2B\n", "t", "t.csv"),
                       "t.csv data row 1 column N = -2B: total_params (N) must be greater than 0; "
                       "leave the cell blank if it is not published",
                       InputError);
  // Zero: D = 0 made C vs M·D = 0 print "+0.00 %, within tolerance" and the row consistent;
  // ra_pct = 0 and D_over_N = 0 printed infinite ratios. mu = 0 (no coupling loss) is a value.
  CHECK_THROWS_WITH_AS(
      parse_claim_table("name,N,M,D,C\na,2.15e9,1.44e10,0,9.36e20\n", "t", "t.csv"),
      "t.csv data row 1 column D = 0: tokens_consumed (D) must be greater than "
      "0; leave the cell blank if it is not published",
      InputError);
  for (const char* header :
       {"N", "Na", "M", "C", "D_hat", "Epoch", "D_over_N", "eta", "B", "iters", "BPC", "Loss"})
    CHECK_THROWS_WITH_AS(parse_claim_table(fmt::format("{}\n0\n", header), "t", "t.csv"),
                         doctest::Contains("must be greater than 0"), InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("ra_pct\n0\n", "t", "t.csv"),
                       doctest::Contains("activation_rate must be in (0, 1] (ra_pct in (0, 100])"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("ra_pct\n150\n", "t", "t.csv"),
                       doctest::Contains("t.csv data row 1 column ra_pct = 150: activation_rate"),
                       InputError);
  CHECK(parse_claim_table("ra_pct,mu\n100,0\n", "t", "t.csv").rows.size() == 1);
  // A spec's shared value is held to the same: a zero there reaches every row.
  CHECK_THROWS_WITH_AS(
      parse_spec("schema = 1\n[tables.t.shared]\nseq_len = 2048\ncompute = 0\n", "s.toml"),
      doctest::Contains("shared.compute = 0: compute (C) must be greater than 0"), InputError);
  const ClaimTable t = parse_claim_table("name,N,C\na,1e9,1e20\nb,,1e20\n", "t", "t.csv");
  const AuditSpec spec =
      parse_spec("schema = 1\n[[claims]]\nname = \"n\"\nequal = [\"N\"]\n", "s.toml");
  CHECK_THROWS_WITH_AS(
      audit_tables({t}, spec),
      "claim 'n' needs total_params (N) of row t:2, whose cell is empty, no shared "
      "value in the spec, and nothing to derive it from",
      InputError);
}

TEST_CASE("spreadsheet and pandas habits: empty rows of separators, an unnamed index column") {
  // Excel saves an emptied row as ",": it is blank, not a third row with nothing published.
  const ClaimTable t =
      parse_claim_table("N,C\r\n1e9,1e21\r\n,\r\n1e9,1e21\r\n, \r\n", "t", "t.csv");
  CHECK(t.rows.size() == 2);
  // pandas' to_csv writes its index under an empty header.
  CHECK_THROWS_WITH_AS(parse_claim_table(",N,C\n0,1e9,1e21\n", "t", "t.csv"),
                       doctest::Contains("t.csv: column 1 has an empty header (pandas writes its "
                                         "row index so: save with to_csv(index=False)"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("N,,C\n1e9,,1e21\n", "t", "t.csv"),
                       "t.csv: column 2 has an empty header; give it a header, or remove the "
                       "column",
                       InputError);
}

TEST_CASE(
    "a where on a quantity the claim tests is refused: it would hide the rows that break it") {
  // C: 1.00e20, 1.00e20, 1.03e20. "equal C" over all three fails (row 3 is +3 %); "where
  // C = 1e20" keeps rows 1 and 2 only, so the same claim would hold with row 3 left out.
  const ClaimTable t = parse_claim_table(
      "label,N,C,Epoch\nd,1.00e9,1.00e20,2.00\na,1.00e9,1.00e20,2.00\nb,1.00e9,1.03e20,9.00\n", "w",
      "w.csv");
  auto spec_with = [](const std::string& claim) {
    return parse_spec("schema = 1\n[[claims]]\nname = \"x\"\n" + claim, "s.toml");
  };
  const AuditReport all = audit_tables({t}, spec_with("equal = [\"C\"]\nbaseline = \"d\"\n"));
  CHECK_FALSE(claim(all, "x")->holds);
  CHECK_THROWS_WITH_AS(
      audit_tables({t},
                   spec_with("equal = [\"N\", \"C\"]\nbaseline = \"d\"\nwhere = { C = 1e20 }\n")),
      "claim 'x' selects its rows by C (where compute = 1e20) and tests C too: a row that breaks "
      "the claim would be left out instead of failing it; name the rows instead (a spec's rows = "
      "[\"table:2-5\"], or --rows), or leave C out of the claim",
      InputError);
  // A bound or a range on the filtered quantity hides its breaking rows too.
  CHECK_THROWS_AS(
      audit_tables({t}, spec_with("at_most = { epochs = 8 }\nwhere = { epochs = [1, 3] }\n")),
      InputError);
  // Selecting by one quantity and testing another is the filter's purpose: it holds.
  const AuditReport ok =
      audit_tables({t}, spec_with("equal = [\"N\"]\nbaseline = \"d\"\nwhere = { C = 1e20 }\n"));
  CHECK(claim(ok, "x")->holds);
  CHECK(claim(ok, "x")->left_out == std::vector<std::string>{"w:3"});
}

TEST_CASE(
    "a baseline label may hold a colon; one that is also a table:row of another row is refused") {
  // Row 1 is labelled "moe:k2" (no table:row: "k2" is no row number); row 2 of table w is
  // labelled "w:3", which reads as row 3 of w too.
  const ClaimTable t =
      parse_claim_table("label,N\nmoe:k2,1.000e9\nw:3,1.004e9\nother,1.006e9\n", "w", "w.csv");
  auto spec_with = [](const std::string& baseline) {
    return parse_spec(
        "schema = 1\n[[claims]]\nname = \"x\"\nequal = [\"N\"]\nbaseline = \"" + baseline + "\"\n",
        "s.toml");
  };
  const AuditReport r = audit_tables({t}, spec_with("moe:k2"));
  REQUIRE(claim(r, "x"));
  CHECK(claim(r, "x")->rows.front() == "w:1");
  CHECK_THROWS_WITH_AS(audit_tables({t}, spec_with("w:3")),
                       "claim 'x': baseline 'w:3' is row 3 of table 'w' and the label of w:2; "
                       "rename the label or name the baseline by the other",
                       InputError);
  // A label that reads as table:row of a table that is not loaded is that label.
  const ClaimTable u = parse_claim_table("label,N\ndense:5,1.000e9\nb,1.004e9\n", "u", "u.csv");
  CHECK(claim(audit_tables({u}, spec_with("dense:5")), "x")->rows.front() == "u:1");
  // Two rows of one label: the error names both.
  const ClaimTable v = parse_claim_table("label,N\nd,1.000e9\nd,1.004e9\n", "v", "v.csv");
  CHECK_THROWS_WITH_AS(audit_tables({v}, spec_with("d")),
                       "claim 'x': baseline 'd' labels 2 rows (v:1, v:2); name one row by its "
                       "label or as table:row",
                       InputError);
}

TEST_CASE("a claim with no row besides its baseline is refused; the verdict says what it covered") {
  // C: dense 2.80e21, 2.86e21, 5.45e21; moe 2.86e21, 2.86e21, 1.40e21. `where compute = 2.86e12`
  // (a typo for e21) keeps none of the six: with the baseline dense:2 added back, it would be
  // compared with itself and hold.
  const ClaimTable dense = parse_claim_table(
      "name,N,C\nd1,3.29e9,2.80e21\nd2,6.48e9,2.86e21\nd3,6.48e9,5.45e21\n", "dense", "dense.csv");
  const ClaimTable moe = parse_claim_table(
      "name,N,C\nm1,6.50e9,2.86e21\nm2,6.51e9,2.86e21\nm3,6.52e9,1.40e21\n", "moe", "moe.csv");
  auto spec_with = [](const std::string& claim) {
    return parse_spec("schema = 1\n[[claims]]\nname = \"x\"\nequal = [\"N\"]\n" + claim, "s.toml");
  };
  CHECK_THROWS_WITH_AS(
      audit_tables({dense, moe}, spec_with("rows = [\"moe:*\", \"dense:*\"]\nwhere = { compute = "
                                           "2.86e12 }\nbaseline = \"dense:2\"\n")),
      "claim 'x' has no row besides its baseline dense:2 to compare with it (6 rows listed, 0 "
      "kept by where compute = 2.86e12); check rows and where",
      InputError);
  CHECK_THROWS_WITH_AS(
      audit_tables({dense, moe},
                   spec_with("rows = [\"moe:*\", \"dense:*\"]\nwhere = { compute = 2.86e12 }\n")),
      "claim 'x' selects no rows (6 rows listed, 0 kept by where compute = 2.86e12); check rows "
      "and where",
      InputError);
  CHECK_THROWS_WITH_AS(
      audit_tables({dense, moe}, spec_with("rows = [\"dense:2\"]\nbaseline = \"dense:2\"\n")),
      "claim 'x' has no row besides its baseline dense:2 to compare with it (1 row listed); check "
      "rows and where",
      InputError);
  CHECK_THROWS_WITH_AS(audit_tables({dense, moe}, spec_with("rows = [\"moe:1\"]\n")),
                       "claim 'x' selects one row, nothing to compare it with (1 row listed); "
                       "check rows and where",
                       InputError);

  // The intended 2.86e21 keeps moe:1, moe:2 and dense:2 (dense:1 is -2.1 %, dense:3 +90.6 %,
  // moe:3 -51.0 %): 2 of 3 moe rows, 1 of 3 dense rows (in the order `rows` lists the tables);
  // where left out 3, not counting the baseline, which is always covered.
  const AuditReport r = audit_tables(
      {dense, moe}, spec_with("rows = [\"moe:*\", \"dense:*\"]\nwhere = { compute = 2.86e21 }\n"
                              "baseline = \"dense:2\"\n"));
  const ClaimVerdict* c = claim(r, "x");
  REQUIRE(c);
  CHECK(c->rows == std::vector<std::string>{"dense:2", "moe:1", "moe:2"});
  CHECK(c->left_out == std::vector<std::string>{"moe:3", "dense:1", "dense:3"});
  CHECK(c->coverage ==
        "2 of 3 moe rows, 1 of 3 dense rows; where compute = 2.86e21 left out 3: moe:3 dense:1,3");
  const std::string text = render(r, ReportFormat::table);
  CHECK(text.find("  HOLDS  x\n         covers 2 of 3 moe rows, 1 of 3 dense rows; where compute "
                  "= 2.86e21 left out 3: moe:3 dense:1,3\n") != std::string::npos);
  CHECK(render(r, ReportFormat::md).find("| x | 2 of 3 moe rows, 1 of 3 dense rows; where") !=
        std::string::npos);
  CHECK(render(r, ReportFormat::json).find("\"left_out\": [\n        \"moe:3\"") !=
        std::string::npos);
  // A table's own consistency claim covers its rows by definition: no coverage line.
  CHECK(claim(r, "table dense: rows internally consistent")->coverage.empty());
}

TEST_CASE("with a baseline the distance from it is what is tested and printed; the edge holds") {
  // Baseline C 2.86e21. By hand: 2.8886e21 / 2.86e21 = 1.0100 (+1.000 %, exactly the tolerance:
  // holds, though 0.010000000000000009 in doubles); 2.8314e21 / 2.86e21 = 0.9900 (-1.000 %:
  // holds); 2.8887e21 / 2.86e21 = 1.010035 (+1.0035 %: breaks it).
  const ClaimTable t = parse_claim_table(
      "name,C\nbase,2.86e21\nup,2.8886e21\ndown,2.8314e21\nover,2.8887e21\n", "t", "t.csv");
  const AuditSpec spec = parse_spec(R"(schema = 1
[[claims]]
name = "up"
rows = ["t:1-2"]
baseline = "t:1"
equal = ["C"]
[[claims]]
name = "down"
rows = ["t:1", "t:3"]
baseline = "t:1"
equal = ["C"]
[[claims]]
name = "over"
rows = ["t:1", "t:4"]
baseline = "t:1"
equal = ["C"]
[[claims]]
name = "spread at the edge"
rows = ["t:1-2"]
equal = ["C"]
)",
                                    "inline.toml");
  const AuditReport r = audit_tables({t}, spec);
  const std::string text = render(r, ReportFormat::table);
  CAPTURE(text);
  REQUIRE(claim(r, "up"));
  CHECK(claim(r, "up")->holds);
  CHECK(*claim(r, "up")->quantities[0].deviation == doctest::Approx(0.01));
  CHECK(text.find("farthest from the baseline t:2 (+1.000%), tolerance 1.00% -> holds") !=
        std::string::npos);
  CHECK(claim(r, "down")->holds);
  CHECK(text.find("farthest from the baseline t:3 (-1.000%), tolerance 1.00% -> holds") !=
        std::string::npos);
  CHECK_FALSE(claim(r, "over")->holds);
  CHECK(claim(r, "over")->quantities[0].breaking == std::vector<std::string>{"t:4"});
  CHECK(text.find("farthest from the baseline t:4 (+1.003%), tolerance 1.00% -> FAILS") !=
        std::string::npos);
  // Without a baseline the range (2.8886 - 2.86) / 2.86 = 1.000 % is what is tested: holds too.
  CHECK(claim(r, "spread at the edge")->holds);
  CHECK(text.find("range 1.00%, tolerance 1.00% -> holds") != std::string::npos);

  // Baseline in the middle: N 1e9, 0.993e9 (-0.700 %), 1.008e9 (+0.800 %). The range
  // (1.008 - 0.993) / 0.993 = 1.51 % is not what the claim tests; each row is within 1 %.
  const ClaimTable m =
      parse_claim_table("name,N\nbase,1e9\nlow,0.993e9\nhigh,1.008e9\n", "m", "m.csv");
  const AuditSpec mid = parse_spec(
      "schema = 1\n[[claims]]\nname = \"mid\"\nbaseline = \"base\"\nequal = [\"N\"]\n", "m.toml");
  const AuditReport rm = audit_tables({m}, mid);
  CHECK(claim(rm, "mid")->holds);
  CHECK(claim(rm, "mid")->quantities[0].deviation_row == "m:3");
  const std::string mt = render(rm, ReportFormat::table);
  CHECK(mt.find("min 9.93e8 (m:2), max 1.008e9 (m:3), farthest from the baseline m:3 (+0.800%), "
                "tolerance 1.00% -> holds") != std::string::npos);
  CHECK(render(rm, ReportFormat::json).find("\"deviation_row\": \"m:3\"") != std::string::npos);
}

TEST_CASE("shape values are whole numbers within stated bounds, in the spec and in columns") {
  auto spec = [](const std::string& shared) {
    return parse_spec("schema = 1\n[tables.moe7b.shared]\n" + shared + "\n", "s.toml");
  };
  // "24B" reads as 2.4e10 layers: a unit typo, refused before any FLOP is counted.
  CHECK_THROWS_WITH_AS(spec("layers = \"24B\""),
                       "s.toml: [tables.moe7b].shared.layers = \"24B\" (2.4e10): layers must be a "
                       "whole number from 1 to 10000",
                       InputError);
  CHECK_THROWS_WITH_AS(spec("d_model = 2048.5"),
                       "s.toml: [tables.moe7b].shared.d_model = 2048.5: d_model must be a whole "
                       "number from 1 to 1000000",
                       InputError);
  CHECK_THROWS_WITH_AS(spec("layers = 10001"),
                       "s.toml: [tables.moe7b].shared.layers = 10001: layers must be a whole "
                       "number from 1 to 10000",
                       InputError);
  CHECK_THROWS_WITH_AS(spec("layers = 0"), doctest::Contains("from 1 to 10000"), InputError);
  CHECK_THROWS_WITH_AS(spec("d_ffn = 1000001"),
                       "s.toml: [tables.moe7b].shared.d_ffn = 1000001: d_ffn must be a whole "
                       "number from 0 (none) to 1000000",
                       InputError);
  CHECK_THROWS_WITH_AS(spec("experts = 1.5"), doctest::Contains("from 0 (none) to 10000000"),
                       InputError);
  // At the bounds, and 0 where it means none, are accepted; "2k" is 2000, a whole number.
  const AuditSpec ok =
      spec("layers = 10000\ndense_layers = 0\nd_model = \"2k\"\nd_ffn = 1000000\nexperts = 0");
  CHECK(ok.tables[0].shared.at("layers").value == 10000);
  CHECK(ok.tables[0].shared.at("d_model").value == 2000);
  // Non-shape quantities keep their own rules: a fractional epoch count is fine.
  CHECK(spec("epochs = 2.5").tables[0].shared.at("epochs").value == 2.5);
  // The same rule for a column.
  CHECK_THROWS_WITH_AS(parse_claim_table("name,L_layers\na,24B\n", "t", "t.csv"),
                       "t.csv data row 1 column L_layers = 24B (2.4e10): layers must be a whole "
                       "number from 1 to 10000",
                       InputError);
  CHECK_THROWS_WITH_AS(parse_claim_table("name,Dm\na,2048.5\n", "t", "t.csv"),
                       doctest::Contains("d_model must be a whole number"), InputError);
}

TEST_CASE("a leading UTF-8 byte-order mark (Excel's CSV UTF-8) is not part of the first header") {
  const ClaimTable t = parse_claim_table("\xEF\xBB\xBFN,C\n1e9,1e20\n", "t", "t.csv");
  REQUIRE(t.headers.size() == 2);
  CHECK(t.headers[0] == "N");
  CHECK(t.quantities[0] == "total_params");
  CHECK(t.rows[0].at("total_params").value == 1e9);
  // Only a leading one: elsewhere it is still an unknown header.
  CHECK_THROWS_WITH_AS(parse_claim_table("N,\xEF\xBB\xBF"
                                         "C\n1e9,1e20\n",
                                         "t", "t.csv"),
                       doctest::Contains("unknown column"), InputError);
}

TEST_CASE("tolerances: a fraction or a percentage, in (0, 1)") {
  CHECK(parse_tolerance("0.01", "--tolerance") == 0.01);
  CHECK(parse_tolerance("1%", "--tolerance") == doctest::Approx(0.01));
  CHECK(parse_tolerance("0.5%", "--tolerance") == doctest::Approx(0.005));
  CHECK_THROWS_WITH_AS(parse_tolerance("abc", "--tolerance"),
                       "--tolerance abc: not a tolerance; give a fraction in (0, 1) such as 0.01, "
                       "or a percentage such as 1%",
                       InputError);
  CHECK_THROWS_WITH_AS(parse_tolerance("150%", "--tolerance"),
                       "--tolerance 150% is out of range: give a fraction in (0, 1) such as 0.01, "
                       "or a percentage in (0%, 100%) such as 1%",
                       InputError);
  CHECK_THROWS_AS(parse_tolerance("1", "--tolerance"), InputError);
  CHECK_THROWS_AS(parse_tolerance("0%", "--tolerance"), InputError);
  CHECK_THROWS_AS(parse_tolerance("%", "--tolerance"), InputError);
}

TEST_CASE("the report format: -o's extension, --format agreeing with it") {
  CHECK(report_format_for("", "") == ReportFormat::table);
  CHECK(report_format_for("json", "") == ReportFormat::json);
  CHECK(report_format_for("", "x.json") == ReportFormat::json);
  CHECK(report_format_for("", "out/x.md") == ReportFormat::md);
  CHECK(report_format_for("", "x.txt") == ReportFormat::table);
  CHECK(report_format_for("md", "x.md") == ReportFormat::md);
  CHECK(report_format_for("json", "/dev/stdout") == ReportFormat::json);
  CHECK_THROWS_WITH_AS(report_format_for("", "x.html"),
                       "-o x.html: cannot tell the format from the extension '.html'; use .json, "
                       ".md or .txt (terminal text)",
                       InputError);
  CHECK_THROWS_WITH_AS(report_format_for("", "report"),
                       "-o report: cannot tell the format from a name without an extension; use "
                       ".json, .md or .txt (terminal text), or give --format",
                       InputError);
  CHECK_THROWS_WITH_AS(report_format_for("table", "x.json"),
                       "--format table contradicts -o x.json, which is written as json; drop "
                       "--format or change the extension",
                       InputError);
  CHECK_THROWS_WITH_AS(report_format_for("md", "x.txt"),
                       doctest::Contains("which is written as table"), InputError);
  CHECK_THROWS_AS(report_format_for("html", "x.json"), InputError);
}

TEST_CASE("the FLOP convention of a compute claim: as stated, or paper as the assumed default") {
  const ClaimTable a = parse_claim_table("name,C\na1,1e21\na2,1e21\n", "a", "a.csv");
  const ClaimTable b = parse_claim_table("name,C\nb1,1e21\n", "b", "b.csv");
  const std::string claim_toml = "[[claims]]\nname = \"c\"\nequal = [\"C\"]\n";
  auto note = [&](const std::string& tables_toml) {
    const AuditSpec spec = parse_spec("schema = 1\n" + tables_toml + claim_toml, "s.toml");
    return claim(audit_tables({a, b}, spec), "c")->quantities[0].note;
  };
  CHECK(note("").find("FLOPs read as paper training, the default: no table states a convention") !=
        std::string::npos);
  CHECK(note("[tables.a]\nconvention = \"paper\"\n[tables.b]\nconvention = \"paper\"\n")
            .find("FLOPs as each table claims them: paper training") != std::string::npos);
  CHECK(note("[tables.a]\nconvention = \"paper\"\n[tables.b]\nflops = \"training\"\n")
            .find("FLOPs as each table claims them: paper training; paper training, the default, "
                  "assumed for b (no convention stated)") != std::string::npos);
  // Tables that count FLOPs differently are not compared as printed: a megatron C (LM head in)
  // against a paper one, or a forward C (a third of training) against a training one, "held"
  // at +0.00 % with the same numbers printed.
  for (const char* tables :
       {"[tables.a]\nconvention = \"megatron\"\n", "[tables.b]\nflops = \"forward\"\n",
        "[tables.a]\nconvention = \"exact/causal\"\n[tables.b]\nconvention = \"exact/full\"\n"})
    CHECK_THROWS_WITH_AS(note(tables),
                         doctest::Contains("claim 'c' compares C (compute) across "
                                           "tables that count FLOPs differently"),
                         InputError);
  CHECK_THROWS_WITH_AS(note("[tables.a]\nconvention = \"megatron\"\n"),
                       doctest::Contains("(a: megatron training, b: paper training)"), InputError);
  // A where filter and a bound on C read one number per row too.
  const AuditSpec where = parse_spec(
      "schema = 1\n[tables.b]\nflops = \"forward\"\n[[claims]]\nname = \"w\"\n"
      "where = { compute = 1e21 }\nat_least = { epochs = 1 }\n",
      "s.toml");
  CHECK_THROWS_WITH_AS(audit_tables({a, b}, where),
                       doctest::Contains("claim 'w' filters rows by C (compute) across tables"),
                       InputError);
  const AuditSpec bound = parse_spec(
      "schema = 1\n[tables.b]\nflops = \"forward\"\n[[claims]]\nname = \"b\"\n"
      "at_most = { C = 2e21 }\n",
      "s.toml");
  CHECK_THROWS_WITH_AS(audit_tables({a, b}, bound),
                       doctest::Contains("claim 'b' bounds C (compute) across tables"), InputError);
  // One table's paper/causal and another's paper are one reading (paper has its own mask).
  CHECK_NOTHROW(note("[tables.a]\nconvention = \"paper/causal\"\n"));
}

TEST_CASE("a between that breaks names its interval, not the words of an at_most") {
  // Epoch 9 breaks both "at most 8.3" and "between 1.7 and 8.3": two findings, and the reader
  // could not tell them apart (both said "is above the claimed at most 8.3").
  const ClaimTable t = parse_claim_table("label,Epoch\na,2\nb,9\nc,1\n", "ep", "ep.csv");
  const AuditSpec spec = parse_spec(
      "schema = 1\n[[claims]]\nname = \"epochs bounded\"\nat_most = { epochs = 8.3 }\n"
      "between = { epochs = [1.7, 8.3] }\n",
      "s.toml");
  const AuditReport a = audit_tables({t}, spec);
  std::vector<std::string> messages;
  for (const Finding& f : a.findings)
    if (f.severity == Severity::error) messages.push_back(f.message);
  CAPTURE(messages.size());
  REQUIRE(messages.size() == 3);
  CHECK(std::count(messages.begin(), messages.end(),
                   "claim 'epochs bounded': Epoch = 9 is above the claimed at most 8.3") == 1);
  CHECK(std::count(messages.begin(), messages.end(),
                   "claim 'epochs bounded': Epoch = 9 is above the upper end of the claimed [1.7, "
                   "8.3]") == 1);
  CHECK(std::count(messages.begin(), messages.end(),
                   "claim 'epochs bounded': Epoch = 1 is below the lower end of the claimed [1.7, "
                   "8.3]") == 1);
}
