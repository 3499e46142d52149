// The published tables (tests/fixtures/reference, the paper's Tables 12 and 13) through the
// example spec examples/audit-paper/claims.toml. Expected values are worked out by hand here.
//
// 7B MoE row 1: E = 83, K = 1, D_e = D_se = 512, L = 24 with 1 dense layer, D_m = 2048,
// D_ffn = 5464, H = 16, D_h = 128, S = 2048.
//   attention       24·4·2048²            =   402,653,184
//   dense FFN       3·2048·5464           =    33,570,816
//   active MoE      23·3·2048·(512+512)   =   144,703,488
//   router          23·2048·83            =     3,909,632
//   N_a router out  = 580,927,488;  router in = 584,837,120
//     published 5.85e8 (± 5e5): router in fits (−0.028 %), router out is −0.70 % (outside the
//     printed rounding, inside 1 %).
//   N router out = 402,653,184 + 33,570,816 + 23·3·2048·(512 + 83·512) = 6,513,770,496
//   N router in  = 6,517,680,128
//   r_a printed 8.97 %: router in for both = 584,837,120 / 6,517,680,128 = 8.9731 % fits
//     (band ± 0.005); router out 580,927,488 / 6,513,770,496 = 8.918 % does not.
//   paper M (router in, as N_a) = 6·584,837,120 + 12·24·2048·2048 = 3,509,022,720 +
//     1,207,959,552 = 4,716,982,272; printed 4.73e9 is +0.276 %: beyond the printed rounding
//     (± 0.106 %), within 1 % → an info finding, not an error.
//   C = M·D = 4.73e9 · 6.05e11 = 2.86165e21 (printed 2.86e21 ✓); D/N = 6.05e11 / 6,513,770,496
//     = 92.880 (printed 92.88 ✓).
//
// 7B dense row 5: L = 32, H = 32, D_m = 4096, D_ffn = 11008.
//   N = 32·4·4096² + 32·3·4096·11008 = 2,147,483,648 + 4,328,521,728 = 6,476,005,376 (6.48e9 ✓)
//
// Equal N, values the tables print or imply (the derivation with the narrowest rounding band):
//   dense:5 prints 6.48e9. MoE rows have no N column; e.g. row 1: D/(D/N) = 6.05e11/92.88 =
//   6,513,781,223; the largest is row 7: 2.21e11 / 33.83 = 6,532,663,317.
//   Against the baseline: +0.813 % ≤ 1 % → the claim HOLDS at a 1 % tolerance.
//   Recomputed from the shapes (router out): 6,513,770,496 vs 6,476,005,376 = +0.583 %, also
//   inside 1 % (the "0.5 % gap" of the issue): the verdict is HOLDS, with the gap reported.
// Equal C: every row prints 2.86e21: spread 0 → holds.
#include <doctest/doctest.h>

#include <filesystem>

#include "audit_test_util.hpp"
#include "moeplan/audit/audit_tables.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/audit/render.hpp"

using namespace moeplan;
using namespace moeplan::audit;
using namespace moeplan::audit::test;

namespace {
AuditReport reference_audit() {
  const std::filesystem::path spec_path =
      std::filesystem::path(MOEPLAN_SOURCE_DIR) / "examples/audit-paper/claims.toml";
  const AuditSpec spec = load_spec(spec_path);
  const std::string ref = MOEPLAN_REFERENCE_DIR;
  const auto tables = load_claim_tables(
      {ref + "/paper_7b_moe_fixed_compute.csv", ref + "/paper_dense_baselines.csv"}, spec,
      spec_path.parent_path());
  REQUIRE(tables.size() == 2);
  CHECK(tables[0].name == "moe7b");  // matched to the spec's entries by file
  CHECK(tables[1].name == "dense");
  return audit_tables(tables, spec);
}
}  // namespace

TEST_CASE("the paper's 7B tables: every claim holds, no error finding") {
  const AuditReport r = reference_audit();
  for (const Finding& f : r.findings) CHECK_MESSAGE(f.severity != Severity::error, f.message);
  CHECK(r.all_hold());
  CHECK(exit_status(r) == 0);
}

TEST_CASE("the equal-N and equal-C claim, with the numbers worked out above") {
  const AuditReport r = reference_audit();
  const ClaimVerdict* c = claim(r, "7B MoE rows vs 7B dense (C = 2.86e21): equal N and equal C");
  REQUIRE(c);
  CHECK(c->holds);
  // The claim names the 8 MoE rows and dense row 5 (the dense row of C = 2.86e21; row 4 has
  // 2.80e21, −2.1 %): nothing is left out.
  CHECK(c->rows.size() == 9);
  CHECK(c->rows[0] == "dense:5");
  CHECK(c->coverage == "8 of 8 moe7b rows, 1 of 6 dense rows");
  CHECK(c->left_out.empty());
  // The tested distance from the baseline: moe7b:7's N, 2.21e11 / 33.83 / 6.48e9 − 1 = +0.813 %.
  CHECK(c->quantities[0].deviation_row == "moe7b:7");
  CHECK(*c->quantities[0].deviation == doctest::Approx(2.21e11 / 33.83 / 6.48e9 - 1));
  REQUIRE(c->quantities.size() == 2);
  const QuantityVerdict& n = c->quantities[0];
  CHECK(n.quantity == "total_params");
  CHECK(n.min == doctest::Approx(6.48e9));
  CHECK(n.min_row == "dense:5");
  CHECK(n.max == doctest::Approx(2.21e11 / 33.83));
  CHECK(n.max_row == "moe7b:7");
  CHECK(n.rel_range == doctest::Approx(2.21e11 / 33.83 / 6.48e9 - 1));  // 0.813 %
  CHECK(n.holds);
  CHECK(n.note.find("6513770496") != std::string::npos);  // recomputed MoE N (router out)
  CHECK(n.note.find("6476005376") != std::string::npos);  // recomputed dense N
  CHECK(n.note.find("0.58%") != std::string::npos);
  const QuantityVerdict& cq = c->quantities[1];
  CHECK(cq.quantity == "compute");
  CHECK(cq.rel_range == 0.0);
  CHECK(cq.holds);
}

TEST_CASE("MoE row 1: N_a and r_a fit the router-in reading; M is +0.28 % from paper") {
  const AuditReport r = reference_audit();
  // No error or info on N_a of row 1: 5.85e8 fits 584,837,120 within its rounding.
  CHECK(matching(r.findings, Severity::error, "moe7b", 1, "active_params").empty());
  CHECK(matching(r.findings, Severity::info, "moe7b", 1, "active_params").empty());
  // The table as a whole counts the router in N_a: one warning naming it.
  const auto w = matching(r.findings, Severity::warning, "moe7b", 0, "active_params");
  REQUIRE(w.size() == 1);
  CHECK(w[0]->message.find("router") != std::string::npos);
  const auto m = matching(r.findings, Severity::info, "moe7b", 1, "flops_per_token");
  REQUIRE(m.size() == 1);
  CHECK(*m[0]->expected == doctest::Approx(4716982272.0));
  CHECK(*m[0]->rel_diff == doctest::Approx(4.73e9 / 4716982272.0 - 1));
  CHECK(m[0]->message.find("paper (router in) training") != std::string::npos);
}

TEST_CASE("the JSON form carries schema 1, the claims and the findings") {
  const std::string j = render_json(reference_audit());
  CHECK(j.find("\"schema\": 1") != std::string::npos);
  CHECK(j.find("\"claims\"") != std::string::npos);
  CHECK(j.find("\"rel_diff\"") != std::string::npos);
}
