// End to end through the built moeplan (MOEPLAN_BINARY): exit statuses, one-line errors, and no
// output file left behind on error.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "audit_test_util.hpp"

using namespace moeplan::audit::test;
namespace fs = std::filesystem;

namespace {
struct Result {
  int status;
  std::string out, err;
};
Result run(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / "moeplan-audit-cli";
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
  const fs::path p = fs::temp_directory_path() / "moeplan-audit-cli" / name;
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
