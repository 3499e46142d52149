// End to end through the built moeplan (MOEPLAN_BINARY): exit statuses, one-line errors, and no
// output file left behind on error.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit_test_util.hpp"
#include "scratch.hpp"

using namespace moeplan::audit::test;
namespace fs = std::filesystem;

namespace {
struct Result {
  int status;
  std::string out, err;
};
using moeplan::test::scratch;
Result run(const std::string& args) {
  const fs::path dir = scratch();
  fs::create_directories(dir);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const std::string cmd = std::string(MOEPLAN_BINARY) + " audit " + args + " >" + out + " 2>" + err;
  const int raw = std::system(cmd.c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
}
size_t lines(const std::string& s) {
  return size_t(std::count(s.begin(), s.end(), '\n'));
}
fs::path out_file(const std::string& name) {
  const fs::path p = scratch() / name;
  fs::remove(p);
  return p;
}
}  // namespace

TEST_CASE("the example audit of the published tables exits 0") {
  const Result r =
      run("--spec " + std::string(MOEPLAN_SOURCE_DIR) + "/examples/audit-paper/claims.toml");
  CHECK(r.status == 0);
  CHECK(r.out.find("HOLDS  7B MoE rows vs 7B dense") != std::string::npos);
  CHECK(r.err.empty());
  // A spec's equal-N-and-C claim says it did not test D̂, as the command line's always did: the
  // paper claims strictly equal resources, and "3 of 3 hold" covered two of the three.
  CHECK(r.out.find("claim '7B MoE rows vs 7B dense (C = 2.86e21): equal N and equal C' does not "
                   "test equal unique data D̂, the third equal resource: no table prints D̂") !=
        std::string::npos);
  // Markdown gives each quantity's note too: the compute row names its FLOP convention.
  const Result md = run("--spec " + std::string(MOEPLAN_SOURCE_DIR) +
                        "/examples/audit-paper/claims.toml --format md");
  CHECK(md.status == 0);
  CHECK_MESSAGE(md.out.find("-&gt; holds (values: published; FLOPs as each table claims them: "
                            "paper training) |") != std::string::npos,
                md.out);
}

TEST_CASE("a spec's shared value that a column contradicts is refused; JSON nulls for no value") {
  const fs::path dir = scratch() / "shared_vs_column";
  fs::create_directories(dir);
  std::ofstream(dir / "s.csv") << "label,N,S\nd,1.00e9,4096\nm,1.00e9,4096\n";
  std::ofstream(dir / "spec.toml") << "schema = 1\n[tables.s]\nfile = \"s.csv\"\n"
                                      "[tables.s.shared]\nseq_len = 2048\n"
                                      "[[claims]]\nequal = [\"N\"]\nbaseline = \"d\"\n";
  const Result r = run("--spec " + (dir / "spec.toml").string());
  CHECK(r.status == 2);
  CHECK(lines(r.err) == 1);
  CHECK_MESSAGE(r.err.find("s.csv data row 1 prints seq_len = 4096, the spec's "
                           "[tables.s.shared] says seq_len = 2048") != std::string::npos,
                r.err);
  std::ofstream(dir / "s.csv") << "label,N,S\nd,1.00e9,2048\nm,1.00e9,2048\n";
  CHECK(run("--spec " + (dir / "spec.toml").string()).status == 0);
  // A command-line claim's "D̂ went untested" line belongs to no table and compares nothing:
  // null table and tolerance in JSON (not "" and 0).
  std::ofstream(dir / "t.csv") << "label,N,C\nd,1.00e9,1e20\nm,1.00e9,1e20\n";
  const Result ok =
      run("--claims " + (dir / "t.csv").string() + " --equal N,C --baseline d --format json");
  CHECK_MESSAGE(ok.status == 0, (ok.out + ok.err));
  const auto j = nlohmann::json::parse(ok.out);
  bool seen = false;
  for (const auto& f : j["findings"])
    if (f["message"].get<std::string>().find("does not test equal unique data") !=
        std::string::npos) {
      seen = true;
      CHECK(f["table"].is_null());
      CHECK(f["tolerance"].is_null());
    }
  CHECK(seen);
}

TEST_CASE("spec and --claims mistakes name where they were made") {
  const fs::path dir = scratch() / "spec_mistakes";
  fs::create_directories(dir);
  std::ofstream(dir / "t.csv") << "label,N\na,1.00e9\nb,1.00e9\n";
  auto spec = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return run("--spec " + (dir / name).string());
  };
  // A table file that is not there: the entry that named it.
  const Result missing = spec("missing.toml",
                              "schema = 1\n[tables.x]\nfile = \"nosuch.csv\"\n[[claims]]\nequal = "
                              "[\"N\"]\n");
  CHECK(missing.status == 2);
  CHECK_MESSAGE(missing.err.find("[tables.x] file = \"nosuch.csv\": ") != std::string::npos,
                missing.err);
  // A key given twice: the TOML error keeps its line numbers, on one line.
  const Result twice = spec("twice.toml", "schema = 1\n[[claims]]\nname = \"a\"\nname = \"b\"\n");
  CHECK(twice.status == 2);
  CHECK(lines(twice.err) == 1);
  CHECK_MESSAGE(twice.err.find(" 4 | name = \"b\"") != std::string::npos, twice.err);
  // Two entries of one file; one file given twice to --claims.
  const Result shared = spec("shared.toml",
                             "schema = 1\n[tables.x]\nfile = \"t.csv\"\n[tables.y]\n"
                             "file = \"t.csv\"\n[[claims]]\nequal = [\"N\"]\n");
  CHECK_MESSAGE(
      shared.err.find("[tables.y] file = \"t.csv\" is [tables.x]'s file too") != std::string::npos,
      shared.err);
  const Result again = run("--claims " + (dir / "t.csv").string() + " --claims " +
                           (dir / "." / "t.csv").string() + " --equal N");
  CHECK(again.status == 2);
  CHECK_MESSAGE(again.err.find("t.csv is given twice; give each table once") != std::string::npos,
                again.err);
}

TEST_CASE("json output written atomically with -o; a failing claim exits 1") {
  const fs::path o = out_file("fail.json");
  const Result r = run("--spec " + fixture("claims_fail.toml") + " --format json -o " + o.string());
  CHECK(r.status == 1);
  REQUIRE(fs::exists(o));
  std::ifstream in(o);
  std::stringstream s;
  s << in.rdbuf();
  CHECK(s.str().find("\"schema\": 1") != std::string::npos);
  CHECK(s.str().find("\"breaking\"") != std::string::npos);
}

TEST_CASE("a defective table exits 1; --claims alone checks rows only") {
  CHECK(run("--spec " + fixture("tiny_defects_spec.toml")).status == 1);
  CHECK(run("--claims " + fixture("tiny_clean.csv")).status == 0);
  CHECK(run("--claims " + fixture("tiny_clean.csv") + " --format md").out.find("| verdict |") !=
        std::string::npos);
}

TEST_CASE("runs: matching records exit 0, defects exit 1") {
  CHECK(run(fixture("runs_ok")).status == 0);
  CHECK(run(fixture("runs_bad")).status == 1);
  // Markdown's rows column says what each claim covered (it was empty for a runs audit).
  const Result md = run(fixture("runs_ok") + " --format md");
  CHECK_MESSAGE(md.out.find("| holds | run dense: measured ledgers match the plan | dense |") !=
                    std::string::npos,
                md.out);
}

TEST_CASE("unusable input: one line on stderr, exit 2, no output file") {
  const char* cases[] = {
      "--claims {}ragged.csv",
      "--claims {}bad_number.csv",
      "--claims {}unknown_column.csv",
      "--spec {}spec_missing_table.toml",
      "--spec {}spec_missing_column.toml",
      "--spec {}spec_missing_shared.toml",
      "--claims {}no_such_file.csv",
      "{}no_such_runs",
  };
  for (const char* c : cases) {
    std::string args = c;
    args.replace(args.find("{}"), 2, fixture(""));
    const fs::path o = out_file("never.json");
    const Result r = run(args + " --format json -o " + o.string());
    CHECK_MESSAGE(r.status == 2, args);
    CHECK_MESSAGE(lines(r.err) == 1, r.err);
    CHECK(r.err.rfind("moeplan: error: ", 0) == 0);
    CHECK_MESSAGE(!fs::exists(o), args);
  }
  // The message names what is wrong.
  CHECK(run("--claims " + fixture("ragged.csv")).err.find("data row 2") != std::string::npos);
  CHECK(run("--claims " + fixture("bad_number.csv")).err.find("1.4x4e10") != std::string::npos);
  CHECK(run("--claims " + fixture("unknown_column.csv")).err.find("'Dx'") != std::string::npos);
}

TEST_CASE("a claim from the command line: --equal, --baseline by row label, --strict-reuse") {
  // labelled_claim.csv, by hand against dense-1b (N 1e9, C 1.2e20): moe-1b-a200m N +0.50 %, C
  // 0 %; moe-1b-a100m N 0.98e9 = -2.00 %, C 1.14e20 = -5.00 %: it breaks both at 1 %.
  const std::string table = " --claims " + fixture("labelled_claim.csv");
  const Result r = run(table + " --equal N,C --baseline dense-1b");
  CHECK(r.status == 1);
  CHECK(r.err.empty());
  CHECK(r.out.find("FAILS  every row equal in N, C (baseline dense-1b)") != std::string::npos);
  CHECK(r.out.find("C = 1.14e20 is -5.00% from the baseline labelled_claim:1's 1.2e20") !=
        std::string::npos);
  // Values as the table prints them: "0.98e9", not 9.8e8.
  CHECK(r.out.find("N = 0.98e9 is -2.00% from the baseline labelled_claim:1's 1.0e9") !=
        std::string::npos);
  CHECK(r.out.find("error    labelled_claim:3 moe-1b-a100m  compute") != std::string::npos);
  CHECK(r.out.find("error    labelled_claim:2") == std::string::npos);  // +0.50 % holds
  const Result j = run(table + " --equal N,C --baseline dense-1b --format json");
  CHECK(j.out.find("\"label\": \"moe-1b-a100m\"") != std::string::npos);
  CHECK(r.out.find("broken by labelled_claim:3\n") != std::string::npos);
  // At 6 % both hold; table:row names the same baseline.
  const Result loose = run(table +
                           " --equal total_params,compute --baseline labelled_claim:1 "
                           "--tolerance 0.06");
  CHECK(loose.status == 0);
  CHECK(loose.out.find("HOLDS  every row equal in total_params, compute (baseline "
                       "labelled_claim:1)") != std::string::npos);
  // Refusals: one line each, exit 2.
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" --equal foo", "--equal foo: not a quantity moeplan knows"},
           {" --equal N --baseline nope",
            "baseline 'nope' is no row's label (labels: dense-1b, moe-1b-a200m, moe-1b-a100m)"},
           {" --equal N --baseline labelled_claim:2-3",
            "--baseline = 'labelled_claim:2-3' must name one row"},
           {" --baseline dense-1b", "--baseline needs a claim"},
           {" --equal N --strict-reuse", "--strict-reuse needs --baseline"},
           {" --strict-reuse --baseline dense-1b",
            "needs tokens_unique (D_hat) of row "
            "labelled_claim:1"}}) {
    const Result e = run(table + args);
    CHECK_MESSAGE(e.status == 2, args);
    CHECK_MESSAGE(lines(e.err) == 1, e.err);
    CHECK_MESSAGE(e.err.find(needle) != std::string::npos, e.err);
  }
  const Result both = run(fixture("runs_ok") + " --equal N");
  CHECK(both.status == 2);
  CHECK(both.err.find("go with --claims tables") != std::string::npos);
  // Without D̂ claimed, the report says the third resource went untested (and why: this table
  // prints no D_hat or Epoch).
  CHECK(r.out.find("does not test equal unique data D̂, the third equal resource: no table "
                   "prints D̂") != std::string::npos);
}

TEST_CASE("a command-line claim over some rows: --where QUANTITY=VALUE|LOW:HIGH, --rows") {
  // labelled_claim.csv: C 1.2e20 (rows 1, 2) and 1.14e20 (row 3). Where C = 1.2e20, against
  // dense-1b: N +0.50 % (row 2) holds at 1 %; row 3 (N -2 %, C -5 %) is left out.
  const std::string table = " --claims " + fixture("labelled_claim.csv");
  const Result w = run(table + " --equal N --baseline dense-1b --where C=1.2e20");
  CHECK_MESSAGE(w.status == 0, (w.out + w.err));
  CHECK(w.out.find("HOLDS  every row where C=1.2e20 equal in N (baseline dense-1b)") !=
        std::string::npos);
  CHECK(w.out.find("where compute = 1.2e20 left out 1: labelled_claim:3") != std::string::npos);
  // A range: N_a from 1.5e8 to 1e9 keeps rows 1 and 2.
  const Result range = run(table + " --equal N --baseline dense-1b --where Na=1.5e8:1e9");
  CHECK_MESSAGE(range.status == 0, (range.out + range.err));
  // --rows: rows 1-2 hold, all three do not.
  CHECK(run(table + " --equal N,C --baseline dense-1b --rows labelled_claim:1-2").status == 0);
  const Result all = run(table + " --equal N,C --baseline dense-1b --rows labelled_claim");
  CHECK(all.status == 1);
  CHECK(all.out.find("FAILS  every row of labelled_claim equal in N, C") != std::string::npos);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" --equal N --where foo=1", "--where 'foo=1' is not QUANTITY=VALUE"},
           {" --equal N --where C", "--where 'C' is not QUANTITY=VALUE"},
           {" --equal N --where C=2:1", "--where 'C=2:1': the low bound is above the high one"},
           {" --where C=1.2e20", "--where needs a claim: --equal N,C"},
           // Where C = 1.2e20 would leave row 3 (C -5 %) out of "equal C" instead of failing it.
           {" --equal N,C --baseline dense-1b --where C=1.2e20",
            "selects its rows by C (where compute = 1.2e20) and tests C too"},
           {" --equal N --rows nosuch:1", "nosuch"}}) {
    const Result e = run(table + args);
    CHECK_MESSAGE(e.status == 2, args);
    CHECK_MESSAGE(lines(e.err) == 1, e.err);
    CHECK_MESSAGE(e.err.find(needle) != std::string::npos, e.err);
  }
}

TEST_CASE(
    "-o: the extension chooses the format; an unknown one or a contradicting --format is refused") {
  const std::string spec = "--spec " + fixture("tiny_spec.toml");
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const fs::path json = out_file("by_ext.json"), md = out_file("by_ext.md");
  CHECK(run(spec + " -o " + json.string()).status == 0);
  CHECK(slurp(json).rfind("{\n  \"claims\"", 0) == 0);
  CHECK(run(spec + " -o " + md.string()).status == 0);
  CHECK(slurp(md).rfind("# moeplan audit\n", 0) == 0);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" -o {}", "cannot tell the format from the extension '.html'; use .json, .md or .txt"},
           {" --format table -o {}", "cannot tell the format from the extension '.html'"}}) {
    const fs::path html = out_file("x.html");
    std::string a = args;
    a.replace(a.find("{}"), 2, html.string());
    const Result e = run(spec + a);
    CHECK_MESSAGE(e.status == 2, a);
    CHECK_MESSAGE(lines(e.err) == 1, e.err);
    CHECK_MESSAGE(e.err.find(needle) != std::string::npos, e.err);
    CHECK(!fs::exists(html));
  }
  const fs::path j2 = out_file("x.json");
  const Result e = run(spec + " --format md -o " + j2.string());
  CHECK(e.status == 2);
  CHECK(lines(e.err) == 1);
  CHECK(e.err.find("--format md contradicts -o " + j2.string() + ", which is written as json") !=
        std::string::npos);
  CHECK(!fs::exists(j2));
}

TEST_CASE("published tables: where on E or K over dense rows; a shape that gives no head_dim") {
  const std::string ref = std::string(MOEPLAN_REFERENCE_DIR);
  const std::string both = " --claims " + ref + "/paper_7b_moe_fixed_compute.csv --claims " + ref +
                           "/paper_dense_baselines.csv";
  // A dense row's E and K are 0 (no experts): `where K=1:6` keeps the MoE rows and leaves the
  // dense ones out. It stopped: "needs top_k (K) of row paper_dense_baselines:1, which has no
  // such column".
  const Result k = run(both + " --equal N --where K=1:6");
  CHECK_MESSAGE(k.status == 0, (k.out + k.err));
  CHECK(k.out.find("left out 9: paper_7b_moe_fixed_compute:6-8 paper_dense_baselines:1-6") !=
        std::string::npos);
  // E = 0 selects the dense rows (2.15B to 6.48B: not equal in N, so the claim fails, exit 1).
  const Result e0 = run(both + " --equal N --where E=0");
  CHECK_MESSAGE(e0.status == 1, (e0.out + e0.err));
  CHECK(e0.out.find("covers 6 of 6 paper_dense_baselines rows; where experts = 0 left out 8: "
                    "paper_7b_moe_fixed_compute:1-8") != std::string::npos);
  // An M off the claimed convention, which is itself the nearest: said as off by so much against
  // the tolerance (it read "matches no convention ... nearest is" the claimed one).
  const Result tight = run(" --spec " + std::string(MOEPLAN_SOURCE_DIR) +
                           "/examples/audit-paper/claims.toml" + " --tolerance 0.2%");
  CHECK(tight.out.find("M = 4.73e9 is +0.28% from the claimed paper (router in) training = "
                       "4.717e9, outside the tolerance of 0.20%; no other convention comes "
                       "nearer") != std::string::npos);
  // heads that do not divide d_model: head_dim cannot be d_model / heads, and the skip line says
  // which row and why (it said only "needs head_dim").
  std::ifstream in(ref + "/paper_dense_baselines.csv");
  std::stringstream text;
  text << in.rdbuf();
  std::string csv = text.str();
  const size_t at = csv.find(",28,17,2176,");
  REQUIRE(at != std::string::npos);
  csv.replace(at, 12, ",28,18,2176,");
  const fs::path planted = scratch() / "dense_h18.csv";
  std::ofstream(planted) << csv;
  const Result h = run(" --claims " + planted.string() + " --equal N");
  CHECK_MESSAGE(h.out.find("row dense_h18:1: d_model 2176 is not a multiple of heads 18") !=
                    std::string::npos,
                h.out);
}

TEST_CASE("--tolerance takes 0.06 or 6%; --equal refuses an empty item") {
  // labelled_claim.csv against dense-1b: the farthest row is -5.00 % (C): holds at 6 %, fails at
  // 1 % (see above). "6%" must read as 0.06, not fail or read as 6.
  const std::string table = " --claims " + fixture("labelled_claim.csv") + " --equal N,C";
  CHECK(run(table + " --baseline dense-1b --tolerance 6%").status == 0);
  CHECK(run(table + " --baseline dense-1b --tolerance 1%").status == 1);
  // Spaces around an item are not part of it: "N, C" is N and C.
  CHECK(run(" --claims " + fixture("labelled_claim.csv") +
            " --equal 'N, C' --baseline dense-1b --tolerance 6%")
            .status == 0);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" --tolerance abc",
            "--tolerance abc: not a tolerance; give a fraction in (0, 1) such as 0.01, or a "
            "percentage such as 1%"},
           {" --tolerance 2", "--tolerance 2 is out of range"},
           {" --equal N,", "--equal 'N,' has an empty item"},
           {" --equal ,C", "--equal ',C' has an empty item"},
           {" --equal ''", "--equal '' has an empty item"},
           {" --equal C", "--equal names compute twice (C); give each quantity once"}}) {
    const Result e = run(table + args);
    CHECK_MESSAGE(e.status == 2, args);
    CHECK_MESSAGE(lines(e.err) == 1, e.err);
    CHECK_MESSAGE(e.err.find(needle) != std::string::npos, e.err);
  }
}

TEST_CASE("--tolerance is every tolerance: a claim's own tolerance in the spec gives way") {
  // C 2.86e21 vs 2.8886e21: +1.000 %. The claim's own tolerance 2 % holds it; --tolerance 0.5%
  // must break it (it held, exit 0), and --tolerance 3% hold it.
  const fs::path t = out_file("tol.csv");
  std::ofstream(t) << "label,C\nbase,2.86e21\nup,2.8886e21\n";
  const fs::path s = out_file("tol.toml");
  std::ofstream(s) << "schema = 1\n[tables.tol]\nfile = \"tol.csv\"\ntolerance = 0.02\n"
                      "[[claims]]\nname = \"c\"\nbaseline = \"base\"\nequal = [\"C\"]\n"
                      "tolerance = 0.02\n";
  CHECK(run("--spec " + s.string()).status == 0);
  const Result strict = run("--spec " + s.string() + " --tolerance 0.5%");
  CHECK(strict.status == 1);
  CHECK(strict.out.find("tolerance 0.50% -> FAILS") != std::string::npos);
  CHECK(run("--spec " + s.string() + " --tolerance 3%").status == 0);
}

TEST_CASE("an empty --format is refused, not read as the terminal table") {
  const Result r = run("--spec " + std::string(MOEPLAN_SOURCE_DIR) +
                       "/examples/audit-paper/claims.toml --format ''");
  CHECK(r.status == 2);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("--format '' is not known; use table, json or md") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE(
    "equal against a zero: 0 .. 1024 is not equal, and a zero baseline breaks no claim itself") {
  // The relative range of 0 .. 1024 used to be taken as 0 % (no division by the zero), so "every
  // row equal in Dse" held over 0, 512 and 1024 with exit 0.
  const fs::path t = out_file("zeros.csv");
  std::ofstream(t) << "label,N,C,Dse\na,1e9,1e21,0\nb,1e9,1e21,512\nc,1e9,1e21,1024\n";
  const Result r = run("--claims " + t.string() + " --equal Dse");
  CHECK(r.status == 1);
  CHECK(r.out.find("FAILS  every row equal in Dse") != std::string::npos);
  // All zero is equal.
  const fs::path z = out_file("all_zero.csv");
  std::ofstream(z) << "label,N,Dse\na,1e9,0\nb,1e9,0\n";
  CHECK(run("--claims " + z.string() + " --equal Dse").status == 0);
  // Against a zero baseline (no shared expert): the other row breaks it, the baseline (0 % from
  // itself) does not.
  const fs::path b = out_file("zero_base.csv");
  std::ofstream(b) << "label,N,Dse\nbase,1e9,0\nx,1e9,512\n";
  const Result rb = run("--claims " + b.string() + " --equal Dse --baseline base");
  CAPTURE(rb.out);
  CHECK(rb.status == 1);
  CHECK(rb.out.find("broken by zero_base:2\n") != std::string::npos);
  CHECK(rb.out.find("nan") == std::string::npos);
  // N = 0 is no model: refused as input, naming the cell (it was a baseline 0 % from itself).
  const fs::path n0 = out_file("zero_n.csv");
  std::ofstream(n0) << "label,N,C\nbase,0,1e21\nx,1e9,1e21\n";
  const Result rn = run("--claims " + n0.string() + " --equal N --baseline base");
  CHECK(rn.status == 2);
  CHECK(lines(rn.err) == 1);
  CHECK_MESSAGE(rn.err.find("zero_n.csv data row 1 column N = 0: total_params (N) must be "
                            "greater than 0") != std::string::npos,
                rn.err);
}

TEST_CASE("a --baseline label two rows share is refused, in one table or across two") {
  // The search compared each row with the selector it had just overwritten by the first match,
  // so a second 'd' was never seen and the first was taken silently.
  const fs::path t = out_file("dup_label.csv");
  std::ofstream(t) << "label,N\nd,1e9\nd,2e9\nm,1e9\n";
  const Result r = run("--claims " + t.string() + " --equal N --baseline d");
  CHECK(r.status == 2);
  CHECK(r.err.find("baseline 'd' labels 2 rows") != std::string::npos);
  const fs::path a = out_file("lab_a.csv"), b = out_file("lab_b.csv");
  std::ofstream(a) << "model,N\ndense-1b,1e9\nm,1.005e9\n";
  std::ofstream(b) << "model,N\ndense-1b,1e9\nm,1.005e9\n";
  CHECK(run("--claims " + a.string() + " --claims " + b.string() + " --equal N --baseline dense-1b")
            .status == 2);
  // One match is the baseline.
  CHECK(run("--claims " + a.string() + " --equal N --baseline dense-1b").status == 0);
}

TEST_CASE("a record whose plan's shape no run could train is damage (exit 2), not inf findings") {
  for (const auto& [key, value, says] :
       {std::tuple{"heads", 0, "heads = 0 is invalid"},
        std::tuple{"top_k", 9, "top_k = 9 is invalid; it must be in [1, experts = 4]"}}) {
    const fs::path dir = scratch() / (std::string("bad_arch_") + key);
    fs::remove_all(dir);
    fs::copy(fixture("runs_ok"), dir, fs::copy_options::recursive);
    const fs::path rec = dir / "moe-k1" / "record.json";
    std::ifstream in(rec);
    nlohmann::json r = nlohmann::json::parse(in);
    in.close();
    r["plan"]["arch"][key] = value;
    std::ofstream(rec) << r.dump();
    const Result res = run(dir.string());
    CAPTURE(res.out);
    CHECK(res.status == 2);
    CHECK(res.err.find("'plan.arch' is not a shape a run trains") != std::string::npos);
    CHECK(res.err.find(says) != std::string::npos);
  }
}
