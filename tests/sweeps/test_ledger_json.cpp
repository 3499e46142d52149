// A FLOP ledger as JSON: integers while they fit 64 bits, decimal strings past them.
#include <doctest/doctest.h>

#include <cmath>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/ledger_json.hpp"

using namespace moeplan;
using nlohmann::json;

TEST_CASE("flop counts in JSON: a number while it fits 64 bits, digits beyond") {
  // (nlohmann's == equates 510720 and 510720.0: the type is checked apart.)
  CHECK(flop_count_to_json(FlopCount(510720)) == json(510720));
  CHECK(flop_count_to_json(FlopCount(510720)).is_number_integer());
  CHECK(flop_count_to_json(FlopCount(INT64_MAX)) == json(INT64_MAX));
  CHECK(flop_count_to_json(FlopCount(INT64_MAX)).is_number_integer());
  const FlopCount past = FlopCount(INT64_MAX) + 1;  // 2^63
  CHECK(flop_count_to_json(past) == json("9223372036854775808"));
  // Readers take an integer, an unsigned integer (2^63 .. 2^64-1 as a JSON reader parses it),
  // digits, and a whole float below 2^63; never a fraction or a float past 2^63.
  CHECK(*flop_count_from_json(json::parse("510720")) == FlopCount(510720));
  CHECK(*flop_count_from_json(json::parse("18446744073709551615")) ==
        *parse_flop_count("18446744073709551615"));
  CHECK(*flop_count_from_json(json("51072000000000000000")) ==
        *parse_flop_count("51072000000000000000"));
  CHECK(*flop_count_from_json(json::parse("5e5")) == FlopCount(500000));
  // A float reads exactly below 2^53 = 9007199254740992; 2^53 + 1 reads as 2^53, so from 2^53 on
  // a float is refused.
  CHECK(*flop_count_from_json(json::parse("9007199254740991.0")) == FlopCount(9007199254740991));
  CHECK_FALSE(flop_count_from_json(json::parse("9007199254740992.0")));
  CHECK_FALSE(flop_count_from_json(json::parse("9007199254740993.0")));
  // 10^36 - 1 is the largest count read; 10^36 is refused.
  const std::string nines(36, '9');
  CHECK(to_string(*flop_count_from_json(json(nines))) == nines);
  CHECK_FALSE(flop_count_from_json(json("1" + std::string(36, '0'))));
  for (const char* bad :
       {"1.5", "1e19", "\"1e19\"", "null", "true", "[1]", "\"\"", "-1", "\"-1\"", "-5e5"})
    CHECK_MESSAGE(!flop_count_from_json(json::parse(bad)), bad);
}

TEST_CASE("a ledger past 2^64 round-trips through JSON exactly") {
  FlopLedger l;
  // 2^61 per product (2^20 cubed, times 2), 16 products: 2^65 = 36893488147419103232.
  const int64_t n = int64_t(1) << 20;
  for (int i = 0; i < 16; ++i) l.add_gemm(FlopCategory::projection, Phase::weight_grad, n, n, n);
  l.add_gemm(FlopCategory::router, Phase::forward, 2, 3, 4);  // 48
  l.elementwise = 1000;
  const json j = flop_ledger_to_json(l);
  CHECK(j.at("by_category").at("projection").at("weight-grad") == json("36893488147419103232"));
  CHECK(j.at("by_category").at("router").at("forward") == json(48));
  CHECK(j.at("by_category").at("router").at("forward").is_number_integer());
  CHECK(j.at("total") == json("36893488147419103280"));
  CHECK(j.at("elementwise") == json(1000));
  CHECK(j.at("elementwise").is_number_integer());
  CHECK(flop_ledger_from_json(json::parse(j.dump()), "r.json") == l);
}

TEST_CASE("a damaged ledger is refused naming the file and the key") {
  json j = flop_ledger_to_json(FlopLedger{});
  j["by_category"]["expert"]["input-grad"] = 1.5;
  CHECK_THROWS_WITH_AS(
      flop_ledger_from_json(j, "r.json", "measured.flops."),
      "r.json: 'measured.flops.by_category.expert.input-grad' is missing or not a FLOP count (0 "
      "to 10^36 - 1, as a JSON integer below 2^64 or a string of decimal digits)",
      InputError);
  j["by_category"].erase("expert");
  CHECK_THROWS_WITH_AS(flop_ledger_from_json(j, "r.json"),
                       "r.json: 'by_category.expert' is missing or not an object", InputError);
  j["by_category"]["expert"] = flop_ledger_to_json(FlopLedger{})["by_category"]["router"];
  j["by_category"]["experts"] = j["by_category"]["expert"];  // a typo is not dropped
  CHECK_THROWS_WITH_AS(flop_ledger_from_json(j, "r.json"),
                       "r.json: unknown FLOP category 'experts' under by_category", InputError);
  j["by_category"].erase("experts");
  j["by_category"]["router"]["backward"] = 0;
  CHECK_THROWS_WITH_AS(flop_ledger_from_json(j, "r.json"),
                       "r.json: unknown phase 'backward' under by_category.router", InputError);
  j["by_category"]["router"].erase("backward");
  j.erase("elementwise");  // informational: may be left out
  CHECK(flop_ledger_from_json(j, "r.json") == FlopLedger{});
}

TEST_CASE("a record's other counts: whole, not negative, below 2^63") {
  CHECK(count_from_json(json(0)) == 0);
  CHECK(count_from_json(json(1e3)) == 1000);  // a whole float, as some writers print it
  CHECK(count_from_json(json(uint64_t(9223372036854775807ULL))) == INT64_MAX);
  CHECK_FALSE(count_from_json(json(uint64_t(9223372036854775808ULL))));  // 2^63
  CHECK_FALSE(count_from_json(json(9223372036854775808.0)));             // 2^63 as a double
  CHECK_FALSE(count_from_json(json(-1)));
  CHECK_FALSE(count_from_json(json(1.5)));
  CHECK_FALSE(count_from_json(json("12")));
  CHECK_FALSE(count_from_json(json(nullptr)));
}

TEST_CASE("curve_defect: the first key of a curve that is not a number, by its full path") {
  CHECK_FALSE(curve_defect(json::object()));  // no curves: nothing to read
  json r = {{"val_curve", {{{"step", 2}, {"val_bpc", 1.5}, {"parts", {{"facts", 1.2}}}}}},
            {"loss_curve", {{{"tokens_consumed", 64}, {"train_loss", 3.1}}}}};
  CHECK_FALSE(curve_defect(r));
  auto defect = [&](const json& rec) {
    const auto d = curve_defect(rec);
    REQUIRE(d);
    return fmt::format("{}|{}|{}", d->key, d->want, d->missing);
  };
  json bad = r;
  bad["val_curve"] = "oops";
  CHECK(defect(bad) == "val_curve|an array|false");
  bad = r;
  bad["val_curve"].push_back(3);
  CHECK(defect(bad) == "val_curve[1]|an object|false");
  bad = r;
  bad["val_curve"][0].erase("val_bpc");
  CHECK(defect(bad) == "val_curve[0].val_bpc|a number >= 0|true");
  bad = r;
  bad["val_curve"][0]["parts"] = json::array();
  CHECK(defect(bad) == "val_curve[0].parts|an object|false");
  bad = r;
  bad["val_curve"][0]["parts"]["arith"] = "0.9";
  CHECK(defect(bad) == "val_curve[0].parts.arith|a number|false");
  bad = r;
  bad["loss_curve"][0]["tokens_consumed"] = nullptr;
  CHECK(defect(bad) == "loss_curve[0].tokens_consumed|a number >= 0|false");
  // A loss is never negative: -1.7e308 beside 1.7e308 overflowed a chart's axis range.
  bad = r;
  bad["loss_curve"][0]["train_loss"] = -1.7e308;
  CHECK(defect(bad) == "loss_curve[0].train_loss|a number >= 0|false");
  // Bits are nats over ln 2: 2.0794 nats is 3.0 bits (2.0794415 / 0.6931472); a BPC of 1.0
  // beside it was edited.
  bad = r;
  bad["val_curve"][0]["val_loss"] = 3 * std::log(2.0);
  bad["val_curve"][0]["val_bpc"] = 3.0;
  CHECK_FALSE(curve_defect(bad));
  bad["val_curve"][0]["val_bpc"] = 1.0;
  CHECK(defect(bad).starts_with("val_curve[0].val_bpc|its val_loss over ln 2, 3"));
  // A part's bits are its loss's too: facts 0.1 bits beside 1.0397 nats (1.5 bits) was edited
  // (the report showed 0.100 in its facts column, and the audit passed it).
  bad["val_curve"][0]["val_bpc"] = 3.0;
  bad["val_curve"][0]["parts"] = {{"facts", 1.5}};
  bad["val_curve"][0]["parts_loss"] = {{"facts", 1.5 * std::log(2.0)}};
  CHECK_FALSE(curve_defect(bad));
  bad["val_curve"][0]["parts"]["facts"] = 0.1;
  CHECK(defect(bad).starts_with("val_curve[0].parts.facts|its parts_loss over ln 2, 1.5"));
  bad["val_curve"][0]["parts"] = json::object();
  CHECK(defect(bad).starts_with("val_curve[0].parts.facts|the bits of parts_loss.facts"));
  bad["val_curve"][0]["parts"] = {{"facts", 1.5}};
  bad["val_curve"][0]["parts_loss"]["facts"] = -1.0;
  CHECK(defect(bad) == "val_curve[0].parts_loss.facts|a number >= 0|false");
  // A complete record's final BPC with no evaluation behind it.
  bad = r;
  bad["status"] = "complete";
  bad["final_val_bpc"] = 1.5;
  CHECK_FALSE(curve_defect(bad));  // its last evaluation's
  bad["val_curve"] = json::array();
  CHECK(defect(bad) == "val_curve|the evaluations behind final_val_bpc (none is given)|false");
}

TEST_CASE("curve_defect: the training seconds at each evaluation, one an entry, never falling") {
  const json r = {{"val_curve",
                   {{{"step", 2}, {"val_bpc", 1.9}},
                    {{"step", 4}, {"val_bpc", 1.7}},
                    {{"step", 6}, {"val_bpc", 1.6}}}},
                  {"val_curve_train_seconds", {0.5, 0.5, 1.25}},
                  {"train_seconds", 1.25}};
  CHECK_FALSE(curve_defect(r));  // equal neighbours: no training between two evaluations
  auto defect = [&](const json& v) {
    json rec = r;
    rec["val_curve_train_seconds"] = v;
    const auto d = curve_defect(rec);
    REQUIRE(d);
    return d->key + "|" + d->want;
  };
  CHECK(defect({0.5, 1.0}) ==
        "val_curve_train_seconds|a list of 3 numbers, one for each val_curve entry");
  CHECK(defect("1.0") ==
        "val_curve_train_seconds|a list of 3 numbers, one for each val_curve entry");
  CHECK(defect({0.5, "1.0", 1.25}) == "val_curve_train_seconds[1]|a number >= 0");
  CHECK(defect({-0.5, 1.0, 1.25}) == "val_curve_train_seconds[0]|a number >= 0");
  CHECK(defect({0.5, 1.0, 0.75}) ==
        "val_curve_train_seconds[2]|at least the evaluation's before it, 1");
  CHECK(defect({0.5, 1.0, 1.5}) ==
        "val_curve_train_seconds[2]|at most the record's train_seconds, 1.25");
  // A record without train_seconds (a running one's may lack it) bounds nothing by it.
  json running = r;
  running.erase("train_seconds");
  running["val_curve_train_seconds"] = {0.5, 1.0, 1.5};
  CHECK_FALSE(curve_defect(running));
}

TEST_CASE("run_facts_defect: how a record ran, where given, is of its kind") {
  const json ok = {{"device", "cuda"},          {"kernels", "attention=fused_mma"},
                   {"world_size", 2},           {"pass_seqs", 4},
                   {"optimizer_sharded", true}, {"train_seconds", 0.0},
                   {"wall_seconds", 12.5},      {"final_val_bpc", 1.8}};
  CHECK_FALSE(run_facts_defect(ok));
  CHECK_FALSE(run_facts_defect(json::object()));  // older records: none of them
  auto defect = [&](const char* key, const json& v) {
    json r = ok;
    r[key] = v;
    const auto d = run_facts_defect(r);
    REQUIRE(d);
    return d->key + "|" + d->want;
  };
  // world_size 0 divided the report's batch by zero (a crash, exit 136): refused.
  CHECK(defect("world_size", 0) == "world_size|a whole number >= 1");
  CHECK(defect("world_size", 1.5) == "world_size|a whole number >= 1");
  CHECK(defect("world_size", -1) == "world_size|a whole number >= 1");
  CHECK(defect("pass_seqs", 0) == "pass_seqs|a whole number >= 1");
  CHECK(defect("device", 3) == "device|a string");
  CHECK(defect("optimizer_sharded", "yes") == "optimizer_sharded|true or false");
  CHECK(defect("train_seconds", -1) == "train_seconds|a number >= 0");
  CHECK(defect("final_val_bpc", "1.8") == "final_val_bpc|a number > 0");
  // 0 BPC is no measurement: it was every report's "best point".
  CHECK(defect("final_val_bpc", 0.0) == "final_val_bpc|a number > 0");
}

TEST_CASE("plan_defect: the plan is the record's point's (one run is not two points)") {
  const json r = {{"point_id", "moe-ra0.500"}, {"plan", {{"id", "moe-ra0.300"}}}};
  const auto d = plan_defect(r);
  REQUIRE(d);
  CHECK(d->key == "plan.id");
  CHECK(d->want == "the record's point_id, \"moe-ra0.500\"");
  CHECK_FALSE(plan_defect(json{{"point_id", "dense"}, {"plan", {{"id", "dense"}}}}));
}

TEST_CASE("plan_defect: a record's plan agrees with itself") {
  // By hand: N_a / N = 30,000 / 100,000 = 0.3; C = M·D = 2.0e5 · 409,600 = 8.192e10;
  // D = steps · B · S = 50 · 4 · 2048 = 409,600; epochs = D / D̂ = 409,600 / 204,800 = 2.
  const json ok = {{"plan",
                    {{"activation_rate", 0.3},
                     {"total_params", 100000},
                     {"active_params", 30000},
                     {"flops_per_token", 2.0e5},
                     {"compute", 8.192e10},
                     {"tokens_consumed", 409600},
                     {"tokens_unique", 204800},
                     {"epochs", 2.0},
                     {"steps", 50},
                     {"batch_seqs", 4},
                     {"arch", {{"seq_len", 2048}}}}}};
  CHECK_FALSE(plan_defect(ok));
  CHECK_FALSE(plan_defect(json{{"plan", json::object()}}));  // keys not given: nothing to hold
  auto defect = [&](const char* key, const json& v) {
    json r = ok;
    r["plan"][key] = v;
    const auto d = plan_defect(r);
    REQUIRE(d);
    return d->key + "|" + d->want;
  };
  // An edited r_a moved the point on the report's chart and in its table; 1e30 printed 31 digits.
  CHECK(defect("activation_rate", 0.9) ==
        "plan.activation_rate|active_params / total_params = 30000 / 100000 = 0.3");
  CHECK(defect("activation_rate", 1e30) == "plan.activation_rate|in (0, 1]");
  CHECK(defect("compute", 5.0) == "plan.compute|flops_per_token · tokens_consumed = 8.192e+10");
  CHECK(defect("steps", 49) ==
        "plan.tokens_consumed|steps · batch_seqs · seq_len = 49 · 4 · 2048 = 401408");
  CHECK(defect("epochs", 7.0) == "plan.epochs|tokens_consumed / tokens_unique = 2");
  CHECK(defect("tokens_unique", 409601) == "plan.tokens_unique|in [1, tokens_consumed = 409600]");
  // The last digit of a double written and read back is not a defect.
  CHECK_FALSE(plan_defect(json{
      {"plan", {{"activation_rate", 0.1 + 0.2}, {"total_params", 10}, {"active_params", 3}}}}));
}

TEST_CASE("check_point_folder: a record lies in the folder of its point_id") {
  CHECK_NOTHROW(check_point_folder("moe-ra0.300", "runs/moe-ra0.300/record.json"));
  CHECK_THROWS_WITH_AS(check_point_folder("other", "runs/moe-ra0.300/record.json"),
                       doctest::Contains("runs/moe-ra0.300/record.json: 'point_id' is \"other\" "
                                         "but the record lies in folder 'moe-ra0.300'"),
                       InputError);
}
