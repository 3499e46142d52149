// End to end through the built binary: exit statuses, one-line errors, and every output format.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "moeplan/sweeps/manifest_io.hpp"
#include "scratch.hpp"

namespace fs = std::filesystem;

namespace {

struct Result {
  int status = -1;
  std::string out, err;
};

using moeplan::test::scratch;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `moeplan <args>` (args are shell words we control), stdout and stderr kept apart; `env`:
// assignments before the command ("MOEPLAN_COLUMNS=100").
Result run_moeplan(const std::string& args, const std::string& env = "") {
  const fs::path err = scratch() / "stderr.txt";
  const std::string cmd = env + " '" + MOEPLAN_BINARY + "' " + args + " 2>'" + err.string() + "'";
  Result r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.err = slurp(err);
  return r;
}

fs::path write(const std::string& name, const std::string& text) {
  const fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Exit 2, one line on stderr that starts with "moeplan: error:" and contains `needle`.
void expect_bad_input(const std::string& args, const std::string& needle) {
  const Result r = run_moeplan(args);
  CAPTURE(args);
  CAPTURE(r.err);
  CHECK(r.status == 2);
  CHECK(r.err.rfind("moeplan: error: ", 0) == 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find(needle) != std::string::npos);
}

const char* kArch2b =
    "d_model = 1408\nlayers = 16\ndense_layers = 1\nheads = 11\nhead_dim = 128\nd_ffn = 3904\n"
    "experts = 89\ntop_k = 1\nd_expert = 352\nd_shared = 352\nseq_len = 2048\nvocab = 65536\n";

}  // namespace

TEST_CASE("grid --N 2e9 --ra 0.05:0.4: table with 8 points, the dense baseline, flags") {
  const Result r = run_moeplan("grid --N 2e9 --ra 0.05:0.4");
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("M [paper]") != std::string::npos);
  CHECK(r.out.find("C [paper]") != std::string::npos);
  CHECK(r.out.find("D consumed") != std::string::npos);
  CHECK(r.out.find("D̂ unique") != std::string::npos);
  CHECK(r.out.find("dense ") != std::string::npos);
  int rows = 0;
  for (size_t at = r.out.find("\n   moe-ra"); at != std::string::npos;
       at = r.out.find("\n   moe-ra", at + 1))
    ++rows;
  int flagged = 0;
  for (size_t at = r.out.find("\n!  moe-ra"); at != std::string::npos;
       at = r.out.find("\n!  moe-ra", at + 1))
    ++flagged;
  CHECK(rows + flagged == 8);
  CHECK(flagged == 1);  // r_a 0.05 < the 7.17 % floor of the 2B backbone
  CHECK(r.out.find("! moe-ra0.050: r_a 5.00% not reachable") != std::string::npos);
  CHECK(r.out.find("ABOVE the sweep's tolerance") == std::string::npos);
}

TEST_CASE("grid: the header says when step rounding alone breaks the C tolerance") {
  // A data-parallel width of 1e6 sequences a step leaves the 2B dense baseline 20 steps and the
  // r_a 0.2 point 90: rounding to whole steps moves C by up to half a step, 2.5 % and 0.56 %.
  const Result r = run_moeplan("grid --N 2e9 --ra 0.2 --dp-width 1e6");
  CHECK(r.status == 0);
  CHECK(r.out.find("ABOVE the sweep's tolerance of 1.0%") != std::string::npos);
  // The planner's own note: a unique budget above the baseline's consumption is capped, said.
  const Result u = run_moeplan("grid --N 2e9 --ra 0.2 --unique-tokens 1e20");
  CHECK(u.status == 0);
  CHECK(u.out.find("dense: --unique-tokens 1e+20 is more than the dense baseline consumes") !=
        std::string::npos);
  CHECK(u.out.find("1 point + dense baseline") != std::string::npos);
}

TEST_CASE("grid: an unreachable r_a's note gives its cause, the floor or the step size") {
  // N 1.2e5: the MoE points are solved to the baseline's N, 2·(4·72² + 3·72·184) = 120,960 (L2
  // Dm72 Dffn184). Attention and the dense layer of the MoE backbone (L2 Dm40 Dffn112) are
  // 2·4·40² + 3·40·112 = 26,240 parameters, 21.69 % of it, so 20 % is below the floor; 40 % is
  // above it and missed only because one expert or one top_k moves r_a by more than ±0.5 points.
  // The note gives the share of the point's own N (E98 K1 De8 Dse8: 26,240 + 3·40·(98·8 + 8) =
  // 121,280), as its parameter table does: 21.64 %.
  const Result r = run_moeplan("grid --N 1.2e5 --ra 0.2:0.5 --points 4");
  CHECK(r.status == 0);
  const size_t low = r.out.find("! moe-ra0.200: r_a 20.00% not reachable");
  const size_t high = r.out.find("! moe-ra0.400: r_a 40.00% not reachable");
  REQUIRE(low != std::string::npos);
  REQUIRE(high != std::string::npos);
  const std::string low_note = r.out.substr(low, r.out.find('\n', low) - low);
  const std::string high_note = r.out.substr(high, r.out.find('\n', high) - high);
  CHECK(low_note.find("attention and dense layers alone are 21.64% of its N") != std::string::npos);
  CHECK(high_note.find("a step wider than the tolerance (expert granularity)") !=
        std::string::npos);
  CHECK(high_note.find("attention and dense layers") == std::string::npos);
}

TEST_CASE("notes: plan prints a reachable point's note; grid's header points only where it helps") {
  // A deep backbone (80 layers, 1024 wide) at r_a 1: its M is above the dense baseline's, so it
  // consumes fewer tokens than the baseline's D̂ and cannot read them all. The note said so in
  // JSON only: the table printed notes of unreachable points alone.
  const fs::path deep =
      write("deep.toml",
            "d_model = 1024\nlayers = 80\ndense_layers = 1\nheads = 8\nhead_dim = 128\n"
            "d_ffn = 2816\nseq_len = 2048\nvocab = 65536\n");
  Result r = run_moeplan("plan --N 2e9 --ra 1 --backbone '" + deep.string() + "'");
  CHECK(r.status == 0);
  CHECK_MESSAGE(r.out.find("\nnote: consumes D = 39B tokens, fewer than the dense baseline's 40B "
                           "unique ones") != std::string::npos,
                r.out);
  // At N 1e5 the dense baseline's note is about warm-up: the header's "strict reuse: ... unique
  // tokens" pointed at it as if it were about D̂ (it should only for a capped --unique-tokens).
  r = run_moeplan("grid --N 1e5 --ra 0.05:0.4");
  CHECK(r.status == 0);
  CHECK(r.out.find("\n  dense: warm-up") != std::string::npos);
  CHECK(r.out.find("see the dense baseline's note") == std::string::npos);
  // The header's N: a bound against the dense baseline, not the N asked for (rows at small N
  // can sit 1.4 % from it); and a rate merged into a point that does not reach it is counted.
  CHECK(r.out.find("N target 100k (every point within ±1.0% of the dense baseline's N)") !=
        std::string::npos);
  r = run_moeplan("grid --N 2e9 --ra 0.02,0.07041");
  CHECK(r.status == 0);
  CHECK(r.out.find("1 point + dense baseline; 1 point also stands for asked rates not reachable "
                   "(see the notes)") != std::string::npos);
  CHECK(r.out.find("moe-ra0.070: also asked for r_a 0.020, not reachable within ±0.50 points") !=
        std::string::npos);
}

TEST_CASE("grid: a --unique-tokens above the baseline's D is capped aloud in every format") {
  // The user's probe: N 2e9 at the default 20 tokens per parameter consumes 40B tokens in the
  // dense baseline, so a unique budget of 1e12 is capped to them; the header points at the note.
  const std::string probe = "grid --N 2e9 --ra 0.1,0.3 --unique-tokens 1e12";
  const std::string note = "--unique-tokens 1e+12 is more than the dense baseline consumes";
  Result r = run_moeplan(probe);
  CHECK(r.status == 0);
  CHECK(r.out.find("same 40B unique tokens (see the dense baseline's note)") != std::string::npos);
  CHECK(r.out.find("\n  dense: " + note) != std::string::npos);
  r = run_moeplan(probe + " --format md");
  CHECK(r.out.find("Notes:") != std::string::npos);
  CHECK(r.out.find("-   dense: " + note) != std::string::npos);
  r = run_moeplan(probe + " --format csv");
  CHECK(r.out.find(",\"" + note) != std::string::npos);
  r = run_moeplan(probe + " --format json");
  CHECK(nlohmann::json::parse(r.out).at("dense").at("note").get<std::string>().rfind(note, 0) == 0);
  // Below what the baseline consumes, the budget is taken as given: no note, no pointer.
  r = run_moeplan("grid --N 2e9 --ra 0.1,0.3 --unique-tokens 1e10");
  CHECK(r.out.find("same 10B unique tokens\n") != std::string::npos);
  CHECK(r.out.find("dense: ") == std::string::npos);
}

TEST_CASE("-o sweep.toml writes a manifest that reads back; formats by extension and flag") {
  const fs::path toml = scratch() / "sweep.toml";
  Result r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 -o '" + toml.string() + "'");
  CHECK(r.status == 0);
  CHECK(r.out.find("wrote") != std::string::npos);
  const moeplan::Manifest m = moeplan::read_manifest(toml);
  CHECK(m.points.size() == 4);
  CHECK(m.created_by.find("grid --N 2e6") != std::string::npos);
  CHECK(m.train == moeplan::TrainSettings{});

  // --train sets the manifest's [train] table, and the command line it came from is kept.
  r = run_moeplan(
      "grid --N 2e6 --ra 0.2 --train erc_loss=0.01 --train source=text:book.txt "
      "--train eval_tokens=4k -o '" +
      (scratch() / "train.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK(r.out.find("dense baseline + 1 point)") != std::string::npos);
  const moeplan::Manifest t = moeplan::read_manifest(scratch() / "train.toml");
  CHECK(t.train.erc_loss == 0.01);
  CHECK(r.err.find("capacity_factor") == std::string::npos);  // dropless: nothing to say
  // A capacity factor: said at plan time that its drops are FLOPs planned but not spent, which
  // report and audit hold against equal C (at N 2e4, r_a 0.3 and 1.25, 36 % were dropped).
  r = run_moeplan("grid --N 2e6 --ra 0.2 --train capacity_factor=1.25 -o '" +
                  (scratch() / "cf.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK(r.err.find("moeplan: warning: capacity_factor = 1.25 drops the routed assignments") !=
        std::string::npos);
  CHECK(r.err.find("the compute tolerance (1 % of C)") != std::string::npos);
  // show and run say it too: a hand-edited [train] never passed through grid.
  r = run_moeplan("show '" + (scratch() / "cf.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK(r.err.find("moeplan: warning: capacity_factor = 1.25 drops") != std::string::npos);
  r = run_moeplan("run '" + (scratch() / "cf.toml").string() + "' --estimate 1 --out '" +
                  (scratch() / "cf-runs").string() + "'");
  CHECK(r.status == 0);
  CHECK(r.err.find("moeplan: warning: capacity_factor = 1.25 drops") != std::string::npos);
  // Typed relative to the folder grid runs in; written relative to -o's folder, which is where
  // `moeplan run` reads a relative path from: the same file seen from there.
  CHECK(t.train.source ==
        "text:" + (fs::current_path() / "book.txt").lexically_relative(scratch()).string());
  fs::create_directories(scratch() / "sub");
  r = run_moeplan("grid --N 2e6 --ra 0.2 --train source=text:book.txt -o '" +
                  (scratch() / "sub" / "rel.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK(moeplan::read_manifest(scratch() / "sub" / "rel.toml").train.source ==
        "text:" + (fs::current_path() / "book.txt").lexically_relative(scratch() / "sub").string());
  // A source that cannot feed the sweep is warned of (it may be made later): the file is written.
  CHECK(r.err.find("moeplan: warning: source 'text:") != std::string::npos);
  CHECK(r.err.find("cannot read") != std::string::npos);
  std::ofstream(scratch() / "short.txt") << "far too short for a 2e6-parameter sweep";
  r = run_moeplan(
      "grid --N 2e6 --ra 0.2 --train 'source=text:" + (scratch() / "short.txt").string() +
      "' -o '" + (scratch() / "short.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK_MESSAGE(r.err.find("moeplan: warning: point 'dense': source 'text:") != std::string::npos,
                r.err);
  CHECK_MESSAGE(r.err.find("has 39 tokens; the plan needs") != std::string::npos, r.err);
  r = run_moeplan("grid --N 2e6 --ra 0.2 --train source=text:/data/book.txt -o '" +
                  (scratch() / "sub" / "abs.toml").string() + "'");
  CHECK(moeplan::read_manifest(scratch() / "sub" / "abs.toml").train.source ==
        "text:/data/book.txt");  // an absolute path is kept
  CHECK(t.train.eval_tokens == 4000);
  CHECK(t.created_by.find("--train erc_loss=0.01") != std::string::npos);
  // Arguments a shell would split or expand are quoted, so the line pastes back as typed.
  r = run_moeplan("grid --N 2e6 --ra 0.2 --train \"source=text:my book's.txt\" -o '" +
                  (scratch() / "quoted.toml").string() + "'");
  CHECK(r.status == 0);
  CHECK_MESSAGE(
      moeplan::read_manifest(scratch() / "quoted.toml")
              .created_by.find("--train 'source=text:my book'\\''s.txt'") != std::string::npos,
      moeplan::read_manifest(scratch() / "quoted.toml").created_by);

  const fs::path json = scratch() / "sweep.json";
  r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 -o '" + json.string() + "'");
  CHECK(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(slurp(json));
  CHECK(j.at("points").size() == 4);
  CHECK(j.at("dense").at("total_params").get<int64_t>() == m.dense.counts.total_params);

  r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 --format csv");
  CHECK(r.status == 0);
  CHECK(count_lines(r.out) == 1 + 1 + 4);  // header, dense, 4 points
  CHECK(r.out.rfind("id,role,description,total_params,active_params,activation_rate,", 0) == 0);

  r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 --format json");
  CHECK(nlohmann::json::parse(r.out).at("points").size() == 4);

  r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 --format toml");
  CHECK(moeplan::manifest_from_toml_string(r.out, "stdout").points.size() == 4);

  r = run_moeplan("grid --N 2e6 --ra 0.1:0.4 --points 4 --format md");
  CHECK(r.out.find("| ---") != std::string::npos);
  CHECK(r.out.find("| M [paper] |") != std::string::npos);

  // `show` re-reads and re-renders the manifest.
  r = run_moeplan("show '" + toml.string() + "' --format csv");
  CHECK(r.status == 0);
  CHECK(count_lines(r.out) == 6);
}

TEST_CASE("grid --count-router: M and C are labelled paper (router in) wherever printed") {
  // The flag puts the router inside N_a, so paper's 6·N_a counts it: the header said [paper].
  Result r = run_moeplan("grid --N 2e6 --ra 0.2,0.3 --count-router");
  CHECK(r.status == 0);
  CHECK(r.out.find("M [paper (router in)]") != std::string::npos);
  CHECK(r.out.find("C [paper (router in)]") != std::string::npos);
  CHECK(r.out.find("FLOPs [paper (router in)] for every point") != std::string::npos);
  CHECK(r.out.find("M [paper]") == std::string::npos);
  r = run_moeplan("grid --N 2e6 --ra 0.2,0.3 --count-router --format md");
  CHECK(r.out.find("| M [paper (router in)] |") != std::string::npos);
  r = run_moeplan("grid --N 2e6 --ra 0.2,0.3 --count-router --count-norms --format csv");
  CHECK(count_lines(r.out) == 1 + 1 + 2);
  // The convention field of each row, quoted for its comma: dense, then both points.
  size_t rows = 0;
  for (size_t at = r.out.find(",\"paper (router in, norms in)\","); at != std::string::npos;
       at = r.out.find(",\"paper (router in, norms in)\",", at + 1))
    ++rows;
  CHECK(rows == 3);
  // Without the flags nothing changes.
  r = run_moeplan("grid --N 2e6 --ra 0.2,0.3");
  CHECK(r.out.find("M [paper]") != std::string::npos);
  CHECK(r.out.find("router in") == std::string::npos);
  // The manifest keeps the bare convention key (and the arch's count_router) and reads back; a
  // comment says how M and C read. JSON's convention stays the key audit and run parse.
  const fs::path toml = scratch() / "router-in.toml";
  r = run_moeplan("grid --N 2e6 --ra 0.2,0.3 --count-router -o '" + toml.string() + "'");
  CHECK(r.status == 0);
  const std::string text = slurp(toml);
  CHECK(text.find("# M and C read paper (router in)") != std::string::npos);
  CHECK(text.find("convention = \"paper\"\n") != std::string::npos);
  const moeplan::Manifest m = moeplan::read_manifest(toml);
  CHECK(m.dense.arch.count_router);
  r = run_moeplan("show '" + toml.string() + "'");
  CHECK(r.status == 0);
  CHECK(r.out.find("M [paper (router in)]") != std::string::npos);
  r = run_moeplan("grid --N 2e6 --ra 0.2 --count-router --format json");
  CHECK(nlohmann::json::parse(r.out).at("points")[0].at("convention") == "paper");
  // plan prints the same label for its budget.
  r = run_moeplan("plan --N 2e6 --ra 0.2 --count-router");
  CHECK(r.out.find("budget [paper (router in)]") != std::string::npos);
}

TEST_CASE("plan --arch reproduces the ACCOUNTING.md worked check") {
  const fs::path arch = write("arch2b.toml", kArch2b);
  Result r = run_moeplan("plan --arch '" + arch.string() + "'");
  CHECK(r.status == 0);
  // N = 2,150,612,992 and N_a = 187,973,632 (ACCOUNTING.md "Worked check").
  CHECK(r.out.find("2,150,612,992") != std::string::npos);
  CHECK(r.out.find("187,973,632") != std::string::npos);
  CHECK(r.out.find("exact/causal") != std::string::npos);
  CHECK(r.out.find("megatron") != std::string::npos);
  r = run_moeplan("plan --arch '" + arch.string() + "' --format json --tokens 1e9");
  CHECK(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("total_params").get<int64_t>() == 2150612992);
  CHECK(j.at("active_params").get<int64_t>() == 187973632);
  // M = 6·187,973,632 + 12·16·1408·2048 = 1,127,841,792 + 553,648,128 = 1,681,489,920
  CHECK(j.at("flops_per_token").get<double>() == 1681489920.0);
  CHECK(j.at("convention") == "paper");
  // --tokens 1e9 in whole steps: within one step of 1e9.
  const double step = j.at("batch_tokens").get<double>();
  CHECK(std::abs(j.at("tokens_consumed").get<double>() - 1e9) <= step);
  CHECK(j.at("flops_per_token_by_convention").contains("exact/full"));
}

TEST_CASE("plan: the dense baseline's note is printed; a refused --tokens budget names the flag") {
  // 2B dense baseline consumes 40B tokens: a unique budget of 1e11 is capped to them, and said.
  Result r = run_moeplan("plan --N 2e9 --ra 0.2 --unique-tokens 1e11");
  CHECK(r.status == 0);
  CHECK(r.out.find("dense: --unique-tokens 1e+11 is more than the dense baseline consumes") !=
        std::string::npos);
  // The point's own budget: 1e6 tokens consumed cannot hold 2e6 unique ones; capped, and said
  // (it was replaced in silence), in the table's notes and the JSON's note.
  r = run_moeplan("plan --N 3e5 --ra 0.2 --tokens 1e6 --tokens-unique 2e6");
  CHECK(r.status == 0);
  CHECK_MESSAGE(r.out.find("unique tokens 2e6 are more than this point consumes (1M tokens): D̂ "
                           "is capped to them") != std::string::npos,
                r.out);
  // Once, as the plan's note (it was printed a second time under the table).
  CHECK(r.out.find("are more than this point consumes") ==
        r.out.rfind("are more than this point consumes"));
  r = run_moeplan("plan --N 3e5 --ra 0.2 --tokens 1e6 --tokens-unique 2e6 --format json");
  CHECK(nlohmann::json::parse(r.out).at("note").get<std::string>().find("capped") !=
        std::string::npos);
  // --unique-tokens is named as typed in --arch mode too (it was "--tokens-unique"); a --tokens
  // past the counted tokens is said in tokens, not as a FLOP budget.
  expect_bad_input("plan --arch " + std::string(MOEPLAN_SOURCE_DIR) +
                       "/examples/arch-2b-moe.toml --unique-tokens 0",
                   "--unique-tokens = 0 is invalid");
  expect_bad_input(
      "plan --arch " + std::string(MOEPLAN_SOURCE_DIR) + "/examples/arch-2b-moe.toml --tokens 1e30",
      "--tokens = 1e30 is above the 4.61e+18 tokens moeplan counts");
  // From --N/--ra too (it advised a FLOP budget).
  {
    const Result r = run_moeplan("plan --N 2e9 --ra 0.2 --tokens 1e30");
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.rfind("moeplan: error: --tokens = 1e30 is above the 4.61e+18 tokens "
                              "moeplan counts",
                              0) == 0,
                  r.err);
  }
  // A deep model is counted layer kind by layer kind, not layer by layer: 1e10 layers took
  // minutes (planned and refused here in an instant: N is within limits, the budget is not).
  {
    const fs::path deep = scratch() / "deep.toml";
    std::ofstream(deep) << "d_model = 64\nlayers = 10000000000\nheads = 4\nhead_dim = 16\n"
                           "d_ffn = 128\nseq_len = 32\nvocab = 256\n";
    const Result d = run_moeplan("plan --arch '" + deep.string() + "' --convention exact");
    CHECK_MESSAGE(d.status == 0, d.err);
    CHECK(d.out.find("exact") != std::string::npos);
  }
  // grid with a backbone file whose name is not UTF-8: created_by writes the byte as bash's
  // $'\xff' (the manifest held the byte itself, and show then refused it as not valid TOML).
  {
    const fs::path odd = scratch() / "b\xff.toml";
    fs::copy_file(std::string(MOEPLAN_SOURCE_DIR) + "/examples/backbone-7b.toml", odd,
                  fs::copy_options::overwrite_existing);
    const fs::path out = scratch() / "odd-sweep.toml";
    const Result g = run_moeplan("grid --N 6.52e9 --ra 0.2 --backbone '" + odd.string() + "' -o '" +
                                 out.string() + "'");
    REQUIRE_MESSAGE(g.status == 0, g.err);
    const moeplan::Manifest m = moeplan::read_manifest(out);
    CHECK_MESSAGE(m.created_by.find("--backbone $'") != std::string::npos, m.created_by);
    CHECK(m.created_by.find("b\\xff.toml'") != std::string::npos);
  }
  // A file name that is not UTF-8 in JSON: the byte as U+FFFD (it was an exit 70).
  {
    const fs::path odd = scratch() /
                         "a\xff"
                         "b.toml";
    fs::copy_file(std::string(MOEPLAN_SOURCE_DIR) + "/examples/arch-2b-moe.toml", odd,
                  fs::copy_options::overwrite_existing);
    const Result j = run_moeplan("plan --arch '" + odd.string() + "' --format json");
    CHECK_MESSAGE(j.status == 0, j.err);
    CHECK(nlohmann::json::parse(j.out).at("id").get<std::string>().find("a\xef\xbf\xbd"
                                                                        "b.toml") !=
          std::string::npos);
  }
  r = run_moeplan("plan --arch " + std::string(MOEPLAN_SOURCE_DIR) +
                  "/examples/arch-2b-moe.toml --tokens 100");
  CHECK(r.status == 2);
  CHECK(r.err.find("moeplan: error: --tokens 100: compute C = ") == 0);
}

TEST_CASE("plan --N --ra solves a point; --convention names the summary's convention") {
  Result r = run_moeplan("plan --N 2e9 --ra 0.2 --convention exact");
  CHECK(r.status == 0);
  CHECK(r.out.find("budget [exact/causal]") != std::string::npos);
  CHECK(r.out.find("equal-resource dense baseline") != std::string::npos);
  r = run_moeplan("plan --N 2e9 --ra 0.2 --format json");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(std::abs(j.at("activation_rate").get<double>() - 0.2) <= 0.005);
  CHECK(std::abs(j.at("total_params").get<double>() - 2e9) <= 0.01 * 2e9);
}

TEST_CASE("bad input: one line naming the value, exit status 2") {
  expect_bad_input("grid --N -5 --ra 0.1:0.2", "--N = -5");
  expect_bad_input("grid --N=0 --ra 0.1:0.2", "--N = 0");
  expect_bad_input("grid --N lots --ra 0.1:0.2", "'lots' is not a number");
  // N out of range names the limit on the side it was broken: above 1e18, below 1e5.
  expect_bad_input("grid --N 1e20 --ra 0.2",
                   "N = 1e+20 is above the largest N moeplan plans, 1e18 (parameters are counted "
                   "in 64-bit integers); ask for N <= 1e18");
  expect_bad_input("grid --N 1e4 --ra 0.2", "ask for N >= 1e5");
  expect_bad_input("grid --N 2k --ra 0.2",
                   "; N = 2000 is below the 1e5 the paper family's rules are made for: ask for "
                   "N >= 1e5");
  expect_bad_input("grid --N 0.2 --ra 0.2", "ask for N >= 1e5");
  // An unknown or missing command was CLI11's "A subcommand is required".
  expect_bad_input("gird --N 2e9", "'gird' is not a moeplan command; use grid, plan, ");
  expect_bad_input("", "give a command: grid, plan, ");
  expect_bad_input("--nosuch", "'--nosuch' is not a moeplan option; give a command first: grid, ");
  // Another command's option was CLI11's "The following arguments were not expected: 1
  // --threads" (its list reversed).
  expect_bad_input("grid --N 2e4 --ra 0.5 --seq-len 32 --threads 1",
                   "'--threads' is not an option of `moeplan grid`; it is one of `moeplan run` "
                   "(moeplan grid --help lists its own)");
  expect_bad_input("grid --N 2e4 --ra 0.5 --nosuch=3",
                   "'--nosuch' is not an option of `moeplan grid` (moeplan grid --help");
  // "--compute=" with nothing after '=': CLI11 took the next argument as its value.
  expect_bad_input("grid --N 2e4 --ra 0.5 --seq-len 32 --compute= --count-router",
                   "--compute: '' is empty; give a value, or leave the flag out for its default");
  expect_bad_input("grid --N 2e4 --seq-len= 32 --ra 0.5", "--seq-len");
  // Not a flag's "--count-router=", nor after "--"; a short option's attached value is not
  // taken for an unknown option ("-og2.toml extra" blamed '-og2.toml').
  CHECK(run_moeplan("grid --N 2e4 --seq-len 32 --ra 0.3:0.5 --points 2 --count-router=").status ==
        0);
  const Result extra = run_moeplan("grid --N 2e4 --seq-len 32 --ra 0.3:0.5 --points 2 -o" +
                                   (scratch() / "g2.toml").string() + " extra");
  CHECK(extra.status == 2);
  CHECK_MESSAGE(extra.err.find("is not an option") == std::string::npos, extra.err);
  CHECK_MESSAGE(extra.err.find("extra") != std::string::npos, extra.err);
  // Tolerances name their range at 0 too, and take a percentage as `audit --tolerance` does.
  expect_bad_input("grid --N 1.5e5 --ra 0.2 --n-tolerance 0",
                   "--n-tolerance = 0 is invalid; it is relative (0.01 or 1% = 1 % of N) and must "
                   "be in (0, 0.5)");
  expect_bad_input("grid --N 1.5e5 --ra 0.2 --ra-tolerance 100%",
                   "--ra-tolerance = 100% is invalid; it is absolute (0.005 or 0.5% = 0.5 points "
                   "of r_a) and must be in (0, 1)");
  {
    const Result pct = run_moeplan("grid --N 1.5e5 --ra 0.2 --n-tolerance 2% --ra-tolerance 1%");
    const Result num =
        run_moeplan("grid --N 1.5e5 --ra 0.2 --n-tolerance 0.02 --ra-tolerance 0.01");
    CHECK(pct.status == 0);
    CHECK(pct.out == num.out);
  }
  {  // 1.1 / 100 is 0.011000000000000001: a sweep planned from "1.1%" differed from "0.011"
    const Result pct = run_moeplan("grid --N 1.5e5 --ra 0.2 --n-tolerance 1.1% --format toml");
    const Result num = run_moeplan("grid --N 1.5e5 --ra 0.2 --n-tolerance 0.011 --format toml");
    CHECK(pct.status == 0);
    CHECK(pct.out.find("n_tolerance = 0.011\n") != std::string::npos);
    CHECK(pct.out.substr(pct.out.find("n_tolerance")) ==
          num.out.substr(num.out.find("n_tolerance")));
  }
  expect_bad_input("grid --N 1.5e5 --ra 0.2 --n-tolerance %",
                   "--n-tolerance %: not a tolerance; it is relative");
  {
    const Result v = run_moeplan("--version");
    CHECK(v.status == 0);
    CHECK(v.out == "moeplan 0.1.0\n");
    // Lost on the way to stdout: said with its reason, as every command's output is.
    const Result lost = run_moeplan("--version >/dev/full");
    CHECK(lost.status == 2);
    CHECK_MESSAGE(lost.err.find("cannot write the output to stdout (No space left on device)") !=
                      std::string::npos,
                  lost.err);
  }
  // A single-value option given twice was CLI11's "At Most 1 required but received 2".
  expect_bad_input("grid --N 2e9 --N 3e9 --ra 0.2", "--N was given 2 times; give it once");
  expect_bad_input("grid --N 2e9 --ra 0.1 --ra 0.2", "--ra was given 2 times; give it once");
  // A refused seed is echoed.
  expect_bad_input("grid --N 2e9 --ra 0.2 --train seed=-1",
                   "--train: key 'train.seed' = -1 is invalid; it must be a whole number >= 0");
  // An exponent with a suffix was multiplied: 2e9k planned N = 2T, 2e9B failed on a budget.
  expect_bad_input("grid --N 2e9k --ra 0.2",
                   "--N: '2e9k' has both an exponent and a suffix; write one of them (e.g. 2e9 or "
                   "2B)");
  expect_bad_input("grid --N 2e9B --ra 0.2", "--N: '2e9B' has both an exponent and a suffix");
  expect_bad_input("grid --ra 0.1:0.2", "--N");
  expect_bad_input("grid --N 2e9 --ra 0:0.4", "outside (0, 1]");
  expect_bad_input("grid --N 2e9 --ra 1.5", "outside (0, 1]");
  expect_bad_input("grid --N 2e9 --ra 0.4:0.1", "below its start");
  expect_bad_input("grid --N 2e9 --ra x:0.4", "'x' is not a number");
  // A rate past a double's range or with both an exponent and a suffix keeps its own reason.
  expect_bad_input("grid --N 2e9 --ra 1e400", "--ra '1e400': '1e400' is beyond the largest");
  expect_bad_input("grid --N 2e9 --ra 0.1:1e-400",
                   "--ra '0.1:1e-400': '1e-400' is below the smallest number a double holds");
  expect_bad_input("grid --N 2e9 --ra 2e-1k", "has both an exponent and a suffix");
  expect_bad_input("grid --N 2e9 --ra 0.2 --compute 1e10", "C = 1e+10 FLOPs is 0.00036 of one");
  expect_bad_input("grid --N 2e9 --ra 0.2 --dense-tokens 100", "of one training step");
  // A budget past the counted tokens names its flag (1e300 a parameter was "compute = inf").
  expect_bad_input("grid --N 2e4 --ra 0.5 --seq-len 32 --dense-tpp 1e300",
                   "--dense-tpp = 1e+300 is D = ");
  expect_bad_input("grid --N 2e4 --ra 0.5 --seq-len 32 --dense-tokens 1e305",
                   "--dense-tokens = 1e+305 is above the 4.61e+18 tokens moeplan counts");
  expect_bad_input("grid --N 2e4 --ra 0.5 --seq-len 32 --train seed=1e-400",
                   "'1e-400' is below the smallest number a double holds");
  expect_bad_input("grid --N 2e9 --ra 0.2 --train lr=1", "'lr' is not a training setting");
  expect_bad_input("grid --N 2e9 --ra 0.2 --train erc_loss=-1", "train.erc_loss");
  expect_bad_input("grid --N 2e9 --ra 0.2 --train device=tpu",
                   "key 'train.device' = 'tpu' is not known; use \"cpu\" or \"cuda\"");
  expect_bad_input("grid --N 2e9 --ra 0.1 --family llama", "--family 'llama'");
  expect_bad_input("grid --N 2e9 --ra 0.1 --format xml", "--format 'xml'");
  // Given but empty is not absent: it used to print the table.
  expect_bad_input("grid --N 2e9 --ra 0.1 --format ''",
                   "--format '' is not known; use table, csv, json, toml, md");
  expect_bad_input("grid --N 2e9 --ra 0.1 --format '' -o x.csv", "--format '' is not known");
  // CSV written into a file named .toml read back as a broken manifest; as `audit -o` does, a
  // --format that contradicts the extension is refused (.txt and unknown extensions take any).
  expect_bad_input("grid --N 2e9 --ra 0.1 --format csv -o s.toml",
                   "--format csv contradicts -o s.toml, which is written as toml");
  // Extensions in any case: S.CSV is a CSV file (it was "cannot tell the format").
  {
    const fs::path upper = scratch() / "S.CSV";
    const Result r = run_moeplan("grid --N 2e6 --ra 0.2 -o '" + upper.string() + "'");
    CHECK_MESSAGE(r.status == 0, r.err);
    CHECK(slurp(upper).rfind("id,role,", 0) == 0);
  }
  expect_bad_input("show absent.toml --format json -o x.md",
                   "--format json contradicts -o x.md, which is written as md");
  CHECK(!fs::exists("s.toml"));
  expect_bad_input("show absent.toml --format ''", "--format '' is not known");
  // --points with a list or one rate, and a repeated rate, were silently ignored or duplicated.
  expect_bad_input("grid --N 2e9 --ra 0.1,0.2 --points 5",
                   "--points 5 applies to a range A:B only; --ra '0.1,0.2' is a list");
  expect_bad_input("grid --N 2e9 --ra 0.2 --points 5", "--ra '0.2' is a single rate");
  // N under one parameter overflowed the layer count into an "attention above 4e18" message; a
  // head wider than N affords was told to ask for N >= 1e5 at N = 2e9.
  expect_bad_input("grid --N 1e-300 --ra 0.2",
                   "N = 1e-300 is less than one parameter (N counts parameters: 2e9 or 2B); ask "
                   "for N >= 1e5");
  expect_bad_input("grid --N 2e9 --ra 0.2 --head-dim 1e6",
                   "--head-dim 1000000 is too wide for N = 2e+09: a paper-family MoE backbone "
                   "needs at least 2 layers of d_model >= head_dim; give a smaller --head-dim "
                   "(the rules take 128 here)");
  // Counts are decimal: CLI11 alone read 010 as octal 8 and 0x5 as hex.
  for (const char* points : {"0x5", "0b11", "2.5", "5e1", "''"})
    expect_bad_input(std::string("grid --N 2e9 --ra 0.1:0.3 --points ") + points,
                     "is not a whole number in decimal digits (e.g. 8)");
  // plan's JSON says where the point's budget came from, as the table's closing lines do.
  {
    const Result eq = run_moeplan("plan --N 2e9 --ra 0.2 --format json");
    REQUIRE(eq.status == 0);
    const nlohmann::json j = nlohmann::json::parse(eq.out);
    CHECK(j.at("budget_from") == "the equal-resource dense baseline");
    CHECK(j.at("dense_baseline").at("total_params").get<int64_t>() > 0);
    const Result own = run_moeplan("plan --N 2e9 --ra 0.2 --tokens 1e11 --format json");
    REQUIRE(own.status == 0);
    CHECK(nlohmann::json::parse(own.out).at("budget_from") ==
          "--tokens / --tokens-unique (not equal-resource)");
  }
  // A --train key given twice, and --unique-tokens with --epochs on the --arch path: refused,
  // as the other repeats and conflicts are (the last or the epochs won in silence).
  expect_bad_input("grid --N 3e5 --ra 0.2 --train seed=1 --train seed=2",
                   "--train seed is given twice ('seed=1' and 'seed=2'); give it once");
  expect_bad_input(std::string("plan --arch ") + MOEPLAN_SOURCE_DIR +
                       "/examples/arch-2b-moe.toml --unique-tokens 1e9 --epochs 2",
                   "give at most one of --unique-tokens (strict reuse) and --epochs");
  // Past its type: refused naming the limit (CLI11 said only "Could not convert" past an int,
  // and clamped a count past int64 to its maximum without a word).
  expect_bad_input("grid --N 2e9 --ra 0.1:0.3 --points 3000000000",
                   "--points: '3000000000' is above the largest value allowed, 10000");
  expect_bad_input("run x.toml --checkpoint-every 99999999999999999999",
                   "--checkpoint-every: '99999999999999999999' is above the largest value "
                   "allowed, 9223372036854775807");
  expect_bad_input("run x.toml --threads 99999999999999999999",
                   "--threads: '99999999999999999999' is above the largest value allowed, "
                   "2147483647");
  // Below its type: the option's own smallest value, not the type's minimum.
  expect_bad_input("run x.toml --threads -3000000000",
                   "--threads: '-3000000000' is below the smallest value allowed, 0");
  expect_bad_input("grid --N 2e9 --ra 0.1:0.3 --points -99999999999",
                   "--points: '-99999999999' is below the smallest value allowed, 1");
  expect_bad_input("run x.toml --checkpoint-every -99999999999999999999",
                   "--checkpoint-every: '-99999999999999999999' is below the smallest value "
                   "allowed, 0");
  // The option's own bound, not its type's: --nproc 2147483648 quoted an int's range.
  expect_bad_input("run x.toml --nproc 2147483648",
                   "--nproc: '2147483648' is above the largest value allowed, 1024");
  {
    const Result ten = run_moeplan("grid --N 2e9 --ra 0.1:0.3 --points 010");
    CHECK(ten.status == 0);
    CHECK_MESSAGE(ten.out.find("; 10 points + dense baseline") != std::string::npos, ten.out);
  }
  // A D̂ past 2^63 tokens is every consumed token, as any D̂ above D is: it wrapped to one window
  // of S = 2048 (printed 2.05k unique tokens).
  {
    const Result huge = run_moeplan("grid --N 2e9 --ra 0.2 --unique-tokens 1e30");
    CHECK(huge.status == 0);
    CHECK_MESSAGE(huge.out.find("2.05k") == std::string::npos, huge.out);
    CHECK_MESSAGE(huge.out.find("the same 40B unique tokens") != std::string::npos, huge.out);
  }
  expect_bad_input("grid --N 2e9 --ra 0.1,0.1",
                   "--ra '0.1,0.1': r_a 0.1 is listed twice; give each activation rate once");
  expect_bad_input("grid --N 2e9 --ra 0.1 --convention flops", "--convention 'flops'");
  expect_bad_input("grid --N 2e9 --ra 0.1 -o out.yaml", "out.yaml");
  expect_bad_input("plan --N 2e9 --ra 0.2 --format csv", "--format 'csv'");
  expect_bad_input("plan --N 2e9 --ra 1.2", "outside (0, 1]");

  std::string bad = kArch2b;
  bad.replace(bad.find("top_k = 1"), 9, "top_k = 90");
  expect_bad_input("plan --arch '" + write("topk.toml", bad).string() + "'", "top_k = 90");
  // The key that is wrong is named: `experts` left out of a MoE file is missing (not "experts
  // = 0 is invalid"); a MoE file of one layer (all dense) names the layers.
  bad = kArch2b;
  bad.replace(bad.find("experts = 89\n"), 13, "");
  expect_bad_input("plan --arch '" + write("noexperts.toml", bad).string() + "'",
                   "key 'experts' is missing");
  // A dense file that spells out top_k = 0 (and no experts) is dense, not "experts missing".
  CHECK(run_moeplan("plan --arch '" +
                    write("dense0.toml",
                          "d_model = 24\nlayers = 2\nheads = 3\nhead_dim = 8\n"
                          "d_ffn = 108\nvocab = 256\nseq_len = 32\ntop_k = 0\n"
                          "d_expert = 0\n")
                        .string() +
                    "'")
            .status == 0);
  bad = kArch2b;
  bad.replace(bad.find("layers = 16"), 11, "layers = 1");
  expect_bad_input("plan --arch '" + write("onelayer.toml", bad).string() + "'",
                   "a model with dense_layers == layers (1 == 1) has no MoE layers");
  bad = kArch2b;
  bad.replace(bad.find("heads = 11"), 10, "heads = 12");
  expect_bad_input("plan --arch '" + write("mha.toml", bad).string() + "'",
                   "must equal d_model = 1408 for multi-head attention (attention = \"any\" in "
                   "the arch file lifts this rule)");
  // An empty path was read as "not given": grid printed to the terminal and wrote nothing.
  // Each names what its option takes: `report -o` takes a file, not a folder.
  for (const char* args : {"grid --N 2e6 --ra 0.2 -o ''", "grid --N 2e6 --ra 0.2 --backbone ''",
                           "plan --arch ''", "show ''", "run ''", "audit --plan '' runs",
                           "audit --claims ''", "audit --spec ''", "report runs -o ''"})
    expect_bad_input(args, "'' is an empty path; give a file name");
  for (const char* args : {"run sweep.toml --out ''", "audit ''", "report ''"})
    expect_bad_input(args, "'' is an empty path; give a folder name");
  // An empty value where leaving the flag out means a default (a shell variable left unset,
  // --compute "$C"): grid planned the default 20 tokens a parameter and said nothing.
  for (const char* args :
       {"grid --N 2e9 --ra 0.2 --compute ''", "grid --N 2e9 --ra 0.2 --dense-tokens ''",
        "grid --N 2e9 --ra 0.2 --dense-tpp ''", "grid --N 2e9 --ra 0.2 --unique-tokens ''",
        "grid --N 2e9 --ra 0.2 --epochs ''", "grid --N 2e9 --ra 0.2 --compute '' --dense-tpp 5",
        "grid --N 2e9 --ra 0.2 --vocab ''", "grid --N 2e9 --ra 0.2 --seq-len ''",
        "grid --N 2e9 --ra 0.2 --head-dim ''", "grid --N 2e9 --ra 0.2 --alignment ''",
        "grid --N 2e9 --ra 0.2 --warmup-frac ''", "plan --N 2e9 --ra 0.2 --tokens ''",
        "plan --N 2e9 --ra 0.2 --tokens-unique ''", "plan --N 2e9 --ra ''",
        "run sweep.toml --device ''", "run sweep.toml --kernels ''",
        "audit --claims t.csv --equal N --baseline ''", "audit runs --tolerance ''"}) {
    CAPTURE(args);
    expect_bad_input(args, "'' is empty; give a value, or leave the flag out for its default");
  }
  // A folder given for a manifest or an arch file read as an empty file: "key 'schema' is
  // missing", "key 'd_model' is missing".
  const std::string folder = "'" + scratch().string() + "'";
  expect_bad_input("show " + folder, "is a folder, not a manifest");
  expect_bad_input("run " + folder, "is a folder, not a manifest");
  expect_bad_input("plan --arch " + folder, "is a folder; give the arch file (TOML)");
  expect_bad_input("grid --N 2e9 --ra 0.2 --backbone " + folder,
                   "is a folder; give the backbone file (TOML)");
  expect_bad_input("grid --N 2e6 --ra 0.1:0.4 --points 100000000",
                   "--points: '100000000' is above the largest value allowed, 10000");
  // A vocabulary that makes the embedding pass 64 bits: its count wrapped to a negative number.
  expect_bad_input("plan --N 1e12 --ra 0.2 --vocab 4e15",
                   "token embedding would have 2.56e+19 parameters");
  expect_bad_input("grid --N 2e9 --ra 0.2 --vocab 1",
                   "--vocab = 1 is invalid; it must be a whole "
                   "number >= 2");
  bad = kArch2b;
  bad.replace(bad.find("d_model = 1408"), 14, "d_model = \"wide\"");
  expect_bad_input("plan --arch '" + write("typed.toml", bad).string() + "'", "'d_model'");
  expect_bad_input("plan --arch '" + (scratch() / "absent.toml").string() + "'", "absent.toml");
  // With --arch the file fixes the architecture: the solver's flags were silently ignored.
  {
    const std::string arch = write("arch2b.toml", kArch2b).string();
    expect_bad_input("plan --arch '" + arch + "' --vocab 512",
                     "--vocab applies when plan solves the point from --N and --ra; with --arch");
    expect_bad_input("plan --arch '" + arch + "' --seq-len 128", "--seq-len applies");
    expect_bad_input("plan --arch '" + arch + "' --dense-tpp 40",
                     "--dense-tpp applies when plan solves the point from --N and --ra; with "
                     "--arch " + arch + " the file fixes the architecture (set its budget with "
                     "--compute or --tokens");
    expect_bad_input("plan --arch '" + arch + "' --n-tolerance 0.02", "--n-tolerance applies");
    // The flags that do apply to a given arch still work.
    CHECK(run_moeplan("plan --arch '" + arch + "' --convention exact --dp-width 8 --epochs 2")
              .status == 0);
  }

  // Manifests with a missing, mistyped or stale key.
  const fs::path good = scratch() / "good.toml";
  REQUIRE(run_moeplan("grid --N 2e6 --ra 0.2,0.3 -o '" + good.string() + "'").status == 0);
  const std::string text = slurp(good);
  std::string edited = text;
  edited.erase(edited.find("n_target = "),
               edited.find('\n', edited.find("n_target = ")) - edited.find("n_target = ") + 1);
  expect_bad_input("show '" + write("missing.toml", edited).string() + "'",
                   "'n_target' is missing");
  edited = text;
  edited.replace(edited.find("steps = "), 8, "steps = \"many\" #");
  expect_bad_input("show '" + write("mistyped.toml", edited).string() + "'", "dense.steps");
  edited = text;
  const size_t arch = edited.find("[points.arch]");
  edited.replace(edited.find("d_expert = ", arch), 11, "d_expert = 1");
  expect_bad_input("show '" + write("stale.toml", edited).string() + "'", "points[0].total_params");
}

TEST_CASE("report: one folder named twice is not two replicates; a file is not a runs folder") {
  const std::string runs = std::string(MOEPLAN_SOURCE_DIR) + "/tests/audit/fixtures/runs_cpu2";
  const Result once = run_moeplan("report '" + runs + "'");
  REQUIRE_MESSAGE(once.status == 0, once.err);
  for (const std::string& again : {runs, runs + "/", runs + "/../runs_cpu2"}) {
    const Result r = run_moeplan("report '" + runs + "' '" + again + "'");
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.find("are the same folder; replicates are the runs folders of one sweep "
                             "trained with other seeds") != std::string::npos,
                  r.err);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  // --charts: the HTML report's charts as .svg files, each the report's own drawing (one MoE
  // point and no baseline: its final BPC against r_a, its curves against compute and tokens); a
  // file in the folder's place is refused.
  {
    const fs::path dir = scratch() / "figures" / "new";
    const Result r = run_moeplan("report '" + runs + "' --charts '" + dir.string() + "'");
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK(r.out.find("wrote 3 chart(s) to " + dir.string() +
                     ": bpc-ra.svg, val-c.svg, loss-d.svg\n") != std::string::npos);
    const fs::path html = scratch() / "report.html";
    REQUIRE(run_moeplan("report '" + runs + "' -o '" + html.string() + "'").status == 0);
    for (const char* id : {"bpc-ra", "val-c", "loss-d"}) {
      const std::string svg = slurp(dir / (std::string(id) + ".svg"));
      CHECK(svg.starts_with("<svg xmlns="));
      CHECK_MESSAGE(slurp(html).find(svg) != std::string::npos, id);
    }
    const Result file = run_moeplan("report '" + runs + "' --charts '" + html.string() + "'");
    CHECK(file.status == 2);
    CHECK(file.out.empty());
    CHECK(file.err.find("--charts '" + html.string() + "' is a file, not a folder") !=
          std::string::npos);
  }
  // Each point's figures for a script: csv and json on stdout (--format) or to a file (-o's
  // extension); a format the file's name contradicts, or none, is refused in one line.
  {
    const Result csv = run_moeplan("report '" + runs + "' --format csv");
    REQUIRE_MESSAGE(csv.status == 0, csv.err);
    // Not fitted to a terminal's width: a script reads whole rows.
    CHECK(run_moeplan("report '" + runs + "' --format csv", "MOEPLAN_COLUMNS=40").out == csv.out);
    CHECK(csv.out.starts_with("point,role,status,"));
    CHECK(std::count(csv.out.begin(), csv.out.end(), '\n') == 2);  // the header and one point
    CHECK(csv.out.find("\nmoe-ra0.200,moe,complete,") != std::string::npos);
    const fs::path out = scratch() / "report.json";
    const Result json_file = run_moeplan("report '" + runs + "' -o '" + out.string() + "'");
    REQUIRE_MESSAGE(json_file.status == 0, json_file.err);
    const nlohmann::json doc = nlohmann::json::parse(slurp(out));
    REQUIRE(doc["points"].size() == 1);
    CHECK(doc["points"][0]["point"] == "moe-ra0.200");
    CHECK(doc["points"][0]["vs_dense"] == "no complete dense baseline");
    for (const std::string& args :
         {std::string("--format csv -o '") + (scratch() / "r.md").string() + "'",
          std::string("--format ''"), std::string("--format xml")}) {
      const Result bad = run_moeplan("report '" + runs + "' " + args);
      CHECK_MESSAGE(bad.status == 2, args);
      CHECK_MESSAGE(std::count(bad.err.begin(), bad.err.end(), '\n') == 1, bad.err);
      CHECK(bad.out.empty());
    }
  }
  // The built-in corpus's per-part columns are shown for it, and left out for a source without
  // parts (a text file's: two columns of "-" read as missing results).
  CHECK(once.out.find("facts BPC") != std::string::npos);
  {
    const fs::path text = scratch() / "runs_text";
    for (const char* point : {"moe-ra0.200"}) {  // the fixture's one point
      fs::create_directories(text / point);
      nlohmann::json rec = nlohmann::json::parse(slurp(runs + "/" + point + "/record.json"));
      rec["data"]["parts"] = nlohmann::json::array();
      for (auto& e : rec["val_curve"]) e.erase("parts");
      std::ofstream(text / point / "record.json") << rec.dump(1);
    }
    const Result r = run_moeplan("report '" + text.string() + "'");
    CHECK_MESSAGE(r.status == 0, r.err);
    CHECK(r.out.find("val BPC") != std::string::npos);
    CHECK(r.out.find("facts BPC") == std::string::npos);
    CHECK(r.out.find("arith BPC") == std::string::npos);
  }
  // One point's folder instead of the runs folder: both commands say which folder to give.
  for (const char* cmd : {"report", "audit"}) {
    const Result r = run_moeplan(std::string(cmd) + " '" + runs + "/moe-ra0.200'");
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.find("one point's folder") != std::string::npos, cmd, ": ", r.err);
    CHECK_MESSAGE(r.err.find("'" + runs + "'") != std::string::npos, cmd, ": ", r.err);
  }
  // A record `moeplan audit` refuses (no plan.arch, which the table does not show) is refused
  // here too: the two read the same records.
  const fs::path copy = scratch() / "runs_no_arch";
  fs::create_directories(copy / "moe-ra0.200");
  nlohmann::json rec = nlohmann::json::parse(slurp(runs + "/moe-ra0.200/record.json"));
  rec["plan"].erase("arch");
  std::ofstream(copy / "moe-ra0.200" / "record.json") << rec.dump(1);
  for (const char* cmd : {"report", "audit"}) {
    const Result r = run_moeplan(std::string(cmd) + " '" + copy.string() + "'");
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.find("'plan.arch' is missing or not an object") != std::string::npos, cmd,
                  ": ", r.err);
  }
  // A record with world_size 0 crashed report (a division by it); one copied under another
  // point's folder was shown as its point_id. Both commands refuse both, naming the key.
  for (const auto& [name, key, value, expected] :
       {std::tuple<const char*, const char*, nlohmann::json, const char*>{"runs_ws0", "world_size",
                                                                          0, "'world_size' is"},
        {"runs_moved", "point_id", "other",
         "'point_id' is \"other\" but the record lies in folder 'moe-ra0.200'"}}) {
    const fs::path d = scratch() / name;
    fs::create_directories(d / "moe-ra0.200");
    nlohmann::json rec2 = nlohmann::json::parse(slurp(runs + "/moe-ra0.200/record.json"));
    rec2[key] = value;
    if (std::string(key) == "point_id") rec2["plan"]["id"] = value;  // its plan moved with it
    std::ofstream(d / "moe-ra0.200" / "record.json") << rec2.dump(1);
    for (const char* cmd : {"report", "audit"}) {
      const Result r = run_moeplan(std::string(cmd) + " '" + d.string() + "'");
      CHECK_MESSAGE(r.status == 2, cmd, " ", name, ": ", r.err);
      CHECK_MESSAGE(r.err.find(expected) != std::string::npos, cmd, " ", name, ": ", r.err);
    }
  }
  {  // one run under two point ids: a point's record renamed to another point (plan.id kept)
    const fs::path d = scratch() / "runs_twice";
    fs::create_directories(d / "moe-ra0.900");
    nlohmann::json rec2 = nlohmann::json::parse(slurp(runs + "/moe-ra0.200/record.json"));
    rec2["point_id"] = "moe-ra0.900";
    std::ofstream(d / "moe-ra0.900" / "record.json") << rec2.dump(1);
    for (const char* cmd : {"report", "audit"}) {
      const Result r = run_moeplan(std::string(cmd) + " '" + d.string() + "'");
      CHECK_MESSAGE(r.status == 2, cmd, ": ", r.err);
      CHECK_MESSAGE(r.err.find("'plan.id' is") != std::string::npos, cmd, ": ", r.err);
    }
  }
  const fs::path file = write("sweep-not-runs.toml", "x = 1\n");
  const Result f = run_moeplan("report '" + file.string() + "'");
  CHECK(f.status == 2);
  CHECK_MESSAGE(f.err.find("'" + file.string() + "' is not a folder") != std::string::npos, f.err);
}

TEST_CASE("the example files plan to their hand-computed values") {
  const std::string dir = std::string(MOEPLAN_SOURCE_DIR) + "/examples/";
  // arch-7b-moe.toml (router counted): N = 6,517,444,608, N_a = 1,308,119,040,
  // M = 6·N_a + 12·24·2048·2048 = 9,056,673,792 (worked out in the file's comment).
  Result r = run_moeplan("plan --arch '" + dir + "arch-7b-moe.toml' --format json --tokens 316e9");
  REQUIRE(r.status == 0);
  nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("total_params").get<int64_t>() == 6517444608);
  CHECK(j.at("active_params").get<int64_t>() == 1308119040);
  CHECK(j.at("flops_per_token").get<double>() == 9056673792.0);
  // Published C = 2.86e21 at D = 316B (Table 12): 9.0567e9 · 3.16e11 = 2.862e21.
  CHECK(j.at("compute").get<double>() == doctest::Approx(2.86e21).epsilon(0.01));
  // arch-2b-dense.toml: N = 28·(4·2176² + 3·2176·8848) = 28·76,699,648 = 2,147,590,144;
  // M = 6·N + 12·28·2176·2048 = 12,885,540,864 + 1,497,366,528 = 14,382,907,392.
  r = run_moeplan("plan --arch '" + dir + "arch-2b-dense.toml' --format json");
  REQUIRE(r.status == 0);
  j = nlohmann::json::parse(r.out);
  CHECK(j.at("role") == "dense");
  CHECK(j.at("total_params").get<int64_t>() == 2147590144);
  CHECK(j.at("flops_per_token").get<double>() == 14382907392.0);
  // The example sweep reads back and passes every consistency check.
  const moeplan::Manifest m = moeplan::read_manifest(dir + "sweep-tiny.toml");
  CHECK(m.points.size() == 4);
  CHECK(m.dense.arch.vocab == 256);
}

TEST_CASE("grid --backbone solves only the MoE layer on the given backbone") {
  const std::string dir = std::string(MOEPLAN_SOURCE_DIR) + "/examples/";
  // Table 12's r_a at 20.07 % is the paper's E78 K6 De512 on this backbone (router counted).
  Result r = run_moeplan("grid --N 6.52e9 --backbone '" + dir +
                         "backbone-7b.toml' --ra 0.2007 --count-router --format json");
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& a = j.at("points")[0].at("arch");
  CHECK(a.at("layers") == 24);
  CHECK(a.at("d_ffn") == 5464);
  CHECK(a.at("experts") == 78);
  CHECK(a.at("top_k") == 6);
  CHECK(a.at("d_expert") == 512);
  // count_router set in the file, not by the flag: grid wrote a manifest its own show refused
  // (the dense baseline's N without the router, the points' with it).
  const fs::path cr =
      write("bb-cr.toml", slurp(dir + "backbone-7b.toml") + "count_router = true\n");
  const fs::path sweep = scratch() / "bb-cr-sweep.toml";
  REQUIRE(run_moeplan("grid --N 6.52e9 --backbone '" + cr.string() + "' --ra 0.2007 -o '" +
                      sweep.string() + "'")
              .status == 0);
  r = run_moeplan("show '" + sweep.string() + "' --format json");
  REQUIRE(r.status == 0);
  const nlohmann::json s = nlohmann::json::parse(r.out);
  CHECK(s.at("dense").at("arch").at("count_router") == true);
  CHECK(s.at("points")[0].at("arch").at("experts") == 78);
  // Backbones the planner cannot take: experts given (it solves them), no MoE layer left, and
  // a negative layer count (named as such, not as "dense_layers = 1 leaves no MoE layer").
  const std::string rest =
      "heads = 16\nhead_dim = 128\nd_ffn = 5464\nseq_len = 2048\nvocab = 65536\n";
  for (const auto& [name, text, needle] : std::vector<std::array<std::string, 3>>{
           {"bb.toml", "d_model = 2048\nlayers = 24\nexperts = 8\n" + rest,
            "'experts' is not allowed in a backbone"},
           {"bb2.toml", "d_model = 2048\nlayers = 2\ndense_layers = 2\n" + rest,
            "leaves no MoE layer"},
           {"bb3.toml", "d_model = 2048\nlayers = -24\n" + rest,
            "key 'layers' = -24 is invalid; it must be >= 1 (and above dense_layers)"}})
    expect_bad_input("grid --N 6.52e9 --ra 0.2 --backbone '" + write(name, text).string() + "'",
                     needle);
}

TEST_CASE("show: an edit off the equal-resource sweep is refused; equal_resources = false says so") {
  const fs::path toml = scratch() / "contract.toml";
  REQUIRE(run_moeplan("grid --N 2e6 --ra 0.2,0.3 -o '" + toml.string() + "'").status == 0);
  moeplan::Manifest m = moeplan::read_manifest(toml);
  // The second point given the first's plan under its own id: r_a 0.2 against a target of 0.3.
  const std::string id = m.points[1].id;
  const double target = m.points[1].activation_rate_target;
  m.points[1] = m.points[0];
  m.points[1].id = id;
  m.points[1].activation_rate_target = target;
  moeplan::write_manifest_atomic(m, toml);
  Result r = run_moeplan("show '" + toml.string() + "'");
  CHECK(r.status == 2);
  CHECK(r.err.find("key 'points[1].reachable' = true") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  m.equal_resources = false;
  moeplan::write_manifest_atomic(m, toml);
  r = run_moeplan("show '" + toml.string() + "'");
  CHECK(r.status == 0);
  CHECK(r.out.find("NOT an equal-resource sweep (equal_resources = false)") != std::string::npos);
  CHECK(r.out.find("for every point") == std::string::npos);
  // Nor does the header claim an N bound the contract did not check.
  CHECK(r.out.find("of the dense baseline's N") == std::string::npos);
  CHECK(r.out.find("(n_tolerance ±1.0%, not held)") != std::string::npos);
  CHECK(r.out.find("compute C target of the dense baseline = ") != std::string::npos);
  r = run_moeplan("show '" + toml.string() + "' --format json");
  CHECK(nlohmann::json::parse(r.out).at("equal_resources") == false);
}

TEST_CASE("show: a manifest's notes are text, in the terminal and in Markdown") {
  // A hand-edited note: an escape sequence recoloured the terminal, and in Markdown its raw
  // <script>, its line break (a heading on the next line) and a link came through as markup.
  const fs::path toml = scratch() / "notes.toml";
  REQUIRE(run_moeplan("grid --N 2e6 --ra 0.2 -o '" + toml.string() + "'").status == 0);
  moeplan::Manifest m = moeplan::read_manifest(toml);
  m.points[0].note = "first \x1b[31mRED line\n# second <script>x</script> [a](b) | c";
  moeplan::write_manifest_atomic(m, toml);
  Result r = run_moeplan("show '" + toml.string() + "'");
  REQUIRE(r.status == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find("first \\x1b[31mRED line\\x0a# second") != std::string::npos);
  r = run_moeplan("show '" + toml.string() + "' --format md");
  REQUIRE(r.status == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find("<script>") == std::string::npos);
  CHECK(r.out.find("\n# second") == std::string::npos);
  CHECK(r.out.find("first \\\\x1b[31mRED line\\\\x0a\\# second &lt;script&gt;x&lt;/script&gt; "
                   "[a\\](b) \\| c") != std::string::npos);
}

TEST_CASE("run: points of one sweep on different CPU thread counts are warned about up front") {
  // At N 1e5 (S 64) moe-ra0.200's passes are 39 sequences x 64 x D_m 40 = 99,840 >= 2^16 token
  // widths, so it runs on the default thread count; the dense baseline's (9 x 64 x 72 = 41,472)
  // runs on one. On two or more threads their times could not be compared.
  if (std::thread::hardware_concurrency() < 2) return;  // --threads 2 is refused on one thread
  const fs::path sweep = scratch() / "threads.toml";
  REQUIRE(run_moeplan("grid --N 1e5 --ra 0.2 --dense-tpp 4 --seq-len 64 --warmup-frac 0.05 -o '" +
                      sweep.string() + "'")
              .status == 0);
  const std::string out = (scratch() / "threads-runs").string();
  const Result r =
      run_moeplan("run '" + sweep.string() + "' --estimate 1 --out '" + out + "' --threads 2");
  CHECK_MESSAGE(r.status == 0, r.err);
  CHECK_MESSAGE(r.err.find("moeplan: warning: these points train on different CPU thread counts "
                           "(dense on 1 thread; moe-ra0.200 on 2 threads)") != std::string::npos,
                r.err);
  const Result one =
      run_moeplan("run '" + sweep.string() + "' --estimate 1 --out '" + out + "' --threads 1");
  CHECK(one.status == 0);
  CHECK(one.err.find("thread counts") == std::string::npos);
}

TEST_CASE("errors show a control character in a file name escaped, not as a terminal command") {
  // A runs folder with a point folder named "moe<ESC>[31mred": its record is refused, and the
  // path in the one-line error printed the ESC raw (recolouring the terminal).
  const fs::path runs = scratch() / "esc-runs";
  fs::remove_all(runs);
  fs::create_directories(runs / "moe\x1b[31mred");
  std::ofstream(runs / "moe\x1b[31mred" / "record.json") << "{}";
  for (const char* cmd : {"report", "audit"}) {
    CAPTURE(cmd);
    const Result r = run_moeplan(std::string(cmd) + " '" + runs.string() + "'");
    CHECK(r.status == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find('\x1b') == std::string::npos);
    CHECK_MESSAGE(r.err.find("moe\\x1b[31mred") != std::string::npos, r.err);
  }
}

TEST_CASE("report and audit judge equal N with the sweep's own n_tolerance, as the record says") {
  // grid --n-tolerance 0.05 at N 2e4 plans moe-ra0.600 at 21.2k, +3.75 % from the dense
  // baseline's 20.5k: equal N for this sweep. report held every folder to 1 % and called it
  // "not equal" while `audit --plan` held it to 5 % and said it holds.
  const fs::path sweep = scratch() / "ntol.toml", runs = scratch() / "ntol-runs";
  fs::remove_all(runs);
  REQUIRE(run_moeplan("grid --N 2e4 --ra 0.6 --n-tolerance 0.05 --dense-tpp 2 -o '" +
                      sweep.string() + "'")
              .status == 0);
  REQUIRE(run_moeplan("run '" + sweep.string() + "' --threads 1 --out '" + runs.string() + "'")
              .status == 0);
  const fs::path dense = runs / "dense" / "record.json";
  nlohmann::json d = nlohmann::json::parse(slurp(dense));
  REQUIRE(d.contains("sweep_tolerances"));
  CHECK(d["sweep_tolerances"]["n"] == 0.05);
  CHECK(d["sweep_tolerances"]["compute"] == 0.01);
  Result report = run_moeplan("report '" + runs.string() + "'");
  CHECK(report.status == 0);
  CHECK(report.out.find("NOT compared with the dense baseline") == std::string::npos);
  CHECK(run_moeplan("audit '" + runs.string() + "'").status == 0);
  CHECK(run_moeplan("audit '" + runs.string() + "' --plan '" + sweep.string() + "'").status == 0);
  // A record without them (older runs) is held to 1 %, by both.
  d.erase("sweep_tolerances");
  std::ofstream(dense) << d.dump(1);
  report = run_moeplan("report '" + runs.string() + "'");
  CHECK(report.out.find("NOT compared with the dense baseline") != std::string::npos);
  CHECK(report.out.find("N within 1 % and C [paper] within 1 %") != std::string::npos);
  CHECK(run_moeplan("audit '" + runs.string() + "'").status == 1);
  // Records say whether their manifest was planned as one equal-resource sweep; report says so
  // when it was not (equal_resources = false: an ablation, a test).
  REQUIRE(d.contains("sweep_equal_resources"));
  CHECK(d["sweep_equal_resources"] == true);
  CHECK(report.out.find("NOT an equal-resource sweep") == std::string::npos);
  d["sweep_equal_resources"] = false;
  std::ofstream(dense) << d.dump(1);
  report = run_moeplan("report '" + runs.string() + "'");
  CHECK(report.status == 0);
  CHECK(report.out.find("NOT an equal-resource sweep: dense trained from a manifest that says "
                        "equal_resources = false") != std::string::npos);
  d["sweep_equal_resources"] = "no";
  std::ofstream(dense) << d.dump(1);
  CHECK(run_moeplan("report '" + runs.string() + "'").status == 2);
}

TEST_CASE(
    "report counts no point the audit of its folder refuses, and replicates differ in seeds only") {
  // A record whose FLOP ledger says twice its summary's C (a hand edit, or a record of another
  // run): report took C from the summary and declared the point a win while `audit` failed the
  // folder's equal C. The report now runs the folder's audit and leaves such a point out.
  const fs::path sweep = scratch() / "au.toml", runs = scratch() / "au-runs";
  fs::remove_all(runs);
  REQUIRE(run_moeplan("grid --N 2e4 --ra 0.6 --dense-tpp 2 -o '" + sweep.string() + "'").status ==
          0);
  REQUIRE(run_moeplan("run '" + sweep.string() + "' --threads 1 --out '" + runs.string() + "'")
              .status == 0);
  Result report = run_moeplan("report '" + runs.string() + "'");
  REQUIRE(report.status == 0);
  CHECK(report.out.find("`moeplan audit` of this folder (no --plan): ") != std::string::npos);
  CHECK(report.out.find("audit error") == std::string::npos);
  const fs::path copy = scratch() / "au-edited";
  fs::remove_all(copy);
  fs::copy(runs, copy, fs::copy_options::recursive);
  const fs::path moe = copy / "moe-ra0.600" / "record.json";
  nlohmann::json r = nlohmann::json::parse(slurp(moe));
  for (auto& [cat, phases] : r["measured"]["flops"]["by_category"].items())
    for (auto& [phase, v] : phases.items()) v = v.get<int64_t>() * 2;
  r["measured"]["flops"]["total"] = r["measured"]["flops"]["total"].get<int64_t>() * 2;
  std::ofstream(moe) << r.dump(1);
  CHECK(run_moeplan("audit '" + copy.string() + "'").status == 1);
  report = run_moeplan("report '" + copy.string() + "'");
  CHECK(report.status == 0);
  CHECK(report.out.find("audit error") != std::string::npos);
  // No MoE point compared: no "0 of 0" and no "best point: dense".
  CHECK_MESSAGE(report.out.find("; no MoE point is compared with it") != std::string::npos,
                report.out);
  CHECK(report.out.find("best point") == std::string::npos);
  CHECK(report.out.find("NOT compared with the dense baseline, `moeplan audit` finds an error") !=
        std::string::npos);
  // Its summary C still reads as planned, but the ledger behind it is wrong: its C is not "ok",
  // and it does not match its plan.
  const std::string moe_row = report.out.substr(report.out.find("\nmoe-ra0.600 "));
  CHECK(moe_row.substr(0, moe_row.find('\n', 1)).find(" no ") != std::string::npos);
  CHECK(moe_row.substr(0, moe_row.find('\n', 1)).find(" yes ") == std::string::npos);
  CHECK(report.out.find("measured vs plan: 1 of 2 complete point(s)") != std::string::npos);
  CHECK(report.out.find("(off the plan: moe-ra0.600;") != std::string::npos);
  // Its verdict lost on the way to stdout is an error, said in one line (not exit 70).
  const Result lost = run_moeplan("audit '" + copy.string() + "' >/dev/full");
  CHECK(lost.status == 2);
  CHECK(count_lines(lost.err) == 1);
  CHECK(lost.err.find("cannot write the output to stdout") != std::string::npos);
  // Records of two sweeps' tolerances in one folder: a claim of the audit, so the report's too.
  fs::remove_all(copy);
  fs::copy(runs, copy, fs::copy_options::recursive);
  nlohmann::json d = nlohmann::json::parse(slurp(copy / "dense" / "record.json"));
  d["sweep_tolerances"] = {{"n", 0.05}, {"compute", 0.05}};
  std::ofstream(copy / "dense" / "record.json") << d.dump(1);
  const Result a = run_moeplan("audit '" + copy.string() + "'");
  CHECK(a.status == 1);
  CHECK(a.out.find("FAILS  every record carries the same sweep tolerances") != std::string::npos);
  report = run_moeplan("report '" + copy.string() + "'");
  // No MoE point compared: no "0 of 0" and no "best point: dense".
  CHECK_MESSAGE(report.out.find("; no MoE point is compared with it") != std::string::npos,
                report.out);
  CHECK(report.out.find("best point") == std::string::npos);
  // Records the audit will not judge as one sweep (another reuse rule): the report still
  // renders them, and says the audit refuses the folder.
  fs::remove_all(copy);
  fs::copy(runs, copy, fs::copy_options::recursive);
  nlohmann::json lr = nlohmann::json::parse(slurp(moe));
  lr["plan"]["reuse"] = "loose";
  std::ofstream(moe) << lr.dump(1);
  REQUIRE(run_moeplan("audit '" + copy.string() + "'").status == 2);
  report = run_moeplan("report '" + copy.string() + "'");
  CHECK_MESSAGE(report.status == 0, report.err);
  CHECK(report.out.find("`moeplan audit` of this folder refuses it: ") != std::string::npos);
  // ... and declares no win the audit refuses: the baseline is no baseline to it.
  CHECK_MESSAGE(report.out.find("no comparison: `moeplan audit` will not judge these records as "
                                "one sweep") != std::string::npos,
                report.out);
  // No record has an error of its own: the dense row is not marked, the MoE row is "not one
  // sweep" (it was the dense baseline's "audit error", and so in every chart's legend).
  CHECK(report.out.find("not one sweep") != std::string::npos);
  CHECK(report.out.find("audit error") == std::string::npos);
  CHECK(report.out.find("best point") == std::string::npos);
  // Replicates: another [train] setting than the seeds is another experiment, refused.
  fs::remove_all(copy);
  fs::copy(runs, copy, fs::copy_options::recursive);
  for (const char* id : {"dense", "moe-ra0.600"}) {  // eval_every alone is a replicate still
    nlohmann::json x = nlohmann::json::parse(slurp(copy / id / "record.json"));
    x["train"]["eval_every"] = 7;
    x["train"]["seed"] = 11;
    std::ofstream(copy / id / "record.json") << x.dump(1);
  }
  CHECK(run_moeplan("report '" + runs.string() + "' '" + copy.string() + "'").status == 0);
  for (const char* id : {"dense", "moe-ra0.600"}) {
    nlohmann::json x = nlohmann::json::parse(slurp(copy / id / "record.json"));
    x["train"]["load_balance"] = 0.1;
    std::ofstream(copy / id / "record.json") << x.dump(1);
  }
  const Result rep = run_moeplan("report '" + runs.string() + "' '" + copy.string() + "'");
  CHECK(rep.status == 2);
  CHECK_MESSAGE(rep.err.find("trained with train.load_balance = 0.1 in") != std::string::npos,
                rep.err);
  CHECK(rep.err.find("replicates differ only in their seeds (seed, data_seed)") !=
        std::string::npos);
}

namespace {

// A line's cells: the runs of text between two or more spaces.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  for (size_t at = line.find_first_not_of(' '); at != std::string::npos;) {
    size_t end = line.find("  ", at);
    cells.push_back(line.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end == std::string::npos ? end : line.find_first_not_of(' ', end);
  }
  return cells;
}

// Terminal columns of UTF-8 text without wide characters: code points, less combining marks.
size_t columns_of(const std::string& line) {
  size_t n = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    n += !(c == 0xCC || (c == 0xCD && static_cast<unsigned char>(line[i + 1]) < 0xB0));
  }
  return n;
}

}  // namespace

TEST_CASE("a table wider than the terminal (MOEPLAN_COLUMNS) prints in parts, each with the ids") {
  const std::string args = "grid --N 2e9 --ra 0.05:0.4";
  const Result whole = run_moeplan(args);  // a pipe: whole rows
  const Result fit = run_moeplan(args, "MOEPLAN_COLUMNS=100");
  REQUIRE(whole.status == 0);
  REQUIRE(fit.status == 0);
  auto lines_starting = [](const std::string& text, const std::string& start) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(start, 0) == 0) out.push_back(line);
    return out;
  };
  const auto whole_header = lines_starting(whole.out, "   id  ");
  REQUIRE(whole_header.size() == 1);
  CHECK(columns_of(whole_header[0]) > 200);  // the table as it is: 223 columns
  const auto headers = lines_starting(fit.out, "   id  ");
  CHECK(headers.size() >= 3);
  // Every part fits in 100 columns and begins with the key columns; the parts' other columns, one
  // after another, are the whole table's, for the header and for a row (the flagged one).
  for (const char* start : {"   id  ", "!  moe-ra0.050  "}) {
    const std::vector<std::string> parts = lines_starting(fit.out, start);
    CHECK(parts.size() == headers.size());
    std::vector<std::string> joined;
    for (const std::string& p : parts) {
      CHECK_MESSAGE(columns_of(p) <= 100, p);
      const std::vector<std::string> c = cells_of(p);
      joined.insert(joined.end(), c.begin() + 1 + (start[0] == '!'), c.end());
    }
    std::vector<std::string> want = cells_of(lines_starting(whole.out, start).at(0));
    want.erase(want.begin(), want.begin() + 1 + (start[0] == '!'));
    CHECK(joined == want);
  }
  // 0: whole rows, as in a pipe; not a whole number: refused before any work.
  CHECK(run_moeplan(args, "MOEPLAN_COLUMNS=0").out == whole.out);
  const Result bad = run_moeplan(args, "MOEPLAN_COLUMNS=wide");
  CHECK(bad.status == 2);
  CHECK(bad.out.empty());
  CHECK(bad.err ==
        "moeplan: error: MOEPLAN_COLUMNS 'wide' is not a width: give a whole number of terminal "
        "columns up to 100000 for tables to fit in, or 0 for whole rows\n");
}

TEST_CASE("run's progress in a terminal narrower than its line: fitted, so no row is left behind") {
  // Rewritten in place with "\r\033[K", a line wider than the terminal wraps and leaves a row
  // behind at each rewrite. In a 70-column terminal (a pseudo-terminal from util-linux's script)
  // each rewrite must be at most 69 columns and still say the step, the loss and the ETA.
  if (std::system("command -v script >/dev/null 2>&1") != 0) {
    MESSAGE("util-linux's script not found: the terminal case is not checked");
    return;
  }
  const fs::path dir = scratch() / "progress";
  fs::create_directories(dir);
  const std::string sweep = (dir / "t.toml").string();
  REQUIRE(run_moeplan("grid --N 2e4 --ra 0.25 --dense-tokens 1e5 -o '" + sweep + "'").status == 0);
  const fs::path log = dir / "tty.out";
  const std::string inner = std::string("stty cols 70; '") + MOEPLAN_BINARY + "' run '" + sweep +
                            "' --out '" + (dir / "runs").string() + "'";
  const std::string cmd = "script -qec \"" + inner + "\" /dev/null > '" + log.string() + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::string out = slurp(log);
  const std::string rewrite = "\r\033[K";
  int rewrites = 0;
  for (size_t at = out.find(rewrite); at != std::string::npos; at = out.find(rewrite, at + 1)) {
    const size_t from = at + rewrite.size();
    const std::string line = out.substr(from, out.find_first_of("\r\n", from) - from);
    CAPTURE(line);
    CHECK(line.size() <= 69);  // ASCII: ids and figures
    CHECK(line.find(" step ") != std::string::npos);
    CHECK(line.find("  loss ") != std::string::npos);
    CHECK(line.find("  ETA ") != std::string::npos);
    ++rewrites;
  }
  CHECK(rewrites >= 4);  // two points, each its first and last step at least
  // Not a terminal: the whole line, every field, as before.
  fs::remove_all(dir / "runs");
  const Result piped = run_moeplan("run '" + sweep + "' --out '" + (dir / "runs").string() + "'");
  REQUIRE(piped.status == 0);
  CHECK(piped.out.find(" tokens consumed  loss ") != std::string::npos);
  CHECK(piped.out.find(" FLOP/s [exact/causal]  ETA ") != std::string::npos);
}

TEST_CASE("output that cannot reach stdout is an error, not exit 0; a huge input is refused") {
  // A full disk or a closed stdout left an empty file and exit 0 (or exit 70 for JSON).
  for (const char* args : {"conventions >/dev/full", "grid --N 3e5 --ra 0.2:0.5 >/dev/full",
                           "grid --N 3e5 --ra 0.2:0.5 --format json >/dev/full",
                           "plan --N 3e5 --ra 0.2 >&-", "--help >/dev/full"}) {
    const Result r = run_moeplan(args);
    CHECK_MESSAGE(r.status == 2, args, ": ", r.err);
    CHECK_MESSAGE(count_lines(r.err) == 1, args, ": ", r.err);
    CHECK_MESSAGE(r.err.find("cannot write the output to stdout") != std::string::npos, args, ": ",
                  r.err);
  }
  // /dev/zero as a manifest filled memory until killed (or bad_alloc, exit 70).
  for (const char* args : {"show /dev/zero", "plan --arch /dev/zero"}) {
    const Result r = run_moeplan(args);
    CHECK(r.status == 2);
    CHECK_MESSAGE(r.err.find("is larger than 256 MiB") != std::string::npos, args, ": ", r.err);
  }
}

TEST_CASE("audit --plan names the equal-C claim in the convention its values are in") {
  // Records planned in exact/causal, audited against a manifest planned in megatron: each point's
  // C is measured against the manifest's plan (megatron), and the claim said "exact/causal".
  const fs::path exact = scratch() / "conv-exact.toml", meg = scratch() / "conv-meg.toml",
                 runs = scratch() / "conv-runs";
  fs::remove_all(runs);
  const std::string args = "grid --N 2e4 --ra 0.5 --ra-tolerance 0.05 --dense-tpp 2 --seq-len 32 ";
  REQUIRE(run_moeplan(args + "--convention exact -o '" + exact.string() + "'").status == 0);
  REQUIRE(run_moeplan(args + "--convention megatron -o '" + meg.string() + "'").status == 0);
  REQUIRE(run_moeplan("run '" + exact.string() + "' --threads 1 --out '" + runs.string() + "'")
              .status == 0);
  const Result own = run_moeplan("audit '" + runs.string() + "'");
  CHECK(own.out.find("equal training compute C (exact/causal) across the sweep") !=
        std::string::npos);
  const Result other = run_moeplan("audit '" + runs.string() + "' --plan '" + meg.string() + "'");
  CHECK(other.out.find("equal training compute C (megatron) across the sweep") !=
        std::string::npos);
  CHECK(other.out.find("equal training compute C (exact/causal)") == std::string::npos);
}

TEST_CASE("grid --lr-scale: the header names the η rule, and plan takes the flag too") {
  Result r = run_moeplan("grid --N 1e5 --ra 0.2 --dense-tpp 4 --seq-len 64 --lr-scale 0.5");
  CHECK(r.status == 0);
  CHECK(r.out.find("η rule: step-law ×0.5\n") != std::string::npos);
  r = run_moeplan("grid --N 1e5 --ra 0.2 --dense-tpp 4 --seq-len 64");
  CHECK(r.status == 0);
  CHECK(r.out.find("η rule") == std::string::npos);  // the step law's own η: nothing to say
  r = run_moeplan("plan --N 1e5 --ra 0.2 --dense-tpp 4 --seq-len 64 --lr-scale 2");
  CHECK(r.status == 0);
  CHECK(r.out.find("η lr_peak (step-law ×2)") != std::string::npos);
  r = run_moeplan("grid --N 1e5 --ra 0.2 --lr-scale 0");
  CHECK(r.status == 2);
  CHECK(r.err.find("--lr-scale = 0 is invalid; it must be in (0, 100]") != std::string::npos);
}
