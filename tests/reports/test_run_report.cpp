// `moeplan report` on records made here: the HTML report carries its four charts, the text and
// markdown reports the bars of each MoE point's BPC against the dense baseline.
#include <doctest/doctest.h>
#include <algorithm>
#include <array>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeplan/accounting/error.hpp"
#include "moeplan/reports/run_report.hpp"
#include "moeplan/reports/text_table.hpp"
#include "scratch.hpp"
#include "strings.hpp"

using nlohmann::json;

namespace {

// A record with what the report reads: 4 steps of 100 tokens, validation at steps 2 and 4.
json record(const std::string& id, bool dense, double ra, double bpc, bool complete = true) {
  json r;
  r["point_id"] = id;
  r["status"] = complete ? "complete" : "running";
  r["final_val_bpc"] = bpc;
  r["device"] = "cpu";
  r["train_seconds"] = 10.0;
  r["wall_seconds"] = 11.0;
  r["plan"] = {{"id", id},
               {"role", dense ? "dense" : "moe"},
               {"activation_rate", ra},
               {"total_params", 1000.0},
               {"compute", 4e5},
               {"tokens_consumed", 400.0},
               {"tokens_unique", 100.0},
               {"epochs", 4.0},
               {"steps", 4},
               {"flops_per_token", 1000.0},
               {"convention", "paper"},
               {"batch_seqs", 1}};
  r["measured"] = {{"total_params", 1000},
                   {"steps", complete ? 4 : 2},
                   {"compute", {{"paper", 4e5}, {"within_rounding", true}}},
                   {"tokens", {{"consumed", 400}, {"unique", 100}, {"epochs", 4.0}}},
                   {"matches_plan", {{"tokens_consumed", true}}},
                   {"flops", {{"total", 5e5}}}};
  r["val_curve"] = json::array({{{"step", 2}, {"val_bpc", bpc + 0.5}, {"parts", json::object()}},
                                {{"step", 4}, {"val_bpc", bpc}, {"parts", json::object()}}});
  json loss = json::array();
  for (int s = 1; s <= 4; ++s)
    loss.push_back({{"step", s}, {"tokens_consumed", 100 * s}, {"train_loss", 3.0 - 0.1 * s}});
  r["loss_curve"] = loss;
  return r;
}

// Point `id`'s row in the first table after offset `from` of a text report, and its cells (split
// at blanks).
std::string row_of(const std::string& text, const std::string& id, size_t from = 0) {
  const size_t at = text.find("\n" + id + " ", from);
  REQUIRE_MESSAGE(at != std::string::npos, id);
  return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}
std::vector<std::string> cells_of_row(const std::string& text, const std::string& id,
                                      size_t from = 0) {
  std::istringstream row(row_of(text, id, from));
  std::vector<std::string> cells;
  for (std::string c; row >> c;) cells.push_back(c);
  return cells;
}

using moeplan::test::occurrences;

}  // namespace

TEST_CASE("report: charts in HTML, bars in text and markdown") {
  const std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8),
                                  record("moe-b", false, 0.4, 2.1)};
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(occurrences(html, "<svg") == 4);
  CHECK(html.find("Final validation BPC against the activation rate") != std::string::npos);
  CHECK(html.find("Training time against the activation rate (cpu)") != std::string::npos);
  CHECK(html.find("dense baseline (10.0 s)") != std::string::npos);
  CHECK(html.find("dense baseline (2.0000)") != std::string::npos);
  // Validation against compute: step 4 of 100 tokens at M 1000 is C = 4e5 [paper].
  CHECK(html.find("training compute C [paper] (FLOPs)") != std::string::npos);
  CHECK(occurrences(html, "data-series=\"moe-a\"") == 2);  // validation and training-loss charts
  CHECK(occurrences(html, "data-series=\"dense\"") == 2);

  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  // −0.2 is the longest bar (40 characters); +0.1 half of it.
  CHECK(text.find("  moe-a  -0.2000  " + std::string(40, '#') + "\n") != std::string::npos);
  CHECK(text.find("  moe-b  +0.1000  " + std::string(20, '+') + "\n") != std::string::npos);
  CHECK(text.find("<svg") == std::string::npos);
  const std::string md = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::markdown);
  // The bars as an indented code block (a ``` fence could be ended by a point id's backticks).
  CHECK(md.find("\n\n    val BPC minus the dense baseline's") != std::string::npos);
  CHECK(md.find("\n      moe-a  -0.2000  " + std::string(40, '#') + "\n") != std::string::npos);
  CHECK(md.find("```") == std::string::npos);
  // The heading is the title's first sentence; what BPC and C mean is a paragraph under it (the
  // whole title was one heading line of some 300 characters).
  CHECK_MESSAGE(md.starts_with("# moeplan report: 3 run(s) in runs\n\nBPC = "), md.substr(0, 80));
  CHECK(md.find("D̂ unique does not\n\n|") != std::string::npos);
}

TEST_CASE("report: without a complete dense baseline, no bars and no baseline line") {
  const std::vector<json> recs = {record("dense", true, 1.0, 2.0, false),
                                  record("moe-a", false, 0.2, 1.8)};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("val BPC minus") == std::string::npos);
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(occurrences(html, "<svg") == 3);  // no time chart without the baseline's time
  CHECK(html.find("dense baseline (") == std::string::npos);
  // Its curves so far are still drawn, named as not complete.
  CHECK(occurrences(html, "data-series=\"dense (not complete)\"") == 2);
  // The running baseline's row: no "C ok" verdict on a partial C (it read "no"), no final parts.
  json running = record("dense", true, 1.0, 2.0, false);
  running["val_curve"][1]["parts"] = {{"facts", 1.25}};
  const std::string row_text = moeplan::render_run_report(
      {running, record("moe-a", false, 0.2, 1.8)}, "runs", moeplan::ReportFormat::markdown);
  const size_t at = row_text.find("| dense |");
  REQUIRE(at != std::string::npos);
  const std::string row = row_text.substr(at, row_text.find('\n', at) - at);
  CAPTURE(row);
  CHECK(row.find("| no |") == std::string::npos);
  CHECK(row.find("1.250") == std::string::npos);
}

namespace {

json with_seed(json r, int seed) {
  r["train"] = {{"seed", seed}, {"data_seed", 1}};
  return r;
}

// Three folders (seeds 1, 2, 3): each a dense baseline at BPC 2.0 and the MoE points given, at
// r_a 0.2, 0.3, 0.4, ..., with their BPC in each folder.
std::vector<std::vector<json>> three_seeds(
    const std::vector<std::pair<std::string, std::array<double, 3>>>& moe) {
  std::vector<std::vector<json>> folders;
  for (int f = 0; f < 3; ++f) {
    folders.push_back({with_seed(record("dense", true, 1.0, 2.0), f + 1)});
    for (size_t i = 0; i < moe.size(); ++i)
      folders.back().push_back(
          with_seed(record(moe[i].first, false, 0.2 + 0.1 * double(i), moe[i].second[f]), f + 1));
  }
  return folders;
}

}  // namespace

TEST_CASE("replicates: mean, sample sd and paired differences over folders, by hand") {
  // Folder A (seed 1): dense 2.0, moe-a 1.8, moe-b 2.1. Folder B (seed 2): dense 1.9, moe-a 1.8,
  // moe-b 1.8. moe-a: mean 1.8, sd 0; vs dense -0.2 and -0.1: mean -0.15, sd 0.0707 (√0.005);
  // beats dense 2 of 2. moe-b: mean 1.95, sd 0.2121 (√0.045); vs dense +0.1 and -0.1: mean 0,
  // sd 0.1414; beats 1 of 2. Seeds needed for moe-a's interval to leave out 0 were its mean
  // and sd to hold: |mean|/sd = 2.121 against t/√n = 2.484 at 3 and 3.182/2 = 1.591 at 4: 4.
  // moe-b's mean is 0 (to rounding): no number of seeds. The margins' 95 % intervals, mean ±
  // t·sd/√2 with t = 12.706 at one degree of freedom (the closed form tan(0.475·π)): moe-a -0.15
  // ± 12.706·0.05 = [-0.7853, +0.4853], moe-b 0 ± 12.706·0.1 = [-1.2706, +1.2706]; both across 0.
  const std::vector<std::vector<json>> folders = {{with_seed(record("dense", true, 1.0, 2.0), 1),
                                                   with_seed(record("moe-a", false, 0.2, 1.8), 1),
                                                   with_seed(record("moe-b", false, 0.4, 2.1), 1)},
                                                  {with_seed(record("dense", true, 1.0, 1.9), 2),
                                                   with_seed(record("moe-a", false, 0.2, 1.8), 2),
                                                   with_seed(record("moe-b", false, 0.4, 1.8), 2)}};
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  auto line_of = [&](const std::string& id) {
    const size_t at = text.find("\n" + id + " ");
    REQUIRE(at != std::string::npos);
    return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  auto has = [](const std::string& line, const std::vector<std::string>& cells) {
    size_t from = 0;
    for (const auto& c : cells) {
      const size_t at = line.find(c, from);
      if (at == std::string::npos) return false;
      from = at + c.size();
    }
    return true;
  };
  CHECK(has(line_of("dense"), {"2 of 2", "1.9500", "0.0707", "1.9000", "2.0000"}));
  CHECK(has(line_of("moe-a"),
            {"2 of 2", "1.8000", "0.0000", "-0.1500", "0.0707", "[-0.7853, +0.4853]", "2 of 2"}));
  CHECK(has(line_of("moe-b"),
            {"2 of 2", "1.9500", "0.2121", "+0.0000", "0.1414", "[-1.2706, +1.2706]", "1 of 2"}));
  CHECK(text.find("(2 pairs: t = 12.71, the mean ± 8.98 × sd) lies wholly below 0 for 0 of 2 MoE "
                  "points, wholly above 0 for 0, across 0 for 2 (not told apart from 0 by these "
                  "seeds; seeds needed, were the mean and sd to hold: moe-a 4, moe-b over 1000)") !=
        std::string::npos);
  // The paired t test: moe-a's t = -0.15 / (0.0707107/√2) = -3 at one degree of freedom, p = 1 −
  // (2/π)·atan(3) = 0.2048; moe-b's mean is 0, p 1. Holm over the two: 0.2048 > 0.05/2.
  CHECK(has(line_of("moe-a"), {"[-0.7853, +0.4853]", "0.2048", "2 of 2"}));
  CHECK(has(line_of("moe-b"), {"[-1.2706, +1.2706]", "1.0000", "1 of 2"}));
  CHECK(text.find("the 2 MoE points with an interval, taken together (Holm's step-down on their "
                  "p, family-wise error 5 %; each interval above holds for its point alone): told "
                  "apart from 0 for 0 of 2; the steps stop at moe-a, p = 0.2048 > 0.05/2 = "
                  "0.0250") != std::string::npos);
  CHECK(text.find("every replicate: 1 of 2") != std::string::npos);
  CHECK(text.find("a (seed/data_seed 1/1), b (seed/data_seed 2/1)") != std::string::npos);
  CHECK(text.find("not independent") == std::string::npos);
  const std::string html =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::html);
  // Two charts: every replicate's BPC, and the margins with their intervals (both across 0).
  CHECK(occurrences(html, "<svg") == 2);
  CHECK(html.find("dense mean (1.9500)") != std::string::npos);
  CHECK(occurrences(html, "data-whisker=") == 2);
  CHECK(html.find("dense baseline (margin 0)") != std::string::npos);
}

TEST_CASE("replicates: the same seeds are named; a differing plan is refused") {
  const std::vector<std::vector<json>> same = {{with_seed(record("dense", true, 1.0, 2.0), 5)},
                                               {with_seed(record("dense", true, 1.0, 2.0), 5)}};
  const std::string text =
      moeplan::render_replicate_report(same, {"x", "y"}, moeplan::ReportFormat::text);
  CHECK(text.find("not independent: 'x' and 'y' (seed/data_seed 5/1)") != std::string::npos);
  json other = record("moe-a", false, 0.2, 1.8);
  other["plan"]["steps"] = 5;
  try {
    moeplan::render_replicate_report({{record("moe-a", false, 0.2, 1.8)}, {other}}, {"x", "y"},
                                     moeplan::ReportFormat::text);
    FAIL("a differing plan was accepted");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()).find("point 'moe-a' has another plan in 'y' than in 'x' "
                                     "(plan.steps differs)") != std::string::npos);
  }
}

TEST_CASE("report: a point that read other data than the dense baseline is not compared with it") {
  auto reading = [](json r, const std::string& source, int64_t validation) {
    r["data"] = {{"source", source}, {"validation_tokens", validation}};
    r["train"] = {{"seed", 1234}, {"data_seed", 1}};
    return r;
  };
  // moe-a read the baseline's data; moe-b a text file (its 0.1 BPC says nothing against dense's
  // 2.0); moe-c the built-in corpus with a smaller held-out set.
  const std::vector<json> recs = {reading(record("dense", true, 1.0, 2.0), "builtin", 256),
                                  reading(record("moe-a", false, 0.2, 1.8), "builtin", 256),
                                  reading(record("moe-b", false, 0.3, 0.1), "text:t.txt", 256),
                                  reading(record("moe-c", false, 0.4, 1.7), "builtin", 128)};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("MoE points with lower validation BPC: 1 of 1; best point: moe-a (1.8000 BPC)\n"
                  "one run per point: each margin holds its seed's noise too") !=
        std::string::npos);
  CHECK(text.find("not compared with the dense baseline, which read builtin, data_seed 1, 256 "
                  "validation tokens: trained or validated on other data: moe-b (text:t.txt, "
                  "256 validation tokens), moe-c (builtin, data_seed 1, 128 validation "
                  "tokens)") != std::string::npos);
  CHECK(occurrences(text, "other data") == 3);  // two cells and the sentence
  // The same source by name, another held-out set by content (the file changed): not compared.
  std::vector<json> edited = {reading(record("dense", true, 1.0, 2.0), "text:t.txt", 256),
                              reading(record("moe-a", false, 0.2, 1.8), "text:t.txt", 256)};
  edited[0]["data"]["validation_fingerprint"] = "00000000000000aa";
  edited[1]["data"]["validation_fingerprint"] = "00000000000000bb";
  const std::string e = moeplan::render_run_report(edited, "runs", moeplan::ReportFormat::text);
  CHECK(e.find("moe-a (text:t.txt, 256 validation tokens; other tokens: the source changed "
               "between runs)") != std::string::npos);
  edited[1]["data"]["validation_fingerprint"] = "00000000000000aa";
  // A record without its [train] settings (older) compares by source and held-out size alone.
  std::vector<json> older = {reading(record("dense", true, 1.0, 2.0), "builtin", 256),
                             reading(record("moe-a", false, 0.2, 1.8), "builtin", 256)};
  older[1].erase("train");
  CHECK(moeplan::render_run_report(older, "runs", moeplan::ReportFormat::text).find("other data") ==
        std::string::npos);
  CHECK(moeplan::render_run_report(edited, "runs", moeplan::ReportFormat::text)
            .find("MoE points with lower validation BPC: 1 of 1") != std::string::npos);
  CHECK(text.find("  moe-a  -0.2000") != std::string::npos);
  CHECK(text.find("  moe-b  ") == std::string::npos);  // no bar
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(occurrences(html, "data-series=\"MoE points\"") == 2);  // the BPC and time charts
  // Replicates pair a point with its own folder's baseline only on the same data: folder b's
  // baseline drew another built-in corpus (data_seed 2, a legitimate replicate), its moe-b not.
  auto seed2 = [](json r) {
    r["train"]["data_seed"] = 2;
    return r;
  };
  const std::vector<std::vector<json>> folders = {
      {reading(record("dense", true, 1.0, 2.0), "builtin", 256),
       reading(record("moe-b", false, 0.3, 1.9), "builtin", 256)},
      {seed2(reading(record("dense", true, 1.0, 2.0), "builtin", 256)),
       reading(record("moe-b", false, 0.3, 1.7), "builtin", 256)}};
  const std::string reps =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  const size_t at = reps.find("\nmoe-b ");
  REQUIRE(at != std::string::npos);
  const std::string line = reps.substr(at + 1, reps.find('\n', at + 1) - at - 1);
  CHECK_MESSAGE(line.find("-0.1000") != std::string::npos, line);  // a's pair only
  CHECK_MESSAGE(line.find("1 of 1") != std::string::npos, line);
  // Another source for the same point: not a replicate, refused.
  try {
    moeplan::render_replicate_report(
        {{reading(record("moe-b", false, 0.3, 1.9), "builtin", 256)},
         {reading(record("moe-b", false, 0.3, 0.1), "text:t.txt", 256)}},
        {"a", "b"}, moeplan::ReportFormat::text);
    FAIL("replicates over two sources were accepted");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()) ==
          "point 'moe-b' read other data in 'b' (text:t.txt, 256 validation tokens) than in 'a' "
          "(builtin, 256 validation tokens); replicates train the same plan on the same source "
          "and held-out set, with other seeds");
  }
}

TEST_CASE("report: a training region edited between two points' runs is other data") {
  auto reading = [](json r, const std::string& train_fp) {
    r["data"] = {{"source", "text:t.txt"},
                 {"validation_tokens", 256},
                 {"validation_fingerprint", "00000000000000aa"},
                 {"training_fingerprint", train_fp}};
    r["train"] = {{"seed", 1234}, {"data_seed", 1}};
    return r;
  };
  // The held-out tokens agree, the training region (the same D̂ = 100 unique) does not.
  std::vector<json> recs = {reading(record("dense", true, 1.0, 2.0), "00000000000000c1"),
                            reading(record("moe-a", false, 0.2, 1.8), "00000000000000c2")};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("moe-a (text:t.txt, 256 validation tokens; other tokens: the source changed "
                  "between runs)") != std::string::npos);
  CHECK(text.find("dense baseline val BPC 2.0000; no MoE point is compared with it") !=
        std::string::npos);
  // A point of another D̂ reads a longer region with its own fingerprint: that is no edit (its
  // D̂ is then judged by the resources check, not as other data).
  recs[1]["measured"]["tokens"]["unique"] = 200;
  recs[0]["plan"]["reuse"] = "loose";
  CHECK(
      moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text).find("other tokens") ==
      std::string::npos);

  // Replicates: one point, one source by name, other tokens in the two folders (each folder's
  // own corpus.txt): refused.
  try {
    moeplan::render_replicate_report(
        {{reading(record("moe-a", false, 0.2, 1.8), "0000000000000001")},
         {reading(record("moe-a", false, 0.2, 1.7), "0000000000000002")}},
        {"a", "b"}, moeplan::ReportFormat::text);
    FAIL("replicates over two corpora of one name were accepted");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()) ==
          "point 'moe-a' read other tokens in 'b' than in 'a' from text:t.txt, 256 validation "
          "tokens (data.training_fingerprint 0000000000000002 against 0000000000000001): the "
          "files differ between the folders; replicates train on the same data, with other seeds");
  }
}

TEST_CASE("report: FLOP categories above the record's total are refused, not a negative rate") {
  json r = record("moe-a", false, 0.2, 1.8);
  r["measured"]["flops"]["by_category"] = {{"padding", {{"forward", 400000}}},
                                           {"expert", {{"forward", 200000}}}};  // total 5e5
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), r};
  const std::filesystem::path dir = moeplan::test::fresh_dir("report_categories");
  for (const json& x : recs) {
    std::filesystem::create_directories(dir / x["point_id"].get<std::string>());
    std::ofstream(dir / x["point_id"].get<std::string>() / "record.json") << x.dump();
  }
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'measured.flops.total' is below the sum of its "
                                         "categories, 600000"),
                       moeplan::InputError);
}

TEST_CASE("report: BPC of a source whose tokens are not bytes is per token, and says so") {
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text)
            .find("BPC = validation bits per byte, on held-out data;") != std::string::npos);
  for (json& r : recs)
    r["data"] = {{"source", "shards:x_*.bin"}, {"validation_tokens", 256}, {"byte_tokens", false}};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("BPC = validation bits per token, the source's tokens not being bytes, on "
                  "held-out data;") != std::string::npos);
  CHECK(text.find("bits per byte") == std::string::npos);
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("validation bits per token (lower is better)") != std::string::npos);
  CHECK(html.find("bits per byte") == std::string::npos);
}

TEST_CASE("replicates: a record not comparable with its folder's baseline is left out, named") {
  // Folder b's moe-a has 5 % more C than b's dense: it is no replicate of the equal-resource
  // point. moe-a's columns are folder a's alone: mean 1.8, vs dense -0.2, 1 of 1.
  json unequal = with_seed(record("moe-a", false, 0.2, 1.0), 2);
  unequal["measured"]["compute"]["paper"] = 4.2e5;
  const std::vector<std::vector<json>> folders = {
      {with_seed(record("dense", true, 1.0, 2.0), 1),
       with_seed(record("moe-a", false, 0.2, 1.8), 1)},
      {with_seed(record("dense", true, 1.0, 1.9), 2), unequal}};
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t at = text.find("\nmoe-a ");
  REQUIRE(at != std::string::npos);
  const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  CHECK(line.find("1 of 2") != std::string::npos);
  CHECK(line.find("1.8000") != std::string::npos);
  CHECK(line.find("1.4000") == std::string::npos);  // the mean with the unequal record
  CHECK(line.find("-0.2000") != std::string::npos);
  CHECK(text.find("left out, not compared with their folder's dense baseline (as `moeplan report "
                  "FOLDER` says of one folder):\n  moe-a in 'b': C [paper] 420k is +5.00% from "
                  "the baseline's 400k") != std::string::npos);
}

TEST_CASE(
    "report: C plan [paper] is the plan's C through the paper lens; a sweep planned in another "
    "convention also gets its own C columns") {
  // A plan in the exact convention: plan.compute 5e5 [exact/causal], its paper reading 4e5;
  // measured 5.1e5 in exact/causal (the record's per-convention totals).
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  for (json& r : recs) {
    r["plan"]["convention"] = "exact";
    r["plan"]["mask"] = "causal";
    r["plan"]["compute"] = 5e5;
    r["measured"]["compute"]["plan_paper"] = 4e5;
    r["measured"]["flops"]["conventions"] = {{"exact/causal", 5.1e5}, {"paper", 4e5}};
  }
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("C plan [paper]  C meas [paper]  C plan [exact/causal]  C meas [exact/causal]") !=
        std::string::npos);
  CHECK(text.find("and in the exact/causal convention the sweep was planned equal in") !=
        std::string::npos);
  const std::vector<std::string> cells = cells_of_row(text, "moe-a");
  // point, r_a, r_a target, N plan, N meas, then C plan and meas [paper], C plan and meas
  // [exact/causal].
  REQUIRE(cells.size() > 8);
  CHECK(std::vector<std::string>(cells.begin() + 5, cells.begin() + 9) ==
        std::vector<std::string>{"400k", "400k", "500k", "510k"});
  // A paper-planned sweep has no such columns.
  const std::string paper = moeplan::render_run_report(
      {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)}, "runs",
      moeplan::ReportFormat::text);
  CHECK(paper.find("C plan [exact") == std::string::npos);
  CHECK(paper.find("planned equal in") == std::string::npos);
}

TEST_CASE("report: a point off its target r_a is marked, in its row and under the table") {
  // grid's '!': the shape rules reach 0.278 where 0.2 was asked; the id still says 0.200.
  std::vector<json> recs = {record("dense", true, 1.0, 2.0),
                            record("moe-ra0.200", false, 0.278, 1.8),
                            record("moe-ra0.400", false, 0.4, 1.9)};
  recs[1]["plan"]["activation_rate_target"] = 0.2;
  recs[1]["plan"]["reachable"] = false;
  recs[1]["plan"]["note"] = "r_a 20.00% not reachable\nwithin 0.5 points";
  recs[2]["plan"]["activation_rate_target"] = 0.4;
  recs[2]["plan"]["reachable"] = true;
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("r_a  r_a target") != std::string::npos);
  const auto missed = cells_of_row(text, "moe-ra0.200"), met = cells_of_row(text, "moe-ra0.400");
  REQUIRE(missed.size() > 4);
  CHECK(std::vector<std::string>(missed.begin() + 1, missed.begin() + 4) ==
        std::vector<std::string>{"0.278", "0.200", "!"});
  CHECK(std::vector<std::string>(met.begin() + 1, met.begin() + 4) ==
        std::vector<std::string>{"0.400", "0.400", "1k"});  // then N plan
  CHECK(text.find("\n! off its target r_a (not reachable under the shape rules): moe-ra0.200 "
                  "trains r_a 0.278 (target 0.200") != std::string::npos);
  // The plan's note is shown there, on that one line (it was "the plan's note says why").
  CHECK(text.find("(target 0.200; its plan's note: r_a 20.00% not reachable\\x0awithin 0.5 "
                  "points)") != std::string::npos);
  // Without the target in the record (older records): no mark, no line.
  const std::string plain = moeplan::render_run_report(
      {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)}, "runs",
      moeplan::ReportFormat::text);
  CHECK(plain.find("off its target") == std::string::npos);
}

TEST_CASE("replicates: the r_a target column and the off-target line, as one folder's report") {
  std::vector<std::vector<json>> folders;
  for (int seed : {1, 2}) {
    json moe = with_seed(record("moe-ra0.200", false, 0.278, 1.8), seed);
    moe["plan"]["activation_rate_target"] = 0.2;
    moe["plan"]["reachable"] = false;
    folders.push_back({with_seed(record("dense", true, 1.0, 2.0), seed), moe});
  }
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("r_a  r_a target  replicates") != std::string::npos);
  CHECK(text.find("0.200 !") != std::string::npos);
  CHECK(text.find("\n! off its target r_a (not reachable under the shape rules): moe-ra0.200 "
                  "trains r_a 0.278 (target 0.200") != std::string::npos);
}

TEST_CASE("report: the BPC chart under loose reuse does not claim equal D̂") {
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  for (json& r : recs) r["plan"]["reuse"] = "loose";
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("(equal N, C and D̂)") == std::string::npos);
  CHECK(html.find("loose reuse: D̂ per point") != std::string::npos);
}

TEST_CASE("replicates: every replicate means every folder; the count is over all folders") {
  // Folder b has no dense baseline: moe-a pairs only in a (1 of 1 beats there), which is not
  // "every replicate" of two folders.
  const std::vector<std::vector<json>> folders = {{with_seed(record("dense", true, 1.0, 2.0), 1),
                                                   with_seed(record("moe-a", false, 0.2, 1.8), 1)},
                                                  {with_seed(record("moe-a", false, 0.2, 1.7), 2)}};
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("in every replicate: 0 of 1 (1 paired in fewer than the 2 folders: not counted "
                  "as every replicate)") != std::string::npos);
  const size_t at = text.find("\ndense ");
  REQUIRE(at != std::string::npos);
  CHECK(text.substr(at, text.find('\n', at + 1) - at).find("1 of 2") != std::string::npos);
}

TEST_CASE("report: a damaged record is refused naming the file and the key, not read as zeros") {
  const std::filesystem::path dir = moeplan::test::fresh_dir("report_damaged");
  auto put = [&](const std::string& id, const json& r) {
    std::filesystem::create_directories(dir / id);
    std::ofstream(dir / id / "record.json") << r.dump();
  };
  json d = record("dense", true, 1.0, 2.0);
  put("dense", d);
  json m = record("moe-a", false, 0.2, 1.8);
  m.erase("final_val_bpc");
  put("moe-a", m);
  try {
    moeplan::load_run_records(dir);
    FAIL("a record without final_val_bpc was read");
  } catch (const moeplan::InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(
        what.find("moe-a/record.json': 'final_val_bpc' is missing; the record is damaged") !=
            std::string::npos,
        what);
  }
  // Beside a checkpoint, removing only record.json rebuilds it (as `run` says of a damaged one).
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir), doctest::Contains("(move the point's"),
                       moeplan::InputError);
  std::filesystem::create_directories(dir / "moe-a" / "checkpoint");
  std::ofstream(dir / "moe-a" / "checkpoint" / "state.ckpt") << "x";
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("(remove only record.json and run the sweep again"),
                       moeplan::InputError);
  std::filesystem::remove_all(dir / "moe-a" / "checkpoint");
  m = record("moe-a", false, 0.2, 1.8);
  m["measured"].erase("flops");
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'measured.flops' is missing"), moeplan::InputError);
  put("moe-a", json::array());
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'(the whole record)' is not a JSON object"),
                       moeplan::InputError);
  // A point id that could not be one (`moeplan run` refuses it): a line break would rewrite the
  // Markdown report's paragraphs, an ESC the terminal's colours, a control character the SVG.
  m = record("moe-a", false, 0.2, 1.8);
  m["point_id"] = "moe\n# heading";
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(
      moeplan::load_run_records(dir),
      doctest::Contains("'point_id' is \"moe\\n# heading\" (a point id is non-empty"),
      moeplan::InputError);
  m = record("moe-a", false, 0.2, 1.8);
  m["measured"]["flops"]["total"] = "5e19";  // digits only, or a number
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'measured.flops.total' is not a FLOP count"),
                       moeplan::InputError);
  m = record("moe-a", false, 0.2, 1.8);
  m["measured"]["flops"]["by_category"]["padding"] = {{"forward", -1}};  // no negative FLOPs
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(
      moeplan::load_run_records(dir),
      doctest::Contains("'measured.flops.by_category.padding.forward' is not a FLOP count"),
      moeplan::InputError);
  // The curves the charts read: arrays of objects with numbers.
  m = record("moe-a", false, 0.2, 1.8);
  m["val_curve"] = "oops";
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'val_curve' is not an array"), moeplan::InputError);
  m["val_curve"] = json::array({json{{"step", 5}, {"val_bpc", 1.9}, {"parts", {{"facts", "x"}}}}});
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'val_curve[0].parts.facts' is not a number"),
                       moeplan::InputError);
  m["val_curve"] = json::array({json{{"step", 5}, {"val_bpc", 1.9}}});
  m["loss_curve"] = json::array({json{{"tokens_consumed", 64}}});
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'loss_curve[0].train_loss' is missing"),
                       moeplan::InputError);
  // A status run never writes (a hand edit) is damage, as `run` and `audit` say.
  m = record("moe-a", false, 0.2, 1.8);
  m["status"] = "done";
  put("moe-a", m);
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'status' is \"done\" (valid: \"running\", \"complete\")"),
                       moeplan::InputError);
  for (const json& bad : {json(1.5), json(-1), json(1e30)}) {
    m = record("moe-a", false, 0.2, 1.8);
    m["measured"]["tokens"]["consumed"] = bad;
    put("moe-a", m);
    CHECK_THROWS_WITH_AS(
        moeplan::load_run_records(dir),
        doctest::Contains("'measured.tokens.consumed' is not a whole number >= 0 below 2^63"),
        moeplan::InputError);
  }
  // Keys a record may leave out, given with the wrong type: refused by name, not a raw JSON
  // type_error (null is what a hand edit or a NaN written by another tool leaves).
  struct Edit {
    std::vector<std::string> path;
    json value;
    std::string message;
  };
  const Edit edits[] = {
      {{"measured", "tokens", "dropped_assignments"},
       nullptr,
       "'measured.tokens.dropped_assignments' is not a whole number >= 0"},
      {{"measured", "compute", "plan_paper"},
       nullptr,
       "'measured.compute.plan_paper' is not a number"},
      {{"plan", "role"}, 5, "'plan.role' is 5 (valid: \"dense\", \"moe\")"},
      {{"plan", "reuse"}, "loosely", "'plan.reuse' is \"loosely\" (valid: \"strict\", \"loose\")"},
      {{"plan", "batch_seqs"}, -4, "'plan.batch_seqs' is not a whole number >= 0"},
      {{"data"}, "builtin", "'data' is not an object"},
      {{"train", "seed"}, "7", "'train.seed' is not a whole number >= 0"},
  };
  for (const Edit& e : edits) {
    m = record("moe-a", false, 0.2, 1.8);
    json* at = &m;
    for (size_t i = 0; i + 1 < e.path.size(); ++i) at = &(*at)[e.path[i]];
    (*at)[e.path.back()] = e.value;
    put("moe-a", m);
    CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir), doctest::Contains(e.message.c_str()),
                         moeplan::InputError);
  }
  put("moe-a", record("moe-a", false, 0.2, 1.8));
  CHECK(moeplan::load_run_records(dir).size() == 2);
  // Entries that are no point's folder (a looping link, a dangling one, a file) are passed over:
  // the loop ended the report with a raw filesystem exception and exit 70.
  std::filesystem::create_directory_symlink("loop", dir / "loop");
  std::filesystem::create_directory_symlink("nowhere", dir / "dangling");
  std::ofstream(dir / "notes.txt") << "x";
  CHECK(moeplan::load_run_records(dir).size() == 2);
  // Not valid JSON: the parser's words, without its exception tag.
  std::ofstream(dir / "moe-a" / "record.json") << "{\"a\":";
  try {
    moeplan::load_run_records(dir);
    FAIL("a truncated record was read");
  } catch (const moeplan::InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(
        what.find("record.json' is not valid JSON: parse error at line 1") != std::string::npos,
        what);
    CHECK(what.find("[json.exception") == std::string::npos);
    // And what to do about it (no checkpoint beside this one to rebuild it from).
    CHECK_MESSAGE(what.ends_with("(move the point's folder away and run it again)"), what);
  }
  // A record.json that is a folder says so (it said "unreadable: ... unexpected end of input").
  std::filesystem::remove(dir / "moe-a" / "record.json");
  std::filesystem::create_directory(dir / "moe-a" / "record.json");
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("moe-a/record.json' is a folder, not a file"),
                       moeplan::InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("prose wider than a terminal: broken at spaces, each line indented as it was") {
  // Width 12, by hand: "  one two" (9) + " three" would be 15; "  three" (7) + "  four" (the
  // two spaces between kept) 13 > 12; "  four" then "  abcdefghijklmn" (16: a word wider than
  // the line alone); "·" and "D̂" take one column each.
  CHECK(moeplan::fit_to_width("  one two three  four abcdefghijklmn\n", 12) ==
        "  one two\n  three\n  four\n  abcdefghijklmn\n");
  CHECK(moeplan::fit_to_width("x\nC = M·D D̂ D̂ unique\n", 12) == "x\nC = M·D D̂ D̂\nunique\n");
  CHECK(moeplan::fit_to_width("fits in twelve", 14) == "fits in twelve");
  CHECK(moeplan::fit_to_width("a b  ", 3) == "a b");  // trailing spaces: dropped, no empty line
  CHECK(moeplan::fit_to_width("ab cd  ", 3) == "ab\ncd");
  CHECK(moeplan::fit_to_width("a  b c", 5) == "a  b\nc");  // two spaces between words kept
  // A marked line continues under its text: the grid's "! point: why" notes.
  CHECK(moeplan::fit_to_width("! moe-a: not reachable\n", 16) == "! moe-a: not\n  reachable\n");
  CHECK(moeplan::fit_to_width("  - a bb cc\n", 8) == "  - a bb\n    cc\n");
  // A line of columns (the audit's findings) continues under its last column where that begins
  // in the first half: "r_a" at column 12 of 24.
  CHECK(moeplan::fit_to_width("  warn  t1  r_a counts the router weights", 24) ==
        "  warn  t1  r_a counts\n            the router\n            weights");
  // ... and under the last column that does, where the last begins further in: "t1" at 8, as
  // "r_a" at 12 is past 22 / 2.
  CHECK(moeplan::fit_to_width("  warn  t1  r_a counts the router", 22) ==
        "  warn  t1  r_a counts\n        the router");
}

TEST_CASE("text tables wider than a terminal: in parts, each with the key column") {
  // By hand: columns id 5 wide ("moe-D̂" is 5 columns), alpha 5, b 2, gamma 5, two spaces apart:
  // 23 columns in all. In 16: the key column (5) and two spaces leave 9, which hold alpha and b
  // (7 .. 16), then gamma alone.
  moeplan::TextTable t;
  t.add_column("id", moeplan::TextTable::Align::left);
  t.add_column("alpha");
  t.add_column("b");
  t.add_column("gamma");
  t.add_row({"dense", "1.000", "22", "333"});
  t.add_row({"moe-D̂", "0.200", "4", "55555"});
  const std::string table = t.render();
  REQUIRE(table ==
          "id     alpha   b  gamma\n"
          "-----  -----  --  -----\n"
          "dense  1.000  22    333\n"
          "moe-D̂  0.200   4  55555\n");
  const std::string text = "a title wider than sixteen columns\n\n" + table + "\nafter\n";
  CHECK(moeplan::fit_to_width(text, 16) ==
        "a title wider\n"  // prose broken at spaces: 13 columns, and " than" would make 18
        "than sixteen\n"
        "columns\n\n"
        "id     alpha   b\n"
        "-----  -----  --\n"
        "dense  1.000  22\n"
        "moe-D̂  0.200   4\n"
        "\n"
        "id     gamma\n"
        "-----  -----\n"
        "dense    333\n"
        "moe-D̂  55555\n"
        "\nafter\n");
  CHECK(moeplan::fit_to_width(text, 34) == text);  // the title (34) and the table (23) fit
  CHECK(moeplan::fit_to_width(text, 0) == text);   // no width: as it is
  CHECK(moeplan::fit_to_width(table, 16).ends_with("moe-D̂  55555\n"));  // no blank line added
  // A table of one column wider than the width has nothing to split: as it is, its row whole. A
  // line wider than the rule right under the rows is prose, wrapped, not cut into columns.
  moeplan::TextTable one;
  one.add_column("architecture", moeplan::TextTable::Align::left);
  one.add_row({"L16 Dm1408 | E95 K7"});
  CHECK(moeplan::fit_to_width(one.render() + "a line of prose wider than that\n", 10) ==
        "architecture\n-------------------\nL16 Dm1408 | E95 K7\na line of\nprose\nwider than\n"
        "that\n");
  CHECK(moeplan::fit_to_width(table + "prose right under the rows\n", 16) ==
        moeplan::fit_to_width(table, 16) + "prose right\nunder the rows\n");
  // A first column without a header (the grid's flag) is a key with the next one: 5 columns.
  moeplan::TextTable g;
  g.add_column("", moeplan::TextTable::Align::left);
  g.add_column("id", moeplan::TextTable::Align::left);
  g.add_column("x");
  g.add_column("yy");
  g.add_row({"!", "a", "1", "2"});
  g.add_row({"", "bb", "3", "4"});
  // Two columns of one quantity (the same first word) go to the next part together where the
  // first would end a part holding others: "x plan" joins "x meas" (7 .. 21 needs 18 with the
  // key), not "a" (4 .. 13 would fit 18).
  moeplan::TextTable q;
  q.add_column("id", moeplan::TextTable::Align::left);
  q.add_column("a");
  q.add_column("x plan");
  q.add_column("x meas");
  q.add_row({"p", "1", "5", "6"});
  CHECK(moeplan::fit_to_width(q.render(), 18) ==
        "id  a\n"
        "--  -\n"
        "p   1\n"
        "\n"
        "id  x plan  x meas\n"
        "--  ------  ------\n"
        "p        5       6\n");
  CHECK(moeplan::fit_to_width(g.render(), 9) ==
        "   id  x\n"
        "-  --  -\n"
        "!  a   1\n"
        "   bb  3\n"
        "\n"
        "   id  yy\n"
        "-  --  --\n"
        "!  a    2\n"
        "   bb   4\n");
}

TEST_CASE("text tables in HTML: a left-aligned column's cells marked, text escaped") {
  moeplan::TextTable t;
  t.add_column("id", moeplan::TextTable::Align::left);
  t.add_column("N <plan>");
  t.add_row({"a&b", "1.5k"});
  CHECK(t.render_html() ==
        "<table>\n"
        "<tr><th class=\"l\">id</th><th>N &lt;plan&gt;</th></tr>\n"
        "<tr><td class=\"l\">a&amp;b</td><td>1.5k</td></tr>\n"
        "</table>\n");
}

TEST_CASE("text tables: wide CJK characters take two columns, combining marks none") {
  // "模型" is two wide characters (4 columns), "D̂" is D plus a combining mark (1 column): the
  // second column starts in the same terminal column on every line.
  moeplan::TextTable t;
  t.add_column("id", moeplan::TextTable::Align::left);
  t.add_column("x");
  t.add_row({"模型", "1"});
  t.add_row({"abcd", "2"});
  t.add_row({"D̂", "3"});
  std::istringstream in(t.render());
  std::vector<size_t> ends;
  for (std::string line; std::getline(in, line);) {
    size_t columns = 0;  // by hand: ASCII 1, the two ideographs 2 each, U+0302 0
    for (size_t i = 0; i < line.size();) {
      const unsigned char c = static_cast<unsigned char>(line[i]);
      if (c < 0x80)
        columns += 1, i += 1;
      else if (line.compare(i, 3, "模") == 0 || line.compare(i, 3, "型") == 0)
        columns += 2, i += 3;
      else if (line.compare(i, 2, "\u0302") == 0)
        i += 2;
      else
        columns += 1, i += (c >> 5) == 0x6 ? 2 : 3;
    }
    ends.push_back(columns);
  }
  REQUIRE(ends.size() == 5);  // header, rule, three rows
  for (size_t e : ends) CHECK(e == ends[0]);
}

TEST_CASE("report: FLOP counts past 64 bits (strings of digits) give the time table its rates") {
  // 5.1072e19 FLOPs in 10 s of training is 5.1072e18 FLOP/s = 5.11e+06 TFLOP/s; padding of
  // 1.072e19 leaves 5.1072e19 - 1.072e19 = 4.0352e19 useful: 4.04e+06 TFLOP/s.
  json m = record("moe-a", false, 0.2, 1.8);
  m["measured"]["flops"]["total"] = "51072000000000000000";
  m["measured"]["flops"]["by_category"]["padding"] = {
      {"forward", "10720000000000000000"}, {"input-grad", 0}, {"weight-grad", 0}};
  const std::vector<json> recs = {record("dense", true, 1.0, 2.0), m};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  const size_t at = text.find("\nmoe-a  cpu") + 1;
  REQUIRE_MESSAGE(at != 0, text);
  const std::string row = text.substr(at, text.find('\n', at) - at);
  CHECK_MESSAGE(row.find("5.11e+06") != std::string::npos, row);
  CHECK_MESSAGE(row.find("4.04e+06") != std::string::npos, row);
}

TEST_CASE("report: a point without the baseline's N, C or D̂ gets no comparison, whatever it says") {
  // moe-a is equal-resource (N +0.5 %, C -0.9 %: within 1 %); moe-n has 30 % fewer parameters,
  // moe-c 2 % less compute, moe-u half the unique tokens (strict reuse). Each BPC is below the
  // baseline's 2.0: only moe-a may count as beating it.
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9),
                            record("moe-n", false, 0.3, 1.5), record("moe-c", false, 0.4, 1.6),
                            record("moe-u", false, 0.5, 1.7)};
  recs[0]["plan"]["reuse"] = "strict";
  recs[1]["measured"]["total_params"] = 1005;
  recs[1]["measured"]["compute"]["paper"] = 4e5 * 0.991;
  recs[1]["plan"]["compute"] = 4e5 * 0.991;  // its plan rounded the same way: C ok
  recs[2]["measured"]["total_params"] = 700;
  recs[3]["measured"]["compute"]["paper"] = 4e5 * 0.98;
  recs[3]["plan"]["compute"] = 4e5 * 0.98;
  recs[4]["measured"]["tokens"]["unique"] = 50;
  recs[4]["plan"]["tokens_unique"] = 50.0;
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("MoE points with lower validation BPC: 1 of 1; best point: moe-a") !=
        std::string::npos);
  CHECK(text.find("moe-n: N 700 is -30.00% from the baseline's 1k") != std::string::npos);
  CHECK(text.find("moe-c: C [paper] 392k is -2.00% from the baseline's 400k") != std::string::npos);
  CHECK(text.find("moe-u: D̂ 50 unique is not the baseline's 100 (strict reuse)") !=
        std::string::npos);
  CHECK(occurrences(text, "not equal   ") == 3);  // the three cells
  // Their training curves stay in the HTML charts, named as left out of the comparison.
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(occurrences(html, "data-series=\"moe-c (not equal-resource)\"") == 2);
  CHECK(occurrences(html, "data-series=\"moe-a\"") == 2);
  // No bar for the three: one bar line, moe-a's.
  CHECK(occurrences(text, "-0.1000") == 1);
  CHECK(text.find("-0.5000") == std::string::npos);
}

TEST_CASE("report: the C columns and chart name the reading N_a was counted under") {
  // --count-router puts the router's weights in N_a and so in paper's 6·N_a: the record's
  // measured.compute.paper is then "paper (router in)", as grid and run print it.
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9)};
  for (json& r : recs) r["plan"]["arch"] = {{"count_router", true}};
  std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("C plan [paper (router in)]") != std::string::npos);
  CHECK(text.find("C = M·D in the paper (router in) convention") != std::string::npos);
  // The measured-vs-plan line judges that same figure, and says so.
  CHECK(text.find("with C [paper (router in)] within the plan's rounding") != std::string::npos);
  std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("training compute C [paper (router in)] (FLOPs)") != std::string::npos);
  // Without the reading: plain paper; an exact-planned sweep's chart is in exact/causal.
  recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9)};
  text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("C plan [paper]") != std::string::npos);
  for (json& r : recs) r["plan"]["convention"] = "exact", r["plan"]["mask"] = "causal";
  html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("training compute C [exact/causal] (FLOPs)") != std::string::npos);
  // A folder mixing records of an exact and a megatron sweep: each cell of the own-convention
  // columns names its convention (two equal-looking figures were in two conventions).
  std::vector<json> mixed = recs;
  mixed[1]["plan"]["convention"] = "megatron";
  text = moeplan::render_run_report(mixed, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("C plan [exact/causal or megatron]") != std::string::npos);
  CHECK(text.find("400k [megatron]") != std::string::npos);
  CHECK(text.find("400k [exact/causal]") != std::string::npos);
  CHECK(text.find("records of more than one sweep, each cell says its own") != std::string::npos);
  // A mistyped reading is damage, named.
  recs[1]["plan"]["arch"] = {{"count_router", "yes"}};
  const auto dir = std::filesystem::temp_directory_path() / "moeplan-report-reading";
  std::filesystem::remove_all(dir);
  for (const json& r : recs) {
    std::filesystem::create_directories(dir / r["point_id"].get<std::string>());
    std::ofstream(dir / r["point_id"].get<std::string>() / "record.json") << r.dump();
  }
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("'plan.arch.count_router' is not true or false"),
                       moeplan::InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("report: equal C is judged in the convention the sweep was planned in") {
  // A sweep planned in exact/causal: both points measured 4.0e5 FLOPs through the exact/causal
  // lens (equal), while their paper C differ by 3.5 % (3.86e5 vs 4e5: the attention term is
  // counted otherwise). The audit holds them equal in the plan's convention; the report said
  // "not equal" from C [paper].
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9)};
  for (json& r : recs) {
    r["plan"]["convention"] = "exact";
    r["plan"]["mask"] = "causal";
    r["measured"]["flops"]["conventions"] = {{"exact/causal", 4e5}, {"paper", 4e5}};
  }
  recs[1]["measured"]["compute"]["paper"] = 3.86e5;
  recs[1]["measured"]["flops"]["conventions"]["paper"] = 3.86e5;
  std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("not equal   ") == std::string::npos);
  CHECK(text.find("MoE points with lower validation BPC: 1 of 1; best point: moe-a") !=
        std::string::npos);
  // 2 % apart in exact/causal C: not equal, and the reason names that convention.
  recs[1]["measured"]["flops"]["conventions"]["exact/causal"] = 3.92e5;
  text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(text.find("moe-a: C [exact/causal] 392k is -2.00% from the baseline's 400k") !=
        std::string::npos);
  CHECK(text.find("(N within 1 % and C [exact/causal] within 1 %") != std::string::npos);
}

TEST_CASE("report: measured vs plan is read from the numbers, not from the record's own flags") {
  // Flags that say all is well over numbers that do not: 90 unique tokens read of the 100
  // planned, and C [paper] 2 % under its plan. Both records claim to match.
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9)};
  recs[1]["measured"]["tokens"]["unique"] = 90;
  recs[1]["measured"]["compute"]["paper"] = 4e5 * 0.98;
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("measured vs plan: 1 of 2 complete point(s)") != std::string::npos);
  CHECK(text.find("rounding (off the plan: moe-a; `moeplan audit` says where)") !=
        std::string::npos);
  CHECK(occurrences(text, "  no  ") + occurrences(text, " no ") >= 1);  // moe-a's "C ok" cell
  // The epochs the record states, 5 against the planned 4: said to match before.
  recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9)};
  recs[1]["measured"]["tokens"]["epochs"] = 5.0;
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text)
            .find("measured vs plan: 1 of 2 complete point(s)") != std::string::npos);
}

TEST_CASE("report: user text is escaped in Markdown; the verdict's lines are paragraphs") {
  // A point id is a folder name: "<img src=x onerror=alert(1)>" is a legal one, and Markdown
  // renderers pass raw HTML through; a '|' or a line break would split the table.
  std::vector<json> recs = {record("dense", true, 1.0, 2.0),
                            record("moe<img src=x onerror=alert(1)>|a&b\nc", false, 0.2, 1.9)};
  recs[1]["measured"]["tokens"]["unique"] = 90;  // off its plan: named in the verdict
  const std::string md =
      moeplan::render_run_report(recs, "runs<x>", moeplan::ReportFormat::markdown);
  CAPTURE(md);
  CHECK(md.find("<img") == std::string::npos);
  CHECK(md.find("moe&lt;img src=x onerror=alert(1)&gt;\\|a&amp;b c") != std::string::npos);
  CHECK(md.find("(off the plan: moe&lt;img") != std::string::npos);
  CHECK(md.find("runs&lt;x&gt;") != std::string::npos);
  // Each verdict line its own paragraph (they ran together), in Markdown and in HTML.
  CHECK(md.find("\n\nmeasured vs plan: ") != std::string::npos);
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("<p>measured vs plan: ") != std::string::npos);
  CHECK(html.find("<img") == std::string::npos);
}

TEST_CASE("report: -o's extension in any case; a bare '.md' is told it has no name") {
  using moeplan::ReportFormat;
  using moeplan::run_report_format;
  CHECK(run_report_format(std::nullopt, "r.HTML") == ReportFormat::html);
  CHECK(run_report_format(std::nullopt, "out/R.Md") == ReportFormat::markdown);
  CHECK(run_report_format(std::nullopt, "r.TXT") == ReportFormat::text);
  CHECK(run_report_format(std::nullopt, "r.Csv") == ReportFormat::csv);
  CHECK(run_report_format(std::nullopt, "r.json") == ReportFormat::json);
  CHECK(run_report_format(std::nullopt, "") == ReportFormat::text);
  CHECK(run_report_format("json", "") == ReportFormat::json);
  CHECK(run_report_format("table", "r.txt") == ReportFormat::text);
  CHECK(run_report_format("csv", "/dev/stdout") == ReportFormat::csv);  // no extension: --format
  CHECK_THROWS_WITH_AS(run_report_format(std::nullopt, ".md"),
                       doctest::Contains("('.md' is a name without an extension: give e.g. "
                                         "report.md)"),
                       moeplan::InputError);
  CHECK_THROWS_WITH_AS(run_report_format(std::nullopt, "r.table"),
                       "-o 'r.table': the report is written as .md, .html, .txt, .csv or .json",
                       moeplan::InputError);
  CHECK_THROWS_WITH_AS(run_report_format("xml", ""),
                       "--format 'xml' is not a report format (valid: table, md, html, csv, json)",
                       moeplan::InputError);
  CHECK_THROWS_WITH_AS(run_report_format("csv", "r.json"),
                       doctest::Contains("--format csv contradicts -o 'r.json', which is written "
                                         "as json"),
                       moeplan::InputError);
  CHECK_THROWS_WITH_AS(run_report_format("md", "r.txt"),
                       doctest::Contains("which is written as table;"), moeplan::InputError);
}

TEST_CASE("report: a folder with two dense baselines is refused; ties in r_a sort by id") {
  const auto dir = std::filesystem::temp_directory_path() / "moeplan-report-two-dense";
  std::filesystem::remove_all(dir);
  auto put = [&](const json& r) {
    std::filesystem::create_directories(dir / r["point_id"].get<std::string>());
    std::ofstream(dir / r["point_id"].get<std::string>() / "record.json") << r.dump();
  };
  put(record("dense", true, 1.0, 2.0));
  put(record("moe-b", false, 0.2, 1.9));
  put(record("moe-a", false, 0.2, 1.8));
  const auto recs = moeplan::load_run_records(dir);
  REQUIRE(recs.size() == 3);
  CHECK(recs[1]["point_id"] == "moe-a");
  CHECK(recs[2]["point_id"] == "moe-b");
  put(record("a-dense", true, 1.0, 1.5));
  CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir),
                       doctest::Contains("holds 2 dense baselines (a-dense, dense)"),
                       moeplan::InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("report: a point not complete is named as not compared; the folder name is text") {
  // 3 MoE points, one interrupted: the verdict counted "2 of 2" and said nothing of the third.
  const std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9),
                                  record("moe-b", false, 0.3, 1.8),
                                  record("moe-c", false, 0.4, 1.7, false)};
  const std::string text =
      moeplan::render_run_report(recs, "runs\x1b[31m\nX", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("MoE points with lower validation BPC: 2 of 2") != std::string::npos);
  CHECK(text.find("not compared, not complete (a run stopped or still training; the same "
                  "`moeplan run` resumes it): moe-c (running, step 2 of 4)") != std::string::npos);
  // The runs folder as given, its escape sequence and line break shown, not acted on.
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("in runs\\x1b[31m\\x0aX. BPC") != std::string::npos);
  // The chart names its curve as not complete.
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("moe-c (not complete)") != std::string::npos);
}

TEST_CASE("report: a point the folder's audit finds an error in is named so in every chart") {
  const std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.9),
                                  record("moe-b", false, 0.3, 1.8)};
  moeplan::FolderAudit audit;
  audit.claims = audit.holding = 1;
  audit.errors["moe-b"] = {"a ledger error"};
  audit.error_quantities["moe-b"] = {"flops"};
  const std::string html =
      moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html, &audit);
  CHECK(html.find("moe-b (audit error)") != std::string::npos);
  CHECK(html.find("moe-a (audit error)") == std::string::npos);
  // Its C is not "ok": the ledger behind it is what the audit found wrong.
  const std::string text =
      moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text, &audit);
  CHECK(text.find("(off the plan: moe-b;") != std::string::npos);
  // The sweep's equal-C claim books its errors as "compute" too, for a point whose own ledger
  // and plan agree: that point did what its plan said, and its C is "ok".
  moeplan::FolderAudit claim;
  claim.claims = 1;
  claim.errors["moe-b"] = {"claim 'equal training compute C': ..."};
  claim.error_quantities["moe-b"] = {"compute"};
  const std::string c_text =
      moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text, &claim);
  CHECK(c_text.find("measured vs plan: 3 of 3 complete point(s)") != std::string::npos);
  // A running record: the audit errs on it (its status), and the charts say why: not complete.
  std::vector<json> running = recs;
  running[2] = record("moe-b", false, 0.3, 1.8, false);
  moeplan::FolderAudit status;
  status.errors["moe-b"] = {"record is 'running'"};
  status.error_quantities["moe-b"] = {"status"};
  const std::string r_html =
      moeplan::render_run_report(running, "runs", moeplan::ReportFormat::html, &status);
  CHECK(r_html.find("moe-b (not complete)") != std::string::npos);
  CHECK(r_html.find("moe-b (audit error)") == std::string::npos);
}

TEST_CASE("replicates: the chart of every replicate draws every replicate the means count") {
  // Folder b has no dense baseline: its moe-a (1.7) counts in the BPC mean (1.8 with a's 1.9)
  // but pairs with no baseline. The chart of "every replicate" left b's point out while its
  // mean (1.8) included it.
  const std::vector<std::vector<json>> folders = {{with_seed(record("dense", true, 1.0, 2.0), 1),
                                                   with_seed(record("moe-a", false, 0.2, 1.9), 1)},
                                                  {with_seed(record("moe-a", false, 0.2, 1.7), 2)}};
  const std::string html =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::html);
  CAPTURE(html);
  CHECK(html.find("data-series=\"b\"") != std::string::npos);
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b\x1b"}, moeplan::ReportFormat::text);
  CHECK(text.find("1.8000") != std::string::npos);   // the mean of 1.9 and 1.7
  CHECK(text.find("-0.1000") != std::string::npos);  // vs dense: a's pair alone
  CHECK(text.find('\x1b') == std::string::npos);
}

TEST_CASE("replicates: the chart draws each replicate's own dense baseline in its colour") {
  // The margins are paired with each folder's own baseline (a: 2.0, b: 2.1), so the chart draws
  // each beside its folder's points, then their mean, 2.05. Folder c has no baseline: no line.
  const std::vector<std::vector<json>> folders = {
      {with_seed(record("dense", true, 1.0, 2.0), 1),
       with_seed(record("moe-a", false, 0.2, 1.9), 1)},
      {with_seed(record("dense", true, 1.0, 2.1), 2),
       with_seed(record("moe-a", false, 0.2, 1.8), 2)},
      {with_seed(record("moe-a", false, 0.2, 1.85), 3)}};
  const std::string html =
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::html);
  CAPTURE(html);
  auto polyline = [&](const std::string& name) {
    const size_t at = html.find("<polyline data-series=\"" + name + "\"");
    return at == std::string::npos ? std::string() : html.substr(at, html.find("/>", at) - at);
  };
  CHECK(polyline("a: dense (2.0000)").find("stroke=\"#0072B2\" stroke-width=\"1.2\"") !=
        std::string::npos);
  CHECK(polyline("b: dense (2.1000)").find("stroke=\"#D55E00\" stroke-width=\"1.2\"") !=
        std::string::npos);
  CHECK(html.find("c: dense") == std::string::npos);
  CHECK(polyline("dense mean (2.0500)").find("stroke=\"#000000\" stroke-width=\"1.8\"") !=
        std::string::npos);
  CHECK(polyline("MoE mean").find("stroke=\"#000000\" stroke-width=\"2.8\"") != std::string::npos);
}

TEST_CASE("report: a point with no training time has no time ratio; wall time to 0.1 s") {
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  recs[1]["train_seconds"] = 0.0;
  recs[0]["wall_seconds"] = 0.39;
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  // The time table's moe-a row: 0.0 s, then tokens/s, both rates and the ratio all "-" (the ratio
  // was "0.00x": 0 s over the baseline's 10 s).
  const std::vector<std::string> cells =
      cells_of_row(text, "moe-a", text.find("train time vs dense"));
  REQUIRE(cells.size() >= 4);
  CHECK(cells.back() == "-");
  CHECK(text.find("0.00x") == std::string::npos);
  // The first table's wall seconds: 0.39 s is 0.4, not 0.
  const size_t dense_row = text.find("\ndense ");
  REQUIRE(dense_row != std::string::npos);
  const std::string first = text.substr(dense_row, text.find('\n', dense_row + 1) - dense_row);
  CHECK_MESSAGE(first.find(" 0.4 ") != std::string::npos, first);
}

TEST_CASE("replicates in markdown: the heading is the title's first sentence") {
  std::vector<std::vector<json>> folders;
  for (int seed : {1, 2})
    folders.push_back({with_seed(record("dense", true, 1.0, 2.0), seed),
                       with_seed(record("moe-a", false, 0.2, 1.8), seed)});
  const std::string md =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::markdown);
  CHECK_MESSAGE(md.starts_with("# moeplan report: 2 points over 2 runs folders of one sweep: a "
                               "(seed/data_seed 1/1), b (seed/data_seed 2/1)\n\nval BPC = final"),
                md.substr(0, 160));
}

TEST_CASE("replicates: the margin's 95 % interval over three seeds, below, above and across 0") {
  // Dense 2.0 in every folder. Margins: moe-a -0.10, -0.12, -0.14 (mean -0.12, sd 0.02);
  // moe-b +0.10, +0.12, +0.14; moe-c -0.10, +0.10, 0 (mean 0, sd 0.1). t at 2 degrees of
  // freedom 4.302653 (closed form 0.95·√(2/(1 − 0.95²))), over √3: 2.4841. Half-widths 0.049683
  // and 0.248414: moe-a [-0.1697, -0.0703] below 0, moe-b [+0.0703, +0.1697] above, moe-c
  // [-0.2484, +0.2484] across.
  const auto folders = three_seeds({{"moe-a", {1.90, 1.88, 1.86}},
                                    {"moe-b", {2.10, 2.12, 2.14}},
                                    {"moe-c", {1.90, 2.10, 2.00}}});
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("[-0.1697, -0.0703]") != std::string::npos);
  CHECK(text.find("[+0.0703, +0.1697]") != std::string::npos);
  CHECK(text.find("[-0.2484, +0.2484]") != std::string::npos);
  CHECK(text.find("(3 pairs: t = 4.30, the mean ± 2.48 × sd) lies wholly below 0 for 1 of 3 MoE "
                  "points, wholly above 0 for 1, across 0 for 1 (not told apart from 0 by these "
                  "seeds; seeds needed, were the mean and sd to hold: moe-c over 1000)") !=
        std::string::npos);  // moe-c's mean is 0: no number of seeds; only it is across 0
  // Paired t: moe-a's and moe-b's |t| = 0.12 / (0.02/√3) = 10.392305, p = 1 − 10.392305 /
  // √(2 + 108) = 0.0091 (closed form at 2 degrees of freedom); moe-c's mean 0, p 1. Holm:
  // 0.0091 <= 0.05/3, 0.0091 <= 0.05/2, 1 > 0.05/1.
  CHECK(text.find("told apart from 0 for 2 of 3: moe-a (below 0), moe-b (above 0); the steps stop "
                  "at moe-c, p = 1.0000 > 0.05/1 = 0.0500") != std::string::npos);
  // The dense row has no interval: its cell is "-".
  const size_t at = text.find("\ndense ");
  REQUIRE(at != std::string::npos);
  CHECK(text.substr(at, text.find('\n', at + 1) - at).find('[') == std::string::npos);
  // The same line in the markdown and HTML reports.
  for (auto format : {moeplan::ReportFormat::markdown, moeplan::ReportFormat::html})
    CHECK(moeplan::render_replicate_report(folders, {"a", "b", "c"}, format)
              .find("wholly below 0 for 1 of 3 MoE points") != std::string::npos);
  // One point left across 0 by Holm (moe-c): one hollow marker.
  CHECK(occurrences(
            moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::html),
            "data-ring=") == 1);
}

TEST_CASE("replicates: two intervals below 0, one margin told apart when judged together") {
  // Dense 2.0 in three folders. moe-a margins -0.10, -0.12, -0.14: interval [-0.1697, -0.0703],
  // p 0.0091 (above). moe-d margins -0.05, -0.08, -0.11: mean -0.08, sd 0.03, half-width
  // 4.302653·0.03/√3 = 0.074524, interval [-0.1545, -0.0055], below 0 too; t = -4.618802, p = 1 −
  // 4.618802/√(2 + 21.333333) = 0.0438. moe-c margins -0.10, +0.10, 0: p 1. Holm over three:
  // 0.0091 <= 0.05/3 = 0.0167; 0.0438 > 0.05/2 = 0.0250, and the steps stop there.
  const auto folders = three_seeds({{"moe-a", {1.90, 1.88, 1.86}},
                                    {"moe-d", {1.95, 1.92, 1.89}},
                                    {"moe-c", {1.90, 2.10, 2.00}}});
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("[-0.1545, -0.0055]      0.0438") != std::string::npos);
  CHECK(text.find("lies wholly below 0 for 2 of 3 MoE points") != std::string::npos);
  CHECK(text.find("told apart from 0 for 1 of 3: moe-a (below 0); the steps stop at moe-d, p = "
                  "0.0438 > 0.05/2 = 0.0250") != std::string::npos);
  // The JSON summary says the same per point.
  const json doc = json::parse(
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::json));
  REQUIRE(doc["summary"].size() == 4);
  CHECK(doc["summary"][0]["vs_dense_holm_5pct"].is_null());  // dense
  CHECK(doc["summary"][1]["vs_dense_holm_5pct"] == true);
  CHECK(doc["summary"][2]["vs_dense_holm_5pct"] == false);
  CHECK(doc["summary"][2]["val_bpc_vs_dense_p"].get<double>() ==
        doctest::Approx(0.0438171).epsilon(1e-4));
  CHECK(doc["summary"][3]["vs_dense_holm_5pct"] == false);
  // The margins chart draws the two that Holm leaves across 0 hollow, and its legend says so.
  const std::string html =
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::html);
  CHECK(occurrences(html, "data-ring=") == 2);
  // Each ring lies on a point's dot (same centre): it hollows that marker.
  for (size_t at = html.find("data-ring="); at != std::string::npos;
       at = html.find("data-ring=", at + 1)) {
    const size_t cx = html.find(" cx=", at), end = html.find(" r=", cx);
    REQUIRE(end != std::string::npos);
    const std::string centre = html.substr(cx, end - cx);  // ` cx="..." cy="..."`
    CAPTURE(centre);
    CHECK(html.find("<circle" + centre + " r=\"") != std::string::npos);
  }
  CHECK(html.find("data-series=\"MoE: mean margin, 95 % interval; hollow: Holm does not rule out "
                  "0\"") != std::string::npos);
}

TEST_CASE("replicates: a p under 0.0001 in scientific notation, and 0 as 0") {
  // moe-e's margins -0.100, -0.101, -0.102: t = -0.101 / (0.001/√3) = -174.937, p = 1 − 174.937 /
  // √(2 + 174.937²) = 3.27e-05. moe-f's -0.5 in every seed: sd 0, p 0 (not "0.0000").
  const auto folders = three_seeds({{"moe-e", {1.900, 1.899, 1.898}}, {"moe-f", {1.5, 1.5, 1.5}}});
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b", "c"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("[-0.1035, -0.0985]     3.3e-05") != std::string::npos);
  CHECK(text.find("[-0.5000, -0.5000]           0") != std::string::npos);
  CHECK(text.find("told apart from 0 for 2 of 2: moe-e (below 0), moe-f (below 0)\n") !=
        std::string::npos);
}

TEST_CASE("replicates: a point paired in one folder only has no interval, and says so") {
  // moe-a pairs in a and b; moe-b only in a (b's moe-b still training).
  const std::vector<std::vector<json>> folders = {
      {with_seed(record("dense", true, 1.0, 2.0), 1),
       with_seed(record("moe-a", false, 0.2, 1.8), 1),
       with_seed(record("moe-b", false, 0.4, 1.9), 1)},
      {with_seed(record("dense", true, 1.0, 2.0), 2),
       with_seed(record("moe-a", false, 0.2, 1.7), 2),
       with_seed(record("moe-b", false, 0.4, 1.9, false), 2)}};
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  // moe-a's margins -0.2 and -0.3: mean -0.25, sd 0.0707 (|mean|/sd 3.536); t/√n with the
  // handbook's t is 8.98 at 2 seeds and 4.303/√3 = 2.484 at 3: 3 seeds needed.
  CHECK(text.find("across 0 for 1 (not told apart from 0 by these seeds; seeds needed, were the "
                  "mean and sd to hold: moe-a 3) (1 paired in one replicate only: no interval)") !=
        std::string::npos);
  // With only that point: no interval at all, said once.
  const std::vector<std::vector<json>> one = {{with_seed(record("dense", true, 1.0, 2.0), 1),
                                               with_seed(record("moe-b", false, 0.4, 1.9), 1)},
                                              {with_seed(record("dense", true, 1.0, 2.0), 2)}};
  const std::string none =
      moeplan::render_replicate_report(one, {"a", "b"}, moeplan::ReportFormat::text);
  CHECK(none.find("no MoE point is paired with its dense baseline in two replicates or more") !=
        std::string::npos);
  CHECK(none.find("wholly below") == std::string::npos);
  // One point with an interval (moe-a in the case above) is no family: no Holm line.
  CHECK(text.find("taken together") == std::string::npos);
  // Its margin is drawn, without a whisker.
  const std::string none_html =
      moeplan::render_replicate_report(one, {"a", "b"}, moeplan::ReportFormat::html);
  CHECK(none_html.find("data-series=\"MoE: mean margin, 95 % interval\"") != std::string::npos);
  CHECK(none_html.find("data-whisker=") == std::string::npos);
}

TEST_CASE("one folder: the hint to replicate only where a MoE point is compared") {
  const std::string alone = moeplan::render_run_report({record("dense", true, 1.0, 2.0)}, "runs",
                                                       moeplan::ReportFormat::text);
  CHECK(alone.find("one run per point") == std::string::npos);
  const std::string no_dense = moeplan::render_run_report({record("moe-a", false, 0.2, 1.8)},
                                                          "runs", moeplan::ReportFormat::text);
  CHECK(no_dense.find("one run per point") == std::string::npos);
}

TEST_CASE("replicates with no MoE point paired: no '0 of 0'") {
  std::vector<std::vector<json>> folders;
  for (int seed : {1, 2}) folders.push_back({with_seed(record("dense", true, 1.0, 2.0), seed)});
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("no MoE point is paired with its folder's dense baseline") != std::string::npos);
  CHECK(text.find("0 of 0") == std::string::npos);
}

TEST_CASE("report: C judged at the sweep's compute tolerance; D̂ above the baseline's unequal") {
  // n 5 %, compute 1 %: C −2 % is unequal whatever N's tolerance.
  json dense = record("dense", true, 1.0, 2.0);
  dense["sweep_tolerances"] = {{"n", 0.05}, {"compute", 0.01}};
  json moe_c = record("moe-c", false, 0.2, 1.8);
  moe_c["measured"]["compute"]["paper"] = 0.98 * 4e5;
  // Strict reuse: 200 unique tokens against the baseline's 100 is not equal D̂ either (only
  // fewer had been tried).
  json moe_u = record("moe-u", false, 0.3, 1.7);
  moe_u["plan"]["tokens_unique"] = 200.0;
  moe_u["measured"]["tokens"]["unique"] = 200;
  moe_u["measured"]["tokens"]["epochs"] = 2.0;
  moe_u["plan"]["epochs"] = 2.0;
  const std::string text =
      moeplan::render_run_report({dense, moe_c, moe_u}, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("moe-c: C [paper] 392k is -2.00% from the baseline's 400k") != std::string::npos);
  CHECK(text.find("moe-u: D̂ 200 unique is not the baseline's 100 (strict reuse)") !=
        std::string::npos);
}

TEST_CASE("replicates: points trained as an ablation are named with their folder") {
  // One replicate's records came from a manifest with equal_resources = false: the verdict named
  // "dense, moe-a" with no folder, and with two such folders "dense, moe-a, dense, moe-a".
  std::vector<std::vector<json>> folders;
  for (int seed : {1, 2, 3}) {
    json d = with_seed(record("dense", true, 1.0, 2.0), seed);
    json m = with_seed(record("moe-a", false, 0.2, 1.8), seed);
    if (seed != 2) d["sweep_equal_resources"] = m["sweep_equal_resources"] = false;
    folders.push_back({d, m});
  }
  const std::string text = moeplan::render_replicate_report(
      folders, {"runs/s1", "runs/s2", "runs/s3"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("NOT an equal-resource sweep: dense, moe-a in runs/s1; dense, moe-a in runs/s3 "
                  "trained from a manifest that says equal_resources = false") !=
        std::string::npos);
}

// A dense baseline and two MoE points, trained on one kind of GPU ("GPU X") with CUDA.
std::vector<json> on_gpu_x() {
  std::vector<json> recs = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8),
                            record("moe-b", false, 0.3, 1.7)};
  for (json& r : recs) {
    r["device"] = "cuda";
    r["hardware"] = json::array({"GPU X"});
  }
  return recs;
}

TEST_CASE("report: MFU of a device whose peak is known; times of other hardware not compared") {
  // record(): 5e5 FLOPs executed in 10 s. 1e5 of them padding: useful 4e5 in 10 s = 4e4 FLOP/s.
  // On 2 ranks of a 1e5 FLOP/s peak each: 4e4 / 2 / 1e5 = 20.0 %.
  std::vector<json> recs = on_gpu_x();
  for (json& r : recs) {
    r["world_size"] = 2;
    r["peak_flops_per_second_per_device"] = 1e5;
    r["measured"]["flops"]["by_category"] = {{"padding", {{"forward", 1e5}}}};
  }
  // moe-b was resumed on other hardware: its time is a mix, compared with nothing, no MFU.
  recs[2]["hardware"] = json::array({"GPU X", "GPU Y"});
  recs[2].erase("peak_flops_per_second_per_device");
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("MFU [exact/causal useful, of the device peak]") != std::string::npos);
  // The time table's rows; their last two cells are the time ratio and the MFU.
  const size_t times = text.find("train time vs dense");
  auto row = [&](const std::string& id) { return row_of(text, id, times); };
  auto last_two = [&](const std::string& id) {
    const std::vector<std::string> cells = cells_of_row(text, id, times);
    return cells.size() < 2 ? std::string() : cells[cells.size() - 2] + " " + cells.back();
  };
  CHECK_MESSAGE(row("moe-a").find("cuda (GPU X) x2") != std::string::npos, row("moe-a"));
  CHECK(last_two("moe-a") == "1.00x 20.0%");
  CHECK_MESSAGE(row("moe-b").find("cuda (GPU X then GPU Y) x2") != std::string::npos, row("moe-b"));
  CHECK(last_two("moe-b") == "- -");
  // The same device label on both points is not enough when both were resumed elsewhere.
  recs[0]["hardware"] = recs[2]["hardware"];
  const std::string mixed = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  for (const char* id : {"dense", "moe-a", "moe-b"}) {  // no time ratio (second to last: MFU)
    const std::vector<std::string> c = cells_of_row(mixed, id, mixed.find("train time vs dense"));
    REQUIRE(c.size() >= 2);
    CHECK_MESSAGE(c[c.size() - 2] == "-", id);
  }
  CHECK(mixed.find("Time = work / rate") == std::string::npos);  // nothing timed against dense
  // Markdown: the time table's heading is its title's first sentence, the rest a paragraph.
  const std::string md = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::markdown);
  CHECK_MESSAGE(md.find("\n## Time and achieved FLOP rate (equal C is not equal time)\n\nExecuted: "
                        "every product") != std::string::npos,
                md);
  // HTML has the column too; CPU records (no peak) have none.
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html)
            .find("<th>MFU [exact/causal useful, of the device peak]</th>") != std::string::npos);
  const std::vector<json> cpu = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  CHECK(moeplan::render_run_report(cpu, "runs", moeplan::ReportFormat::text).find("MFU") ==
        std::string::npos);
  CHECK(text.find("(given)") == std::string::npos);  // every peak here the maker's
  // A peak given to `moeplan run --peak-tflops`: the cell says so, and the title what it means.
  recs[0]["hardware"] = recs[1]["hardware"];  // the dense baseline on GPU X alone again
  recs[1]["peak_source"] = "given";
  const std::string given = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  const size_t given_times = given.find("train time vs dense");
  const std::vector<std::string> cells = cells_of_row(given, "moe-a", given_times);
  REQUIRE(cells.size() >= 3);  // cells split at spaces: "20.0%" and "(given)"
  CHECK(cells[cells.size() - 3] + " " + cells[cells.size() - 2] + " " + cells.back() ==
        "1.00x 20.0% (given)");
  CHECK(cells_of_row(given, "dense", given_times).back() == "20.0%");
  CHECK_MESSAGE(given.find("; (given): over the peak given to moeplan run --peak-tflops\n") !=
                    std::string::npos,
                given);
}

TEST_CASE("report: the most device memory a GPU point held, of its device's; none on a CPU") {
  std::vector<json> recs = on_gpu_x();
  // 51.4 GiB = 55,190,329,753 bytes (51.4 x 2^30, rounded down); 140 GiB = 150,323,855,360;
  // 68.5 MiB = 71,827,456. The dense baseline's record is from before the field: "-".
  recs[1]["device_memory"] = {{"peak_bytes", int64_t{55190329753}},
                              {"device_bytes", int64_t{150323855360}}};
  recs[2]["device_memory"] = {{"peak_bytes", 71827456}, {"device_bytes", int64_t{150323855360}}};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("train time vs dense");
  // The last cells: the time ratio and the memory (split at spaces: six words).
  auto last_cells = [&](const std::string& id) {
    const std::vector<std::string> cells = cells_of_row(text, id, times);
    std::string words;
    for (size_t i = cells.size() >= 6 ? cells.size() - 6 : 0; i < cells.size(); ++i)
      words += (words.empty() ? "" : " ") + cells[i];
    return words;
  };
  CHECK(last_cells("moe-a") == "1.00x 51.40 GiB of 140.00 GiB");
  CHECK(last_cells("moe-b") == "1.00x 68.5 MiB of 140.00 GiB");
  CHECK(cells_of_row(text, "dense", times).back() == "-");
  CHECK(text.find("device memory, most held") != std::string::npos);
  CHECK(text.find(". Device memory: the most moeplan's buffers held at once on one device (rank "
                  "0's), of its size") != std::string::npos);
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html)
            .find("<th>device memory, most held</th>") != std::string::npos);
  // The HTML chart of memory against r_a needs the dense baseline's memory as its reference:
  // without it, none. With it (32 GiB), one marker a MoE point that has a figure.
  const auto memory_chart = [&](const std::vector<json>& rs) {
    const std::string html = moeplan::render_run_report(rs, "runs", moeplan::ReportFormat::html);
    const size_t at = html.find("Device memory held against the activation rate (");
    return at == std::string::npos ? std::string() : html.substr(at, html.find("</svg>", at) - at);
  };
  CHECK(memory_chart(recs).empty());
  recs[0]["device_memory"] = {{"peak_bytes", int64_t{32} << 30},
                              {"device_bytes", int64_t{150323855360}}};
  std::string chart = memory_chart(recs);
  // These records are from before the kernel request was kept: named by the device.
  CHECK(chart.rfind("Device memory held against the activation rate (cuda (GPU X))<", 0) == 0);
  CHECK(chart.find("dense baseline (32.00 GiB)") != std::string::npos);
  CHECK(occurrences(chart, "<circle") == 2);
  // At their own heights: 51.4 GiB above 68.5 MiB (SVG's y grows downwards).
  const auto cy = [&](size_t n) {
    size_t at = chart.find("<circle");
    for (size_t i = 0; i < n; ++i) at = chart.find("<circle", at + 1);
    return std::stod(chart.substr(chart.find("cy=\"", at) + 4));
  };
  CHECK(cy(0) < cy(1));
  recs[2].erase("device_memory");
  CHECK(occurrences(memory_chart(recs), "<circle") == 1);
  // CPU records have no such field, and the table no such column.
  const std::vector<json> cpu = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  CHECK(
      moeplan::render_run_report(cpu, "runs", moeplan::ReportFormat::text).find("device memory") ==
      std::string::npos);
}

TEST_CASE("report: a damaged hardware list, peak or rank count is refused by key") {
  const std::filesystem::path dir = moeplan::test::fresh_dir("report_hardware");
  auto refused = [&](const char* key, const json& value, const char* want) {
    json r = record("dense", true, 1.0, 2.0);
    r[key] = value;
    std::filesystem::create_directories(dir / "dense");
    std::ofstream(dir / "dense" / "record.json") << r.dump();
    const std::string expected = std::string("'") + key + "' is " + want;
    CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir), doctest::Contains(expected.c_str()),
                         moeplan::InputError);
  };
  refused("hardware", "GPU X", "not a list of strings");
  refused("hardware", json::array({1}), "not a list of strings");
  refused("peak_flops_per_second_per_device", 0, "not a FLOP rate > 0");
  refused("peak_flops_per_second_per_device", "989e12", "not a FLOP rate > 0");
  refused("peak_source", "guessed", "not \"built-in\" (the maker's) or \"given\" (--peak-tflops)");
  refused("peak_source", true, "not \"built-in\" (the maker's) or \"given\" (--peak-tflops)");
  refused("world_size", 0, "not a whole number of ranks from 1 to 1048576");
  refused("world_size", "2", "not a whole number of ranks from 1 to 1048576");
  refused("world_size", int64_t(1) << 40, "not a whole number of ranks from 1 to 1048576");
  const char* memory =
      "not {peak_bytes, device_bytes}, whole numbers > 0, the peak within the device";
  refused("device_memory", 5, memory);
  refused("device_memory", json::parse(R"({"peak_bytes":1024})"), memory);
  refused("device_memory", json::parse(R"({"peak_bytes":0,"device_bytes":1024})"), memory);
  refused("device_memory", json::parse(R"({"peak_bytes":2048,"device_bytes":1024})"), memory);
  refused("device_memory", json::parse(R"({"peak_bytes":"1","device_bytes":1024})"), memory);
  refused("kernels_requested", 3, "not a string");
  refused("threads_requested", -1, "not a whole number >= 0");
  refused("threads_requested", "2", "not a whole number >= 0");
  const char* layouts =
      "not a list of {from_step, world_size, micro_batch, threads} (whole numbers >= 0), "
      "optimizer_sharded (true or false) and kernels (a string)";
  refused("layouts", json::object(), layouts);
  refused("layouts", json::parse(R"([{"from_step":0,"world_size":2,"micro_batch":0}])"), layouts);
  refused("layouts", json::parse(R"([{"from_step":0,"world_size":2,"micro_batch":0,"threads":0,
                           "optimizer_sharded":1}])"),
          layouts);
  refused("layouts", json::parse(R"([{"from_step":-1,"world_size":2,"micro_batch":0,"threads":0,
                           "optimizer_sharded":false,"kernels":""}])"),
          layouts);
}

TEST_CASE("report: points run under one kernel request are timed against each other") {
  // One command trained both on one GPU with `auto`: the MoE point resolved to another experts
  // kernel (and, say, another attention kernel for its head width) than the dense baseline. Its
  // time is still compared: each point ran at moeplan's own choice for it.
  std::vector<json> recs = on_gpu_x();
  for (json& r : recs) {
    r["kernels_requested"] = "";
    r["threads_requested"] = 0;
  }
  recs[0]["kernels"] = "attention=fused_mma_lean,experts=tiled128";
  recs[1]["kernels"] = "attention=fused_mma,experts=wgmma,router=tiled";
  recs[2]["kernels"] = recs[0]["kernels"];
  recs[2]["kernels_requested"] = "experts=tiled";  // asked for otherwise: not comparable
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("train time vs dense");
  CHECK(cells_of_row(text, "moe-a", times).back() == "1.00x");
  CHECK(cells_of_row(text, "moe-b", times).back() == "-");
  // The time chart names what its points share: the request.
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html)
            .find("Training time against the activation rate (cuda (GPU X) --kernels auto)") !=
        std::string::npos);
  // The device column names what ran.
  CHECK(row_of(text, "moe-a", times).find("cuda (GPU X) attention=fused_mma,experts=wgmma") !=
        std::string::npos);
  CHECK(text.find("under the same --kernels and --threads request (auto chooses for each "
                  "point)") != std::string::npos);
  // Records from before the request was kept are compared by the kernels that ran.
  for (json& r : recs) {
    r.erase("kernels_requested");
    r.erase("threads_requested");
  }
  const std::string old = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  const size_t t2 = old.find("train time vs dense");
  CHECK(cells_of_row(old, "moe-a", t2).back() == "-");
  CHECK(cells_of_row(old, "moe-b", t2).back() == "1.00x");
  // So are a new record and an old one (a sweep whose baseline was trained before the request
  // was kept): moe-b ran the baseline's kernels.
  recs[2]["kernels_requested"] = "";
  recs[2]["threads_requested"] = 0;
  const std::string mixed = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(cells_of_row(mixed, "moe-b", mixed.find("train time vs dense")).back() == "1.00x");
  // On the CPU, --threads 2 gives a small model one thread (its kernels say so) and a larger one
  // two: one request, compared.
  std::vector<json> cpu = {record("dense", true, 1.0, 2.0), record("moe-a", false, 0.2, 1.8)};
  cpu[0]["kernels"] = "eigen-fp32, 2 threads";
  cpu[1]["kernels"] = "eigen-fp32";
  for (json& r : cpu) {
    r["kernels_requested"] = "";
    r["threads_requested"] = 2;
  }
  const std::string c = moeplan::render_run_report(cpu, "runs", moeplan::ReportFormat::text);
  CHECK(cells_of_row(c, "moe-a", c.find("train time vs dense")).back() == "1.00x");
  cpu[1]["threads_requested"] = 1;
  const std::string c1 = moeplan::render_run_report(cpu, "runs", moeplan::ReportFormat::text);
  CHECK(cells_of_row(c1, "moe-a", c1.find("train time vs dense")).back() == "-");
}

TEST_CASE("report: a point resumed in another layout (--elastic) is timed against nothing") {
  std::vector<json> recs = on_gpu_x();
  // moe-b trained its first 7 steps on 2 ranks, the rest on 1: its label says where the layout
  // changed and it gets no ratio. Given to the dense baseline instead, no point gets one.
  recs[2]["layouts"] = json::parse(R"([
      {"from_step":0,"world_size":2,"micro_batch":0,"threads":0,"optimizer_sharded":false,
       "kernels":"k"},
      {"from_step":7,"world_size":1,"micro_batch":0,"threads":0,"optimizer_sharded":false,
       "kernels":"k"}])");
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("train time vs dense");
  CHECK(cells_of_row(text, "moe-a", times).back() == "1.00x");
  CHECK(cells_of_row(text, "moe-b", times).back() == "-");
  CHECK_MESSAGE(row_of(text, "moe-b", times).find("cuda (GPU X), another layout from step 7") !=
                    std::string::npos,
                row_of(text, "moe-b", times));
  CHECK(text.find("a point resumed on other hardware or in another layout has none") !=
        std::string::npos);
  recs[0]["layouts"] = recs[2]["layouts"];
  recs[2].erase("layouts");
  const std::string other = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  const size_t t2 = other.find("train time vs dense");
  CHECK(cells_of_row(other, "moe-a", t2).back() == "-");
  CHECK(cells_of_row(other, "moe-b", t2).back() == "-");
}

// The last n cells of point `id`'s row in the table after `from`, joined by blanks.
std::string last_cells(const std::string& text, const std::string& id, size_t from, size_t n) {
  const std::vector<std::string> cells = cells_of_row(text, id, from);
  std::string words;
  for (size_t i = cells.size() - std::min(n, cells.size()); i < cells.size(); ++i)
    words += (words.empty() ? "" : " ") + cells[i];
  return words;
}

// A record's evaluations at the training seconds given: val BPC `bpc[i]` at `seconds[i]`, the
// last its final BPC and its training time.
json timed(json r, const std::vector<double>& bpc, const std::vector<double>& seconds) {
  r["val_curve"] = json::array();
  for (size_t i = 0; i < bpc.size(); ++i)
    r["val_curve"].push_back({{"step", int(i + 1)}, {"val_bpc", bpc[i]}});
  r["val_curve_train_seconds"] = seconds;
  r["final_val_bpc"] = bpc.back();
  r["train_seconds"] = seconds.back();
  return r;
}

TEST_CASE("report: when each MoE point first reached the dense baseline's BPC, in training time") {
  // The dense baseline ends at 2.0 BPC after 10 s of training. By hand, the first evaluation at
  // or below 2.0:
  //   moe-a: 2.4, 2.1, 1.95 (18 s), 1.8      -> 18.0 s, 18 / 10 = 1.80x
  //   moe-b: 2.3, 2.1                         -> not reached
  //   moe-c: 2.5, 2.0 (8 s; equal counts)     -> 8.0 s, 0.80x
  //   moe-d: no times (an older record)       -> "-", and not counted
  std::vector<json> recs = {
      timed(record("dense", true, 1.0, 2.0), {2.6, 2.0}, {5, 10}),
      timed(record("moe-a", false, 0.2, 1.8), {2.4, 2.1, 1.95, 1.8}, {6, 12, 18, 24}),
      timed(record("moe-b", false, 0.4, 2.1), {2.3, 2.1}, {3, 6}),
      timed(record("moe-c", false, 0.3, 2.0), {2.5, 2.0}, {4, 8}),
      record("moe-d", false, 0.5, 1.9)};
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("train time vs dense");
  REQUIRE(times != std::string::npos);
  CHECK(text.find("dense's final BPC reached [train s, vs dense]", times) != std::string::npos);
  auto last = [&](const std::string& id, size_t n) { return last_cells(text, id, times, n); };
  CHECK(last("moe-a", 3) == "18.0 s (1.80x)");
  CHECK(last("moe-b", 2) == "not reached");
  CHECK(last("moe-c", 3) == "8.0 s (0.80x)");
  CHECK(last("moe-d", 2) == "1.00x -");  // record()'s 10 s, the dense's 10 s; then no time
  CHECK(last("dense", 2) == "1.00x -");
  CHECK(text.find("Time to the dense baseline's final validation BPC (2.0000, after 10.0 s of "
                  "training): 2 of 3 MoE point(s) reached it, in 0.80x-1.80x the dense "
                  "baseline's training time; 1 of them in less.") != std::string::npos);
  // The same line in markdown and HTML.
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::markdown)
            .find("2 of 3 MoE point(s) reached it") != std::string::npos);
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(html.find("<p>Time to the dense baseline's final validation BPC") != std::string::npos);
  // The chart: the dense baseline's curve and the three compared points', and the line at 2.0.
  const size_t at = html.find("Validation BPC against training time (");
  REQUIRE(at != std::string::npos);
  const std::string chart = html.substr(at, html.find("</svg>", at) - at);
  CHECK(chart.find("dense baseline's final BPC (2.0000)") != std::string::npos);
  CHECK(occurrences(chart, "<polyline") == 5);  // dense, moe-a, moe-b, moe-c and the line
  CHECK(chart.find("moe-d") == std::string::npos);
  // A point on other hardware is not timed against the baseline: not compared, not drawn.
  recs[3]["hardware"] = json::array({"another CPU"});
  const std::string other = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(other.find("1 of 2 MoE point(s) reached it, in 1.80x the dense baseline's training "
                   "time; 0 of them in less.") != std::string::npos);
  // With no MoE point timed so, neither the column, nor the line, nor the chart.
  for (json& r : recs) r.erase("val_curve_train_seconds");
  const std::string none = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CHECK(none.find("reached [train s") == std::string::npos);
  CHECK(none.find("Time to the dense baseline") == std::string::npos);
  CHECK(none.find("against training time") == std::string::npos);
}

TEST_CASE("report: a point still training has reached the dense baseline's BPC, or not yet") {
  // A sweep stopped at a time limit: the dense baseline complete (2.0 BPC after 10 s), three MoE
  // points still training. Their curves so far are the start of their whole curves (the plan's
  // schedule), so a time at which one got to 2.0 is final; one that has not is "not yet", not
  // "not reached". By hand:
  //   moe-a (complete): 2.4, 1.9 (12 s)   -> 12.0 s, 1.20x
  //   moe-e (running):  2.3, 1.98 (15 s)  -> 15.0 s, 1.50x
  //   moe-f (running):  2.6, 2.2 (7 s)    -> not yet at 7.0 s
  //   moe-g (running):  no evaluation yet -> not yet (no evaluation)
  std::vector<json> recs = {timed(record("dense", true, 1.0, 2.0), {2.6, 2.0}, {5, 10}),
                            timed(record("moe-a", false, 0.2, 1.9), {2.4, 1.9}, {6, 12}),
                            timed(record("moe-e", false, 0.3, 1.98, false), {2.3, 1.98}, {8, 15}),
                            timed(record("moe-f", false, 0.4, 2.2, false), {2.6, 2.2}, {3, 7}),
                            record("moe-g", false, 0.5, 2.5, false)};
  recs[4]["val_curve"] = json::array();
  recs[4]["val_curve_train_seconds"] = json::array();
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("train time vs dense");
  REQUIRE(times != std::string::npos);
  auto last = [&](const std::string& id, size_t n) { return last_cells(text, id, times, n); };
  CHECK(last("moe-a", 3) == "12.0 s (1.20x)");
  CHECK(last("moe-e", 4) == "- 15.0 s (1.50x)");  // no time ratio: it has not finished
  CHECK(last("moe-f", 6) == "- not yet at 7.0 s");
  CHECK(last("moe-g", 5) == "- not yet (no evaluation)");
  CHECK(text.find("training): 2 of 4 MoE point(s) reached it, in 1.20x-1.50x the dense "
                  "baseline's training time; 0 of them in less; 2 point(s) still training had not "
                  "reached it by their last evaluation.") != std::string::npos);
  // The chart draws the curves so far of the points still training.
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  const size_t at = html.find("Validation BPC against training time (");
  REQUIRE(at != std::string::npos);
  const std::string chart = html.substr(at, html.find("</svg>", at) - at);
  CHECK(chart.find("moe-e") != std::string::npos);
  CHECK(chart.find("moe-f") != std::string::npos);
  // A ring where moe-a and moe-e reached 2.0, none on the others; the baseline's level grey and
  // dotted beside its dashed curve. By hand: x ticks 0 .. 15 (the level spans 3 .. 15), widened
  // for the ring at 15 by 6 px · 15 / 460 px = 0.1957; y ticks 1.8 .. 2.6, the rings inside.
  //   moe-a (12 s, 1.9):  x 70 + 12 / 15.1957 · 460 = 433.3, y 314 − 0.1 / 0.8 · 280 = 279.0
  //   moe-e (15 s, 1.98): x 70 + 15 / 15.1957 · 460 = 524.1, y 314 − 0.18 / 0.8 · 280 = 251.0
  CHECK(occurrences(chart, "data-ring=") == 2);
  CHECK(chart.find("<circle data-ring=\"moe-a\" cx=\"433.3\" cy=\"279.0\"") != std::string::npos);
  CHECK(chart.find("<circle data-ring=\"moe-e\" cx=\"524.1\" cy=\"251.0\"") != std::string::npos);
  CHECK(chart.find("dense baseline's final BPC (2.0000); \u25CB first reached") !=
        std::string::npos);
  CHECK(chart.find("stroke=\"#777777\" stroke-width=\"1.8\" stroke-dasharray=\"2 3\"") !=
        std::string::npos);
  // With the folder's audit, as `moeplan report` runs it: the audit errs on each running record
  // for its status alone (it judges nothing else of it), which leaves the figure as it was; any
  // other error of its, an error in the baseline, or a plan of another C takes it out.
  moeplan::FolderAudit audit;
  audit.claims = 2;
  audit.holding = 1;
  for (const char* id : {"moe-e", "moe-f", "moe-g"}) {
    audit.errors[id] = {"record is 'running', not complete"};
    audit.error_quantities[id] = {"status"};
  }
  auto cell_e = [&](const std::vector<json>& rs, const moeplan::FolderAudit* a) {
    const std::string t = moeplan::render_run_report(rs, "runs", moeplan::ReportFormat::text, a);
    const size_t at = t.find("train time vs dense");
    if (at == std::string::npos || t.find("dense's final BPC reached", at) == std::string::npos)
      return std::string("no column");
    return last_cells(t, "moe-e", at, 3);
  };
  CHECK(cell_e(recs, &audit) == "15.0 s (1.50x)");
  moeplan::FolderAudit other = audit;
  other.errors["moe-e"].push_back("another data source");
  other.error_quantities["moe-e"].insert("data");
  CHECK(cell_e(recs, &other) == "- - -");
  moeplan::FolderAudit in_dense = audit;
  in_dense.errors["dense"] = {"a ledger error"};
  in_dense.error_quantities["dense"] = {"flops"};
  CHECK(cell_e(recs, &in_dense) == "no column");  // no point compared: no column
  std::vector<json> off = recs;
  off[2]["plan"]["compute"] = 4.1e5;  // 2.5 % above the baseline's plan, over the 1 % tolerance
  CHECK(cell_e(off, &audit) == "- - -");
  off[2]["plan"]["compute"] = 4.03e5;  // 0.75 %: within it
  CHECK(cell_e(off, &audit) == "15.0 s (1.50x)");
  off[2]["plan"]["tokens_unique"] = 101.0;  // strict reuse: the baseline's D̂ unique exactly
  CHECK(cell_e(off, &audit) == "- - -");
  // Finished, moe-f would be "not reached" and no longer counted as training.
  recs[3]["status"] = "complete";
  const std::string done = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(cells_of_row(done, "moe-f", done.find("train time vs dense")).back() == "reached");
  CHECK(done.find("; 1 point(s) still training had not reached it") != std::string::npos);
}

TEST_CASE("report in HTML: the title's first sentence as the page's title and heading") {
  const std::vector<json> recs = {timed(record("dense", true, 1.0, 2.0), {2.6, 2.0}, {5, 10}),
                                  timed(record("moe-a", false, 0.2, 1.9), {2.4, 1.9}, {6, 12})};
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  CAPTURE(html);
  // The Markdown report's headings, as HTML: the first sentence of each title, then the rest.
  CHECK(html.find("<title>moeplan report: 2 run(s) in runs</title>") != std::string::npos);
  CHECK(html.find("<h1>moeplan report: 2 run(s) in runs</h1>\n<p>BPC = validation bits per "
                  "byte") != std::string::npos);
  CHECK(html.find("<h2>Charts</h2>\n<figure>") != std::string::npos);
  CHECK(html.find("<h2>Time and achieved FLOP rate (equal C is not equal time)</h2>\n<p>Executed: "
                  "every product") != std::string::npos);
  // Each table in a box of its own that scrolls across, not the page.
  CHECK(occurrences(html, "<div class=\"wide\"><table>") == 2);
  CHECK(occurrences(html, "</table>\n</div>") == 2);
  // Text columns left-aligned as in the terminal's table (the page sets cells right-aligned):
  // the point and status columns, the time table's point and device.
  CHECK(occurrences(html, "<th class=\"l\">point</th>") == 2);
  CHECK(html.find("<th class=\"l\">status</th>") != std::string::npos);
  CHECK(html.find("<th class=\"l\">device</th>") != std::string::npos);
  CHECK(html.find("<td class=\"l\">complete</td>") != std::string::npos);
  CHECK(html.find("<td class=\"l\">cpu</td>") != std::string::npos);
  CHECK(html.find("<td>0.200</td>") != std::string::npos);  // r_a: right, the page's default
  CHECK(html.find(".l{text-align:left}") != std::string::npos);
  // Replicates: the same head.
  const std::string reps =
      moeplan::render_replicate_report({{with_seed(recs[0], 1), with_seed(recs[1], 1)},
                                        {with_seed(recs[0], 2), with_seed(recs[1], 2)}},
                                       {"a", "b"}, moeplan::ReportFormat::html);
  CHECK(reps.find(
            "<title>moeplan report: 2 points over 2 runs folders of one sweep: a (seed/data_seed "
            "1/") != std::string::npos);
  CHECK(reps.find("<h1>moeplan report: 2 points over 2 runs folders") != std::string::npos);
  CHECK(occurrences(reps, "<div class=\"wide\"><table>") == 1);
}

TEST_CASE("report charts as files: the HTML report's charts, each whole, named by its id") {
  const std::vector<json> recs = {timed(record("dense", true, 1.0, 2.0), {2.6, 2.0}, {5, 10}),
                                  timed(record("moe-a", false, 0.2, 1.9), {2.4, 1.9}, {6, 12})};
  const std::string html = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html);
  const std::vector<moeplan::ChartFile> charts = moeplan::run_report_charts(recs);
  std::vector<std::string> ids;
  for (const auto& c : charts) {
    ids.push_back(c.id);
    CHECK(c.svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));  // a document alone
    CHECK(c.svg.ends_with("</svg>\n"));
    CHECK_MESSAGE(html.find(c.svg) != std::string::npos, c.id);  // the report's own drawing
  }
  // Final BPC and time against r_a, BPC against time, against compute, loss against tokens; no
  // memory chart without a GPU's device_memory.
  CHECK(ids == std::vector<std::string>{"bpc-ra", "time-ra", "bpc-time", "val-c", "loss-d"});
  CHECK(occurrences(html, "<svg") == 5);
  const std::vector<std::vector<json>> folders = {{with_seed(recs[0], 1), with_seed(recs[1], 1)},
                                                  {with_seed(recs[0], 2), with_seed(recs[1], 2)}};
  const std::vector<moeplan::ChartFile> reps =
      moeplan::replicate_report_charts(folders, {"a", "b"});
  REQUIRE(reps.size() == 2);
  CHECK(reps[0].id == "replicates");
  CHECK(reps[1].id == "margins");
  CHECK(moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::html)
            .find(reps[0].svg) != std::string::npos);
}

namespace {

// A record with this FLOP ledger (its total, padding and recompute) and training time.
json with_flops(json r, double total, double padding, double recompute, double secs) {
  r["measured"]["flops"] = {
      {"total", total},
      {"by_category",
       {{"padding", {{"forward", padding}}}, {"recompute", {{"forward", recompute}}}}}};
  r["train_seconds"] = secs;
  return r;
}

}  // namespace

TEST_CASE("report: each point's work against the dense baseline's, and time = work / rate") {
  // Useful FLOPs: the ledger's total less padding and recompute. By hand:
  //   dense: 1.0e6 - 1e5 padding          = 9.0e5 in 10 s
  //   moe-a: 1.2e6 - 1.5e5 recompute      = 1.05e6 -> 1.05e6 / 9e5 = 1.17x, in 30 s: 3.00x,
  //          so its rate is 1.1667 / 3 = 0.39x the dense's
  //   moe-b: 9.0e5                        -> 1.00x, in 15 s: 1.50x, rate 0.67x
  //   moe-c: running                      -> "-"
  //   moe-e: 1.8e6 on another CPU         -> 2.00x, but not timed: outside the line's ranges
  std::vector<json> recs = {with_flops(record("dense", true, 1.0, 2.0), 1e6, 1e5, 0, 10),
                            with_flops(record("moe-a", false, 0.2, 1.8), 1.2e6, 0, 1.5e5, 30),
                            with_flops(record("moe-b", false, 0.3, 1.9), 9e5, 0, 0, 15),
                            with_flops(record("moe-c", false, 0.4, 1.9, false), 4e5, 0, 0, 5),
                            with_flops(record("moe-e", false, 0.5, 1.9), 1.8e6, 0, 0, 20)};
  recs[4]["hardware"] = json::array({"another CPU"});
  const std::string text = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CAPTURE(text);
  const size_t times = text.find("FLOPs vs dense [exact/causal useful]");
  REQUIRE(times != std::string::npos);
  auto last_two = [&](const std::string& id) {  // the work, then the time ratio
    const std::vector<std::string> c = cells_of_row(text, id, times);
    return c.size() < 2 ? std::string() : c[c.size() - 2] + " " + c.back();
  };
  CHECK(last_two("dense") == "1.00x 1.00x");
  CHECK(last_two("moe-a") == "1.17x 3.00x");
  CHECK(last_two("moe-b") == "1.00x 1.50x");
  CHECK(last_two("moe-c") == "- -");
  CHECK(last_two("moe-e") == "2.00x -");
  CHECK(text.find("Time = work / rate: against the dense baseline, 2 MoE point(s) timed with it "
                  "did 1.00x-1.17x its useful FLOPs [exact/causal] at 0.39x-0.67x its useful "
                  "FLOP rate") != std::string::npos);
  CHECK(text.find("Equal C [paper] is not equal work: the paper convention counts neither the LM "
                  "head nor the router") != std::string::npos);
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::markdown)
            .find("\n\nTime = work / rate: ") != std::string::npos);
  CHECK(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::html)
            .find("<p>Time = work / rate: ") != std::string::npos);
  // One point timed: one figure, not a range.
  recs[2]["hardware"] = recs[4]["hardware"];
  const std::string one = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(one.find("1 MoE point(s) timed with it did 1.17x its useful FLOPs [exact/causal] at 0.39x "
                 "its useful FLOP rate") != std::string::npos);
  // A sweep planned in another convention: the ratios, without the paper convention's note.
  for (json& r : recs) r["plan"]["convention"] = "exact";
  const std::string exact = moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::text);
  CHECK(exact.find("Time = work / rate") != std::string::npos);
  CHECK(exact.find("Equal C [paper] is not equal work") == std::string::npos);
}

TEST_CASE("report: damaged evaluation times are refused by key") {
  const std::filesystem::path dir = moeplan::test::fresh_dir("report_eval_times");
  auto refused = [&](const json& value, const char* want) {
    json r = timed(record("dense", true, 1.0, 2.0), {2.6, 2.0}, {5, 10});
    r["val_curve_train_seconds"] = value;
    std::filesystem::create_directories(dir / "dense");
    std::ofstream(dir / "dense" / "record.json") << r.dump();
    CHECK_THROWS_WITH_AS(moeplan::load_run_records(dir), doctest::Contains(want),
                         moeplan::InputError);
  };
  refused(json::array({5}), "'val_curve_train_seconds' is not a list of 2 numbers");
  refused(json::array({5, "10"}), "'val_curve_train_seconds[1]' is not a number >= 0");
  refused(json::array({6, 5}), "'val_curve_train_seconds[1]' is not at least the evaluation's");
  refused(json::array({5, 11}), "'val_curve_train_seconds[1]' is not at most the record's");
}

TEST_CASE("replicates: time to each folder's dense baseline's BPC, counted and averaged by hand") {
  // Folder A: dense 2.0 after 10 s; moe-a first at or below 2.0 at 15 s (1.5x); moe-b never.
  // Folder B: dense 1.9 after 8 s; moe-a first at or below 1.9 at 16 s (2.0x); moe-b at 6 s
  // (0.75x). moe-a: 2 of 2, mean (1.5 + 2.0) / 2 = 1.75x; moe-b: 1 of 2, 0.75x.
  const std::vector<std::vector<json>> folders = {
      {with_seed(timed(record("dense", true, 1.0, 2.0), {2.5, 2.0}, {5, 10}), 1),
       with_seed(timed(record("moe-a", false, 0.2, 1.8), {2.2, 1.99, 1.8}, {5, 15, 20}), 1),
       with_seed(timed(record("moe-b", false, 0.4, 2.1), {2.4, 2.1}, {6, 12}), 1)},
      {with_seed(timed(record("dense", true, 1.0, 1.9), {2.5, 1.9}, {4, 8}), 2),
       with_seed(timed(record("moe-a", false, 0.2, 1.8), {2.0, 1.9, 1.8}, {8, 16, 24}), 2),
       with_seed(timed(record("moe-b", false, 0.4, 1.85), {1.88, 1.85}, {6, 12}), 2)}};
  const std::string text =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.find("dense's BPC reached (timed)  in time vs dense, mean") != std::string::npos);
  CHECK(cells_of_row(text, "moe-a").back() == "1.75x");
  CHECK(cells_of_row(text, "moe-b").back() == "0.75x");
  const std::vector<std::string> b = cells_of_row(text, "moe-b");
  CHECK(b[b.size() - 4] + " " + b[b.size() - 3] + " " + b[b.size() - 2] == "1 of 2");
  CHECK(cells_of_row(text, "dense").back() == "-");
  // Folder B's moe-b on other hardware: timed in one folder only, and not reached there.
  std::vector<std::vector<json>> other = folders;
  other[1][2]["hardware"] = json::array({"another CPU"});
  const std::string t2 =
      moeplan::render_replicate_report(other, {"a", "b"}, moeplan::ReportFormat::text);
  const std::vector<std::string> b2 = cells_of_row(t2, "moe-b");
  CHECK(b2.back() == "-");
  CHECK(b2[b2.size() - 4] + " " + b2[b2.size() - 3] + " " + b2[b2.size() - 2] == "0 of 1");
  // Records without the times: neither column.
  for (auto& f : other)
    for (json& r : f) r.erase("val_curve_train_seconds");
  CHECK(moeplan::render_replicate_report(other, {"a", "b"}, moeplan::ReportFormat::text)
            .find("dense's BPC reached") == std::string::npos);
}

namespace {

// A CSV text's rows, each a map from the header's names to its cells, read as RFC 4180 has them
// (a quoted field may hold commas, doubled quotes and line breaks). Every row must have the
// header's number of cells.
std::vector<std::map<std::string, std::string>> csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> lines(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    std::string& cell = lines.back().back();
    if (quoted) {
      if (c != '"')
        cell += c;
      else if (i + 1 < text.size() && text[i + 1] == '"')
        cell += text[++i];
      else
        quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      lines.back().emplace_back();
    } else if (c == '\n') {
      lines.emplace_back(1);
    } else {
      cell += c;
    }
  }
  REQUIRE(lines.back() == std::vector<std::string>(1));  // the text ends in a line break
  lines.pop_back();
  REQUIRE(!lines.empty());
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    REQUIRE(lines[i].size() == lines[0].size());
    std::map<std::string, std::string> row;
    for (size_t k = 0; k < lines[0].size(); ++k) row[lines[0][k]] = lines[i][k];
    rows.push_back(row);
  }
  return rows;
}

double number(const std::string& cell) {
  REQUIRE_MESSAGE(!cell.empty(), "an empty cell where a number was expected");
  return std::stod(cell);
}

}  // namespace

TEST_CASE("report as csv and json: each point's figures unrounded, empty or null for the '-'") {
  // By hand (record(): 400 tokens consumed, 100 unique; the dense baseline 2.0 BPC in 10 s):
  //   dense: 1.0e6 executed, 1e5 of it padding: useful 9e5; in 10 s 1e5 and 9e4 FLOP/s; 40 tok/s
  //   moe-a: 1.2e6, 1.5e5 recompute: useful 1.05e6 = 1.1667x the dense's, in 30 s = 3.00x; its
  //          useful rate 3.5e4 FLOP/s over a 1e5 peak = 0.35; 1.8 BPC: -0.2, beats dense
  //   moe-c: running: no BPC, no C verdict, "not complete"
  //   moe-e: 1.8e6 = 2.00x the work, on another CPU: no time ratio; 1.9 BPC: -0.1
  //   moe-f: N 1100, 10 % off the baseline's: "not equal", no difference, no work ratio; its
  //          time 10 s on the baseline's CPU: 1.00x; the audit's error, a comma in it
  std::vector<json> recs = {with_flops(record("dense", true, 1.0, 2.0), 1e6, 1e5, 0, 10),
                            with_flops(record("moe-a", false, 0.2, 1.8), 1.2e6, 0, 1.5e5, 30),
                            with_flops(record("moe-c", false, 0.3, 1.9, false), 4e5, 0, 0, 5),
                            with_flops(record("moe-e", false, 0.4, 1.9), 1.8e6, 0, 0, 20),
                            with_flops(record("moe-f", false, 0.5, 2.1), 1e6, 0, 0, 10)};
  recs[1]["peak_flops_per_second_per_device"] = 1e5;
  recs[3]["hardware"] = json::array({"another CPU"});
  recs[4]["measured"]["total_params"] = 1100;
  moeplan::FolderAudit audit;
  audit.claims = 3;
  audit.holding = 2;
  audit.failing = {"equal N"};
  audit.errors["moe-f"] = {"N is 10% off, by hand"};
  audit.error_quantities["moe-f"] = {"total_params"};

  const std::string csv =
      moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::csv, &audit);
  CAPTURE(csv);
  CHECK(csv.starts_with("point,role,status,"));
  CHECK(csv.find(",\"N is 10% off, by hand\"\n") != std::string::npos);
  const auto rows = csv_rows(csv);
  REQUIRE(rows.size() == 5);
  std::map<std::string, std::map<std::string, std::string>> by;
  for (const auto& row : rows) by[row.at("point")] = row;
  const auto& d = by["dense"];
  CHECK(d.at("vs_dense") == "baseline");
  CHECK(d.at("val_bpc_vs_dense").empty());
  CHECK(number(d.at("flops_useful_exact_causal")) == doctest::Approx(9e5));
  CHECK(number(d.at("flops_per_second_executed_exact_causal")) == doctest::Approx(1e5));
  CHECK(number(d.at("flops_per_second_useful_exact_causal")) == doctest::Approx(9e4));
  CHECK(number(d.at("tokens_per_second_consumed")) == doctest::Approx(40));
  CHECK(number(d.at("tokens_consumed_measured")) == 400);
  CHECK(number(d.at("tokens_unique_measured")) == 100);
  CHECK(d.at("activation_rate_target").empty());
  CHECK(d.at("mfu_useful").empty());
  const auto& a = by["moe-a"];
  CHECK(a.at("vs_dense") == "compared");
  CHECK(number(a.at("val_bpc")) == 1.8);  // unrounded: the table prints 1.8000
  CHECK(number(a.at("val_bpc_vs_dense")) == doctest::Approx(-0.2));
  CHECK(a.at("beats_dense") == "true");
  CHECK(number(a.at("useful_flops_vs_dense")) == doctest::Approx(1.05e6 / 9e5));
  CHECK(number(a.at("train_time_vs_dense")) == doctest::Approx(3.0));
  CHECK(number(a.at("mfu_useful")) == doctest::Approx(0.35));
  CHECK(a.at("compute_ok") == "true");
  CHECK(a.at("compute_convention") == "paper");
  CHECK(number(a.at("compute_measured_flops")) == 4e5);
  const auto& c = by["moe-c"];
  CHECK(c.at("status") == "running");
  CHECK(c.at("val_bpc").empty());
  CHECK(c.at("compute_ok").empty());
  CHECK(c.at("vs_dense") == "not complete");
  CHECK(number(c.at("steps_measured")) == 2);
  const auto& e = by["moe-e"];
  CHECK(number(e.at("val_bpc_vs_dense")) == doctest::Approx(-0.1));
  CHECK(number(e.at("useful_flops_vs_dense")) == doctest::Approx(2.0));
  CHECK(e.at("train_time_vs_dense").empty());
  CHECK(e.at("device") == "cpu (another CPU)");
  const auto& f = by["moe-f"];
  CHECK(f.at("vs_dense") == "not equal");
  CHECK(f.at("val_bpc_vs_dense").empty());
  CHECK(f.at("beats_dense").empty());
  CHECK(f.at("useful_flops_vs_dense").empty());
  CHECK(number(f.at("train_time_vs_dense")) == doctest::Approx(1.0));
  CHECK(number(f.at("audit_errors")) == 1);
  CHECK(f.at("audit_first_error") == "N is 10% off, by hand");

  // JSON: the same figures as numbers, null for the empty cells, and what they are counted in.
  const json doc =
      json::parse(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::json, &audit));
  CHECK(doc["schema"] == 1);
  CHECK(doc["dense_baseline"] == "dense");
  CHECK(doc["audit"]["claims"] == 3);
  CHECK(doc["audit"]["failing"] == json::array({"equal N"}));
  CHECK(doc["audit"]["refused"].is_null());
  CHECK(doc["conventions"]["tokens"].get<std::string>().starts_with("consumed counts repeats"));
  const json& points = doc["points"];
  REQUIRE(points.size() == 5);
  CHECK(points[1]["point"] == "moe-a");
  CHECK(points[1]["mfu_useful"].get<double>() == doctest::Approx(0.35));
  CHECK(points[1]["beats_dense"] == true);
  CHECK(points[2]["val_bpc"].is_null());
  CHECK(points[3]["train_time_vs_dense"].is_null());
  CHECK(points[4]["val_bpc_vs_dense"].is_null());
  // Without an audit: null, not a claim count of 0.
  CHECK(json::parse(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::json))["audit"]
            .is_null());
  // The built-in corpus's parts as columns where the final evaluation has them.
  recs[0]["val_curve"][1]["parts"] = {{"facts", 1.25}, {"arith", 2.5}};
  recs[2]["val_curve"][1]["parts"] = {{"other", 3.0}};  // moe-c's, still training: no column
  const auto parts = csv_rows(moeplan::render_run_report(recs, "runs", moeplan::ReportFormat::csv));
  CHECK(number(parts[0].at("val_bpc_facts")) == 1.25);
  CHECK(number(parts[0].at("val_bpc_arith")) == 2.5);
  CHECK(parts[1].at("val_bpc_facts").empty());
  CHECK(parts[0].count("val_bpc_other") == 0);
}

TEST_CASE("replicates as csv and json: every folder's rows against its own dense baseline") {
  // Folder a: dense 2.0, moe-a 1.8 (-0.2); folder b: dense 1.9, moe-a 1.85 (-0.05).
  const std::vector<std::vector<json>> folders = {
      {with_seed(record("dense", true, 1.0, 2.0), 1),
       with_seed(record("moe-a", false, 0.2, 1.8), 1)},
      {with_seed(record("dense", true, 1.0, 1.9), 2),
       with_seed(record("moe-a", false, 0.2, 1.85), 2)}};
  const std::string csv =
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::csv);
  CAPTURE(csv);
  CHECK(csv.starts_with("folder,point,"));
  const auto rows = csv_rows(csv);
  REQUIRE(rows.size() == 4);
  CHECK(rows[1].at("folder") == "a");
  CHECK(number(rows[1].at("val_bpc_vs_dense")) == doctest::Approx(-0.2));
  CHECK(rows[3].at("folder") == "b");
  CHECK(rows[3].at("point") == "moe-a");
  CHECK(number(rows[3].at("val_bpc_vs_dense")) == doctest::Approx(-0.05));
  CHECK(number(rows[3].at("seed")) == 2);
  const json doc = json::parse(
      moeplan::render_replicate_report(folders, {"a", "b"}, moeplan::ReportFormat::json));
  CHECK(doc["replicates"] == 2);
  REQUIRE(doc["folders"].size() == 2);
  CHECK(doc["folders"][1]["folder"] == "b");
  CHECK(doc["folders"][1]["points"][1]["val_bpc_vs_dense"].get<double>() == doctest::Approx(-0.05));
  // The summary is the replicate table's rows, unrounded. moe-a's margins -0.2 and -0.05: mean
  // -0.125, sd 0.15/√2 = 0.106066; 95 % interval -0.125 ± 12.7062·0.106066/√2 (= 0.952965).
  // Dense: mean 1.95, sd 0.1/√2 = 0.0707107, and no margin (null).
  REQUIRE(doc["summary"].size() == 2);
  const json& ds = doc["summary"][0];
  CHECK(ds["point"] == "dense");
  CHECK(ds["val_bpc_mean"].get<double>() == doctest::Approx(1.95));
  CHECK(ds["val_bpc_sd"].get<double>() == doctest::Approx(0.0707107).epsilon(1e-6));
  CHECK(ds["val_bpc_vs_dense_ci95"].is_null());
  CHECK(ds["beats_dense"].is_null());
  const json& ms = doc["summary"][1];
  CHECK(ms["point"] == "moe-a");
  CHECK(ms["vs_dense_pairs"] == 2);
  CHECK(ms["beats_dense"] == 2);
  CHECK(ms["val_bpc_vs_dense_mean"].get<double>() == doctest::Approx(-0.125));
  CHECK(ms["val_bpc_vs_dense_sd"].get<double>() == doctest::Approx(0.106066).epsilon(1e-6));
  CHECK(ms["val_bpc_vs_dense_ci95"][0].get<double>() == doctest::Approx(-1.077965).epsilon(1e-6));
  CHECK(ms["val_bpc_vs_dense_ci95"][1].get<double>() == doctest::Approx(0.827965).epsilon(1e-6));
  // Its paired t: -0.125 / (0.106066/√2) = -1.666667 at one degree of freedom, p = 1 − (2/π)·
  // atan(1.666667) = 0.344042. One point has no family to step down over: null.
  CHECK(ms["val_bpc_vs_dense_p"].get<double>() == doctest::Approx(0.344042).epsilon(1e-5));
  CHECK(ms["vs_dense_holm_5pct"].is_null());
  CHECK(ds["val_bpc_vs_dense_p"].is_null());
  CHECK(ms["dense_bpc_reached_time_vs_dense_mean"].is_null());  // the records time nothing
  CHECK(doc["conventions"].contains("summary"));
  // A folder whose points are all still training has no final parts: its rows still have the
  // parts' columns (empty), so that every CSV row lines up with the header.
  std::vector<std::vector<json>> partial = folders;
  for (json& r : partial[0]) r["val_curve"][1]["parts"] = {{"facts", 1.5}};
  for (json& r : partial[1]) r["status"] = "running";
  const auto lined =
      csv_rows(moeplan::render_replicate_report(partial, {"a", "b"}, moeplan::ReportFormat::csv));
  REQUIRE(lined.size() == 4);
  CHECK(number(lined[0].at("val_bpc_facts")) == 1.5);
  CHECK(lined[2].at("val_bpc_facts").empty());
  // The replicates' checks hold for the export too: another plan is refused.
  std::vector<std::vector<json>> other = folders;
  other[1][1]["plan"]["total_params"] = 2000.0;
  CHECK_THROWS_AS(moeplan::render_replicate_report(other, {"a", "b"}, moeplan::ReportFormat::csv),
                  moeplan::InputError);
}

namespace {

// A record planned at `factor` times a step-law η of `eta` (as grid --lr-scale writes it), seed 1.
json at_lr(json r, double eta, double factor) {
  r["plan"]["lr_peak"] = eta * factor;
  r["plan"]["lr_min"] = 1e-5;
  std::ostringstream rule;
  rule << "step-law";
  if (factor != 1) rule << " ×" << factor;  // "step-law ×0.5", "step-law ×2"
  r["plan"]["rule"] = rule.str();
  r["train"] = {{"seed", 1}, {"data_seed", 1}};
  return r;
}

// Three folders at η ×0.5, ×1 and ×2: dense 2.10, 2.00, 1.95 (best at the highest η); moe-a
// 1.90, 1.80, 1.85 (best at ×1, bracketed); moe-b 1.99, 2.00, 2.05 (best at the lowest η).
std::vector<std::vector<json>> lr_folders() {
  const double factors[] = {0.5, 1, 2};
  const double dense[] = {2.10, 2.00, 1.95}, a[] = {1.90, 1.80, 1.85}, b[] = {1.99, 2.00, 2.05};
  std::vector<std::vector<json>> folders;
  for (int f = 0; f < 3; ++f)
    folders.push_back({at_lr(record("dense", true, 1.0, dense[f]), 0.01, factors[f]),
                       at_lr(record("moe-a", false, 0.2, a[f]), 0.02, factors[f]),
                       at_lr(record("moe-b", false, 0.4, b[f]), 0.03, factors[f])});
  return folders;
}

}  // namespace

TEST_CASE("learning-rate sweep: each point's best η, bracketed or not, and best against best") {
  const auto folders = lr_folders();
  const std::string text =
      moeplan::render_replicate_report(folders, {"lo", "mid", "hi"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(
      text.starts_with("moeplan report: a learning-rate sweep, 3 points over 3 runs folders: lo "
                       "(η ×0.5), mid (η ×1), hi (η ×2)"));
  // moe-a: best 1.80 at ×1 (η 0.02), tried below and above; 1.80 − dense's best 1.95 = −0.15.
  // moe-b: best 1.99 at ×0.5 (η 0.015), the lowest tried; 1.99 − 1.95 = +0.04.
  CHECK(cells_of_row(text, "dense") ==
        std::vector<std::string>{"dense", "1.000", "2.1000", "2.0000", "1.9500", "0.02", "×2",
                                 "no:", "highest", "η", "tried", "-"});
  CHECK(cells_of_row(text, "moe-a") == std::vector<std::string>{"moe-a", "0.200", "1.9000",
                                                                "1.8000", "1.8500", "0.02", "×1",
                                                                "yes", "-0.1500"});
  CHECK(cells_of_row(text, "moe-b") ==
        std::vector<std::string>{"moe-b", "0.400", "1.9900", "2.0000", "2.0500", "0.015", "×0.5",
                                 "no:", "lowest", "η", "tried", "+0.0400"});
  CHECK(text.find("dense baseline: best at η 0.02 (hi (η ×2)), the highest tried: its best may "
                  "lie higher\n") != std::string::npos);
  CHECK(text.find("each at its own best η of those tried, MoE points below the dense baseline: 1 "
                  "of 2\n") != std::string::npos);
  CHECK(text.find("best η at an end of those tried (another --lr-scale beyond it would tell "
                  "whether it is the best): dense (highest η tried), moe-b (lowest η tried)\n") !=
        std::string::npos);
  CHECK(text.find("one run per η and point") != std::string::npos);
  // HTML: the table and one chart, BPC against the factor, a line per point (dense dashed).
  const std::string html =
      moeplan::render_replicate_report(folders, {"lo", "mid", "hi"}, moeplan::ReportFormat::html);
  CHECK(occurrences(html, "<svg") == 1);
  CHECK(occurrences(html, "<polyline data-series=") == 3);
  // The factors on a log2 axis (×0.5, ×1, ×2 evenly apart): ticks -1, 0 and 1.
  CHECK(html.find("log2 of peak η / the step law's η") != std::string::npos);
  CHECK(html.find(">-1</text>") != std::string::npos);
  const auto charts = moeplan::replicate_report_charts(folders, {"lo", "mid", "hi"});
  REQUIRE(charts.size() == 1);
  CHECK(charts[0].id == "lr-sweep");
  // JSON: the summary per point, unrounded.
  const json doc = json::parse(
      moeplan::render_replicate_report(folders, {"lo", "mid", "hi"}, moeplan::ReportFormat::json));
  REQUIRE(doc["summary"].size() == 3);
  CHECK(doc["summary"][1]["point"] == "moe-a");
  CHECK(doc["summary"][1]["best_lr_peak"].get<double>() == doctest::Approx(0.02));
  CHECK(doc["summary"][1]["bracketed"] == true);
  CHECK(doc["summary"][1]["best_val_bpc_vs_dense_best"].get<double>() == doctest::Approx(-0.15));
  CHECK(doc["summary"][2]["best_folder"] == "lo");
  CHECK(doc["summary"][2]["bracketed"] == false);
  CHECK(doc["summary"][0]["best_val_bpc_vs_dense_best"].is_null());
}

TEST_CASE("learning-rate sweep: a point trained at one η only is not bracketed") {
  // dense only at ×0.5 and ×1 (hi has none); moe-a only at ×2 (lo and mid still training).
  auto folders = lr_folders();
  folders[2].erase(folders[2].begin());  // hi: no dense
  folders[0][1]["status"] = folders[1][1]["status"] = "running";
  const std::string text =
      moeplan::render_replicate_report(folders, {"lo", "mid", "hi"}, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(cells_of_row(text, "moe-a") ==
        std::vector<std::string>{"moe-a", "0.200", "running", "running", "1.8500", "0.04", "×2",
                                 "no:", "one", "η", "tried", "-0.1500"});
  // dense: 2.10 at ×0.5, 2.00 at ×1: best at the highest tried.
  CHECK(text.find("dense baseline: best at η 0.01 (mid (η ×1)), the highest tried") !=
        std::string::npos);
  CHECK(text.find("moe-a (one η tried)") != std::string::npos);
}

TEST_CASE("learning-rate sweep: other seeds, one η twice or two rules in a folder are refused") {
  auto refused = [](const std::vector<std::vector<json>>& folders, const std::string& words) {
    try {
      moeplan::render_replicate_report(folders, {"lo", "mid", "hi"}, moeplan::ReportFormat::text);
      FAIL("accepted");
    } catch (const moeplan::InputError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, std::string(e.what()));
    }
  };
  auto seeds = lr_folders();
  seeds[2][1]["train"]["seed"] = 2;
  refused(seeds, "'hi' holds points trained with two seeds (seed/data_seed 1/1 and 2/1)");
  auto twice = lr_folders();
  twice[2] = twice[1];
  refused(twice, "'mid' and 'hi' trained the same seeds (seed/data_seed 1/1) at one η (step-law)");
  // One η under two rules (hi's plans edited to mid's η, renamed): refused, naming both.
  auto renamed = lr_folders();
  for (size_t i = 0; i < renamed[2].size(); ++i) {
    renamed[2][i]["plan"] = renamed[1][i]["plan"];
    renamed[2][i]["plan"]["rule"] = "hand-tuned";
  }
  refused(renamed, "point 'dense' trained at the same η (0.01) in 'mid' and 'hi'");
  // Another seed at one η only: the η's do not pair.
  auto other = lr_folders();
  for (json& r : other[2]) r["train"]["seed"] = 2;
  refused(other,
          "the folders at step-law ×2 trained seed/data_seed 2/1, those at step-law ×0.5 "
          "1/1; a learning-rate sweep trains every seed at every η");
  // Other data (another held-out set): refused, naming both.
  auto data = lr_folders();
  for (auto& folder : data)
    for (json& r : folder) r["data"] = {{"source", "builtin"}, {"validation_tokens", 4096}};
  data[2][2]["data"]["validation_tokens"] = 2048;
  refused(data,
          "point 'moe-b' read other data in 'hi' (builtin, 2048 validation tokens) than in "
          "'lo' (builtin, 4096 validation tokens)");
  // Another setting beside the seeds: refused, naming it.
  auto setting = lr_folders();
  setting[1][1]["train"]["load_balance"] = 0.5;
  refused(setting,
          "point 'moe-a' trained with train.load_balance = 0.5 in 'mid' but null in "
          "'lo'; a learning-rate sweep compares runs that differ in η and seed only");
  auto rules = lr_folders();
  rules[0][2]["plan"]["rule"] = "hand-tuned";
  refused(rules, "'lo' holds points planned under two η rules (step-law ×0.5 and hand-tuned)");
  // The same seeds on another device or checkpoint interval: read, as replicates read them.
  auto device = lr_folders();
  for (json& r : device[2]) r["train"]["device"] = "cuda";
  CHECK_NOTHROW(
      moeplan::render_replicate_report(device, {"lo", "mid", "hi"}, moeplan::ReportFormat::text));
  // Another difference beside η: refused, naming it (not η, which is meant to differ).
  auto steps = lr_folders();
  steps[1][1]["plan"]["steps"] = 5;
  refused(steps,
          "point 'moe-a' has another plan in 'mid' than in 'lo' (plan.steps differs); a "
          "learning-rate sweep's folders differ in η only");
}

namespace {

// The sweep of lr_folders() over three seeds (1, 2, 3), a folder per seed and η: "a1".."a3" at
// ×0.5, "b1".."b3" at ×1, "c1".."c3" at ×2, given out of order (by seed, then ×2, ×0.5, ×1).
//   dense  ×0.5: 2.10 2.12 2.11   ×1: 2.00 2.04 2.03   ×2: 1.95 2.01 2.01
//   moe-a  ×0.5: 1.90 1.92 1.91   ×1: 1.80 1.82 1.81   ×2: 1.85 1.88 1.86
//   moe-b  ×0.5: 1.99 2.03 1.98   ×1: 2.00 2.02 2.04   ×2: 2.05 2.06 2.07
std::pair<std::vector<std::vector<json>>, std::vector<std::string>> lr_seed_folders() {
  const double factors[] = {2, 0.5, 1};
  const char* prefix[] = {"c", "a", "b"};
  const double dense[3][3] = {{1.95, 2.01, 2.01}, {2.10, 2.12, 2.11}, {2.00, 2.04, 2.03}};
  const double a[3][3] = {{1.85, 1.88, 1.86}, {1.90, 1.92, 1.91}, {1.80, 1.82, 1.81}};
  const double b[3][3] = {{2.05, 2.06, 2.07}, {1.99, 2.03, 1.98}, {2.00, 2.02, 2.04}};
  std::vector<std::vector<json>> folders;
  std::vector<std::string> names;
  for (int seed = 1; seed <= 3; ++seed)
    for (int f = 0; f < 3; ++f) {
      std::vector<json> folder = {
          at_lr(record("dense", true, 1.0, dense[f][seed - 1]), 0.01, factors[f]),
          at_lr(record("moe-a", false, 0.2, a[f][seed - 1]), 0.02, factors[f]),
          at_lr(record("moe-b", false, 0.4, b[f][seed - 1]), 0.03, factors[f])};
      for (json& r : folder) r["train"]["seed"] = seed;
      folders.push_back(folder);
      names.push_back(prefix[f] + std::to_string(seed));
    }
  return {folders, names};
}

}  // namespace

TEST_CASE("learning-rate sweep over seeds: means, best vs next and the margin paired by seed") {
  const auto [folders, names] = lr_seed_folders();
  const std::string text =
      moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::text);
  CAPTURE(text);
  CHECK(text.starts_with(
      "moeplan report: a learning-rate sweep over 3 seeds, 3 points at 3 η (×0.5, ×1, ×2), 9 runs "
      "folders. The folders: η ×0.5, 3 seeds: a1 (seed/data_seed 1/1), a2 (seed/data_seed 2/1), "
      "a3 (seed/data_seed 3/1); η ×1, 3 seeds: b1"));
  // By hand, t = 4.302653 at 2 degrees of freedom (NIST/SEMATECH table 1.3.6.7.2: 4.303).
  // moe-a: means 1.91, 1.81, 1.8633 (sd 0.01, 0.01, 0.0153): best ×1 (η 0.02), bracketed.
  // Against dense's best (×2, mean 1.99), by seed: 1.80 − 1.95, 1.82 − 2.01, 1.81 − 2.01 =
  // −0.15, −0.19, −0.20: mean −0.18, sd 0.0264575, half-width 4.302653 × 0.0264575/√3 = 0.065724;
  // t = 0.18/(0.0264575/√3) = 11.7838, two-sided p at 2 dof = 1 − t/√(t² + 2) = 0.007125.
  CHECK(cells_of_row(text, "moe-a") == std::vector<std::string>{"moe-a", "0.200", "1.9100±0.0100",
                                                                "1.8100±0.0100", "1.8633±0.0153",
                                                                "0.02", "×1", "yes", "-0.1800",
                                                                "[-0.2457,", "-0.1143]", "0.0071"});
  // moe-b: means 2.00, 2.02, 2.06: best ×0.5, the lowest. Margins 0.04, 0.02, −0.03: mean 0.01,
  // sd 0.0360555, half-width 0.089567.
  const auto b = cells_of_row(text, "moe-b");
  REQUIRE(b.size() == 15);
  CHECK(b[2] == "2.0000±0.0265");
  CHECK(b[5] == "0.015");
  CHECK(b[7] == "no:");
  CHECK(b[11] == "+0.0100");
  CHECK(b[12] == "[-0.0796,");
  CHECK(b[13] == "+0.0996]");
  // dense: means 2.11, 2.0233, 1.99: best at ×2, the highest tried; no margin of its own.
  CHECK(cells_of_row(text, "dense") == std::vector<std::string>{"dense", "1.000", "2.1100±0.0100",
                                                                "2.0233±0.0208", "1.9900±0.0346",
                                                                "0.02", "×2", "no:", "highest", "η",
                                                                "tried", "-", "-", "-"});
  CHECK(text.find("dense baseline: best at η 0.02 (η ×2, 3 seeds), the highest tried") !=
        std::string::npos);
  CHECK(text.find("each at its own best η of those tried, MoE points below the dense baseline: 1 "
                  "of 2\n") != std::string::npos);
  CHECK(text.find("the margin's 95 % confidence interval wholly below 0 (MoE better beyond the "
                  "seeds' noise): 1 of 2; not: moe-b [-0.0796, +0.0996]\n") != std::string::npos);
  // Best minus next best, by seed: dense ×2 − ×1 = −0.05, −0.03, −0.02: [−0.0713, +0.0046];
  // moe-a ×1 − ×2 = −0.05, −0.06, −0.05: [−0.0677, −0.0390], told apart; moe-b ×0.5 − ×1 = −0.01,
  // +0.01, −0.06: [−0.1096, +0.0696].
  CHECK(text.find("best η told apart from the next best by the seeds (the paired difference's "
                  "95 % interval wholly below 0): 1 of 3: moe-a (×1 vs ×2: [-0.0677, -0.0390]); "
                  "within the seeds' noise, so either η "
                  "may be the best: dense (×2 vs ×1: [-0.0713, +0.0046]), moe-b (×0.5 vs ×1: "
                  "[-0.1096, +0.0696])\n") != std::string::npos);
  CHECK(text.find("each best η is picked on the seeds that then measure its margin") !=
        std::string::npos);
  CHECK(text.find("one run per η and point") == std::string::npos);
  const json doc =
      json::parse(moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::json));
  REQUIRE(doc["summary"].size() == 3);
  const json& a = doc["summary"][1];
  CHECK(a["point"] == "moe-a");
  CHECK(a["best_val_bpc"].get<double>() == doctest::Approx(1.81));
  CHECK(a["best_val_bpc_sd"].get<double>() == doctest::Approx(0.01));
  CHECK(a["best_seeds"] == 3);
  CHECK(a["best_rule"] == "step-law");
  CHECK(a["best_folder"] == "b1, b2, b3");
  CHECK(a["next_best_lr_peak"].get<double>() == doctest::Approx(0.04));
  CHECK(a["best_vs_next_ci95"][0].get<double>() == doctest::Approx(-0.0533333 - 0.0143422));
  CHECK(a["best_vs_next_ci95"][1].get<double>() == doctest::Approx(-0.0533333 + 0.0143422));
  CHECK(a["vs_dense_pairs"] == 3);
  CHECK(a["best_val_bpc_vs_dense_best"].get<double>() == doctest::Approx(-0.18));
  CHECK(a["best_val_bpc_vs_dense_best_ci95"][0].get<double>() == doctest::Approx(-0.245724));
  CHECK(a["best_val_bpc_vs_dense_best_ci95"][1].get<double>() == doctest::Approx(-0.114276));
  CHECK(a["best_val_bpc_vs_dense_best_p"].get<double>() == doctest::Approx(0.007125).epsilon(1e-3));
  CHECK(doc["summary"][0]["best_val_bpc_vs_dense_best_p"].is_null());
  // The chart: the means, titled so; a line per point.
  const std::string html =
      moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::html);
  CHECK(html.find("Final validation BPC (mean over 3 seeds) against the peak learning rate") !=
        std::string::npos);
  CHECK(occurrences(html, "<polyline data-series=") == 3);
}

TEST_CASE("learning-rate sweep over seeds: a seed still training is left out of its η's cell") {
  auto [folders, names] = lr_seed_folders();
  folders[8][1]["status"] = "running";  // b3's moe-a (seed 3 at ×1)
  const std::string text =
      moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::text);
  CAPTURE(text);
  // moe-a at ×1 over seeds 1 and 2: 1.80, 1.82 (sd 0.0141). Its margin, paired by seed against
  // dense at ×2: −0.15, −0.19, mean −0.17 (the difference of means over all seeds would be −0.18);
  // t at 1 degree of freedom 12.706: half-width 12.706 × 0.0282843/√2 = 0.254123.
  const auto a = cells_of_row(text, "moe-a");
  REQUIRE(a.size() >= 15);
  CHECK(a[3] == "1.8100±0.0141");
  CHECK(a[4] == "(2");
  CHECK(a[11] == "-0.1700");
  CHECK(a[12] == "[-0.4241,");
  CHECK(a[13] == "+0.0841]");
  // Two seeds (folders of seed 3 left out): moe-a's margin −0.15, −0.19 over seeds 1 and 2, its
  // interval ± 12.706 × 0.0282843/√2 = 0.254123 wide.
  auto two = lr_seed_folders();
  two.first.resize(6);
  two.second.resize(6);
  const std::string two_text =
      moeplan::render_replicate_report(two.first, two.second, moeplan::ReportFormat::text);
  CHECK(
      two_text.starts_with("moeplan report: a learning-rate sweep over 2 seeds, 3 points at 3 η"));
  CHECK(two_text.find("moe-a [-0.4241, +0.0841]") != std::string::npos);
  // The same η under one rule in each seed's folder, or refused.
  auto eta = lr_seed_folders();
  eta.first[5][1]["plan"]["lr_peak"] = 0.03;  // b2's moe-a
  try {
    moeplan::render_replicate_report(eta.first, eta.second, moeplan::ReportFormat::text);
    FAIL("accepted");
  } catch (const moeplan::InputError& e) {
    CHECK(std::string(e.what()).starts_with(
        "point 'moe-a' trained at η 0.03 in 'b2' but 0.02 in 'b1', both planned step-law"));
  }
}

TEST_CASE("reports over folders: one audit line where every folder's audit reads the same") {
  const auto [folders, names] = lr_seed_folders();
  moeplan::FolderAudit holds;
  holds.claims = holds.holding = 9;
  std::vector<moeplan::FolderAudit> audits(folders.size(), holds);
  std::string text =
      moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::text, audits);
  CHECK(text.find("\nin each of the 9 folders: `moeplan audit` (no --plan): 9 of 9 claims hold; 0 "
                  "error(s), 0 warning(s)") != std::string::npos);
  CHECK(text.find("in 'a1'") == std::string::npos);
  // One folder's differs: each its own line, named.
  audits[4].holding = 8;
  audits[4].failing = {"equal C"};
  text = moeplan::render_replicate_report(folders, names, moeplan::ReportFormat::text, audits);
  CHECK(occurrences(text, "\nin '") == 9);
  CHECK(text.find("\nin 'a2': `moeplan audit` of this folder (no --plan): 8 of 9 claims hold "
                  "(failing: equal C)") != std::string::npos);
  CHECK(text.find("in each of") == std::string::npos);
  // Replicates read them the same way: the three folders at ×0.5 (a1, a2, a3).
  const std::vector<std::vector<json>> reps = {folders[1], folders[4], folders[7]};
  text = moeplan::render_replicate_report(reps, {names[1], names[4], names[7]},
                                          moeplan::ReportFormat::text, {holds, holds, holds});
  CHECK(text.starts_with("moeplan report: 3 points over 3 runs folders of one sweep: a1"));
  CHECK(text.find("\nin each of the 3 folders: `moeplan audit` (no --plan): 9 of 9") !=
        std::string::npos);
}
