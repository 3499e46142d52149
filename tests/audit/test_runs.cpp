// Our own runs: hand-made record.json fixtures (RECORD.md schema 1), every figure worked by hand.
//
// MoE point "moe-k1": L = 2 (1 dense + 1 MoE), D_m = 8, H = 2, D_h = 4, D_ffn = 16, E = 4, K = 1,
// D_e = D_se = 8, S = 4, V = 16; 2 sequences per step (T = 8 tokens), 7 steps: D = 56 consumed,
// D̂ = 40 unique (10 windows), epochs 1.4.
//   One weight product of m tokens, n outputs, k inputs costs 2mnk in each of forward, input-grad,
//   weight-grad. Per step:
//   projection  4 products/layer · 2mnk = 4·2·8·8·8 = 4096 per layer and phase → 8192 per phase
//   attention   causal core per sequence and head D_h·S(S+1) = 4·4·5 = 80; ×2 seqs ×2 heads = 320;
//               forward 2·320 = 640, input-grad 4·320 = 1280 per layer → (1280, 2560, 0)
//   dense FFN   3 · 2·8·16·8 = 6144 per phase;  expert (8 routed) 3 · 2·8·8·8 = 3072 per phase;
//   shared      3072 per phase;  router 2·8·4·8 = 512 per phase;  LM head 2·8·16·8 = 2048 per phase
//   step total  3·8192 + 3840 + 3·6144 + 3·3072 + 3·3072 + 3·512 + 3·2048 = 72,960; ×7 = 510,720
//   N (router out) = attention 2·4·8·8 = 512 + dense 3·8·16 = 384 + experts 3·8·4·8 = 768 +
//   shared 3·8·8 = 192 = 1856; router 8·4 = 32; N_a = 512 + 384 + 192 + 192 = 1280.
//   paper M = 6·1280 + 12·2·8·4 = 8448 per token; planned C = 8448·56 = 473,088.
//   The `paper` lens on the ledger: projection 172,032 + dense 129,024 + expert 64,512 + shared
//   64,512 + attention-core 26,880 · 2S/(S+1) = 26,880 · 8/5 = 43,008 → 473,088 = the plan.
//   Residuals by category, measured exact/causal vs paper: attention-core 26,880 vs the paper's
//   12·L·D_m·S·D = 768·56 = 43,008 (executed causal = (S+1)/(2S) = 5/8 of it); router 3·7·512 =
//   10,752 and LM head 3·7·2048 = 43,008 are not part of paper.
// Dense point "dense": L = 2, D_ffn = 28 (N = 512 + 2·3·8·28 = 1856, equal N), 1 sequence per
//   step, 10 steps: D = 40 = D̂. paper M = 6·1856 + 768 = 11,904; C = 476,160. The MoE's C is
//   473,088: (473,088 − 476,160)/476,160 = −0.645 %, inside 1 %.
// runs_bad/moe-k1: two routed assignments dropped (expert −2·3·2·8·8 = −768 per phase, −2304 in
//   all, paper C 470,784: −0.487 %) and unique tokens 36 instead of 40 (epochs 1.556, not 1.4).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "audit_test_util.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/render.hpp"
#include "moeplan/audit/runs.hpp"
#include "moeplan/audit/runs_io.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "scratch.hpp"

using namespace moeplan;
using namespace moeplan::audit;
using namespace moeplan::audit::test;

TEST_CASE("a record parses into the plan and the measured ledger") {
  const auto recs = load_run_records(fixture("runs_ok"));
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].point_id == "dense");
  const RunRecord& m = recs[1];
  CHECK(m.point_id == "moe-k1");
  CHECK(m.plan.arch.experts == 4);
  CHECK(m.plan.budget.tokens_consumed == 56);
  CHECK(m.ledger.total() == 510720);
  CHECK(m.ledger.category(FlopCategory::router) == 10752);
}

TEST_CASE("runs that match their plans: every claim holds, residuals explained by category") {
  const AuditReport r = audit_runs(load_run_records(fixture("runs_ok")), {}, {});
  for (const Finding& f : r.findings) CHECK_MESSAGE(f.severity == Severity::info, f.message);
  CHECK(r.all_hold());
  // Planned C through the paper lens: 473,088 exactly.
  const auto c = matching(r.findings, Severity::info, "moe-k1", 0, "compute");
  REQUIRE(c.size() == 1);
  CHECK(*c[0]->found == doctest::Approx(473088.0));
  CHECK(*c[0]->expected == doctest::Approx(473088.0));
  const auto att = matching(r.findings, Severity::info, "moe-k1", 0, "flops:attention-core");
  REQUIRE(att.size() == 1);
  CHECK(*att[0]->expected == doctest::Approx(43008.0));
  CHECK(*att[0]->found == doctest::Approx(26880.0));
  CHECK(att[0]->message.find("(S+1)/(2S)") != std::string::npos);
  const auto router = matching(r.findings, Severity::info, "moe-k1", 0, "flops:router");
  REQUIRE(router.size() == 1);
  CHECK(*router[0]->found == doctest::Approx(10752.0));
  CHECK(router[0]->message.find("router FLOPs are not part of paper") != std::string::npos);
  // Paper counts 0 router FLOPs: a measured 10,752 has no relative difference from 0 (it read
  // +0.00 %), where attention's has one.
  CHECK(*router[0]->expected == 0.0);
  CHECK_FALSE(router[0]->rel_diff);
  REQUIRE(att[0]->rel_diff);
  CHECK(*att[0]->rel_diff == doctest::Approx(26880.0 / 43008.0 - 1));
  // Measured N 1888 = planned 1856 + router 32: explained by the counting reading.
  const auto n = matching(r.findings, Severity::info, "moe-k1", 0, "total_params");
  REQUIRE(n.size() == 1);
  CHECK(n[0]->message.find("router weights in (32") != std::string::npos);
  const ClaimVerdict* eqc = claim(r, "equal training compute C (paper) across the sweep");
  REQUIRE(eqc);
  CHECK(eqc->holds);
  CHECK(eqc->quantities[0].rel_range == doctest::Approx(476160.0 / 473088.0 - 1));
  // What is tested and printed: the farthest point from the baseline, 473,088 / 476,160 − 1.
  REQUIRE(eqc->quantities[0].deviation);
  CHECK(*eqc->quantities[0].deviation == doctest::Approx(473088.0 / 476160.0 - 1));
  CHECK(eqc->quantities[0].deviation_row == "moe-k1");
}

namespace {

// runs_ok at 10^14 times the steps: every token and step count × 10^14 (fits 64 bits: 5.6e15
// tokens), every FLOP count the same digits followed by 14 zeros, written as a string (the
// moe-k1 total 510720 becomes 51072000000000000000 = 5.1e19, past 2^64 = 1.8e19), the C figures
// × 1e14. Everything is linear in the steps, so the widened runs match their plans as runs_ok do.
std::filesystem::path widened_runs() {
  namespace fs = std::filesystem;
  using nlohmann::json;
  const fs::path out = moeplan::test::fresh_dir("audit_wide");
  const int64_t k = 100000000000000;  // 10^14
  const std::string zeros(14, '0');
  auto digits = [&](json& v) {
    const int64_t x = v.get<int64_t>();
    v = x == 0 ? json(0) : json(std::to_string(x) + zeros);
  };
  for (const char* id : {"dense", "moe-k1"}) {
    std::ifstream in(fixture("runs_ok") + "/" + id + "/record.json");
    json r = json::parse(in);
    json& p = r["plan"];
    for (const char* key : {"tokens_consumed", "tokens_unique", "steps"})
      p[key] = p[key].get<int64_t>() * k;
    p["compute"] = p["compute"].get<double>() * 1e14;
    json& m = r["measured"];
    for (const char* key : {"consumed", "loss_bearing", "unique", "windows"})
      m["tokens"][key] = m["tokens"][key].get<int64_t>() * k;
    m["steps"] = m["steps"].get<int64_t>() * k;
    json& f = m["flops"];
    for (auto& [cat, phases] : f["by_category"].items())
      for (auto& [phase, v] : phases.items()) digits(v);
    digits(f["total"]);
    digits(f["elementwise"]);
    for (auto& [label, v] : f["conventions"].items()) v = v.get<double>() * 1e14;
    for (const char* key : {"paper", "plan_paper"})
      m["compute"][key] = m["compute"][key].get<double>() * 1e14;
    fs::create_directories(out / id);
    std::ofstream(out / id / "record.json") << r.dump(1);
  }
  return out;
}

// runs_ok copied to `dir`, for tests that edit moe-k1's record: returns that record as written.
nlohmann::json copy_runs_ok(const std::filesystem::path& dir) {
  nlohmann::json moe;
  for (const char* id : {"dense", "moe-k1"}) {
    std::ifstream in(fixture("runs_ok") + "/" + id + "/record.json");
    const nlohmann::json r = nlohmann::json::parse(in);
    if (std::string(id) == "moe-k1") moe = r;
    std::filesystem::create_directories(dir / id);
    std::ofstream(dir / id / "record.json") << r.dump();
  }
  return moe;
}

// The runs in `dir` audited with moe-k1's record replaced by `moe`.
AuditReport audit_with_moe(const std::filesystem::path& dir, const nlohmann::json& moe) {
  std::ofstream(dir / "moe-k1" / "record.json") << moe.dump();
  return audit_runs(load_run_records(dir.string()), {}, {});
}
}  // namespace

TEST_CASE(
    "runs past 2^64 FLOPs: the ledger is read exactly and the audit holds as at small scale") {
  const auto recs = load_run_records(widened_runs().string());
  REQUIRE(recs.size() == 2);
  const RunRecord& m = recs[1];
  REQUIRE(m.point_id == "moe-k1");
  CHECK(to_string(m.ledger.total()) == "51072000000000000000");
  CHECK(to_string(m.ledger_total) == "51072000000000000000");
  // Router: 3 phases × 3584 per phase in runs_ok = 10,752, here 1,075,200,000,000,000,000.
  CHECK(to_string(m.ledger.category(FlopCategory::router)) == "1075200000000000000");
  CHECK(m.plan.budget.steps == 700000000000000);
  const AuditReport r = audit_runs(recs, {}, {});
  for (const Finding& f : r.findings) CHECK_MESSAGE(f.severity == Severity::info, f.message);
  CHECK(r.all_hold());
  const auto c = matching(r.findings, Severity::info, "moe-k1", 0, "compute");
  REQUIRE(c.size() == 1);
  CHECK(*c[0]->found == doctest::Approx(473088e14));
  const auto att = matching(r.findings, Severity::info, "moe-k1", 0, "flops:attention-core");
  REQUIRE(att.size() == 1);
  CHECK(*att[0]->expected == doctest::Approx(43008e14));
  CHECK(*att[0]->found == doctest::Approx(26880e14));
  const ClaimVerdict* eqc = claim(r, "equal training compute C (paper) across the sweep");
  REQUIRE(eqc);
  CHECK(eqc->holds);
  CHECK(eqc->quantities[0].rel_range == doctest::Approx(476160.0 / 473088.0 - 1));

  // The same total as a bare JSON integer past 2^64 (as Python's json writes one): a JSON
  // reader can hold it only as a double, which has lost its last digits, so it is refused.
  const std::filesystem::path f = widened_runs() / "moe-k1" / "record.json";
  std::string text;
  {
    std::ifstream in(f);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string quoted = "\"total\": \"51072000000000000000\"";
  const size_t at = text.find(quoted);
  REQUIRE(at != std::string::npos);
  text.replace(at, quoted.size(), "\"total\": 51072000000000000000");
  std::ofstream(f) << text;
  CHECK_THROWS_WITH_AS(load_run_records(f.parent_path().parent_path().string()),
                       doctest::Contains("record.json: 'measured.flops.total' is missing or "
                                         "not a FLOP count (0 to 10^36 - 1, as a JSON integer "
                                         "below 2^64 or a string of decimal digits)"),
                       InputError);
}

TEST_CASE("runs past 2^64 FLOPs: one FLOP missing of 5.1e19 is found, which a double cannot see") {
  // moe-k1's expert products are 3 × 21504 × 10^14 = 6451200000000000000; one FLOP less in the
  // forward phase (and in the total) is the same double (6.4512e18 has 53 bits of mantissa).
  auto recs = load_run_records(widened_runs().string());
  RunRecord& m = recs[1];
  m.ledger.flops[int(FlopCategory::expert)][int(Phase::forward)] -= 1;
  m.ledger_total -= 1;
  CHECK(double(m.ledger.category(FlopCategory::expert)) == 6451200000000000000.0);
  const AuditReport r = audit_runs(recs, {}, {});
  const auto w = matching(r.findings, Severity::warning, "moe-k1", 0, "flops:expert");
  REQUIRE(w.size() == 1);
  CHECK_MESSAGE(w[0]->message.find("expert FLOPs: measured 6451199999999999999 vs analytic "
                                   "6451200000000000000") != std::string::npos,
                w[0]->message);
  CHECK(w[0]->message.find("capacity drops") != std::string::npos);
  // --format json carries the exact counts beside the doubles, which are equal here.
  const nlohmann::json j = nlohmann::json::parse(render_json(r));
  bool seen = false;
  for (const auto& f : j.at("findings"))
    if (f.at("quantity") == "flops:expert" && f.at("severity") == "warning") {
      seen = true;
      CHECK(f.at("expected") == f.at("found"));
      CHECK(f.at("expected_exact") == "6451200000000000000");
      CHECK(f.at("found_exact") == "6451199999999999999");
    }
  CHECK(seen);
  // The record's total disagreeing with its categories by one FLOP is an error.
  recs[1].ledger_total += 1;
  const AuditReport r2 = audit_runs(recs, {}, {});
  const auto e = matching(r2.findings, Severity::error, "moe-k1", 0, "flops");
  REQUIRE(e.size() == 1);
  CHECK_MESSAGE(e[0]->message.find("flops.total 51072000000000000000 is not the sum of its "
                                   "categories 51071999999999999999") != std::string::npos,
                e[0]->message);
}

TEST_CASE("a record's FLOP ledger must be whole: a missing or negative count is refused") {
  namespace fs = std::filesystem;
  const fs::path dir = widened_runs();
  const fs::path f = dir / "moe-k1" / "record.json";
  nlohmann::json original;
  {
    std::ifstream in(f);
    original = nlohmann::json::parse(in);
  }
  auto refused = [&](const nlohmann::json& r) {
    std::ofstream(f) << r.dump();
    try {
      load_run_records(dir.string());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(read)");
  };
  nlohmann::json r = original;
  r["measured"]["flops"]["by_category"]["padding"].erase("forward");
  CHECK(refused(r).find("record.json: 'measured.flops.by_category.padding.forward' is missing or "
                        "not a FLOP count") != std::string::npos);
  for (const nlohmann::json& bad :
       {nlohmann::json(-1), nlohmann::json("-1"), nlohmann::json("5e19"), nlohmann::json(1.5),
        nlohmann::json("170141183460469231731687303715884105727")}) {  // 2^127 - 1
    r = original;
    r["measured"]["flops"]["by_category"]["expert"]["forward"] = bad;
    CHECK_MESSAGE(refused(r).find("'measured.flops.by_category.expert.forward' is missing or not a "
                                  "FLOP count") != std::string::npos,
                  bad.dump());
  }
  // Every other count is whole and not negative, refused by its full key rather than rounded.
  const std::pair<std::vector<const char*>, nlohmann::json> counts[] = {
      {{"measured", "tokens", "consumed"}, 56.4}, {{"measured", "tokens", "consumed"}, -5},
      {{"measured", "tokens", "consumed"}, 1e30}, {{"measured", "total_params"}, -1},
      {{"plan", "arch", "d_model"}, 8.5},         {{"schema"}, 1.4}};
  for (const auto& [keys, bad] : counts) {
    r = original;
    nlohmann::json* at = &r;
    std::string path;
    for (const char* k : keys) {
      at = &(*at)[k];
      if (!path.empty()) path += '.';
      path.append(k);
    }
    *at = bad;
    CHECK_MESSAGE(refused(r).find("'" + path + "' is missing or not a whole number >= 0") !=
                      std::string::npos,
                  path, " = ", bad.dump(), ": ", refused(r));
  }
  r = original;
  r["measured"]["tokens"]["epochs"] = "1.4";
  CHECK(refused(r).find("'measured.tokens.epochs' is missing or not a finite number") !=
        std::string::npos);
  // A validation ledger counts evaluations: without val_curve to say them, the record is damaged.
  r = original;
  r["measured"]["flops"]["validation"] = r["measured"]["flops"];
  r["measured"]["flops"]["validation"].erase("validation");
  r.erase("val_curve");
  CHECK(refused(r).find("'val_curve' is missing or not an array") != std::string::npos);
  r["val_curve"] = "oops";
  CHECK(refused(r).find("'val_curve' is missing or not an array") != std::string::npos);
  // Its entries, and the loss curve's, are what `moeplan report` reads: objects with numbers.
  r["val_curve"] = {1, 2};
  CHECK(refused(r).find("'val_curve[0]' is missing or not an object") != std::string::npos);
  r["val_curve"] = nlohmann::json::array();
  r["loss_curve"] = {{{"tokens_consumed", 1}}};
  CHECK(refused(r).find("'loss_curve[0].train_loss' is missing or not a number >= 0") !=
        std::string::npos);
  r["loss_curve"] = nlohmann::json::array();
  r["val_curve"] = {{{"step", 1}, {"val_bpc", 2.0}, {"parts", {{"facts", "x"}}}}};
  CHECK(refused(r).find("'val_curve[0].parts.facts' is missing or not a number") !=
        std::string::npos);
  // A final BPC of its own, not its last evaluation's (3.6 against 2.0): a hand edit.
  r["val_curve"] = {{{"step", 1}, {"val_bpc", 2.0}}};
  CHECK(refused(r).find("'final_val_bpc' is missing or not the last evaluation's val_bpc, 2 "
                        "(val_curve[0])") != std::string::npos);
  // What `run` writes and `moeplan report` reads of a complete record: required here too.
  for (const char* key : {"train_seconds", "final_val_bpc"}) {
    r = original;
    r.erase(key);
    CHECK(refused(r).find(std::string("'") + key + "' is missing or not a finite number") !=
          std::string::npos);
  }
  r = original;
  r["measured"].erase("steps");
  CHECK(refused(r).find("'measured.steps' is missing or not a whole number") != std::string::npos);
  r = original;
  r["measured"]["compute"]["within_rounding"] = "yes";
  CHECK(refused(r).find("'measured.compute.within_rounding' is missing or not true or false") !=
        std::string::npos);
  // A status `run` never writes (a hand edit): damage, not a point to pass over with a warning.
  r = original;
  r["status"] = "done";
  CHECK(refused(r).find("'status' is \"done\" (valid: \"running\", \"complete\")") !=
        std::string::npos);
  r = original;
  r["measured"]["flops"]["elementwise"] = "-1";
  CHECK(refused(r).find("'measured.flops.elementwise' is missing or not a FLOP count") !=
        std::string::npos);
  CHECK(refused(original) == "(read)");
}

TEST_CASE("the validation ledger: forward only, one pass over the held-out windows each time") {
  // moe-k1 evaluated twice on 2 held-out windows (8 tokens): each evaluation is one training
  // step's forward (2 sequences of S = 4). Per evaluation, from the header's products:
  //   projection 8192, attention-core 2 layers · 640 = 1280, dense-ffn 6144, expert 3072,
  //   shared-expert 3072, router 512, lm-head 2048: 24,320. Two evaluations: 48,640.
  namespace fs = std::filesystem;
  using nlohmann::json;
  const fs::path dir = moeplan::test::fresh_dir("audit_validation");
  json rec = copy_runs_ok(dir);
  const std::pair<const char*, int64_t> per_eval[] = {
      {"projection", 8192},    {"attention-core", 1280}, {"dense-ffn", 6144}, {"expert", 3072},
      {"shared-expert", 3072}, {"router", 512},          {"lm-head", 2048},   {"padding", 0},
      {"recompute", 0},        {"aux-loss", 0}};
  json v;
  for (const auto& [cat, f] : per_eval)
    v["by_category"][cat] = {{"forward", 2 * f}, {"input-grad", 0}, {"weight-grad", 0}};
  v["total"] = 48640;
  v["elementwise"] = 100;
  rec["measured"]["flops"]["validation"] = v;
  rec["data"] = {{"source", "builtin"}, {"description", "d"}, {"validation_tokens", 8}};
  rec["val_curve"] =
      json::array({json{{"step", 3}, {"val_bpc", 2.5}}, json{{"step", 7}, {"val_bpc", 2.1}}});
  rec["final_val_bpc"] = 2.1;  // the last evaluation's, as `run` writes it
  auto audit = [&](const json& r) { return audit_with_moe(dir, r); };
  auto errors = [](const AuditReport& r, const std::string& q) {
    return matching(r.findings, Severity::error, "moe-k1", 0, q);
  };
  {
    const AuditReport r = audit(rec);
    for (const Finding& f : r.findings)
      CHECK_MESSAGE(f.quantity.rfind("validation", 0) != 0, f.message);
    const RunRecord m = load_run_records(dir.string())[1];
    CHECK(m.has_validation_ledger);
    CHECK(m.evaluations == 2);
    CHECK(m.validation_ledger.total() == 48640);
  }
  {  // one router FLOP more than two passes: not explained
    json r = rec;
    r["measured"]["flops"]["validation"]["by_category"]["router"]["forward"] = 1025;
    r["measured"]["flops"]["validation"]["total"] = 48641;
    const AuditReport a = audit(r);
    const auto e = errors(a, "validation-flops:router");
    REQUIRE(e.size() == 1);
    CHECK_MESSAGE(e[0]->message.find("validation exact/causal router FLOPs: measured 1025 vs "
                                     "analytic 1024 for 2 evaluations of 8 held-out tokens") !=
                      std::string::npos,
                  e[0]->message);
  }
  {  // a plan edited to match a forged ledger: its M against its arch, D against its steps
    json r = rec;
    r["plan"]["flops_per_token"] = r["plan"]["flops_per_token"].get<double>() * 1.008;
    r["plan"]["compute"] =
        r["plan"]["flops_per_token"].get<double>() * r["plan"]["tokens_consumed"].get<double>();
    CHECK_THROWS_WITH_AS(audit(r), doctest::Contains("'plan.flops_per_token' = "),
                         moeplan::InputError);
    r = rec;
    r["plan"]["steps"] = r["plan"]["steps"].get<int64_t>() - 1;
    CHECK_THROWS_WITH_AS(audit(r), doctest::Contains("'plan.tokens_consumed'"),
                         moeplan::InputError);
  }
  {  // what the record rules out itself is an error, not explained as info: padding or
     // recompute on the cpu device, recompute in an evaluation, auxiliary products without the
     // ERC loss, fewer routed products in a dropless run
    auto with = [&](const std::string& cat, int64_t more, const char* ledger) {
      json r = rec;
      json& l = std::string(ledger) == "validation" ? r["measured"]["flops"]["validation"]
                                                    : r["measured"]["flops"];
      l["by_category"][cat]["forward"] = l["by_category"][cat]["forward"].get<int64_t>() + more;
      l["total"] = l["total"].get<int64_t>() + more;
      return r;
    };
    CHECK(errors(audit(with("padding", 1000, "training")), "flops:padding").size() == 1);
    CHECK(errors(audit(with("recompute", 1000, "training")), "flops:recompute").size() == 1);
    json eval_recompute = with("recompute", 1000, "validation");
    eval_recompute["device"] = "cuda";  // not the cpu rule: an evaluation recomputes nothing
    CHECK(errors(audit(eval_recompute), "validation-flops:recompute").size() == 1);
    json eval_aux = with("aux-loss", 1000, "validation");
    eval_aux["device"] = "cuda";
    eval_aux["train"] = {{"erc_loss", 0.01}, {"capacity_factor", 0.0}};
    CHECK(errors(audit(eval_aux), "validation-flops:aux-loss").size() == 1);
    json gpu = with("padding", 1000, "training");  // a GPU's padding is explained
    gpu["device"] = "cuda";
    CHECK(errors(audit(gpu), "flops:padding").empty());
    json aux = with("aux-loss", 1000, "training");
    aux["train"] = {{"erc_loss", 0.0}, {"capacity_factor", 0.0}};
    CHECK(errors(audit(aux), "flops:aux-loss").size() == 1);
    aux["train"]["erc_loss"] = 0.01;  // with the ERC loss on: its products, explained
    CHECK(errors(audit(aux), "flops:aux-loss").empty());
    json dropless = with("expert", -48, "training");
    dropless["train"] = {{"erc_loss", 0.0}, {"capacity_factor", 0.0}};
    CHECK(errors(audit(dropless), "flops:expert").size() == 1);
  }
  {  // three evaluations in the curve, two in the ledger: every category differs
    json r = rec;
    r["val_curve"].push_back(json{{"step", 9}, {"val_bpc", 2.0}});
    r["final_val_bpc"] = 2.0;
    const AuditReport a = audit(r);
    CHECK(errors(a, "validation-flops:projection").size() == 1);
    CHECK(errors(a, "validation-flops:lm-head").size() == 1);
    CHECK(matching(a.findings, Severity::warning, "moe-k1", 0, "validation-flops:expert").size() ==
          1);  // fewer routed products than dropless: read as capacity drops
  }
  {  // a backward pass in the validation ledger, and a total that is not the sum
    json r = rec;
    r["measured"]["flops"]["validation"]["by_category"]["lm-head"]["input-grad"] = 4096;
    const AuditReport a = audit(r);
    const auto e = errors(a, "validation-flops");
    REQUIRE(e.size() == 2);
    CHECK(e[0]->message.find("flops.validation.total 48640 is not the sum of its categories "
                             "52736") != std::string::npos);
    CHECK(e[1]->message.find("4096 input-grad FLOPs: an evaluation runs no backward pass") !=
          std::string::npos);
  }
  {  // held-out tokens that are not whole windows of S = 4 (run scores whole windows): it was an
     // info line, the ledger left unchecked, however large
    json r = rec;
    r["data"]["validation_tokens"] = 9;
    r["measured"]["flops"]["validation"]["by_category"]["projection"]["forward"] = 10'000'000;
    const AuditReport a = audit(r);
    const auto e = errors(a, "validation-flops");
    REQUIRE(e.size() >= 1);
    CHECK_MESSAGE(e.back()->message.find("data.validation_tokens 9 is not a whole number of "
                                         "windows of S = 4") != std::string::npos,
                  e.back()->message);
  }
  {  // a damaged count is refused by its full key
    json r = rec;
    r["measured"]["flops"]["validation"]["by_category"]["expert"]["forward"] = -6;
    std::ofstream(dir / "moe-k1" / "record.json") << r.dump();
    CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                         doctest::Contains("'measured.flops.validation.by_category.expert."
                                           "forward' is missing or not a FLOP count"),
                         InputError);
  }
  {  // a record that does not say its held-out size: said, not compared
    json r = rec;
    r.erase("data");
    const AuditReport a = audit(r);
    const auto i = matching(a.findings, Severity::info, "moe-k1", 0, "validation-flops");
    REQUIRE(i.size() == 1);
    CHECK(i[0]->message.find("not compared") != std::string::npos);
  }
}

TEST_CASE("planted defects in a run: capacity drops and unique data off the plan") {
  const AuditReport r = audit_runs(load_run_records(fixture("runs_bad")), {}, {});
  const auto drop = matching(r.findings, Severity::warning, "moe-k1", 0, "flops:expert");
  REQUIRE(drop.size() == 1);
  CHECK(*drop[0]->expected == doctest::Approx(64512.0));
  CHECK(*drop[0]->found == doctest::Approx(64512.0 - 2304.0));
  CHECK(drop[0]->message.find("capacity drops") != std::string::npos);
  const auto u = matching(r.findings, Severity::error, "moe-k1", 0, "tokens_unique");
  REQUIRE(u.size() == 2);  // against the plan, and against the dense baseline's D̂ (the claim)
  CHECK(*u[0]->expected == doctest::Approx(40.0));
  CHECK(*u[0]->found == doctest::Approx(36.0));
  const auto e = matching(r.findings, Severity::error, "moe-k1", 0, "epochs");
  REQUIRE(e.size() == 1);
  CHECK(*e[0]->expected == doctest::Approx(1.4));
  CHECK(*e[0]->found == doctest::Approx(56.0 / 36.0));
  const ClaimVerdict* du = claim(r, "equal unique data D̂ (strict reuse) across the sweep");
  REQUIRE(du);
  CHECK_FALSE(du->holds);
  CHECK(du->quantities[0].breaking == std::vector<std::string>{"moe-k1"});
  // C through the paper lens: 470,784 vs plan 473,088: −0.487 %, inside 1 %: info, no error.
  const auto c = matching(r.findings, Severity::info, "moe-k1", 0, "compute");
  REQUIRE(c.size() == 1);
  CHECK(*c[0]->rel_diff == doctest::Approx(470784.0 / 473088.0 - 1));
  // Against the dense baseline: (470,784 − 476,160)/476,160 = −1.129 %: the equal-C claim fails.
  const ClaimVerdict* eqc = claim(r, "equal training compute C (paper) across the sweep");
  REQUIRE(eqc);
  CHECK_FALSE(eqc->holds);
  const auto ce = matching(r.findings, Severity::error, "moe-k1", 0, "compute");
  REQUIRE(ce.size() == 1);
  CHECK(*ce[0]->rel_diff == doctest::Approx(470784.0 / 476160.0 - 1));
  CHECK_FALSE(r.all_hold());
}

TEST_CASE("a record's summary is held to its counts: steps and C [paper], as the report shows") {
  // moe-k1 ran 7 steps of T = 8 tokens (56 consumed) and its ledger through the paper lens is
  // 473,088 (the header): a record saying 8 steps or C [paper] 480,000 contradicts itself, and
  // `moeplan report` would show the contradiction as the run's figure.
  namespace fs = std::filesystem;
  using nlohmann::json;
  const fs::path dir = moeplan::test::fresh_dir("audit_summary");
  json rec = copy_runs_ok(dir);
  auto audit = [&](const json& r) { return audit_with_moe(dir, r); };
  {
    json r = rec;
    r["measured"]["steps"] = 8;
    const AuditReport a = audit(r);
    const auto e = matching(a.findings, Severity::error, "moe-k1", 0, "steps");
    REQUIRE(e.size() == 2);
    CHECK(e[0]->message == "optimizer steps: measured 8 vs planned 7 (+14.2857%)");
    CHECK(e[1]->message ==
          "the record's steps 8 is not its consumed tokens / tokens per step (56 / 8 = 7)");
    CHECK_FALSE(a.all_hold());
  }
  {
    json r = rec;
    r["measured"]["compute"]["paper"] = 480000.0;
    const AuditReport a = audit(r);
    // An error, not a warning: the report reads this figure (its C column, its equal C).
    const auto w = matching(a.findings, Severity::error, "moe-k1", 0, "compute");
    REQUIRE(w.size() == 1);
    CHECK(w[0]->message ==
          "the record's measured.compute.paper 480000 differs from the paper lens applied to its "
          "ledger 473088");
  }
  // As written, neither is found.
  const AuditReport ok = audit(rec);
  CHECK(matching(ok.findings, Severity::error, "moe-k1", 0, "steps").empty());
  CHECK(matching(ok.findings, Severity::error, "moe-k1", 0, "compute").empty());
}

TEST_CASE("a sweep planned with the router in N_a names that reading in its C claim") {
  // --count-router: paper's 6·N_a counts the router, so the sweep's C is "paper (router in)",
  // as grid and run print it; the claim said "(paper)".
  auto recs = load_run_records(fixture("runs_ok"));
  for (RunRecord& r : recs) r.plan.arch.count_router = true;
  const AuditReport r = audit_runs(recs, {}, {});
  CHECK(claim(r, "equal training compute C (paper (router in)) across the sweep"));
  CHECK_FALSE(claim(r, "equal training compute C (paper) across the sweep"));
}

TEST_CASE(
    "records of one sweep: one convention, reading and reuse rule; loose reuse claims equal "
    "epochs") {
  // Put together from two sweeps, equal C compared a megatron C with a paper one, and one loose
  // point switched the equal-D̂ claim off for every point.
  auto recs = load_run_records(fixture("runs_ok"));
  auto mixed = recs;
  mixed[1].plan.convention = Convention::megatron;
  CHECK_THROWS_WITH_AS(audit_runs(mixed, {}, {}),
                       doctest::Contains("point 'moe-k1' was planned in megatron with strict "
                                         "reuse, point 'dense' in paper with strict reuse: the "
                                         "records are not one sweep"),
                       InputError);
  mixed = recs;
  mixed[1].plan.budget.reuse = Reuse::loose;
  CHECK_THROWS_WITH_AS(audit_runs(mixed, {}, {}),
                       doctest::Contains("in paper with loose reuse, point 'dense' in paper with "
                                         "strict reuse"),
                       InputError);
  mixed[1].plan.arch.count_router = true;
  mixed[1].plan.budget.reuse = Reuse::strict;
  CHECK_THROWS_WITH_AS(audit_runs(mixed, {}, {}), doctest::Contains("paper (router in)"),
                       InputError);
  // Both loose: the claim is one number of epochs, and 1.4 (moe-k1) against 1.0 breaks it.
  for (RunRecord& r : recs) r.plan.budget.reuse = Reuse::loose;
  const AuditReport loose = audit_runs(recs, {}, {});
  CHECK_FALSE(claim(loose, "equal unique data D̂ (strict reuse) across the sweep"));
  const ClaimVerdict* e = claim(loose, "equal epochs (loose reuse) across the sweep");
  REQUIRE(e);
  CHECK_FALSE(e->holds);
  CHECK(e->quantities[0].deviation == doctest::Approx(0.4));
}

TEST_CASE("a ledger whose categories hold the right totals split otherwise between passes") {
  // The dense record's projection FLOPs all booked as forward: every category total is right,
  // but no training step runs without its backward pass. It passed every check.
  const auto dir = std::filesystem::temp_directory_path() / "moeplan-audit-phases";
  std::filesystem::remove_all(dir);
  nlohmann::json moe = copy_runs_ok(dir);
  nlohmann::json& proj = moe["measured"]["flops"]["by_category"]["projection"];
  const int64_t total = proj["forward"].get<int64_t>() + proj["input-grad"].get<int64_t>() +
                        proj["weight-grad"].get<int64_t>();
  proj = {{"forward", total}, {"input-grad", 0}, {"weight-grad", 0}};
  const AuditReport r = audit_with_moe(dir, moe);
  const auto e = matching(r.findings, Severity::error, "moe-k1", 0, "flops:projection");
  REQUIRE(e.size() == 1);
  CHECK_MESSAGE(e[0]->message.find("the same total, split as no training step splits it") !=
                    std::string::npos,
                e[0]->message);
  CHECK_FALSE(r.all_hold());
  std::filesystem::remove_all(dir);
}

TEST_CASE("runs without a dense baseline are warned of") {
  auto recs = load_run_records(fixture("runs_ok"));
  const AuditReport with_dense = audit_runs(recs, {}, {});
  CHECK(matching(with_dense.findings, Severity::warning, "moe-k1", 0, "baseline").empty());
  // The dense record read as a second MoE point: two points, no baseline.
  recs[0].plan.role = "moe";
  recs[0].point_id = "moe-k0";
  const AuditReport r = audit_runs(recs, {}, {});
  const auto w = matching(r.findings, Severity::warning, "moe-k0", 0, "baseline");
  REQUIRE(w.size() == 1);
  CHECK(w[0]->message.find("no complete dense baseline record") == 0);
}

TEST_CASE("a record whose plan's N is not what its arch gives is refused") {
  // Twice the experts under the printed N: the measured N was compared with the printed one only,
  // so every claim held on a model of another size.
  const auto dir = std::filesystem::temp_directory_path() / "moeplan-audit-arch-n";
  std::filesystem::remove_all(dir);
  nlohmann::json moe = copy_runs_ok(dir);
  moe["plan"]["arch"]["experts"] = moe["plan"]["arch"]["experts"].get<int64_t>() * 2;
  std::ofstream(dir / "moe-k1" / "record.json") << moe.dump();
  CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                       doctest::Contains("'plan.total_params' = 1856 disagrees with its arch"),
                       InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a runs folder with two dense baselines is refused") {
  // Every equal claim is measured against the dense baseline: with two, against whichever
  // sorted first.
  const auto dir = std::filesystem::temp_directory_path() / "moeplan-audit-two-dense";
  std::filesystem::remove_all(dir);
  copy_runs_ok(dir);
  std::ifstream in(dir / "dense" / "record.json");
  nlohmann::json other = nlohmann::json::parse(in);
  other["point_id"] = "a-dense";
  other["plan"]["id"] = "a-dense";
  std::filesystem::create_directories(dir / "a-dense");
  std::ofstream(dir / "a-dense" / "record.json") << other.dump();
  CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                       doctest::Contains("holds 2 dense baselines (a-dense, dense)"), InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("unusable run folders") {
  CHECK_THROWS_WITH_AS(load_run_records(fixture("no-such-runs")), doctest::Contains("no-such-runs"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_run_record("{\"schema\": 1, \"point_id\": \"x\"}", "r.json"),
                       doctest::Contains("'status'"), InputError);
  CHECK_THROWS_WITH_AS(parse_run_record("{not json", "r.json"), doctest::Contains("r.json"),
                       InputError);
  // An id `moeplan run` could not have written (a line break, an ESC): refused, shown escaped.
  CHECK_THROWS_WITH_AS(
      parse_run_record("{\"schema\": 1, \"point_id\": \"a\\u001b[31m\", \"status\": \"complete\"}",
                       "r.json"),
      doctest::Contains("r.json: 'point_id' is \"a\\u001b[31m\" (a point id is non-empty"),
      InputError);
  // A number past a double (1e400) is nlohmann's out_of_range, not a parse_error: it ended the
  // audit with the raw exception and no file named.
  CHECK_THROWS_WITH_AS(parse_run_record("{\"schema\": 1, \"wall_seconds\": 1e400}", "r.json"),
                       doctest::Contains("r.json: not valid JSON"), InputError);
}

TEST_CASE("a runs folder: entries that are no point's folder are passed over, not a crash") {
  // A looping link ended the audit with a raw filesystem exception (exit 70); it, a dangling link
  // and a file are no point's folder.
  const std::filesystem::path dir = moeplan::test::fresh_dir("audit_loop");
  copy_runs_ok(dir);
  std::filesystem::create_directory_symlink("loop", dir / "loop");
  std::filesystem::create_directory_symlink("nowhere", dir / "dangling");
  std::ofstream(dir / "notes.txt") << "x";
  CHECK(load_run_records(dir.string()).size() == 2);
  // The JSON library's words without its exception tag.
  std::ofstream(dir / "moe-k1" / "record.json") << "{\"a\":";
  try {
    load_run_records(dir.string());
    FAIL("a truncated record was read");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(
        what.find("record.json: not valid JSON (parse error at line 1") != std::string::npos, what);
    CHECK(what.find("[json.exception") == std::string::npos);
    // What the owner can do about it, on the same line: no checkpoint here to rebuild it from.
    CHECK_MESSAGE(what.ends_with("(move the point's folder away and run it again)"), what);
    CHECK(what.find('\n') == std::string::npos);
  }
  // Beside the point's checkpoint, removing only record.json and rerunning rebuilds it.
  std::filesystem::create_directories(dir / "moe-k1" / "checkpoint");
  std::ofstream(dir / "moe-k1" / "checkpoint" / "state.ckpt") << "x";
  CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                       doctest::Contains("(remove only record.json and run the sweep again, which "
                                         "resumes from the point's checkpoint"),
                       InputError);
  // A record that parses but is damaged (an edited count) is given the remedy too.
  std::ifstream in(fixture("runs_ok") + "/moe-k1/record.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["plan"]["total_params"] = j["plan"]["total_params"].get<int64_t>() + 1;
  std::ofstream(dir / "moe-k1" / "record.json") << j.dump();
  CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                       doctest::Contains("disagrees with its arch, which gives"), InputError);
  CHECK_THROWS_WITH_AS(load_run_records(dir.string()),
                       doctest::Contains("was edited (remove only record.json"), InputError);
}

TEST_CASE("against manifest points: a planned point without a record, a record off the plan") {
  const auto recs = load_run_records(fixture("runs_ok"));
  std::vector<Plan> planned = {recs[0].plan, recs[1].plan};
  // The manifest plans a third point not run yet, and plans the MoE for 64 consumed tokens (8
  // steps): the record (56 consumed) came from a different plan, and its tokens are 56 vs 64.
  Plan extra = recs[1].plan;
  extra.id = "moe-k2";
  planned.push_back(extra);
  planned[1].budget.tokens_consumed = 64;
  const AuditReport r = audit_runs(recs, planned, {});
  // The point not run yet: the sweep is incomplete, and that claim fails (exit 1), not a warning.
  CHECK(matching(r.findings, Severity::error, "moe-k2", 0, "record").size() == 1);
  const ClaimVerdict* all = claim(r, "every point of the sweep has a complete record");
  REQUIRE(all);
  CHECK_FALSE(all->holds);
  CHECK(all->rows == std::vector<std::string>{"dense", "moe-k1", "moe-k2"});
  // With every planned point recorded and complete, it holds.
  const AuditReport ok = audit_runs(recs, {recs[0].plan, recs[1].plan}, {});
  REQUIRE(claim(ok, "every point of the sweep has a complete record"));
  CHECK(claim(ok, "every point of the sweep has a complete record")->holds);
  // A record still running fails it as well, with or without a manifest.
  std::vector<RunRecord> running = recs;
  running[1].status = "running";
  const AuditReport rr = audit_runs(running, {}, {});
  REQUIRE(claim(rr, "every point of the sweep has a complete record"));
  CHECK_FALSE(claim(rr, "every point of the sweep has a complete record")->holds);
  CHECK(matching(rr.findings, Severity::error, "moe-k1", 0, "status").size() == 1);
  CHECK_FALSE(rr.all_hold());
  const auto plan_diff = matching(r.findings, Severity::warning, "moe-k1", 0, "plan");
  REQUIRE(plan_diff.size() == 1);
  CHECK_MESSAGE(plan_diff[0]->message.find("different plan than the manifest's point: plan.") !=
                    std::string::npos,
                plan_diff[0]->message);
  const auto d = matching(r.findings, Severity::error, "moe-k1", 0, "tokens_consumed");
  REQUIRE(d.size() == 1);
  CHECK(*d[0]->expected == 64.0);
  CHECK(*d[0]->found == 56.0);
  // C against the manifest's plan: paper M = 8448 per token (header) times the planned 64 is
  // 540,672; the ledger through the paper lens is the 473,088 of 56 tokens: −12.5 %, and per
  // consumed token 8448 = M exactly.
  const auto c = matching(r.findings, Severity::error, "moe-k1", 0, "compute");
  REQUIRE(c.size() == 1);
  CHECK(*c[0]->expected == doctest::Approx(540672.0));
  CHECK(*c[0]->found == doctest::Approx(473088.0));
  CHECK_MESSAGE(c[0]->message.find("(D = 64 consumed) = 540672: -12.5000%; the run consumed 56 "
                                   "tokens, not the planned 64: per consumed token 8448 vs M = "
                                   "8448 (+0.0000%)") != std::string::npos,
                c[0]->message);
}

TEST_CASE("against the manifest it was trained from: every plan value compared, as run does") {
  // runs_cpu2's record was trained from sweep-tiny as planned on 2026-11-29 (frozen in
  // tests/fixtures): the record's plan is that manifest point's, value for value.
  const auto recs = load_run_records(fixture("runs_cpu2"));
  const moeplan::Manifest m = moeplan::read_manifest(std::string(MOEPLAN_SOURCE_DIR) +
                                                     "/tests/fixtures/sweep-tiny-2026-11-29.toml");
  std::vector<Plan> planned = {m.points[0]};
  REQUIRE(planned[0].id == "moe-ra0.200");
  const AuditReport same = audit_runs(recs, planned, {});
  CHECK(matching(same.findings, Severity::warning, "moe-ra0.200", 0, "plan").empty());
  // A value the claims do not read (the learning rate, edited in the manifest since) is named.
  planned[0].hyper.lr_peak = 0.5;
  // (The report is kept: matching() points into its findings.)
  const AuditReport edited = audit_runs(recs, planned, {});
  const auto d = matching(edited.findings, Severity::warning, "moe-ra0.200", 0, "plan");
  REQUIRE(d.size() == 1);
  CHECK_MESSAGE(d[0]->message.find("different plan than the manifest's point: plan.lr_peak = ") !=
                    std::string::npos,
                d[0]->message);
  CHECK(d[0]->message.find("(the manifest: 0.5); audited against the manifest") !=
        std::string::npos);
}

// Real records, not hand-made: sweep-tiny's point moe-ra0.200 trained by `moeplan run` on an
// NVIDIA H200 (--device cuda, 2026-11-29, bench/gpu/RESULTS.md) and on this project's 2-core CPU
// machine (--device cpu). The cuBLAS attention computes the whole S×S square, so the GPU ledger
// holds padding the CPU's does not; by hand (arch in the record: L 2, H 7, D_h 8, S 128, batch 75,
// 2551 steps), the masked upper half is D_h·S(S−1) per product, 2 products per head in the
// forward and 4 in the backward: forward 2·75·7·2·8·128·127·2551 = 696,680,140,800 and
// input-grad twice that, 1,393,360,281,600.
TEST_CASE("a GPU record and a CPU record of the same point: same ledger but for padding") {
  const auto gpu = load_run_records(fixture("runs_h200"));
  const auto cpu = load_run_records(fixture("runs_cpu2"));
  REQUIRE(gpu.size() == 1);
  REQUIRE(cpu.size() == 1);
  const FlopLedger& g = gpu[0].ledger;
  const FlopLedger& c = cpu[0].ledger;
  CHECK(g.at(FlopCategory::padding, Phase::forward) == 696680140800);
  CHECK(g.at(FlopCategory::padding, Phase::input_grad) == 1393360281600);
  CHECK(c.category(FlopCategory::padding) == 0);
  for (int i = 0; i < kFlopCategories; ++i)
    if (FlopCategory(i) != FlopCategory::padding) {
      INFO(name(FlopCategory(i)));
      CHECK(g.flops[i] == c.flops[i]);
    }
  CHECK(gpu[0].tokens_consumed == cpu[0].tokens_consumed);
  CHECK(gpu[0].tokens_unique == cpu[0].tokens_unique);
  // The audit holds the GPU run to its plan: the padding is explained, never an error or warning.
  const AuditReport r = audit_runs(gpu, {}, {});
  CHECK(r.all_hold());
  for (const Finding& f : r.findings) CHECK_MESSAGE(f.severity == Severity::info, f.message);
  const auto pad = matching(r.findings, Severity::info, "moe-ra0.200", 0, "flops:padding");
  REQUIRE(!pad.empty());
  CHECK(pad[0]->message.find("masked part of attention squares") != std::string::npos);
  // The validation ledgers (11 evaluations of 16,384 held-out tokens each) likewise: equal but
  // for the GPU's padding, which is explained; the CPU's equals the analytic forward exactly.
  REQUIRE(gpu[0].has_validation_ledger);
  REQUIRE(cpu[0].has_validation_ledger);
  CHECK(gpu[0].evaluations == 11);
  for (int i = 0; i < kFlopCategories; ++i)
    if (FlopCategory(i) != FlopCategory::padding) {
      INFO(name(FlopCategory(i)));
      CHECK(gpu[0].validation_ledger.flops[i] == cpu[0].validation_ledger.flops[i]);
    }
  CHECK(gpu[0].validation_ledger.category(FlopCategory::padding) > 0);
  CHECK(matching(r.findings, Severity::info, "moe-ra0.200", 0, "validation-flops:padding").size() ==
        1);
  for (const Finding& f : audit_runs(cpu, {}, {}).findings)
    CHECK_MESSAGE(f.quantity.rfind("validation", 0) != 0, f.message);
}

TEST_CASE("the same data for every point: source and held-out set; [train] settings compared") {
  // The H200 record is a real one: it says what it read.
  const auto real = load_run_records(fixture("runs_h200"));
  REQUIRE(real.size() == 1);
  CHECK(real[0].data_source == "builtin");
  CHECK(real[0].validation_tokens == 16384);
  CHECK(real[0].train.empty());  // written before records carried their [train] settings

  auto recs = load_run_records(fixture("runs_ok"));  // hand-made: they do not say
  {
    const AuditReport r = audit_runs(recs, {}, {});
    const auto info = matching(r.findings, Severity::info, "dense", 0, "data");
    REQUIRE(info.size() == 1);
    CHECK(info[0]->message.find("does not say which data it read") != std::string::npos);
    CHECK(r.all_hold());
  }
  for (RunRecord& x : recs) {
    x.data_source = "builtin";
    x.data_description = "builtin corpus v1";
    x.validation_tokens = 256;
    x.train = {{"seed", "1234"}, {"data_seed", "1"}, {"z_loss", "0.0"}, {"eval_every", "0"}};
  }
  const std::string name =
      "the same data for every point (source, held-out set) as dense: builtin, data_seed 1, 256 "
      "validation tokens";
  {  // one record's data removed by hand, its data_seed changed: it switched the claim off
    auto edited = recs;
    edited[1].data_source.clear();
    edited[1].train["data_seed"] = "2";
    const AuditReport r = audit_runs(edited, {}, {});
    const auto e = matching(r.findings, Severity::error, "moe-k1", 0, "data");
    REQUIRE(e.size() == 1);
    CHECK(e[0]->message.find("does not say which data it read while the sweep's other records "
                             "do") != std::string::npos);
    CHECK_FALSE(r.all_hold());
    // and the data_seed it trained with is compared as a [train] setting
    const auto w = matching(r.findings, Severity::warning, "moe-k1", 0, "train");
    CHECK(std::any_of(w.begin(), w.end(), [](const Finding* f) {
      return f->message.rfind("[train] data_seed differs across the sweep: moe-k1 2", 0) == 0;
    }));
  }
  {
    const AuditReport r = audit_runs(recs, {}, {});
    const ClaimVerdict* same = claim(r, name);
    REQUIRE(same);
    CHECK(same->holds);
    CHECK(same->rows == std::vector<std::string>{"dense", "moe-k1"});
    CHECK(r.all_hold());
    CHECK(matching(r.findings, Severity::warning, "", 0, "train").empty());
  }
  // The MoE point read a text file (equal D̂ is then not the same tokens) and validated on a
  // smaller held-out set; its seed and z-loss differ too; only when validation runs does not.
  recs[1].data_source = "text:t.txt";
  recs[1].validation_tokens = 128;
  recs[1].train["seed"] = "7";
  recs[1].train["z_loss"] = "0.001";
  recs[1].train["eval_every"] = "5";
  {
    const AuditReport r = audit_runs(recs, {}, {});
    const ClaimVerdict* same = claim(r, name);
    REQUIRE(same);
    CHECK_FALSE(same->holds);
    CHECK_FALSE(r.all_hold());
    const auto e = matching(r.findings, Severity::error, "moe-k1", 0, "data");
    REQUIRE(e.size() == 1);
    CHECK(e[0]->message ==
          "read text:t.txt, 128 validation tokens; the dense baseline dense read builtin, "
          "data_seed 1, 256 validation tokens");
    // Filed under the first point that differs (it was under no point).
    const auto w = matching(r.findings, Severity::warning, "moe-k1", 0, "train");
    REQUIRE(w.size() == 2);  // seed and z_loss, in key order; eval_every is not training
    CHECK(w[0]->message ==
          "[train] seed differs across the sweep: moe-k1 7 against 1234 for the dense baseline "
          "dense; the points were not trained alike");
    CHECK(w[1]->message.find("[train] z_loss differs across the sweep: moe-k1 0.001 against "
                             "0.0") == 0);
  }
  // The same source by name, other tokens: a file edited between the runs. The fingerprints
  // say so (the training region's only where D̂ is the same: here 40 unique tokens each).
  recs[1].data_source = "builtin";
  recs[1].validation_tokens = 256;
  for (RunRecord& x : recs) x.training_fingerprint = x.validation_fingerprint = "00000000000000aa";
  CHECK(claim(audit_runs(recs, {}, {}), name)->holds);
  recs[1].validation_fingerprint = "00000000000000bb";
  recs[1].training_fingerprint = "00000000000000cc";
  {
    const AuditReport r = audit_runs(recs, {}, {});
    CHECK_FALSE(claim(r, name)->holds);
    const auto e = matching(r.findings, Severity::error, "moe-k1", 0, "data");
    REQUIRE(e.size() == 1);
    CHECK(e[0]->message ==
          "read builtin, data_seed 1, 256 validation tokens as the dense baseline dense did, but "
          "other tokens (fingerprints: held-out set 00000000000000bb against 00000000000000aa, "
          "training region 00000000000000cc against 00000000000000aa): the source changed "
          "between the runs");
  }
  recs[1].validation_fingerprint = recs[1].training_fingerprint = "00000000000000aa";
  // Against the manifest's [train]: each record that trained otherwise is named.
  RunsAuditOptions opt;
  opt.manifest_train = settings_from_text(
      R"({"seed": 7, "data_seed": 1, "z_loss": 0.001, "eval_every": 5, "checkpoint_every": 9,
          "device": "cuda"})");
  CHECK(opt.manifest_train.count("checkpoint_every") == 0);  // change no result
  CHECK(opt.manifest_train.count("device") == 0);
  const AuditReport r = audit_runs(recs, {}, opt);
  const auto d = matching(r.findings, Severity::warning, "dense", 0, "train");
  REQUIRE(d.size() == 1);
  CHECK(d[0]->message ==
        "trained with other [train] settings than the manifest's: eval_every = 0 (the manifest: "
        "5), seed = 1234 (the manifest: 7), z_loss = 0.0 (the manifest: 0.001)");
  // moe-k1 trained as the manifest says: its only [train] finding is the sweep-wide one.
  for (const Finding* f : matching(r.findings, Severity::warning, "moe-k1", 0, "train"))
    CHECK(f->message.rfind("[train] ", 0) == 0);
}

TEST_CASE("the sweep claims: equal C at the compute tolerance, equal D̂ exactly") {
  // Equal C is judged at the compute tolerance, whatever N's: moe-k1's −1.129 % still fails with
  // an N tolerance of 5 %.
  RunsAuditOptions opt;
  opt.n_tolerance = 0.05;
  const AuditReport r = audit_runs(load_run_records(fixture("runs_bad")), {}, opt);
  const ClaimVerdict* eqc = claim(r, "equal training compute C (paper) across the sweep");
  REQUIRE(eqc);
  CHECK_FALSE(eqc->holds);
  // Under strict reuse D̂ is the same tokens, so equal means equal: 3,996 against 4,000 unique
  // (−0.1 %, inside every tolerance) fails the claim.
  auto recs = load_run_records(fixture("runs_ok"));
  for (auto& rec : recs) rec.tokens_unique = rec.point_id == "moe-k1" ? 3996 : 4000;
  const AuditReport u = audit_runs(recs, {}, {});
  const ClaimVerdict* du = claim(u, "equal unique data D̂ (strict reuse) across the sweep");
  REQUIRE(du);
  CHECK_FALSE(du->holds);
  CHECK(du->quantities[0].breaking == std::vector<std::string>{"moe-k1"});
}

TEST_CASE("a router-in plan's C is its ledger through the router-in lens") {
  // runs_ok's moe-k1: M 8,448 [paper] over 56 consumed tokens, C 473,088. With the router in N_a
  // (one MoE layer, D_m 8, E 4: 32 weights), M = 8,448 + 6·32 = 8,640 and C = 8,640·56 = 483,840,
  // which the ledger's router products (3 phases · 2·32 · 56 = 10,752) make up exactly. (Against
  // the dense baseline's 476,160 that is +1.6 %: the equal-C claim is not this test's subject.)
  auto recs = load_run_records(fixture("runs_ok"));
  for (RunRecord& r : recs) {
    r.plan.arch.count_router = true;
    if (r.point_id != "moe-k1") continue;
    REQUIRE(r.plan.flops_per_token == 8448.0);
    r.plan.flops_per_token = 8640;
    r.plan.budget.compute = r.plan.budget.compute_target = 483'840;
    r.compute_paper = 483'840;
    r.conventions["paper"] = 483'840;
  }
  const AuditReport a = audit_runs(recs, {}, {});
  const auto c = matching(a.findings, Severity::info, "moe-k1", 0, "compute");
  REQUIRE(c.size() == 1);
  CHECK(*c[0]->expected == 483'840.0);
  CHECK(*c[0]->found == 483'840.0);
}
