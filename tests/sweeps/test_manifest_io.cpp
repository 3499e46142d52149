// Manifest I/O: TOML round trip, JSON keys, and errors for missing, mistyped and stale keys.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/grid.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "scratch.hpp"

using namespace moeplan;

namespace {

Manifest small_sweep(double n, const char* ra, Reuse reuse = Reuse::strict) {
  SweepRequest r;
  r.plan.n_target = n;
  r.plan.budget.reuse = reuse;
  if (reuse == Reuse::loose) r.plan.budget.epochs = 2;
  r.activation_rates = std::string_view(ra).find(':') != std::string_view::npos
                           ? parse_ra_spec(ra, 4)
                           : parse_ra_spec(ra);
  r.created_by = "test \"quoted\" line";
  r.train.seed = 7;
  r.train.positions = "rope";
  return plan_sweep(r);
}

void require_same_plan(const Plan& a, const Plan& b) {
  CHECK(a.id == b.id);
  CHECK(a.role == b.role);
  CHECK(a.arch == b.arch);
  CHECK(a.counts.total_params == b.counts.total_params);
  CHECK(a.counts.active_params == b.counts.active_params);
  CHECK(a.counts.router == b.counts.router);
  CHECK(a.convention == b.convention);
  CHECK(a.mask == b.mask);
  // Exact equality: doubles are written in shortest round-trip form.
  CHECK(a.flops_per_token == b.flops_per_token);
  CHECK(a.activation_rate_target == b.activation_rate_target);
  CHECK(a.reachable == b.reachable);
  CHECK(a.note == b.note);
  const Budget &x = a.budget, &y = b.budget;
  CHECK(x.compute_target == y.compute_target);
  CHECK(x.flops_per_token == y.flops_per_token);
  CHECK(x.seq_len == y.seq_len);
  CHECK(x.batch_seqs == y.batch_seqs);
  CHECK(x.steps == y.steps);
  CHECK(x.tokens_consumed == y.tokens_consumed);
  CHECK(x.tokens_unique == y.tokens_unique);
  CHECK(x.epochs == y.epochs);
  CHECK(x.compute == y.compute);
  CHECK(x.compute_rel_diff == y.compute_rel_diff);
  CHECK(x.tokens_per_param == y.tokens_per_param);
  CHECK(x.effective_data == y.effective_data);
  CHECK(x.reuse == y.reuse);
  const HyperParams &h = a.hyper, &g = b.hyper;
  CHECK(h.rule == g.rule);
  CHECK(h.lr_peak == g.lr_peak);
  CHECK(h.lr_min == g.lr_min);
  CHECK(h.batch_seqs == g.batch_seqs);
  CHECK(h.batch_tokens == g.batch_tokens);
  CHECK(h.warmup_steps == g.warmup_steps);
  CHECK(h.adam_beta1 == g.adam_beta1);
  CHECK(h.adam_beta2 == g.adam_beta2);
  CHECK(h.weight_decay == g.weight_decay);
  CHECK(h.grad_clip == g.grad_clip);
}

void require_same(const Manifest& a, const Manifest& b) {
  CHECK(a.schema == b.schema);
  CHECK(a.family == b.family);
  CHECK(a.created_by == b.created_by);
  CHECK(a.n_target == b.n_target);
  CHECK(a.n_tolerance == b.n_tolerance);
  CHECK(a.ra_tolerance == b.ra_tolerance);
  CHECK(a.compute_tolerance == b.compute_tolerance);
  CHECK(a.train == b.train);
  require_same_plan(a.dense, b.dense);
  REQUIRE(a.points.size() == b.points.size());
  for (size_t i = 0; i < a.points.size(); ++i) require_same_plan(a.points[i], b.points[i]);
}

// Replace the first occurrence of `from` (after `after`, if given) in the TOML text.
std::string edit(std::string text, const std::string& from, const std::string& to,
                 const std::string& after = "") {
  const size_t start = after.empty() ? 0 : text.find(after);
  REQUIRE(start != std::string::npos);
  const size_t at = text.find(from, start);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string error_of(const std::string& text) {
  try {
    manifest_from_toml_string(text, "sweep.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("manifest TOML round trip: 2B strict, 2e6 tiny, loose reuse") {
  for (const Manifest& m : {small_sweep(2e9, "0.05:0.4"), small_sweep(2e6, "0.1,0.25,0.5"),
                            small_sweep(3e5, "0.2:0.5", Reuse::loose)}) {
    const std::string text = manifest_to_toml(m);
    const Manifest back = manifest_from_toml_string(text, "mem.toml");
    require_same(m, back);
    // Writing it again gives the same bytes: nothing drifts through a cycle.
    CHECK(manifest_to_toml(back) == text);
  }
}

TEST_CASE("write_manifest_atomic then read_manifest") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  const auto dir = moeplan::test::fresh_dir("sweeps");
  const auto path = dir / "sweep.toml";
  write_manifest_atomic(m, path);
  require_same(m, read_manifest(path));
  // No temp file is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 1);
  // A missing folder and a folder as the target are said as such (they read "creating a temp
  // file in its folder failed" and "rename failed: Is a directory").
  const std::string missing =
      "nodir/s.toml': its folder '" + (dir / "nodir").string() + "' does not exist";
  CHECK_THROWS_WITH_AS(write_manifest_atomic(m, dir / "nodir" / "s.toml"),
                       doctest::Contains(missing.c_str()), InputError);
  std::filesystem::create_directory(dir / "d.toml");
  CHECK_THROWS_WITH_AS(write_manifest_atomic(m, dir / "d.toml"),
                       doctest::Contains("d.toml': it is a folder; give a file name"), InputError);
  files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == 1);  // no temp file left by either
  std::filesystem::remove_all(dir);
  CHECK_THROWS_AS(read_manifest(dir / "missing.toml"), InputError);
}

TEST_CASE("an atomic write keeps a file's permission bits and writes through a symlink") {
  namespace fs = std::filesystem;
  const fs::path dir = moeplan::test::fresh_dir("atomic");
  fs::create_directories(dir / "shared");
  const fs::path file = dir / "shared" / "sweep.toml";
  write_file_atomic(file, "a");
  CHECK(fs::status(file).permissions() == (fs::perms::owner_read | fs::perms::owner_write |
                                           fs::perms::group_read | fs::perms::others_read));
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);  // 0600
  write_file_atomic(file, "b");
  CHECK(fs::status(file).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
  // Two links deep, one relative: the target gets the content, both links stay links.
  fs::create_symlink("shared/sweep.toml", dir / "link1.toml");
  fs::create_symlink(dir / "link1.toml", dir / "link2.toml");
  write_file_atomic(dir / "link2.toml", "c");
  CHECK(fs::is_symlink(dir / "link1.toml"));
  CHECK(fs::is_symlink(dir / "link2.toml"));
  std::ifstream in(file);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "c");
  CHECK(fs::status(file).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir / "shared")) files += e.is_regular_file();
  CHECK(files == 1);  // no temp file left beside the target
  // A write that fails through a link (into a folder that does not exist) names both.
  fs::create_symlink(dir / "none" / "f.toml", dir / "dangling.toml");
  const std::string want = "dangling.toml' (a link to '" + (dir / "none" / "f.toml").string() +
                           "'): its folder '" + (dir / "none").string() + "' does not exist";
  CHECK_THROWS_WITH_AS(write_file_atomic(dir / "dangling.toml", "e"),
                       doctest::Contains(want.c_str()), InputError);
  // A loop of links is refused in one line, not replaced by a file.
  fs::create_symlink(dir / "loop-b", dir / "loop-a");
  fs::create_symlink(dir / "loop-a", dir / "loop-b");
  CHECK_THROWS_WITH_AS(write_file_atomic(dir / "loop-a", "d"),
                       doctest::Contains("following the symlink failed"), InputError);
  CHECK(fs::is_symlink(dir / "loop-a"));
  fs::remove_all(dir);
}

TEST_CASE("an atomic write to a pipe (-o /dev/stdout) writes the stream, through its /proc link") {
  // /proc/self/fd/N links to "pipe:[inode]", not to a path: there is no folder to put a temp file
  // in, so the bytes go straight to the pipe, in order.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::string link = fmt::format("/proc/self/fd/{}", fds[1]);
  const std::string_view parts[] = {"first ", "second\n"};
  write_file_atomic(link, std::span<const std::string_view>(parts));
  ::close(fds[1]);
  std::string got;
  char buf[64];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, size_t(n));
  ::close(fds[0]);
  CHECK(got == "first second\n");
}

TEST_CASE("JSON uses the ACCOUNTING.md code names") {
  const Manifest m = small_sweep(2e9, "0.1:0.3");
  const nlohmann::json j = manifest_to_json(m);
  CHECK(j.at("schema") == 1);
  REQUIRE(j.at("points").size() == 4);
  for (const char* key : {"total_params",
                          "active_params",
                          "activation_rate",
                          "flops_per_token",
                          "convention",
                          "compute",
                          "tokens_consumed",
                          "tokens_unique",
                          "epochs",
                          "tokens_per_param",
                          "effective_data",
                          "steps",
                          "batch_seqs",
                          "lr_peak",
                          "warmup_steps",
                          "arch",
                          "id",
                          "role",
                          "reachable",
                          "note"})
    CHECK_MESSAGE(j.at("dense").contains(key), key);
  for (const char* key : {"d_model", "layers", "dense_layers", "heads", "kv_heads", "head_dim",
                          "d_ffn", "experts", "top_k", "d_expert", "d_shared", "seq_len", "vocab",
                          "tied_embeddings", "count_router", "count_norms"})
    CHECK_MESSAGE(j.at("points")[0].at("arch").contains(key), key);
  const Plan& p = m.points[1];
  const nlohmann::json jp = plan_to_json(p);
  CHECK(jp.at("total_params").get<int64_t>() == p.counts.total_params);
  CHECK(jp.at("flops_per_token").get<double>() == p.flops_per_token);
  CHECK(jp.at("convention") == "paper");
  // JSON text parses back to the same doubles.
  const nlohmann::json again = nlohmann::json::parse(j.dump());
  CHECK(again.at("points")[1].at("lr_peak").get<double>() == p.hyper.lr_peak);
}

TEST_CASE("grid's json, csv and md outputs are not read as manifests: one line says so") {
  const auto dir = moeplan::test::scratch();
  for (const char* ext : {"json", "csv", "md"}) {
    const auto path = dir / (std::string("moeplan_not_a_manifest.") + ext);
    CHECK_THROWS_WITH_AS(read_manifest(path),
                         doctest::Contains(fmt::format("is grid's {} output, not a manifest: "
                                                       "manifests are TOML",
                                                       ext)
                                               .c_str()),
                         InputError);
  }
}

TEST_CASE("a point must share the dense baseline's vocab, seq_len, readings and convention") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  const std::string text = manifest_to_toml(m);
  REQUIRE(error_of(text).empty());
  const std::string vocab = "vocab = " + std::to_string(m.dense.arch.vocab) + "\n";
  std::string e = error_of(edit(text, vocab, "vocab = 512\n", "[points.arch]"));
  CHECK(e == "sweep.toml: key 'points[0].arch.vocab' = 512 differs from the dense baseline's " +
                 std::to_string(m.dense.arch.vocab) +
                 "; the points of a sweep share seq_len, vocab, tied embeddings, the counting "
                 "readings, the FLOP convention and the reuse rule (re-plan it with `moeplan "
                 "grid`)");
  // Tied embeddings on one point only: the points would be two model families (it was read).
  const std::string tied =
      std::string("tied_embeddings = ") + (m.dense.arch.tied_embeddings ? "true" : "false");
  const std::string other =
      std::string("tied_embeddings = ") + (m.dense.arch.tied_embeddings ? "false" : "true");
  e = error_of(edit(text, tied, other, "[points.arch]"));
  CHECK(e.find("key 'points[0].arch.tied_embeddings' = " +
               std::string(m.dense.arch.tied_embeddings ? "false" : "true") +
               " differs from the dense baseline's") != std::string::npos);
  // The paper convention does not read the mask, so only this check sees an edited one.
  e = error_of(edit(text, "mask = \"full\"", "mask = \"causal\"", "[[points]]"));
  CHECK(e.find("key 'points[0].mask' = \"causal\" differs from the dense baseline's \"full\"") !=
        std::string::npos);
  // The dense baseline edited alike is refused for every point, the first named.
  e = error_of(edit(text, vocab, "vocab = 300\n"));
  CHECK(e.find("key 'points[0].arch.vocab' = " + std::to_string(m.dense.arch.vocab) +
               " differs from the dense baseline's 300") != std::string::npos);
}

TEST_CASE("missing, mistyped, unknown and stale keys are refused with file and key named") {
  const std::string text = manifest_to_toml(small_sweep(2e6, "0.2:0.4"));
  REQUIRE(error_of(text).empty());

  std::string e = error_of(edit(text, "schema = 1\n", ""));
  CHECK(e.find("sweep.toml") != std::string::npos);
  CHECK(e.find("'schema'") != std::string::npos);
  CHECK(e.find("missing") != std::string::npos);

  e = error_of(edit(text, "schema = 1", "schema = 2"));
  CHECK(e.find("schema = 1") != std::string::npos);

  // d_model of the second point as a string.
  e = error_of(edit(text, "d_model = ", "d_model = \"x\" #", "[[points]]"));
  CHECK(e.find("points[0].arch.d_model") != std::string::npos);
  CHECK(e.find("integer") != std::string::npos);

  e = error_of(edit(text, "steps = ", "stepz = ", "[[points]]"));
  CHECK(e.find("points[0].steps") != std::string::npos);

  e = error_of(edit(text, "lr_min = ", "lr_mni = 0.1\nlr_min = ", "[dense]"));
  CHECK(e.find("dense.lr_mni") != std::string::npos);
  CHECK(e.find("not a known key") != std::string::npos);

  // An arch edited without re-planning: its stored total_params no longer match.
  e = error_of(edit(text, "experts = ", "experts = 1 + ", "[points.arch]"));
  CHECK(!e.empty());  // "1 + N" is not TOML at all
  {
    const Manifest m = small_sweep(2e6, "0.2:0.4");
    const std::string experts = "experts = " + std::to_string(m.points[0].arch.experts) + "\n";
    const std::string more = "experts = " + std::to_string(m.points[0].arch.experts + 1) + "\n";
    e = error_of(edit(text, experts, more, "[points.arch]"));
    CHECK(e.find("points[0].total_params") != std::string::npos);
    CHECK(e.find("disagrees with its arch") != std::string::npos);

    const std::string steps = "steps = " + std::to_string(m.points[1].budget.steps) + "\n";
    const std::string fewer = "steps = " + std::to_string(m.points[1].budget.steps - 1) + "\n";
    const size_t second = text.find("[[points]]", text.find("[[points]]") + 1);
    std::string edited = text;
    edited.replace(edited.find(steps, second), steps.size(), fewer);
    e = error_of(edited);
    CHECK(e.find("points[1].tokens_consumed") != std::string::npos);
  }
  e = error_of(edit(text, "flops_per_token = ", "flops_per_token = 1", "[dense]"));
  CHECK(e.find("dense.flops_per_token") != std::string::npos);

  e = error_of(edit(text, "top_k = ", "top_k = 100000 #", "[points.arch]"));
  CHECK(e.find("top_k") != std::string::npos);

  e = error_of("schema = 1\nfamily = [");
  CHECK(e.find("not valid TOML") != std::string::npos);
  CHECK(e.find('\n') == std::string::npos);  // one line

  // Past 64 bits: toml11 read 99999999999999999999 as 2^63 - 1 and the run used another seed
  // than the file says. The limits written as themselves are values.
  e = error_of(edit(text, "seed = ", "seed = 99999999999999999999 #", "[train]"));
  CHECK(e ==
        "sweep.toml: key 'train.seed' = 99999999999999999999 is past the 64-bit integers "
        "TOML holds (-9223372036854775808 to 9223372036854775807)");
  e = error_of(
      edit(text, "d_model = ", "d_model = -1_000_000_000_000_000_000_000 #", "[dense.arch]"));
  CHECK(e.find("key 'dense.arch.d_model' = -1_000_000_000_000_000_000_000 is past the 64-bit") !=
        std::string::npos);
  // Below a double's range toml11 read 0: seed = 1e-400 trained on seed 0 without a word. A
  // zero written as one is a value.
  e = error_of(edit(text, "seed = ", "seed = 1e-400 #", "[train]"));
  CHECK(e ==
        "sweep.toml: key 'train.seed' = 1e-400 is below the smallest number a double holds "
        "(2.2e-308); write 0 if 0 is meant");
  CHECK(error_of(edit(text, "seed = ", "seed = 0.0e-400 #", "[train]")).find("smallest number") ==
        std::string::npos);
  // A long mistyped string is cut between characters: "é" is two bytes, and 57 bytes of them
  // cut one in half (the message was not UTF-8).
  std::string accents = "x";  // after the quote: the 57th byte is the first of an "é"
  for (int i = 0; i < 40; ++i) accents += "\u00e9";
  e = error_of(edit(text, "steps = ", "steps = \"" + accents + "\" #", "[[points]]"));
  CHECK(e.find("must be an integer, found a string") != std::string::npos);
  CHECK(e.find("\u00e9... must be") != std::string::npos);
  CHECK(e.find(std::string(1, '\xc3') + "...") == std::string::npos);
  CHECK(error_of(edit(text, "seed = ", "seed = 9223372036854775807 #", "[train]"))
            .find("past the 64-bit") == std::string::npos);
  CHECK(error_of(edit(text, "seed = ", "seed = 0x7fffffffffffffff #", "[train]"))
            .find("past the 64-bit") == std::string::npos);
}

TEST_CASE("inf, NaN, out-of-range targets and wrapped products are refused, the key named") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  const std::string text = manifest_to_toml(m);
  REQUIRE(error_of(text).empty());
  // inf passed every relative comparison with the arch (|inf - x| <= 1e-9 * inf); a run of such
  // a manifest trained and wrote a record whose plan report and audit refuse as damaged.
  for (const char* key :
       {"flops_per_token = ", "activation_rate = ", "tokens_per_param = ", "effective_data = "}) {
    const std::string e = error_of(edit(text, key, std::string(key) + "inf #", "[[points]]"));
    CAPTURE(key);
    CHECK(e.find("points[0]." + std::string(key).substr(0, std::string(key).size() - 3) +
                 "' = inf must be") != std::string::npos);
  }
  std::string e = error_of(edit(text, "n_target = ", "n_target = inf #"));
  CHECK(e.find("'n_target' = inf must be") != std::string::npos);
  e = error_of(edit(text, "compute_rel_diff = ", "compute_rel_diff = nan #", "[[points]]"));
  CHECK(e.find("'points[0].compute_rel_diff' = nan must be") != std::string::npos);
  // A MoE point's r_a target is in (0, 1]; the dense baseline has none (0.0).
  for (const char* bad : {"-0.2", "7.0", "0.0"}) {
    e = error_of(edit(text, "activation_rate_target = ",
                      "activation_rate_target = " + std::string(bad) + " #", "[[points]]"));
    CAPTURE(bad);
    CHECK(e.find("points[0].activation_rate_target") != std::string::npos);
    CHECK(e.find("must be in (0, 1]") != std::string::npos);
  }
  e = error_of(
      edit(text, "activation_rate_target = 0.0", "activation_rate_target = 0.3", "[dense]"));
  CHECK(e.find("'dense.activation_rate_target' = 0.3 but a dense point has no r_a target") !=
        std::string::npos);
  // steps edited up by about 2^64 tokens' worth: steps·batch_seqs·seq_len is past 2^63 and is
  // refused as such (an int64 product wrapped, and where it wrapped back onto tokens_consumed,
  // as 2^44 more steps at 2^20 tokens a step do, the edit was accepted).
  {
    const std::string steps = "steps = " + std::to_string(m.points[0].budget.steps) + "\n";
    const int64_t per_step = m.points[0].budget.batch_seqs * m.points[0].arch.seq_len;
    const std::string more =
        "steps = " + std::to_string(m.points[0].budget.steps + (int64_t(1) << 62) / per_step * 4) +
        "\n";
    e = error_of(edit(text, steps, more, "[[points]]"));
    CHECK(e.find("'points[0].steps' = ") != std::string::npos);
    CHECK(e.find("is past 2^63 tokens") != std::string::npos);
  }
}

TEST_CASE("[train]: negative coefficients and step counts are refused with the key named") {
  const std::string text = manifest_to_toml(small_sweep(2e6, "0.2:0.4"));
  for (const char* key : {"load_balance", "z_loss", "erc_loss"}) {
    CAPTURE(key);
    const std::string e =
        error_of(edit(text, std::string(key) + " = ", std::string(key) + " = -0.5 #", "[train]"));
    CHECK(e.find(std::string("train.") + key) != std::string::npos);
    CHECK(e.find(">= 0") != std::string::npos);
  }
  CHECK(error_of(edit(text, "erc_alpha = ", "erc_alpha = 0.0 #", "[train]")).find("> 0") !=
        std::string::npos);
  CHECK(error_of(edit(text, "z_loss = ", "z_loss = nan #", "[train]")).find("train.z_loss") !=
        std::string::npos);
  for (const char* key : {"eval_every", "eval_tokens", "checkpoint_every"}) {
    CAPTURE(key);
    const std::string e =
        error_of(edit(text, std::string(key) + " = ", std::string(key) + " = -3 #", "[train]"));
    CHECK(e.find(std::string("train.") + key + "' = -3 is invalid") != std::string::npos);
    // Past 9e15, as grid --train refuses: an eval_tokens near 2^63 wrapped to one window.
    const std::string big = error_of(edit(
        text, std::string(key) + " = ", std::string(key) + " = 9223372036854775777 #", "[train]"));
    CHECK(big.find("must be within 0..9e15") != std::string::npos);
  }
}

TEST_CASE("apply_train_settings: KEY=VALUE from the command line, checked like the file") {
  TrainSettings t;
  apply_train_settings(
      t, {"source=text:my book.txt", "erc_loss=1e-2", "eval_tokens=4k", "renormalize_gates=true",
          "positions=rope", "capacity_factor=1.25", "seed=9"});
  CHECK(t.source == "text:my book.txt");
  CHECK(t.erc_loss == 0.01);
  CHECK(t.eval_tokens == 4000);
  CHECK(t.renormalize_gates);
  CHECK(t.positions == "rope");
  CHECK(t.capacity_factor == 1.25);
  CHECK(t.seed == 9);
  CHECK(t.load_balance == TrainSettings{}.load_balance);  // untouched settings keep theirs
  auto error = [](std::vector<std::string> a) {
    TrainSettings s;
    try {
      apply_train_settings(s, a);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error({"lr=0.1"}).find("'lr' is not a training setting; known: source") !=
        std::string::npos);
  CHECK(error({"erc_loss"}).find("write KEY=VALUE") != std::string::npos);
  // A key given twice: refused, as a repeated flag is (the later one won in silence).
  CHECK(error({"seed=7", "seed=9"}) ==
        "--train seed is given twice ('seed=7' and 'seed=9'); give it once");
  CHECK(error({"seed=1.5"}).find("whole number") != std::string::npos);
  // A negative seed is echoed, as every other refused setting is.
  CHECK(error({"seed=-1"}) ==
        "--train: key 'train.seed' = -1 is invalid; it must be a whole number >= 0");
  CHECK(error({"data_seed=-7"}).find("'train.data_seed' = -7 is invalid") != std::string::npos);
  CHECK(error({"renormalize_gates=1"}).find("true or false") != std::string::npos);
  CHECK(error({"positions=xpos"}).find("train.positions") != std::string::npos);
  // Every refused value is echoed (capacity_factor's said only "must be >= 0").
  CHECK(error({"capacity_factor=-1"}) ==
        "--train: key 'train.capacity_factor' = -1.0 is invalid; it must be a finite number >= 0 "
        "(0 = dropless)");
  CHECK(error({"source=text:a\"b"}).empty());  // quoted for TOML, not broken by it
}

namespace {

// Re-derives every stored budget figure from steps, D̂ and C_target, as a careful hand edit would:
// the plan stays consistent in itself, so only the cross-point contract can refuse it.
void reshape(Plan& p, int64_t steps, int64_t tokens_unique, double compute_target) {
  Budget& b = p.budget;
  b.steps = steps;
  b.tokens_consumed = steps * b.batch_seqs * p.arch.seq_len;
  b.tokens_unique = tokens_unique;
  b.compute_target = compute_target;
  const double d = double(b.tokens_consumed);
  b.compute = p.flops_per_token * d;
  b.compute_rel_diff = (b.compute - compute_target) / compute_target;
  b.epochs = d / double(tokens_unique);
  b.tokens_per_param = d / double(p.counts.total_params);
  b.effective_data = effective_data(double(tokens_unique), b.epochs);
  p.hyper.warmup_steps = std::min(p.hyper.warmup_steps, steps);
}

std::string contract_error(const Manifest& m) { return error_of(manifest_to_toml(m)); }

}  // namespace

TEST_CASE("the equal-resource contract across points: a consistent edit off the sweep is refused") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  REQUIRE(contract_error(m).empty());
  const Budget& db = m.dense.budget;
  const std::string hint = "(a manifest of points that are not one sweep says equal_resources";

  // N: a point planned for a sweep 32 % smaller, spliced in (consistent in itself).
  Manifest e = m;
  e.points[0] = small_sweep(1.36e6, "0.2:0.4").points[0];
  std::string err = contract_error(e);
  CHECK(err.find("key 'points[0].total_params'") != std::string::npos);
  CHECK(err.find("not at equal N") != std::string::npos);
  CHECK(err.find(hint) != std::string::npos);
  CHECK(err.find('\n') == std::string::npos);

  // D̂: one point's unique tokens halved (to whole windows), everything else re-derived.
  e = m;
  {
    Plan& p = e.points[1];
    const int64_t s = p.arch.seq_len;
    const int64_t half = p.budget.tokens_unique / 2 / s * s;
    reshape(p, p.budget.steps, half, p.budget.compute_target);
  }
  err = contract_error(e);
  CHECK(err.find("key 'points[1].tokens_unique' = " +
                 std::to_string(e.points[1].budget.tokens_unique)) != std::string::npos);
  CHECK(err.find("dense baseline's D̂ = " + std::to_string(db.tokens_unique)) !=
        std::string::npos);

  // C: one point given 1.5x the baseline's C_target, steps re-derived to meet it.
  e = m;
  {
    Plan& p = e.points[0];
    const double c = 1.5 * db.compute_target;
    const int64_t steps =
        std::llround(c / (p.flops_per_token * double(p.budget.batch_seqs * p.arch.seq_len)));
    reshape(p, steps, std::min(db.tokens_unique, steps * p.budget.batch_seqs * p.arch.seq_len),
            c);
  }
  err = contract_error(e);
  CHECK(err.find("key 'points[0].compute_target'") != std::string::npos);
  CHECK(err.find("share one C") != std::string::npos);

  // Steps: 10 % more than C_target allows (more than half a step off); the nearest is named.
  e = m;
  {
    Plan& p = e.points[0];
    const int64_t steps = p.budget.steps + std::max<int64_t>(2, p.budget.steps / 10);
    reshape(p, steps, p.budget.tokens_unique, p.budget.compute_target);
  }
  err = contract_error(e);
  CHECK(err.find("key 'points[0].steps' = " + std::to_string(e.points[0].budget.steps)) !=
        std::string::npos);
  CHECK(err.find("nearest whole number of steps is " + std::to_string(m.points[0].budget.steps)) !=
        std::string::npos);
  // One step more or less is still within half a step only when a step is that small; the planner
  // rounds to the nearest, so the planned count itself always passes (checked above).

  // reachable: flipped on a point whose r_a is on target.
  e = m;
  REQUIRE(e.points[0].reachable);
  e.points[0].reachable = false;
  err = contract_error(e);
  CHECK(err.find("key 'points[0].reachable' = false") != std::string::npos);
  CHECK(err.find("within ra_tolerance") != std::string::npos);

  // The dense baseline itself off n_target.
  e = m;
  e.n_target = 1.5 * double(m.dense.counts.total_params);
  err = contract_error(e);
  CHECK(err.find("key 'dense.total_params'") != std::string::npos);
  CHECK(err.find("outside n_tolerance") != std::string::npos);
}

TEST_CASE("the contract under loose reuse: one number of epochs for every point") {
  const Manifest m = small_sweep(3e5, "0.2:0.5", Reuse::loose);
  REQUIRE(contract_error(m).empty());
  REQUIRE(m.dense.budget.epochs > 1.5);
  Manifest e = m;
  Plan& p = e.points[0];
  reshape(p, p.budget.steps, p.budget.tokens_consumed, p.budget.compute_target);  // one epoch
  const std::string err = contract_error(e);
  CHECK(err.find("repeats its data") != std::string::npos);
  CHECK(err.find("the same number of epochs") != std::string::npos);
  CHECK(err.find("tokens_unique") != std::string::npos);
}

TEST_CASE("equal_resources = false: an unequal manifest is read, written and round-trips") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  // The key is written only when false: a planned sweep's bytes do not change.
  CHECK(manifest_to_toml(m).find("equal_resources") == std::string::npos);
  Manifest e = m;
  e.points[0] = small_sweep(1.36e6, "0.2:0.4").points[0];
  REQUIRE(!contract_error(e).empty());
  e.equal_resources = false;
  const std::string text = manifest_to_toml(e);
  CHECK(text.find("equal_resources = false") != std::string::npos);
  CHECK(error_of(text).empty());
  const Manifest back = manifest_from_toml_string(text, "mem.toml");
  CHECK(!back.equal_resources);
  require_same(e, back);
  CHECK(manifest_to_toml(back) == text);
  // Each plan is still checked in itself.
  e.points[0].budget.tokens_consumed += 1;
  CHECK(error_of(manifest_to_toml(e)).find("points[0].tokens_consumed") != std::string::npos);
  // Mistyped, it is refused with the key named.
  CHECK(error_of(edit(text, "equal_resources = false", "equal_resources = \"no\""))
            .find("equal_resources") != std::string::npos);
}

TEST_CASE("hyper-parameters, family, tolerances, ids and the data source: out of range is refused") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  auto expect = [&](Manifest e, const std::string& needle) {
    const std::string err = contract_error(e);
    CAPTURE(needle);
    CAPTURE(err);
    CHECK(err.find(needle) != std::string::npos);
    CHECK(err.find('\n') == std::string::npos);
  };
  Manifest e = m;
  e.dense.hyper.lr_peak = 50;
  expect(e, "key 'dense.lr_peak' = 50.0 is invalid; it must be in (0, 1]");
  e = m;
  e.points[1].hyper.lr_min = 2 * e.points[1].hyper.lr_peak;
  expect(e, "key 'points[1].lr_min'");
  e = m;
  e.points[0].hyper.adam_beta1 = 1.5;
  expect(e, "key 'points[0].adam_beta1' = 1.5 is invalid; it must be in [0, 1)");
  e = m;
  e.points[0].hyper.adam_beta2 = 1;
  expect(e, "key 'points[0].adam_beta2' = 1.0 is invalid");
  e = m;
  e.dense.hyper.weight_decay = -1;
  expect(e, "key 'dense.weight_decay' = -1.0 is invalid");
  e = m;
  e.dense.hyper.grad_clip = -1;
  expect(e, "key 'dense.grad_clip' = -1.0 is invalid");
  e = m;
  e.family = "llama";
  expect(e, "'family'");
  CHECK(contract_error(e).find("llama") != std::string::npos);
  e = m;
  e.n_tolerance = 0.9;
  expect(e, "'n_tolerance' = 0.9");
  e = m;
  e.points[0].id = "a/b";
  expect(e, "key 'points[0].id' = \"a/b\" cannot name a run folder");
  e = m;
  e.points[0].id = "..";
  expect(e, "key 'points[0].id' = \"..\" cannot name a run folder");
  e = m;
  e.train.source = "foo";
  expect(e, "key 'train.source' = \"foo\" is not a data source");
  e.train.source = "text:";
  expect(e, "key 'train.source' = \"text:\" is not a data source");
  // The valid forms still read.
  for (const char* s : {"builtin", "text:a b.txt", "bytes:/x", "shards:data/*.bin"}) {
    e = m;
    e.train.source = s;
    CHECK_MESSAGE(contract_error(e).empty(), s);
  }
}

TEST_CASE("a hand-edited manifest: a second dense point, a long id, messages that name the value") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  const std::string text = manifest_to_toml(m);
  REQUIRE(error_of(text).empty());
  // The dense baseline copied into [[points]] under another id: show and run accepted it, trained
  // it, and report and audit then refused the folder for its two dense baselines.
  Manifest two = m;
  Plan copy = m.dense;
  copy.id = "dense2";
  two.points.push_back(copy);
  std::string e = contract_error(two);
  CAPTURE(e);
  CHECK(e.find(fmt::format("key 'points[{}].role' = \"dense\": a sweep has one dense baseline, "
                           "in [dense]",
                           m.points.size())) != std::string::npos);
  // An id too long to be a folder name is refused on read, not by run when its turn comes.
  Manifest longer = m;
  longer.points[0].id = std::string(256, 'x');
  CHECK(contract_error(longer).find("key 'points[0].id'") != std::string::npos);
  longer.points[0].id = std::string(255, 'x');
  CHECK(contract_error(longer).empty());
  // compute_rel_diff names its value and the one its numbers give.
  e = error_of(edit(text, "compute_rel_diff = ", "compute_rel_diff = 0.5 #", "[[points]]"));
  CHECK(e.find("'points[0].compute_rel_diff' = 0.5 must equal (compute − compute_target) / "
               "compute_target = ") != std::string::npos);
  // A mistyped value is shown with its type.
  e = error_of(edit(text, "steps = ", "steps = 272.5 #", "[[points]]"));
  CHECK(e.find("key 'points[0].steps' = 272.5 must be an integer, found a float") !=
        std::string::npos);
  e = error_of(edit(text, "steps = ", "steps = \"272\" #", "[[points]]"));
  CHECK(e.find("key 'points[0].steps' = \"272\" must be an integer, found a string") !=
        std::string::npos);
  e = error_of(edit(text, "n_target = ", "n_target = -5 #"));
  CHECK(e.find("key 'n_target' = -5.0 must be > 0") != std::string::npos);
  // An arch the shape rules refuse: the table named once, as a key path.
  e = error_of(edit(text, "d_model = ", "d_model = -16 #", "[[points]]"));
  CHECK(e.find("sweep.toml: points[0].arch: d_model = -16") != std::string::npos);
  // An integer past 64 bits in an array of tables names its index.
  e = error_of(edit(text, "steps = ", "steps = 99999999999999999999 #", "[[points]]"));
  CHECK(e.find("key 'points[0].steps' = 99999999999999999999 is past") != std::string::npos);
  // A reachable flag that disagrees with its r_a is a wrong flag, not a sweep of unequal points.
  Manifest flag = m;
  flag.points[0].reachable = !flag.points[0].reachable;
  e = contract_error(flag);
  CHECK(e.find("'points[0].reachable'") != std::string::npos);
  CHECK(e.find("equal_resources = false") == std::string::npos);
}

TEST_CASE("plan_differ: the note is not the plan; a long value is cut to one short line") {
  const Manifest m = small_sweep(2e6, "0.2:0.4");
  const nlohmann::json plan = plan_to_json(m.points[0]);
  nlohmann::json edited = plan;
  edited["note"] = "edited by hand";
  CHECK(plan_differ(edited, plan).empty());  // an edited note resumes and skips as before
  edited["lr_peak"] = 0.5;
  CHECK(plan_differ(edited, plan).find("plan.lr_peak = 0.5 (the manifest: ") == 0);
  edited = plan;
  edited["rule"] = std::string(200, 'r') + "\u00e9";
  const std::string d = plan_differ(edited, plan);
  CHECK(d.find("plan.rule = \"rrr") == 0);
  CHECK(d.find("...") != std::string::npos);
  CHECK(d.size() < 200);
}

TEST_CASE("positions = rope needs an even head_dim at every point: refused by grid and on read") {
  // Head width 5 at N 3e4 (the points' shape search keeps the width asked for).
  SweepRequest r;
  r.plan.n_target = 3e4;
  r.plan.backbone.head_dim = 5;
  r.plan.budget.value = 2;  // dense tokens per parameter
  r.activation_rates = parse_ra_spec("0.3");
  r.train.positions = "rope";
  try {
    plan_sweep(r);
    FAIL("an odd head_dim was planned under rope");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) ==
          "grid: point 'dense' has head_dim = 5, but train.positions = \"rope\" needs an even "
          "head_dim: use positions = \"alibi\", or plan with an even --head-dim");
  }
  // The same sweep under ALiBi plans; its manifest edited to rope is refused on read, naming the
  // file and the point (run found it only when the point's model was built).
  r.train.positions = "alibi";
  const Manifest m = plan_sweep(r);
  std::string text = manifest_to_toml(m);
  const size_t at = text.find("positions = \"alibi\"");
  REQUIRE(at != std::string::npos);
  text.replace(at, std::string("positions = \"alibi\"").size(), "positions = \"rope\"");
  CHECK_THROWS_WITH_AS(manifest_from_toml_string(text, "odd.toml"),
                       doctest::Contains("odd.toml: point 'dense' has head_dim = 5, but "
                                         "train.positions = \"rope\""),
                       InputError);
}

TEST_CASE("a byte source needs vocab >= 256 at every point: refused by grid and on read") {
  // grid --vocab 2 planned a sweep that run then refused ("byte tokens need vocab >= 256").
  SweepRequest r;
  r.plan.n_target = 3e4;
  r.plan.backbone.vocab = 2;
  r.plan.budget.value = 2;
  r.activation_rates = parse_ra_spec("0.3");
  CHECK_THROWS_WITH_AS(plan_sweep(r),
                       doctest::Contains("point 'dense' has vocab = 2, but train.source = "
                                         "\"builtin\" reads bytes, tokens 0 to 255"),
                       InputError);
  // Shards of a tokenizer's ids may have any vocabulary.
  r.train.source = "shards:data/*.bin";
  CHECK_NOTHROW(plan_sweep(r));
}
