// `moeplan run` end to end through the built executable (MOEPLAN_BINARY): complete runs, a real
// SIGKILL and resume, and every refusal (one line, non-zero exit, nothing earlier lost).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/checkpoint.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/model.hpp"
#include "moeplan/backend/record.hpp"
#include "moeplan/backend/run.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "scratch.hpp"
#include "strings.hpp"

namespace fs = std::filesystem;
using namespace moeplan;
using namespace moeplan::backend;
using nlohmann::json;

namespace {

using moeplan::test::fresh_dir;

Arch tiny_arch(bool dense, int64_t head_dim = 8) {
  Arch a;
  a.d_model = 16;
  a.layers = 2;
  a.dense_layers = dense ? 2 : 1;
  a.heads = a.kv_heads = 2;
  a.head_dim = head_dim;
  a.d_ffn = 32;
  if (!dense) {
    a.experts = 4;
    a.top_k = 2;
    a.d_expert = 8;
    a.d_shared = 8;
  }
  a.seq_len = 16;
  a.vocab = 256;
  return a;
}

// A plan made the way the planner makes one, with C chosen so that D = steps·B·S exactly.
Plan plan_for(const std::string& id, const Arch& arch, int64_t steps, int64_t batch,
              int64_t windows, double lr = 3e-3, Convention convention = Convention::paper) {
  Plan p;
  p.id = id;
  const bool dense = arch.is_dense();
  p.role = dense ? "dense" : "moe";
  p.arch = arch;
  p.counts = count_params(p.arch);
  p.activation_rate_target = dense ? 0 : p.counts.activation_rate();
  p.convention = convention;
  p.flops_per_token = flops_per_token(p.arch, convention).total;
  BudgetRequest r;
  r.compute = p.flops_per_token * double(steps * batch * p.arch.seq_len);
  r.flops_per_token = p.flops_per_token;
  r.total_params = p.counts.total_params;
  r.seq_len = p.arch.seq_len;
  r.batch_seqs = batch;
  r.tokens_unique = double(windows * p.arch.seq_len);
  p.budget = make_budget(r);
  p.hyper.lr_peak = lr;
  p.hyper.batch_seqs = batch;
  p.hyper.batch_tokens = batch * p.arch.seq_len;
  p.hyper.warmup_steps = std::min<int64_t>(10, steps);
  return p;
}
// The emulated CLI's devices are MOEPLAN_EMU_DEVICES's, and it reads CUDA_VISIBLE_DEVICES as
// CUDA does (`run --points-at-once` gives each worker its own): a CUDA_VISIBLE_DEVICES the
// machine running the tests set for its real GPUs (often "0") would hide the emulated ones.
const bool g_visible_cleared = ::unsetenv("CUDA_VISIBLE_DEVICES") == 0;

Plan tiny_plan(const std::string& id, bool dense, int64_t steps, int64_t batch, int64_t windows,
               double lr = 3e-3, int64_t head_dim = 8) {
  return plan_for(id, tiny_arch(dense, head_dim), steps, batch, windows, lr);
}

Manifest tiny_manifest(Plan dense, std::vector<Plan> points) {
  Manifest m;
  m.created_by = "test_backend_run";
  m.n_target = double(dense.counts.total_params);
  m.equal_resources = false;  // each test picks its points' steps and shapes
  m.dense = std::move(dense);
  m.points = std::move(points);
  m.train.eval_tokens = 256;
  m.train.eval_every = 25;
  return m;
}

struct Result {
  int status = -1;  // exit code, or 128+signal
  std::string out, err;
};

pid_t spawn(const std::vector<std::string>& args, const fs::path& out_file,
            const fs::path& err_file, const std::string& binary = MOEPLAN_BINARY,
            bool ignore_hangup = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (ignore_hangup) ::signal(SIGHUP, SIG_IGN);  // as nohup starts it
    const int o = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> argv;
    std::string bin = binary;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits (up to a minute) until `p` exists: a spawned run has written its first checkpoint.
void wait_for_file(const fs::path& p) {
  for (int i = 0; i < 300000 && !fs::exists(p); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

int wait_status(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Result run_cli(const std::vector<std::string>& args, const std::string& binary = MOEPLAN_BINARY) {
  const fs::path o = moeplan::test::scratch() / "cli_stdout";
  const fs::path e = moeplan::test::scratch() / "cli_stderr";
  Result r;
  r.status = wait_status(spawn(args, o, e, binary));
  r.out = read_file(o);
  r.err = read_file(e);
  return r;
}

json record(const fs::path& out, const std::string& id) {
  return json::parse(read_file(out / id / "record.json"));
}

bool one_line(const std::string& s) {
  return !s.empty() && s.back() == '\n' && s.find('\n') == s.size() - 1;
}

// `moeplan run --estimate N --profile`'s table for the point `label` prints: the sum its heading
// gives, each phase's milliseconds by name, and the rows' milliseconds and shares added up.
struct PhaseTable {
  double heading_sum = -1, ms_total = 0, share_total = 0;
  std::map<std::string, double> ms;
  // The rows add up to the heading's sum and to 100 %, within what printing each figure rounded
  // (0.0005 ms, 0.05 %) can take.
  bool adds_up() const {
    const double rows = double(ms.size());
    return std::abs(ms_total - heading_sum) <= 0.0005 * (rows + 1) + 1e-9 &&
           std::abs(share_total - 100) <= 0.05 * rows + 1e-9;
  }
};
PhaseTable phase_table(const std::string& out, const std::string& label, int64_t steps) {
  PhaseTable t;
  const std::string head = fmt::format("{} time of a step by phase (mean of {} more step{}: sum ",
                                       label, steps, steps == 1 ? "" : "s");
  const size_t at = out.find(head);
  if (at == std::string::npos) return t;
  t.heading_sum = std::stod(out.substr(at + head.size()));
  std::istringstream rows(out.substr(out.find('\n', at) + 1));
  for (std::string line; std::getline(rows, line) && line.starts_with("    ");) {
    // "    <phase>  <ms> ms  <share> %"
    const size_t pct = line.rfind(" %"), unit = line.rfind(" ms ");
    if (pct == std::string::npos || unit == std::string::npos) return PhaseTable{};
    const size_t ms_at = line.find_last_of(' ', unit - 1) + 1;
    const std::string name = line.substr(4, line.find_last_not_of(' ', ms_at - 1) - 3);
    t.ms[name] = std::stod(line.substr(ms_at, unit - ms_at));
    t.ms_total += t.ms[name];
    t.share_total += std::stod(line.substr(unit + 4, pct - unit - 4));
  }
  return t;
}

}  // namespace

TEST_CASE("moeplan run: ledgers equal the plan and an independent count; reruns skip") {
  const fs::path dir = fresh_dir("complete");
  // dense: 30 steps x 4 seqs = 120 windows over W = 50: 2.4 epochs. moe: 45 x 4 = 180 windows.
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 30, 4, 50), {tiny_plan("moe-a", false, 45, 4, 50)}),
      dir / "sweep.toml");
  const fs::path out = dir / "runs";
  const Result r = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  for (auto [id, steps] : {std::pair<std::string, int64_t>{"dense", 30}, {"moe-a", 45}}) {
    const json rec = record(out, id);
    CHECK(rec["schema"] == 1);
    CHECK(rec["status"] == "complete");
    CHECK(rec["device"] == "cpu");
    CHECK(rec["kernels"] == "eigen-fp32");
    const json& t = rec["measured"]["tokens"];
    // Independent count: steps · 4 seqs · 16 positions, D̂ = 50 windows · 16 = 800.
    CHECK(t["consumed"].get<int64_t>() == steps * 4 * 16);
    CHECK(t["loss_bearing"].get<int64_t>() == steps * 4 * 16);
    CHECK(t["unique"].get<int64_t>() == 800);
    CHECK(t["windows"].get<int64_t>() == steps * 4);
    CHECK(t["epoch_index"].get<int64_t>() == steps * 4 / 50);
    CHECK(t["epoch_cursor"].get<int64_t>() == steps * 4 % 50);
    CHECK(t["dropped"].get<int64_t>() == 0);
    CHECK(t["epochs"].get<double>() == doctest::Approx(double(steps * 4) / 50.0));
    for (auto& [k, v] : rec["measured"]["matches_plan"].items()) CHECK_MESSAGE(v == true, k);
    CHECK(rec["measured"]["compute"]["within_rounding"] == true);
    CHECK(rec["measured"]["total_params"] == rec["plan"]["total_params"]);
    CHECK(rec["measured"]["active_params"] == rec["plan"]["active_params"]);
    CHECK(rec["loss_curve"].size() == size_t(steps));
    CHECK(rec["val_curve"].back()["step"] == steps);
    CHECK(rec["final_val_bpc"].get<double>() > 0);
    CHECK(rec["val_curve"].back()["parts"].contains("facts"));
    CHECK(rec["val_curve"].back()["parts"].contains("arith"));
    // The training seconds at each evaluation: one an entry, never falling, and the last, taken
    // after the last step, the record's training time to the bit (no step trains after it).
    REQUIRE(rec.contains("val_curve_train_seconds"));
    const json& at = rec.at("val_curve_train_seconds");
    REQUIRE(at.size() == rec["val_curve"].size());
    CHECK(at.front().get<double>() > 0);
    for (size_t i = 1; i < at.size(); ++i) CHECK(at[i].get<double>() >= at[i - 1].get<double>());
    CHECK(at.back().get<double>() == rec["train_seconds"].get<double>());
    // The exact ledger equals the analytic exact count for the consumed tokens (dense: no routing
    // to vary; per-token exact M times D).
    if (id == "dense") {
      const double m_exact = flops_per_token(tiny_arch(true), Convention::exact).total;
      CHECK(rec["measured"]["flops"]["total"].get<double>() ==
            doctest::Approx(m_exact * double(steps * 64)).epsilon(1e-9));
      // The record's C in each convention, by hand for tiny_arch(true) (D_m 16, L 2, q and kv
      // width 16, d_ffn 32, V 256, S 16), per consumed token:
      //   N_a = 2 layers · (attention 4·16·16 + SwiGLU 3·16·32) = 2 · (1024 + 1536) = 5120;
      //   paper = 6·N_a + 12·L·D_m·S = 30720 + 6144 = 36864;
      //   megatron = attention projections 2·6·(2·16·16 + 2·16·16) = 12288, core L·6·S·16 =
      //     3072, SwiGLU L·18·16·32 = 18432, LM head 6·16·256 = 24576: 58368;
      //   exact/full − exact/causal = the core at S keys a query less at (S+1)/2:
      //     L · 12 · 16 · (16 − 8.5) = 2880.
      const double d = double(steps * 64);
      const json& conv = rec["measured"]["flops"]["conventions"];
      CHECK(conv["paper"].get<double>() == doctest::Approx(36864.0 * d).epsilon(1e-12));
      CHECK(conv["megatron"].get<double>() == doctest::Approx(58368.0 * d).epsilon(1e-12));
      CHECK(conv["exact/full"].get<double>() - conv["exact/causal"].get<double>() ==
            doctest::Approx(2880.0 * d).epsilon(1e-12));
      CHECK(rec["measured"]["flops"]["per_token"]["paper"].get<double>() ==
            doctest::Approx(36864.0).epsilon(1e-12));
      CHECK(rec["measured"]["compute"]["paper"].get<double>() ==
            doctest::Approx(36864.0 * d).epsilon(1e-12));
      CHECK(rec["measured"]["compute"]["plan_paper"].get<double>() ==
            doctest::Approx(36864.0 * d).epsilon(1e-12));
    }
  }
  const std::string before = read_file(out / "dense" / "record.json");
  const Result again = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(again.status == 0);
  CHECK(again.out.find("already complete") != std::string::npos);
  CHECK(again.out.find("does not hold") == std::string::npos);
  CHECK(read_file(out / "dense" / "record.json") == before);

  // A complete record is read as the audit reads it before it is skipped. One that holds to its
  // plan in every count but one: skipped, and a warning on stderr names the count and how to
  // train it again, keeping the checkpoint's work (the record is left as it is).
  const std::string moe_before = read_file(out / "moe-a" / "record.json");
  json inflated = json::parse(moe_before);
  json& f = inflated["measured"]["flops"];
  f["by_category"]["lm-head"]["forward"] =
      f["by_category"]["lm-head"]["forward"].get<int64_t>() + 1;
  f["total"] = f["total"].get<int64_t>() + 1;
  write_file_atomic(out / "moe-a" / "record.json", inflated.dump());
  const Result noted = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(noted.status == 0);
  CHECK(noted.out.find("already complete (") != std::string::npos);
  CHECK_MESSAGE(noted.err.find("is complete but does not hold to its plan: exact/causal "
                               "lm-head FLOPs: measured ") != std::string::npos,
                noted.err);
  CHECK_MESSAGE(noted.err.find("to train the point again, remove only record.json to resume "
                               "from") != std::string::npos,
                noted.err);
  CHECK(one_line(noted.err));

  // A final BPC that is not its last evaluation's (a hand edit a report would rank the point
  // by): refused as damaged, before anything trains, keeping the checkpoint's work.
  json edited_bpc = json::parse(moe_before);
  edited_bpc["final_val_bpc"] = 0.5;
  write_file_atomic(out / "moe-a" / "record.json", edited_bpc.dump());
  const Result bpc = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(bpc.status == 2);
  CHECK(one_line(bpc.err));
  CHECK_MESSAGE(bpc.err.find("'final_val_bpc' is missing or not the last evaluation's val_bpc") !=
                    std::string::npos,
                bpc.err);
  CHECK_MESSAGE(bpc.err.find("remove only record.json to resume from") != std::string::npos,
                bpc.err);

  // A damaged one is refused before any point trains: the dense point, moved away, is not
  // trained again, and the message names the file and the key.
  json damaged = json::parse(moe_before);
  damaged["measured"]["flops"]["validation"]["by_category"]["router"]["forward"] = -3;
  write_file_atomic(out / "moe-a" / "record.json", damaged.dump());
  fs::remove_all(out / "dense");
  const Result refused = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(refused.status == 2);
  CHECK(one_line(refused.err));
  CHECK_MESSAGE(refused.err.find("moe-a/record.json: 'measured.flops.validation.by_category.router."
                                 "forward' is missing or not a FLOP count") != std::string::npos,
                refused.err);
  CHECK(!fs::exists(out / "dense"));
  // A record.json that is a dangling link is not "no record": refused before anything trains.
  fs::remove(out / "moe-a" / "record.json");
  fs::create_symlink(dir / "nowhere" / "record.json", out / "moe-a" / "record.json");
  const Result dangling = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(dangling.status == 2);
  CHECK(one_line(dangling.err));
  CHECK_MESSAGE(dangling.err.find("moe-a/record.json' is not a file") != std::string::npos,
                dangling.err);
  CHECK(!fs::exists(out / "dense"));
  fs::remove(out / "moe-a" / "record.json");
  damaged = json::parse(moe_before);
  damaged["status"] = 1;
  write_file_atomic(out / "moe-a" / "record.json", damaged.dump());
  const Result bad_status = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(bad_status.status == 2);
  CHECK(one_line(bad_status.err));
  CHECK_MESSAGE(bad_status.err.find("moe-a/record.json': 'status' is 1 (valid: \"running\", "
                                    "\"complete\"); remove only record.json to resume from '") !=
                    std::string::npos,
                bad_status.err);
  // The point is complete, so its checkpoint holds its final step: the remedy names that step,
  // read from the record as it was before it was damaged.
  const std::string final_step =
      "(step " + std::to_string(json::parse(moe_before)["measured"]["steps"].get<long>()) + ")";
  CHECK_MESSAGE(bad_status.err.find("checkpoint/state.ckpt' " + final_step) != std::string::npos,
                bad_status.err);
}

// The final evaluation, again from the checkpoint's weights: the held-out windows' next-token
// losses through the engine, averaged here in position order, and per part by the part of each
// target position. An exact/causal plan: its record still states C [paper] by hand.
TEST_CASE("the record's validation loss, BPC and parts from the checkpoint's weights; C [paper]") {
  const fs::path dir = fresh_dir("val_again");
  const Plan dense = plan_for("dense", tiny_arch(true), 12, 4, 50, 3e-3, Convention::exact);
  Manifest m = tiny_manifest(
      dense, {plan_for("moe-a", tiny_arch(false), 12, 4, 50, 3e-3, Convention::exact)});
  m.train.eval_tokens = 160;  // 10 windows of 16
  write_manifest_atomic(m, dir / "sweep.toml");
  const Result r = run_cli(
      {"run", (dir / "sweep.toml").string(), "--out", (dir / "runs").string(), "--point", "dense"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const json rec = record(dir / "runs", "dense");
  // C [paper] of an exact-convention plan, by hand (the test above): 36864 a consumed token.
  const double d = 12.0 * 4 * 16;
  CHECK(rec["measured"]["compute"]["plan_paper"].get<double>() ==
        doctest::Approx(36864.0 * d).epsilon(1e-12));
  CHECK(rec["measured"]["compute"]["paper"].get<double>() ==
        doctest::Approx(36864.0 * d).epsilon(1e-12));
  // The learning rate of each step, by hand: warm-up over 10 steps to 3e-3 (step k of 1..10 at
  // 3e-3·k/10), then cosine down to lr_min 1e-5 over the other 2: step 11 at progress 0 (3e-3),
  // step 12 at progress 1/2 (1e-5 + (3e-3 − 1e-5)/2 = 1.505e-3).
  const json& lc = rec["loss_curve"];
  REQUIRE(lc.size() == 12);
  for (int k = 1; k <= 12; ++k) {
    INFO("step " << k);
    const double want = k <= 10 ? 3e-3 * k / 10.0 : k == 11 ? 3e-3 : 1.505e-3;
    CHECK(lc[size_t(k - 1)]["step"] == k);
    CHECK(lc[size_t(k - 1)]["lr"].get<double>() == doctest::Approx(want).epsilon(1e-12));
  }

  const Checkpoint ck = read_checkpoint(dir / "runs" / "dense" / "checkpoint" / "state.ckpt");
  REQUIRE(ck.state.step == 12);
  EngineRequest req;
  req.arch = dense.arch;
  req.options.positions = m.train.positions;
  req.seed = m.train.seed;
  req.batch_seqs = dense.budget.batch_seqs;
  req.point_id = dense.id;
  auto engine = make_engine("cpu", req);
  engine->load_state(ck.model_state);
  const int64_t S = dense.arch.seq_len, windows = 10, n = windows * S;
  const DataSplit data = load_source(m.train.source, dense.budget.tokens_unique + 1, n + 1,
                                     m.train.data_seed, dense.arch.vocab);
  REQUIRE(data.validation.size() == n + 1);
  std::vector<int32_t> in(static_cast<size_t>(n)), tg(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    in[size_t(i)] = data.validation.tokens[size_t(i)];
    tg[size_t(i)] = data.validation.tokens[size_t(i + 1)];  // the next token
  }
  std::vector<double> loss(static_cast<size_t>(n));
  engine->forward_loss(in.data(), tg.data(), windows, loss.data());
  double total = 0;
  std::map<int, std::pair<double, int64_t>> parts;
  for (int64_t i = 0; i < n; ++i) {
    total += loss[size_t(i)];
    auto& [sum, count] = parts[data.validation.part[size_t(i + 1)]];
    sum += loss[size_t(i)];
    ++count;
  }
  const json& last = rec["val_curve"].back();
  CHECK(last["step"] == 12);
  const double mean = total / double(n);
  CHECK(last["val_loss"].get<double>() == doctest::Approx(mean).epsilon(1e-12));
  CHECK(last["val_bpc"].get<double>() == doctest::Approx(mean / std::log(2.0)).epsilon(1e-12));
  CHECK(rec["final_val_bpc"].get<double>() == doctest::Approx(mean / std::log(2.0)).epsilon(1e-12));
  REQUIRE(parts.size() == data.part_names.size());
  for (const auto& [k, sc] : parts) {
    INFO(data.part_names[size_t(k)]);
    CHECK(last["parts"][data.part_names[size_t(k)]].get<double>() ==
          doctest::Approx(sc.first / double(sc.second) / std::log(2.0)).epsilon(1e-12));
  }
}

TEST_CASE(
    "SIGKILL mid-epoch, then resume: weights, curves and ledgers equal an uninterrupted run") {
  const fs::path dir = fresh_dir("kill");
  // 250 steps x 4 seqs over W = 50 windows: 20 epochs; checkpoints every 7 steps (mid-epoch).
  Manifest m =
      tiny_manifest(tiny_plan("dense", true, 10, 4, 50), {tiny_plan("moe-k", false, 250, 4, 50)});
  write_manifest_atomic(m, dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();

  const Result whole = run_cli(
      {"run", sweep, "--point", "moe-k", "--out", (dir / "a").string(), "--checkpoint-every", "7"});
  REQUIRE_MESSAGE(whole.status == 0, whole.err);

  const fs::path b = dir / "b";
  const pid_t pid =
      spawn({"run", sweep, "--point", "moe-k", "--out", b.string(), "--checkpoint-every", "7"},
            dir / "b.out", dir / "b.err");
  json at_kill;
  for (int i = 0; i < 200000; ++i) {
    std::error_code ec;
    if (fs::exists(b / "moe-k" / "record.json", ec)) {
      try {
        at_kill = record(b, "moe-k");
      } catch (...) {
      }
      if (!at_kill.is_null() && at_kill["measured"]["steps"].get<int64_t>() >= 14) break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  CHECK(wait_status(pid) == 128 + SIGKILL);
  REQUIRE(!at_kill.is_null());
  const json killed = record(b, "moe-k");
  REQUIRE_MESSAGE(killed["status"] == "running", "the run finished before the kill");
  MESSAGE("killed with the record at step ", killed["measured"]["steps"], ", epoch cursor ",
          killed["measured"]["tokens"]["epoch_cursor"]);

  // Two copies of the killed folder, damaged by hand: c's record truncated (its checkpoint is
  // good), d's checkpoint removed (its record says "running" at some step).
  const fs::path c = dir / "c", d = dir / "d";
  fs::copy(b, c, fs::copy_options::recursive);
  fs::copy(b, d, fs::copy_options::recursive);
  // The run writes its checkpoint, then its record: a kill between the two leaves the record one
  // checkpoint behind. Each copy below keeps one of the two, so each is told the step it keeps.
  const int64_t record_step = killed["measured"]["steps"].get<int64_t>();
  const int64_t killed_step = read_checkpoint_head(b / "moe-k" / "checkpoint" / "state.ckpt").step;
  CHECK_MESSAGE((record_step == killed_step || record_step + 7 == killed_step), "record at step ",
                record_step, ", checkpoint at step ", killed_step);
  const std::string rec_text = read_file(c / "moe-k" / "record.json");
  write_file_atomic(c / "moe-k" / "record.json", rec_text.substr(0, rec_text.size() / 2));
  fs::remove(d / "moe-k" / "checkpoint" / "state.ckpt");

  const Result resumed =
      run_cli({"run", sweep, "--point", "moe-k", "--out", b.string(), "--checkpoint-every", "7"});
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(resumed.out.find("resumed at step") != std::string::npos);

  // A damaged record beside a good checkpoint: the advice keeps the checkpoint's work, and
  // following it resumes to the uninterrupted run's record.
  const Result torn =
      run_cli({"run", sweep, "--point", "moe-k", "--out", c.string(), "--checkpoint-every", "7"});
  CHECK(torn.status == 2);
  CHECK(one_line(torn.err));
  CHECK_MESSAGE(torn.err.find(fmt::format("is unreadable")) != std::string::npos, torn.err);
  CHECK_MESSAGE(torn.err.find(fmt::format("remove only record.json to resume from '{}' (step {})",
                                          (c / "moe-k" / "checkpoint" / "state.ckpt").string(),
                                          killed_step)) != std::string::npos,
                torn.err);
  fs::remove(c / "moe-k" / "record.json");
  const Result c_resumed =
      run_cli({"run", sweep, "--point", "moe-k", "--out", c.string(), "--checkpoint-every", "7"});
  REQUIRE_MESSAGE(c_resumed.status == 0, c_resumed.err);
  CHECK(c_resumed.out.find(fmt::format("resumed at step {}", killed_step)) != std::string::npos);
  // Said before the point trains too, not only in its last line.
  CHECK_MESSAGE(c_resumed.out.find(fmt::format("[moe-k 1/1] resuming at step {} of ",
                                               killed_step)) < c_resumed.out.find("complete"),
                c_resumed.out);
  // A running record without its checkpoint: said before training, then trained from step 0.
  const Result d_restarted =
      run_cli({"run", sweep, "--point", "moe-k", "--out", d.string(), "--checkpoint-every", "7"});
  REQUIRE_MESSAGE(d_restarted.status == 0, d_restarted.err);
  CHECK_MESSAGE(
      d_restarted.out.find(fmt::format(
          "record.json' is at step {} of 250 but '{}' is missing: the point trains "
          "again from step 0",
          record_step, (d / "moe-k" / "checkpoint" / "state.ckpt").string())) != std::string::npos,
      d_restarted.out);
  CHECK(d_restarted.out.find("resumed at step") == std::string::npos);
  for (const fs::path& other : {c, d}) {
    const json ro = record(other, "moe-k"), ra = record(dir / "a", "moe-k");
    CHECK(ra["loss_curve"] == ro["loss_curve"]);
    CHECK(ra["val_curve"] == ro["val_curve"]);
    CHECK(ra["measured"]["tokens"] == ro["measured"]["tokens"]);
    CHECK(ra["measured"]["flops"] == ro["measured"]["flops"]);
  }
  CHECK(record(d, "moe-k")["resumes"].get<int>() == 0);

  const json ra = record(dir / "a", "moe-k"), rb = record(b, "moe-k");
  CHECK(rb["resumes"].get<int>() >= 1);
  // The evaluations' training seconds carry over the resume: the resumed record times every
  // evaluation, the ones before the stop too, on one clock summed over its sessions.
  for (const json* r : {&ra, &rb}) {
    REQUIRE(r->contains("val_curve_train_seconds"));
    const json& at = r->at("val_curve_train_seconds");
    REQUIRE(at.size() == (*r)["val_curve"].size());
    for (size_t i = 1; i < at.size(); ++i) CHECK(at[i].get<double>() >= at[i - 1].get<double>());
    CHECK(at.back().get<double>() == (*r)["train_seconds"].get<double>());
  }
  CHECK(ra["loss_curve"] == rb["loss_curve"]);
  CHECK(ra["val_curve"] == rb["val_curve"]);
  CHECK(ra["measured"]["tokens"] == rb["measured"]["tokens"]);
  CHECK(ra["measured"]["flops"] == rb["measured"]["flops"]);
  const Checkpoint ca = read_checkpoint(dir / "a" / "moe-k" / "checkpoint" / "state.ckpt");
  const Checkpoint cb = read_checkpoint(b / "moe-k" / "checkpoint" / "state.ckpt");
  CHECK(ca.model_state.size() > 1000);
  CHECK(ca.model_state == cb.model_state);  // weights, Adam state, RNG: byte for byte
  CHECK(ca.state.tokens == cb.state.tokens);
  CHECK(ca.state.order == cb.state.order);
  CHECK(ca.state.train_flops == cb.state.train_flops);
}

TEST_CASE("refusals: one line, non-zero exit, earlier records and checkpoints intact") {
  const fs::path dir = fresh_dir("errors");
  const fs::path out = dir / "runs";
  Manifest good =
      tiny_manifest(tiny_plan("dense", true, 12, 4, 20), {tiny_plan("moe-a", false, 12, 4, 20)});
  write_manifest_atomic(good, dir / "good.toml");
  REQUIRE(run_cli({"run", (dir / "good.toml").string(), "--point", "dense", "--out", out.string()})
              .status == 0);
  const std::string rec_before = read_file(out / "dense" / "record.json");
  const std::string ckpt_before = read_file(out / "dense" / "checkpoint" / "state.ckpt");
  auto intact = [&] {
    CHECK(read_file(out / "dense" / "record.json") == rec_before);
    CHECK(read_file(out / "dense" / "checkpoint" / "state.ckpt") == ckpt_before);
  };
  auto refused = [&](const Manifest& m, const std::string& name, const std::string& needle,
                     std::vector<std::string> extra = {}) {
    write_manifest_atomic(m, dir / (name + ".toml"));
    std::vector<std::string> args{
        "run", (dir / (name + ".toml")).string(), "--point", "moe-a", "--out", out.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = run_cli(args);
    CHECK_MESSAGE(r.status != 0, name);
    CHECK_MESSAGE(one_line(r.err), name, ": ", r.err);
    CHECK_MESSAGE(r.err.find(needle) != std::string::npos, name, ": ", r.err);
    intact();
    return r;
  };

  // A token outside the vocabulary where only a later point reads (moe-b's D̂ is twice the
  // dense baseline's): refused before the dense point trains, not after it.
  {
    const Plan dense = tiny_plan("dense", true, 12, 4, 20);
    const int64_t seq = dense.arch.seq_len;
    std::vector<uint16_t> longer(size_t(40 * seq + 1 + 256 + 1 + 64), 66);
    longer[size_t(30 * seq)] = 300;
    write_shard(dir / "late-bad.bin", longer);
    Manifest late = tiny_manifest(dense, {tiny_plan("moe-b", false, 12, 4, 40)});
    late.train.source = "shards:" + (dir / "late-bad.bin").string();
    write_manifest_atomic(late, dir / "late.toml");
    const Result r =
        run_cli({"run", (dir / "late.toml").string(), "--out", (dir / "late-runs").string()});
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find(fmt::format("token 300 at position {} is outside the model's "
                                         "vocabulary",
                                         30 * seq)) != std::string::npos,
                  r.err);
    CHECK_FALSE(fs::exists(dir / "late-runs" / "dense"));
  }
  // A point folder that is a link to itself: the loop is named, not the folder's permissions.
  {
    const fs::path loop = dir / "loop-runs";
    fs::create_directories(loop);
    fs::create_directory_symlink("dense", loop / "dense");
    const Result r = run_cli({"run", (dir / "good.toml").string(), "--out", loop.string()});
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find("a link in its path leads back to itself") != std::string::npos,
                  r.err);
    CHECK_MESSAGE(r.err.find("permissions") == std::string::npos, r.err);
  }
  // Corrupt shards: bad magic, truncated.
  std::vector<uint16_t> toks(2000, 65);
  write_shard(dir / "ok.bin", toks);
  std::string bytes = read_file(dir / "ok.bin");
  std::string bad = bytes;
  bad[1] = 0x7f;
  write_file_atomic(dir / "magic.bin", bad);
  write_file_atomic(dir / "trunc.bin", bytes.substr(0, bytes.size() - 3));
  Manifest m = good;
  m.train.source = "shards:" + (dir / "magic.bin").string();
  CHECK(refused(m, "magic", "bad magic").status == 2);
  m.train.source = "shards:" + (dir / "trunc.bin").string();
  CHECK(refused(m, "trunc", "truncated").status == 2);
  // Source too small: 200 bytes < D̂ + 1 + validation.
  write_file_atomic(dir / "small.txt", std::string(200, 'x'));
  m.train.source = "text:" + (dir / "small.txt").string();
  CHECK(refused(m, "small", "has 200 tokens").status == 2);
  // Unwritable output folder (a path under a regular file; the tests may run as root).
  {
    const Result r =
        run_cli({"run", (dir / "good.toml").string(), "--out", (dir / "ok.bin" / "runs").string()});
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK(r.err.find("cannot write to") != std::string::npos);
    CHECK_MESSAGE(r.err.find("ok.bin' is a file, not a folder") != std::string::npos, r.err);
    intact();
  }
  // What is in a point's way is found before the first point trains, not at its own turn: a
  // file where its folder goes, a folder where its lock file goes; a link to nothing as --out.
  {
    const fs::path in_way = dir / "in-way";
    fs::create_directories(in_way / "dense" / ".lock");
    const Result lock = run_cli({"run", (dir / "good.toml").string(), "--out", in_way.string()});
    CHECK(lock.status == 2);
    CHECK(one_line(lock.err));
    CHECK_MESSAGE(lock.err.find("dense/.lock' is a folder") != std::string::npos, lock.err);
    fs::remove_all(in_way);
    fs::create_directories(in_way);
    write_file_atomic(in_way / "moe-a", "a user's file");
    const Result file = run_cli({"run", (dir / "good.toml").string(), "--out", in_way.string()});
    CHECK(file.status == 2);
    CHECK_MESSAGE(
        file.err.find("in-way/moe-a' is in the way of point 'moe-a'") != std::string::npos,
        file.err);
    CHECK_FALSE(fs::exists(in_way / "dense"));  // nothing trained first
    CHECK(read_file(in_way / "moe-a") == "a user's file");
    fs::remove(in_way / "moe-a");
    fs::create_directories(in_way / "moe-a" / "checkpoint" / "state.ckpt");
    const Result ckpt = run_cli({"run", (dir / "good.toml").string(), "--out", in_way.string()});
    CHECK(ckpt.status == 2);
    CHECK_MESSAGE(ckpt.err.find("state.ckpt' of point 'moe-a' is not a file (a folder); move it "
                                "away to train the point from step 0") != std::string::npos,
                  ckpt.err);
    // A complete point is skipped before it touches checkpoint/ or .lock: what is there is not
    // in its way (a checkpoint folder linked to an archive that is not mounted).
    fs::remove_all(in_way);
    fs::create_directories(in_way);
    fs::copy(out / "dense", in_way / "dense", fs::copy_options::recursive);
    fs::remove_all(in_way / "dense" / "checkpoint");
    fs::create_symlink(dir / "unmounted-archive", in_way / "dense" / "checkpoint");
    const Result done = run_cli(
        {"run", (dir / "good.toml").string(), "--point", "dense", "--out", in_way.string()});
    CHECK_MESSAGE(done.status == 0, done.err);
    CHECK(done.out.find("already complete") != std::string::npos);
    fs::create_symlink(dir / "no-such-folder", dir / "dangling");
    const Result link =
        run_cli({"run", (dir / "good.toml").string(), "--out", (dir / "dangling").string()});
    CHECK(link.status == 2);
    CHECK_MESSAGE(link.err.find("which does not exist") != std::string::npos, link.err);
    intact();
  }
  // A manifest edited to an inconsistent state: tokens_consumed no longer steps·B·S.
  {
    std::string text = read_file(dir / "good.toml");
    const std::string key = "tokens_consumed = " + std::to_string(12 * 4 * 16);
    const auto at = text.rfind(key);
    REQUIRE(at != std::string::npos);
    text.replace(at, key.size(), "tokens_consumed = 999");
    write_file_atomic(dir / "edited.toml", text);
    const Result r = run_cli({"run", (dir / "edited.toml").string(), "--out", out.string()});
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK(r.err.find("999") != std::string::npos);
    intact();
  }
  // --device cuda here: a CPU-only build has no CUDA backend; a CUDA build finds no GPU on this
  // machine. Both must refuse before touching the earlier record.
  {
    const Result r = refused(good, "cuda", "--device cuda: ", {"--device", "cuda"});
    CHECK((r.err.find("no CUDA backend") != std::string::npos ||
           r.err.find("no CUDA device is visible") != std::string::npos));
    // Before any point starts: no plan line printed (a CUDA build printed moe-a's, then failed
    // inside the point after making its folder).
    CHECK_MESSAGE(r.out.empty(), r.out);
  }
  // --kernels chooses among the cuda device's kernels: the cpu device refuses it.
  CHECK(refused(good, "kernels", "--kernels 'experts=tiled' applies to --device cuda",
                {"--kernels", "experts=tiled"})
            .status == 2);
  {  // before any point's line, and on a complete point too (it trains nothing to say it)
    const Result done = run_cli({"run", (dir / "good.toml").string(), "--point", "dense", "--out",
                                 out.string(), "--kernels", "attention=cublas"});
    CHECK(done.status == 2);
    CHECK(done.out.empty());
    CHECK_MESSAGE(done.err.find("the cpu device has one set of kernels") != std::string::npos,
                  done.err);
  }
  // More threads than the machine has: a typo that trained hundreds of times slower.
  if (const unsigned hw = std::thread::hardware_concurrency(); hw > 0) {  // 0: unknown, allowed
    const std::string many = std::to_string(hw + 1);
    CHECK(refused(good, "threads", "--threads " + many + " is more than this machine's",
                  {"--threads", many})
              .status == 2);
  }
  // WORLD_SIZE on the cpu device: each "rank" trained whole points alone and the job split the
  // sweep between them in silence. --nproc on cpu: refused before --out is made.
  {
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("RANK", "0", 1);
    const Result ws = run_cli({"run", (dir / "good.toml").string(), "--out", out.string()});
    ::unsetenv("WORLD_SIZE");
    ::unsetenv("RANK");
    CHECK(ws.status == 2);
    CHECK_MESSAGE(ws.err.find("WORLD_SIZE=2 is set: data-parallel ranks need --device cuda") !=
                      std::string::npos,
                  ws.err);
    const fs::path fresh = dir / "nproc-out";
    const Result np =
        run_cli({"run", (dir / "good.toml").string(), "--out", fresh.string(), "--nproc", "2"});
    CHECK(np.status == 2);
    CHECK_MESSAGE(np.err.find("it needs --device cuda") != std::string::npos, np.err);
    CHECK_FALSE(fs::exists(fresh));
    // --nproc with WORLD_SIZE already set: refused before --out is made too (it was made first).
    ::setenv("WORLD_SIZE", "2", 1);
    const Result both = run_cli({"run", (dir / "good.toml").string(), "--out", fresh.string(),
                                 "--device", "cuda", "--nproc", "2"},
                                MOEPLAN_EMULATED_BINARY);
    ::unsetenv("WORLD_SIZE");
    CHECK(both.status == 2);
    CHECK_MESSAGE(both.err.find("--nproc 2 with WORLD_SIZE=2 already set") != std::string::npos,
                  both.err);
    CHECK_FALSE(fs::exists(fresh));
    // A --kernels the engine refuses: one line before anything is made or started (each rank
    // said it after the launch, three lines in all, and one process left .lock and checkpoint/).
    ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
    for (const char* nproc : {"1", "2"}) {
      const Result k =
          run_cli({"run", (dir / "good.toml").string(), "--out", fresh.string(), "--device", "cuda",
                   "--kernels", "attention=bogus", "--nproc", nproc},
                  MOEPLAN_EMULATED_BINARY);
      CAPTURE(nproc);
      CHECK(k.status == 2);
      CHECK_MESSAGE(one_line(k.err), k.err);
      CHECK_MESSAGE(k.err.find("attention=bogus is not known") != std::string::npos, k.err);
      CHECK_FALSE(fs::exists(fresh));
    }
    ::unsetenv("MOEPLAN_EMU_DEVICES");
  }
  // An absurd learning rate is refused when the manifest is read, before anything trains.
  {
    Manifest absurd = good;
    absurd.points[0] = tiny_plan("moe-a", false, 12, 4, 20, 1e30);
    CHECK(refused(absurd, "absurd-lr", "lr_peak").status == 2);
  }
  // NaN: an absurd weight decay (the manifest bounds it only below) blows the weights up within
  // a few steps; the point's own earlier checkpoint stays readable.
  {
    Manifest nan = good;
    nan.points[0] = tiny_plan("moe-a", false, 12, 4, 20, 1.0);
    nan.points[0].hyper.weight_decay = 1e30;
    const Result r = refused(nan, "nan", "moe-a", {"--checkpoint-every", "1"});
    CHECK(r.status == 4);
    CHECK(r.err.find("at step") != std::string::npos);
    CHECK_MESSAGE(r.err.find("objective not finite") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("(lower lr_peak in the manifest?)") != std::string::npos, r.err);
    if (fs::exists(out / "moe-a" / "checkpoint" / "state.ckpt")) {
      const Checkpoint c = read_checkpoint(out / "moe-a" / "checkpoint" / "state.ckpt");
      CHECK(record(out, "moe-a")["measured"]["steps"] == c.state.step);
      CHECK(record(out, "moe-a")["status"] == "running");
    }
  }
  // An auxiliary coefficient past reason (1e300 is a valid double): the cross-entropy is finite,
  // the gradient is not; the message gives each term and names the large coefficient's key.
  {
    Manifest z = good;
    z.train.z_loss = 1e300;
    write_manifest_atomic(z, dir / "z-huge.toml");
    const Result r = run_cli({"run", (dir / "z-huge.toml").string(), "--point", "moe-a", "--out",
                              (dir / "z-huge-out").string()});
    CHECK(r.status == 4);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find(", z_loss term ") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("(lower lr_peak in the manifest, or the [train] coefficient z_loss = "
                             "1e+300)") != std::string::npos,
                  r.err);
  }
  // A finished point under other [train] settings (another seed): not skipped as if it were the
  // manifest's, refused with the setting named. Where checkpoints fall changes no result.
  {
    Manifest seed = good;
    seed.train.seed = 7;
    write_manifest_atomic(seed, dir / "seed.toml");
    const Result r =
        run_cli({"run", (dir / "seed.toml").string(), "--point", "dense", "--out", out.string()});
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("seed = 1234 (the manifest: 7)") != std::string::npos, r.err);
    intact();
    // --point names another point, one with no record in the folder: the folder still holds the
    // other seed's sweep (its dense record), and a point of seed 7 beside it is refused too.
    const fs::path sib = dir / "sibling";
    fs::remove_all(sib);
    fs::create_directories(sib / "dense");
    fs::copy_file(out / "dense" / "record.json", sib / "dense" / "record.json");
    const Result s7 =
        run_cli({"run", (dir / "seed.toml").string(), "--point", "moe-a", "--out", sib.string()});
    CHECK(s7.status == 2);
    CHECK_MESSAGE(one_line(s7.err), s7.err);
    CHECK_MESSAGE(s7.err.find("seed = 1234 (the manifest: 7); this folder holds another sweep") !=
                      std::string::npos,
                  s7.err);
    CHECK(!fs::exists(sib / "moe-a"));
    // Other sweep-wide settings (tolerances, equal_resources): the folder would hold records under
    // two readings of "equal", which its own audit fails. The point's own record refuses, and so
    // does a sibling's under --point.
    Manifest tol = good;
    tol.n_tolerance = 2 * good.n_tolerance;
    write_manifest_atomic(tol, dir / "tol.toml");
    const Result t =
        run_cli({"run", (dir / "tol.toml").string(), "--point", "dense", "--out", out.string()});
    CHECK(t.status == 2);
    CHECK_MESSAGE(one_line(t.err), t.err);
    CHECK_MESSAGE(
        t.err.find("was written under other sweep settings: n_tolerance = ") != std::string::npos,
        t.err);
    intact();
    const Result ts =
        run_cli({"run", (dir / "tol.toml").string(), "--point", "moe-a", "--out", sib.string()});
    CHECK(ts.status == 2);
    CHECK_MESSAGE(ts.err.find("n_tolerance = ") != std::string::npos, ts.err);
    CHECK_MESSAGE(ts.err.find("this folder holds another sweep") != std::string::npos, ts.err);
    CHECK(!fs::exists(sib / "moe-a"));
    // A record of an equal-resource sweep in the folder of this (unequal) manifest's runs.
    REQUIRE(!good.equal_resources);
    const fs::path eq = dir / "equal-record";
    fs::remove_all(eq);
    fs::create_directories(eq / "dense");
    nlohmann::json rec = nlohmann::json::parse(read_file(out / "dense" / "record.json"));
    REQUIRE(rec.at("sweep_equal_resources") == false);
    rec["sweep_equal_resources"] = true;
    write_file_atomic(eq / "dense" / "record.json", rec.dump(1) + "\n");
    const Result u =
        run_cli({"run", (dir / "good.toml").string(), "--point", "dense", "--out", eq.string()});
    CHECK(u.status == 2);
    CHECK_MESSAGE(u.err.find("equal_resources = true (the manifest: false)") != std::string::npos,
                  u.err);
    Manifest every = good;
    every.train.checkpoint_every = 3;
    write_manifest_atomic(every, dir / "every.toml");
    const Result k =
        run_cli({"run", (dir / "every.toml").string(), "--point", "dense", "--out", out.string()});
    CHECK_MESSAGE(k.status == 0, k.err);
    CHECK(k.out.find("already complete") != std::string::npos);
    intact();
  }
  // A finished point whose plan changed (a learning rate edited in the manifest): refused with
  // the first value that differs named by its key, the record's value and the manifest's.
  {
    Manifest lr = good;
    lr.dense = tiny_plan("dense", true, 12, 4, 20, 5e-3);
    write_manifest_atomic(lr, dir / "lr.toml");
    const Result r =
        run_cli({"run", (dir / "lr.toml").string(), "--point", "dense", "--out", out.string()});
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("different plan for point 'dense': plan.lr_peak = 0.003 (the "
                             "manifest: 0.005); move") != std::string::npos,
                  r.err);
    intact();
  }
}

TEST_CASE(
    "a sweep planned by moeplan grid: measured D, D̂ and epochs equal the plan; C [paper] "
    "within its rounding; the records and the report say so") {
  const fs::path dir = fresh_dir("grid");
  const std::string sweep = (dir / "sweep.toml").string();
  const Result g = run_cli({"grid", "--N", "3e4", "--ra", "0.35,0.5", "--dense-tokens", "1.5e4",
                            "--seq-len", "32", "--ra-tolerance", "0.02", "-o", sweep});
  REQUIRE_MESSAGE(g.status == 0, g.err);
  const Manifest m = read_manifest(sweep);
  const Result r = run_cli({"run", sweep, "--out", (dir / "runs").string()});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  std::vector<const Plan*> plans{&m.dense};
  for (const Plan& p : m.points) plans.push_back(&p);
  REQUIRE(plans.size() == 3);
  for (const Plan* p : plans) {
    const json rec = record(dir / "runs", p->id);
    const json& t = rec["measured"]["tokens"];
    // Exact integer equality with the plan's own numbers (not the record's copy of them).
    CHECK(t["consumed"].get<int64_t>() == p->budget.tokens_consumed);
    CHECK(t["consumed"].get<int64_t>() ==
          p->budget.steps * p->budget.batch_seqs * p->budget.seq_len);
    CHECK(t["unique"].get<int64_t>() == p->budget.tokens_unique);
    CHECK(t["consumed"].get<int64_t>() * p->budget.tokens_unique ==
          p->budget.tokens_consumed * t["unique"].get<int64_t>());
    CHECK(t["epochs"].get<double>() == doctest::Approx(p->budget.epochs).epsilon(1e-12));
    CHECK(rec["measured"]["steps"].get<int64_t>() == p->budget.steps);
    // C [paper] measured through the lens of the ledger vs the plan's rounded C and its target.
    const double measured = rec["measured"]["compute"]["paper"].get<double>();
    const double band = std::abs(p->budget.compute - p->budget.compute_target);
    CHECK(std::abs(measured - p->budget.compute_target) <=
          band * (1 + 1e-9) + 1e-6 * p->budget.compute_target);
    CHECK(measured == doctest::Approx(p->budget.compute).epsilon(1e-9));
    CHECK(rec["measured"]["compute"]["within_rounding"] == true);
    for (auto& [k, v] : rec["measured"]["matches_plan"].items()) CHECK_MESSAGE(v == true, k);
    CHECK(rec["measured"]["total_params"].get<int64_t>() == p->counts.total_params);
  }
  // The audit against the manifest holds at the manifest's 1 % for equal N and C. A --tolerance
  // given is every tolerance of the audit: at 0.3 % the MoE points' N (the planner meets the
  // baseline's within 1 %) break equal N, which the manifest's n_tolerance once quietly kept.
  const std::vector<std::string> audit{"audit", (dir / "runs").string(), "--plan", sweep};
  const Result held = run_cli(audit);
  CHECK_MESSAGE(held.status == 0, held.out);
  CHECK(held.out.find("HOLDS  equal total parameters N across the sweep") != std::string::npos);
  double n_farthest = 0;
  for (const Plan& p : m.points)
    n_farthest = std::max(n_farthest, std::abs(double(p.counts.total_params) /
                                                   double(m.dense.counts.total_params) - 1));
  REQUIRE(n_farthest > 0.003);
  std::vector<std::string> tight = audit;
  tight.insert(tight.end(), {"--tolerance", "0.3%"});
  const Result broke = run_cli(tight);
  CHECK(broke.status == 1);
  CHECK(broke.out.find("FAILS  equal total parameters N across the sweep") != std::string::npos);
  CHECK(broke.out.find("tolerance 0.30% -> FAILS") != std::string::npos);
  const Result rep = run_cli({"report", (dir / "runs").string()});
  CHECK(rep.status == 0);
  CHECK(rep.out.find("3 of 3 complete point(s)") != std::string::npos);
  CHECK(rep.out.find("moe-ra0.500") != std::string::npos);
  // The time table: equal C is not equal time. The dense row's executed rate is its record's
  // ledger total over its training seconds; it is its own time reference (1.00x).
  CHECK(rep.out.find("Time and achieved FLOP rate") != std::string::npos);
  CHECK(rep.out.find("1.00x") != std::string::npos);
  const json dense_rec = record(dir / "runs", m.dense.id);
  const double rate = dense_rec["measured"]["flops"]["total"].get<double>() /
                      dense_rec["train_seconds"].get<double>() / 1e12;
  char rate_text[32];
  std::snprintf(rate_text, sizeof rate_text, "%.3g", rate);
  CHECK(rep.out.find(rate_text) != std::string::npos);
  const Result md =
      run_cli({"report", (dir / "runs").string(), "-o", (dir / "report.md").string()});
  CHECK(md.status == 0);
  CHECK(read_file(dir / "report.md").find("| dense") != std::string::npos);
  // The device column names the hardware (this machine's CPU, as the record says) and the
  // kernels that ran. Times are compared under one request (`auto` may choose otherwise for each
  // point); a point run under another --kernels than the dense baseline gets no time ratio.
  REQUIRE(dense_rec["hardware"].size() == 1);
  const std::string hw = dense_rec["hardware"][0].get<std::string>();
  CHECK_MESSAGE(rep.out.find("cpu (" + hw + ") eigen-fp32") != std::string::npos, rep.out);
  const std::string label = "cpu (" + hw + ") hand-edited";
  auto rest_of_row = [&](const std::string& out) {  // after the label: the numbers and the ratio
    const size_t at = out.find(label);
    return at == std::string::npos ? std::string("(no row)")
                                   : out.substr(at + label.size(), out.find('\n', at) - at);
  };
  json other = record(dir / "runs", "moe-ra0.500");
  CHECK(other["kernels_requested"] == "");
  other["kernels"] = "hand-edited";
  write_file_atomic(dir / "runs" / "moe-ra0.500" / "record.json", other.dump(1));
  // The cells after the label: train s, tokens/s, the two rates, the FLOPs vs dense (which do not
  // depend on the timing), then the time ratio.
  auto cells_after_label = [&](const std::string& out) {
    std::istringstream in(rest_of_row(out));
    std::vector<std::string> cells;
    for (std::string c; in >> c;) cells.push_back(c);
    return cells;
  };
  const Result rep2 = run_cli({"report", (dir / "runs").string()});
  REQUIRE(rep2.status == 0);
  const std::vector<std::string> timed = cells_after_label(rep2.out);
  REQUIRE_MESSAGE(timed.size() >= 6, rep2.out);
  CHECK_MESSAGE(timed[4].ends_with('x'), rep2.out);
  CHECK_MESSAGE(timed[5].ends_with('x'), rep2.out);  // the time ratio
  other["kernels_requested"] = "hand-edited";
  write_file_atomic(dir / "runs" / "moe-ra0.500" / "record.json", other.dump(1));
  const Result rep3 = run_cli({"report", (dir / "runs").string()});
  REQUIRE(rep3.status == 0);
  const std::vector<std::string> untimed = cells_after_label(rep3.out);
  REQUIRE_MESSAGE(untimed.size() >= 6, rep3.out);
  CHECK_MESSAGE(untimed[4] == timed[4], rep3.out);  // the same work
  CHECK_MESSAGE(untimed[5] == "-", rep3.out);       // no time ratio
}

TEST_CASE("a 5e22-FLOP point is not refused for its ledger; the built-in source it would need is") {
  // The 20B grid's dense baseline: M [exact/causal] · D is about 5e22 FLOPs, far past 64-bit
  // counts (9.2e18); the ledger counts in 128 bits, so what refuses it is the built-in corpus:
  // D̂ = 400B tokens generated in memory at 3 bytes each (1.1 TiB), more than half of this
  // machine's memory (skipped where that is unknown, or 2.2 TiB and more). Refused before
  // anything is written, with --estimate too (it reads the same source).
  const std::size_t host = moeplan::backend::host_memory_bytes();
  if (host == 0 || double(host) >= 2.2e12) {
    MESSAGE("host memory unknown or over 2.2 TB: the built-in corpus's refusal is not tested");
    return;
  }
  const fs::path dir = fresh_dir("ledger_limit");
  const std::string sweep = (dir / "sweep.toml").string();
  REQUIRE(run_cli({"grid", "--N", "2e10", "--ra", "0.2", "-o", sweep}).status == 0);
  for (bool estimate : {false, true}) {
    std::vector<std::string> args = {"run", sweep, "--out", (dir / "runs").string()};
    if (estimate) args.insert(args.end(), {"--estimate", "2"});
    const Result r = run_cli(args);
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("FLOP ledger") == std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("source builtin: ") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find(" validation tokens are generated in memory (") != std::string::npos,
                  r.err);
    CHECK_MESSAGE(r.err.find("set [train] source = \"shards:GLOB\"") != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(dir / "runs"));
  }
  // A vast held-out set on a small point: the remedy is a smaller eval_tokens, not shards.
  const std::string small = (dir / "small.toml").string();
  REQUIRE(run_cli({"grid", "--N", "3e5", "--ra", "0.3", "--dense-tokens", "20000", "--train",
                   "eval_tokens=99999999999999", "-o", small})
              .status == 0);
  const Result v = run_cli({"run", small, "--estimate", "1", "--out", (dir / "runs").string()});
  CHECK(v.status == 2);
  CHECK_MESSAGE(
      v.err.find("the held-out set is most of it: lower [train] eval_tokens") != std::string::npos,
      v.err);
}

TEST_CASE("more than 2^31 - 1 windows of unique data is refused before anything trains") {
  // The 2T grid's dense baseline reads D̂ = 40T unique tokens, 1.95e10 windows of 2048: past the
  // window order's 32-bit indices (2^31 - 1 = 2147483647 windows, D̂ up to 2147483647 · 2048 =
  // 4398046509056 tokens at this seq_len).
  const fs::path dir = fresh_dir("window_limit");
  const std::string sweep = (dir / "sweep.toml").string();
  REQUIRE(run_cli({"grid", "--N", "2e12", "--ra", "0.2", "-o", sweep}).status == 0);
  const Result r = run_cli({"run", sweep, "--out", (dir / "runs").string()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(one_line(r.err), r.err);
  CHECK_MESSAGE(r.err.find("point 'dense': D̂ = ") != std::string::npos, r.err);
  CHECK_MESSAGE(
      r.err.find("windows of 2048 tokens; the backend numbers windows in 32 bits (at "
                 "most 2147483647, D̂ up to 4398046509056 at this seq_len)") != std::string::npos,
      r.err);
  CHECK_FALSE(fs::exists(dir / "runs"));
}

TEST_CASE("cpu passes that outgrow the host memory: the most that fit, by the model's own count") {
  using namespace moeplan::backend;
  EngineRequest r;
  r.arch = tiny_arch(false);
  r.batch_seqs = 8;
  auto total = [&](int64_t pass) {
    ModelOptions o;
    o.micro_batch_seqs = pass;
    const auto n = moeplan::backend::Model<float>::memory_need(r.arch, o, 8);
    return n.state + n.activations;
  };
  // What passes of p sequences need grows with p, so the most that fit in need(p) bytes is p.
  for (int64_t p = 1; p < 8; ++p) CHECK(total(p) < total(p + 1));
  const PassFit whole = cpu_pass_fit(r, total(8), false);
  CHECK(whole.pass == 8);
  CHECK(whole.largest == 8);
  CHECK(whole.why.empty());
  CHECK(cpu_pass_fit(r, 0, false).largest == 8);  // not known: taken to fit
  const PassFit seven = cpu_pass_fit(r, total(8) - 1, false);
  CHECK(seven.largest == 7);
  const PassFit three = cpu_pass_fit(r, total(3), false);
  CHECK(three.largest == 3);
  CHECK_MESSAGE(three.why.starts_with(fmt::format(
                    "--device cpu: passes of 8 sequences of 16 tokens need about {} of host "
                    "memory (weights, gradients and AdamW state ",
                    moeplan::bytes_text(double(total(8))))),
                three.why);
  CHECK_MESSAGE(
      three.why.find(fmt::format("more than the {} this machine has available; run "
                                 "smaller passes: --micro-batch 3 (at most 3 sequences "
                                 "a pass fit)",
                                 moeplan::bytes_text(double(total(3))))) != std::string::npos,
      three.why);
  const PassFit none = cpu_pass_fit(r, total(1) - 1, false);
  CHECK(none.largest == 0);
  CHECK_MESSAGE(
      none.why.find(fmt::format("; not even passes of 1 sequence fit (about {}): use a "
                                "machine with more memory, or --device cuda",
                                moeplan::bytes_text(double(total(1))))) != std::string::npos,
      none.why);
  // Less than the model's state alone: no pass helps, and the line says so.
  ModelOptions one;
  one.micro_batch_seqs = 1;
  const std::size_t state = moeplan::backend::Model<float>::memory_need(r.arch, one, 8).state;
  const PassFit model = cpu_pass_fit(r, state - 1, false);
  CHECK(model.largest == 0);
  CHECK_MESSAGE(model.why == fmt::format("--device cpu: the model's weights, gradients and AdamW "
                                         "state alone take {} (16 bytes a parameter); this "
                                         "machine has {} available (use a larger machine, or "
                                         "--device cuda)",
                                         moeplan::bytes_text(double(state)),
                                         moeplan::bytes_text(double(state - 1))),
                model.why);
  // What the registered check reads on this machine: /proc/meminfo's MemAvailable (or a cgroup's
  // room, less), some of the physical memory.
  CHECK(host_memory_available() > 0);
  CHECK(host_memory_available() <= host_memory_bytes());
  // --estimate looks up to the whole batch from passes that fit.
  r.options.micro_batch_seqs = 2;
  CHECK(cpu_pass_fit(r, total(5), true).largest == 5);
  CHECK(cpu_pass_fit(r, total(8), true).largest == 8);
  CHECK(cpu_pass_fit(r, total(5), false).largest == 2);
}

TEST_CASE("a cpu point no machine's memory holds is refused before any point trains") {
  const fs::path dir = fresh_dir("cpu_memory");
  // Sequences of 2^18 tokens: one layer's attention probabilities alone take
  // 4 sequences x 2 heads x 2^36 x 4 bytes = 2 TiB, one sequence's a quarter of that.
  Arch dense = tiny_arch(true), moe = tiny_arch(false);
  dense.seq_len = moe.seq_len = int64_t(1) << 18;
  Manifest m =
      tiny_manifest(plan_for("dense", dense, 2, 4, 2), {plan_for("moe-huge", moe, 2, 4, 2)});
  m.train.eval_tokens = moe.seq_len;
  write_manifest_atomic(m, dir / "sweep.toml");
  const Result r =
      run_cli({"run", (dir / "sweep.toml").string(), "--out", (dir / "runs").string()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(one_line(r.err), r.err);
  CHECK_MESSAGE(r.err.starts_with("moeplan: error: point dense: --device cpu: passes of 4 "
                                  "sequences of 262144 tokens need about "),
                r.err);
  CHECK_MESSAGE(r.err.find("; not even passes of 1 sequence fit (about ") != std::string::npos,
                r.err);
  CHECK_MESSAGE(r.err.ends_with("; 1 more point does not fit: moe-huge (not even one sequence a "
                                "pass fits); found before any point trained\n"),
                r.err);
  CHECK_FALSE(fs::exists(dir / "runs" / "dense" / "record.json"));
  CHECK_FALSE(fs::exists(dir / "runs" / "dense" / "checkpoint"));
}

TEST_CASE("a source too short for a later point is refused before any point trains") {
  const fs::path dir = fresh_dir("short_source");
  // Loose reuse: the dense point reads 20 windows of 16, the MoE point 200. Validation: 256
  // tokens (the manifest's eval_tokens) + 1. A 2,000-byte file feeds the first (321 + 257), not
  // the second (3,201 + 257 = 3,458).
  Manifest m =
      tiny_manifest(tiny_plan("dense", true, 10, 4, 20), {tiny_plan("moe-big", false, 50, 4, 200)});
  write_file_atomic(dir / "t.txt", std::string(2000, 'a'));
  m.train.source = "text:" + (dir / "t.txt").string();
  write_manifest_atomic(m, dir / "sweep.toml");
  const Result r =
      run_cli({"run", (dir / "sweep.toml").string(), "--out", (dir / "runs").string()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(one_line(r.err), r.err);
  CHECK_MESSAGE(r.err.find("point 'moe-big': source 'text:" + (dir / "t.txt").string() +
                           "' has 2000 tokens; the plan needs 3201 for training (D̂ + 1 target) "
                           "plus 257 held-out validation tokens = 3458: give a larger source, "
                           "or plan fewer unique tokens") != std::string::npos,
                r.err);
  CHECK_FALSE(fs::exists(dir / "runs" / "dense" / "record.json"));
  // --point names one point: an id not in the manifest, or an empty one, is refused with the list.
  for (const char* id : {"nope", ""}) {
    const Result p = run_cli(
        {"run", (dir / "sweep.toml").string(), "--point", id, "--out", (dir / "runs").string()});
    CHECK(p.status == 2);
    CHECK_MESSAGE(p.err.find(fmt::format("--point '{}' is not in ", id)) != std::string::npos,
                  p.err);
    CHECK_MESSAGE(p.err.find("its points are: dense, moe-big") != std::string::npos, p.err);
  }
  // A folder given as a text source says so.
  m.train.source = "text:" + dir.string();
  write_manifest_atomic(m, dir / "folder.toml");
  const Result f = run_cli({"run", (dir / "folder.toml").string(), "--out", (dir / "r2").string()});
  CHECK(f.status == 2);
  CHECK_MESSAGE(f.err.find("is a folder; give a file") != std::string::npos, f.err);
  m.train.source = "shards:" + dir.string();
  write_manifest_atomic(m, dir / "shards.toml");
  const Result sh =
      run_cli({"run", (dir / "shards.toml").string(), "--out", (dir / "r3").string()});
  CHECK(sh.status == 2);
  CHECK_MESSAGE(
      sh.err.find("is a folder; give a shard file or a pattern such as") != std::string::npos,
      sh.err);
}

TEST_CASE(
    "a relative source path is read from the manifest's folder; a finished point needs none") {
  const fs::path dir = fresh_dir("relative_source");
  fs::create_directories(dir / "sweeps");
  std::string text;
  for (int i = 0; i < 400; ++i) text += fmt::format("line {} of the file beside the sweeps\n", i);
  write_file_atomic(dir / "t.txt", text);
  Manifest m =
      tiny_manifest(tiny_plan("dense", true, 10, 4, 20), {tiny_plan("moe", false, 10, 4, 20)});
  m.train.source = "text:../t.txt";  // the manifest's folder's parent, not the test's folder
  write_manifest_atomic(m, dir / "sweeps" / "sweep.toml");
  REQUIRE(fs::current_path() != dir / "sweeps");
  const std::string sweep = (dir / "sweeps" / "sweep.toml").string(),
                    runs = (dir / "runs").string();
  Result r = run_cli({"run", sweep, "--out", runs});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK(record(dir / "runs", "dense").at("data").at("source") == "text:../t.txt");
  CHECK(record(dir / "runs", "moe").at("status") == "complete");
  // Complete: rerun with the source gone, the point is skipped, nothing read; an estimate too.
  fs::rename(dir / "t.txt", dir / "t.moved");
  r = run_cli({"run", sweep, "--out", runs});
  CHECK_MESSAGE(r.status == 0, r.err);
  r = run_cli({"run", sweep, "--out", runs, "--estimate", "1"});
  CHECK_MESSAGE(r.status == 0, r.err);
  // A point that still has to train names the folder the path was read from.
  r = run_cli({"run", sweep, "--out", (dir / "runs2").string()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(one_line(r.err), r.err);
  CHECK_MESSAGE(r.err.find("cannot read '" + (dir / "t.txt").string() + "'") != std::string::npos,
                r.err);
  CHECK_MESSAGE(r.err.find("(a relative source path is read from the manifest's folder, '" +
                           (dir / "sweeps").string() + "')") != std::string::npos,
                r.err);
  // Found there but unusable (not a shard): the path was not the trouble, no hint.
  Manifest bad = read_manifest(sweep);
  write_file_atomic(dir / "sweeps" / "bad.bin", std::string(4096, 'x'));
  bad.train.source = "shards:bad.bin";
  write_manifest_atomic(bad, dir / "sweeps" / "bad.toml");
  r = run_cli({"run", (dir / "sweeps" / "bad.toml").string(), "--out", (dir / "runs3").string()});
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.err.find("bad magic") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("relative source path") == std::string::npos, r.err);
  bad.train.source = "shards:ba*.bin";  // a pattern whose folder is there: no hint either
  write_manifest_atomic(bad, dir / "sweeps" / "bad.toml");
  r = run_cli({"run", (dir / "sweeps" / "bad.toml").string(), "--out", (dir / "runs3").string()});
  CHECK_MESSAGE(r.err.find("bad magic") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("relative source path") == std::string::npos, r.err);
}

TEST_CASE("grid then run: a relative --train source names one file, whatever the folders") {
  // The source typed relative to the folder grid runs in (this test's); the manifest written
  // into another folder, to stdout, or read through a symlink: run finds the same file.
  const fs::path dir = fresh_dir("grid_source");
  std::string text;
  for (int i = 0; i < 6000; ++i) text += fmt::format("{} plus {} is {}\n", i, i % 7, i + i % 7);
  write_file_atomic(dir / "corpus.txt", text);
  const std::string rel = "text:" + fs::relative(dir / "corpus.txt", fs::current_path()).string();
  const std::vector<std::string> grid = {"grid",         "--N", "3e4",       "--ra", "0.5",
                                         "--dense-tpp",  "2",   "--seq-len", "32",   "--train",
                                         "source=" + rel};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  fs::create_directories(dir / "sub");
  REQUIRE(run_cli(with(grid, {"-o", (dir / "sub" / "s.toml").string()})).status == 0);
  const Result g = run_cli(with(grid, {"--format", "toml"}));  // to stdout: an absolute path
  REQUIRE(g.status == 0);
  fs::create_directories(dir / "other");
  write_file_atomic(dir / "other" / "s.toml", g.out);
  CHECK(read_manifest(dir / "other" / "s.toml").train.source ==
        "text:" + (dir / "corpus.txt").string());
  // A link one folder deeper: "../corpus.txt" from the link's folder would be other/corpus.txt.
  fs::create_directories(dir / "other" / "deep");
  fs::create_symlink(dir / "sub" / "s.toml", dir / "other" / "deep" / "link.toml");
  for (const fs::path& m :
       {dir / "sub" / "s.toml", dir / "other" / "s.toml", dir / "other" / "deep" / "link.toml"}) {
    const Result r = run_cli({"run", m.string(), "--point", "dense", "--estimate", "1", "--out",
                              (dir / "runs").string()});
    CHECK_MESSAGE(r.status == 0, m.string(), ": ", r.err);
  }
}

TEST_CASE("resume refuses a source whose tokens changed; stale temp files are cleared") {
  const fs::path dir = fresh_dir("changed_source");
  Manifest m =
      tiny_manifest(tiny_plan("dense", true, 12, 4, 20), {tiny_plan("moe-a", false, 12, 4, 20)});
  std::string text;
  for (int i = 0; i < 3000; ++i) text += char('a' + (i * 7) % 26);
  write_file_atomic(dir / "t.txt", text);
  m.train.source = "text:" + (dir / "t.txt").string();
  write_manifest_atomic(m, dir / "sweep.toml");
  const fs::path out = dir / "runs";
  const std::vector<std::string> args{
      "run", (dir / "sweep.toml").string(), "--point", "dense", "--out", out.string()};
  // Leftovers of writes a killed run never finished: cleared when the point trains again.
  fs::create_directories(out / "dense" / "checkpoint");
  write_file_atomic(out / "dense" / ".record.json.tmp.AbC123", "half a record");
  write_file_atomic(out / "dense" / "checkpoint" / ".state.ckpt.tmp.XyZ789", "half a checkpoint");
  // A user's own files that merely look alike are not ours: kept.
  write_file_atomic(out / "dense" / ".my.tmp.notes", "notes");
  write_file_atomic(out / "dense" / "checkpoint" / ".backup.tmp.state.ckpt", "a backup");
  const Result first = run_cli(args);
  REQUIRE_MESSAGE(first.status == 0, first.err);
  CHECK_FALSE(fs::exists(out / "dense" / ".record.json.tmp.AbC123"));
  CHECK_FALSE(fs::exists(out / "dense" / "checkpoint" / ".state.ckpt.tmp.XyZ789"));
  CHECK(fs::exists(out / "dense" / ".my.tmp.notes"));
  CHECK(fs::exists(out / "dense" / "checkpoint" / ".backup.tmp.state.ckpt"));
  // Make the point resumable again (as an interrupted one would be), then change the file's
  // first bytes, keeping its size: the resume is refused, naming both fingerprints.
  json rec = record(out, "dense");
  rec["status"] = "running";
  write_file_atomic(out / "dense" / "record.json", rec.dump(1));
  text[0] = 'Z';
  write_file_atomic(dir / "t.txt", text);
  const Result r = run_cli(args);
  CHECK(r.status == 2);
  CHECK_MESSAGE(one_line(r.err), r.err);
  CHECK_MESSAGE(r.err.find("was trained on other tokens than source 'text:") != std::string::npos,
                r.err);
  CHECK_MESSAGE(
      r.err.find("training region " + rec["data"]["training_fingerprint"].get<std::string>() +
                 " then") != std::string::npos,
      r.err);
  // A record.json that is a symlink is written through, its temp files beside the target: a
  // killed write's there is cleared too, the target folder's other files are not.
  text[0] = 'a';
  write_file_atomic(dir / "t.txt", text);
  fs::create_directories(dir / "kept");
  fs::rename(out / "dense" / "record.json", dir / "kept" / "rec.json");
  fs::create_symlink(dir / "kept" / "rec.json", out / "dense" / "record.json");
  write_file_atomic(dir / "kept" / ".rec.json.tmp.Qw9876", "half a record");
  write_file_atomic(dir / "kept" / ".other.json.tmp.Qw9876", "someone else's");
  const Result resumed = run_cli(args);
  REQUIRE_MESSAGE(resumed.status == 0, resumed.err);
  CHECK(fs::is_symlink(out / "dense" / "record.json"));
  CHECK(record(out, "dense")["status"] == "complete");
  CHECK_FALSE(fs::exists(dir / "kept" / ".rec.json.tmp.Qw9876"));
  CHECK(fs::exists(dir / "kept" / ".other.json.tmp.Qw9876"));
}

TEST_CASE("a stop before a point's first step writes nothing; after a checkpoint, none again") {
  const fs::path dir = fresh_dir("stop_first");
  const Plan p = tiny_plan("dense", true, 6, 2, 20);
  const Manifest m = tiny_manifest(p, {});
  std::atomic<int> stop{SIGINT};  // asked for before the point started
  RunOptions opt;
  opt.out_dir = dir / "runs";
  opt.device = "cpu";
  opt.stop = &stop;
  const PointOutcome out = run_point(p, plan_to_json(p), m.train, opt);
  CHECK(out.status == PointStatus::interrupted);
  CHECK(out.checkpoint_step == -1);
  CHECK_FALSE(fs::exists(opt.out_dir / "dense" / "record.json"));
  CHECK_FALSE(fs::exists(opt.out_dir / "dense" / "checkpoint" / "state.ckpt"));
  // Stopped at step 4, right after its checkpoint there (every 2 steps): not written again.
  stop = 0;
  opt.checkpoint_every = 2;
  opt.on_progress = [&](const Progress& pr) {
    if (pr.step == 4) stop = SIGINT;
  };
  const PointOutcome at4 = run_point(p, plan_to_json(p), m.train, opt);
  CHECK(at4.status == PointStatus::interrupted);
  CHECK(at4.checkpoint_step == 4);
  const fs::path ckpt = opt.out_dir / "dense" / "checkpoint" / "state.ckpt";
  CHECK(read_checkpoint(ckpt).state.step == 4);
  // Resumed and stopped before a step: the checkpoint it resumed from stays the file it was
  // (each write is a new file renamed over it), and the record too.
  auto inode = [](const fs::path& f) {
    struct stat st {};
    REQUIRE(::stat(f.c_str(), &st) == 0);
    return st.st_ino;
  };
  const auto ckpt_inode = inode(ckpt), record_inode = inode(opt.out_dir / "dense" / "record.json");
  opt.on_progress = nullptr;
  const PointOutcome again = run_point(p, plan_to_json(p), m.train, opt);
  CHECK(again.status == PointStatus::interrupted);
  CHECK(again.checkpoint_step == 4);
  CHECK(inode(ckpt) == ckpt_inode);
  CHECK(inode(opt.out_dir / "dense" / "record.json") == record_inode);
}

TEST_CASE("a point another process is training is left to it; a lock its dead owner left is not") {
  const fs::path dir = fresh_dir("lock");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 10, 4, 50), {tiny_plan("moe-l", false, 10, 4, 50)}),
      dir / "sweep.toml");
  const fs::path out = dir / "runs";
  fs::create_directories(out / "moe-l");
  // This process plays the other trainer: it holds runs/moe-l/.lock as a run does.
  const int fd = ::open((out / "moe-l" / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::vector<std::string> args{
      "run", (dir / "sweep.toml").string(), "--point", "moe-l", "--out", out.string()};
  const Result busy = run_cli(args);
  CHECK(busy.status == 3);
  CHECK_MESSAGE(busy.out.find("[moe-l 1/1] is being trained by another moeplan process into '" +
                              out.string() + "'") != std::string::npos,
                busy.out);
  CHECK_MESSAGE(busy.out.find("1 point left to another moeplan process (moe-l); run the same "
                              "command again when it has finished") != std::string::npos,
                busy.out);
  // Left before its data is read or its model built (no engine line: no second copy in memory).
  CHECK_MESSAGE(busy.out.find("passes of") == std::string::npos, busy.out);
  CHECK_FALSE(fs::exists(out / "moe-l" / "record.json"));
  // The whole sweep: the point held elsewhere is left to its trainer, the others train (it
  // stopped the sweep with exit 2 once, after the points before it had trained).
  const Result sweep = run_cli({"run", (dir / "sweep.toml").string(), "--out", out.string()});
  CHECK(sweep.status == 3);
  CHECK(record(out, "dense")["status"] == "complete");
  CHECK_FALSE(fs::exists(out / "moe-l" / "record.json"));
  // A lock says what its holder trains. A second sweep of other settings (another seed) into the
  // same folder, before the holder's first record: refused before anything trains (it trained
  // its other points into the folder, and exited 3 "left to another process").
  const Manifest same = read_manifest(dir / "sweep.toml");
  Manifest seeded = same;
  seeded.train.seed = 7;
  write_manifest_atomic(seeded, dir / "seeded.toml");
  auto own_lock = [&](const Manifest& m) {
    const std::string owner = nlohmann::json{
        {"plan", plan_to_json(m.points[0])},
        {"train",
         train_to_json(m.train)}}.dump();
    REQUIRE(::ftruncate(fd, 0) == 0);
    REQUIRE(::pwrite(fd, owner.data(), owner.size(), 0) == ssize_t(owner.size()));
  };
  own_lock(same);
  const Result other =
      run_cli({"run", (dir / "seeded.toml").string(), "--point", "moe-l", "--out", out.string()});
  CHECK(other.status == 2);
  CHECK(one_line(other.err));
  CHECK_MESSAGE(other.err.find("point 'moe-l' is being trained into this folder by another "
                               "moeplan process under other [train] settings: seed = 1234 (the "
                               "manifest: 7)") != std::string::npos,
                other.err);
  CHECK(other.out.empty());  // before the first point's line
  // The holder's own sweep, its owner written: left to it, as before.
  CHECK(run_cli(args).status == 3);
  // The owner gone (the kernel drops a dead process's flock), the lock file alone blocks nothing.
  ::close(fd);
  const Result free = run_cli(args);
  CHECK_MESSAGE(free.status == 0, free.err);
  CHECK(record(out, "moe-l")["status"] == "complete");
}

TEST_CASE("SIGHUP (a closed terminal) checkpoints and exits 130 as SIGINT does") {
  // It killed the run between checkpoints, losing the steps since the last one.
  const fs::path dir = fresh_dir("sighup");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 10, 4, 50), {tiny_plan("moe-h", false, 400, 4, 50)}),
      dir / "sweep.toml");
  const fs::path out = dir / "runs";
  const pid_t pid = spawn({"run", (dir / "sweep.toml").string(), "--point", "moe-h", "--out",
                           out.string(), "--checkpoint-every", "50"},
                          dir / "h.out", dir / "h.err");
  wait_for_file(out / "moe-h" / "record.json");
  ::kill(pid, SIGHUP);
  CHECK(wait_status(pid) == 130);
  REQUIRE_MESSAGE(record(out, "moe-h")["status"] == "running", "finished before the hang-up");
  CHECK(read_file(dir / "h.out").find("interrupted: checkpoint at step") != std::string::npos);
  // Started ignoring SIGHUP (nohup): it stays ignored, and the run outlives the terminal.
  fs::remove_all(out);
  const pid_t kept = ::fork();
  REQUIRE(kept >= 0);
  if (kept == 0) {
    ::signal(SIGHUP, SIG_IGN);
    const int o = ::open((dir / "n.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::execl(MOEPLAN_BINARY, MOEPLAN_BINARY, "run", (dir / "sweep.toml").c_str(), "--point", "moe-h",
            "--out", out.c_str(), "--checkpoint-every", "50", (char*)nullptr);
    ::_exit(127);
  }
  wait_for_file(out / "moe-h" / "record.json");
  ::kill(kept, SIGHUP);
  CHECK(wait_status(kept) == 0);
  CHECK(record(out, "moe-h")["status"] == "complete");
}

TEST_CASE(
    "SIGINT checkpoints at the end of the step and exits 130; the rerun resumes and completes") {
  const fs::path dir = fresh_dir("sigint");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 10, 4, 50), {tiny_plan("moe-i", false, 400, 4, 50)}),
      dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const fs::path out = dir / "runs";
  const pid_t pid =
      spawn({"run", sweep, "--point", "moe-i", "--out", out.string(), "--checkpoint-every", "50"},
            dir / "i.out", dir / "i.err");
  // Wait for the first checkpoint (step 50), then interrupt.
  wait_for_file(out / "moe-i" / "record.json");
  ::kill(pid, SIGINT);
  CHECK(wait_status(pid) == 130);
  const json rec = record(out, "moe-i");
  REQUIRE_MESSAGE(rec["status"] == "running", "the run finished before the interrupt");
  const Checkpoint c = read_checkpoint(out / "moe-i" / "checkpoint" / "state.ckpt");
  CHECK(rec["measured"]["steps"].get<int64_t>() == c.state.step);  // record and checkpoint agree
  CHECK(c.state.step >= 50);
  CHECK(read_file(dir / "i.out").find("interrupted: checkpoint at step") != std::string::npos);
  // An estimate counts the steps left (and the final evaluation), trains nothing, writes nothing.
  const std::string before = read_file(out / "moe-i" / "record.json");
  const Result est = run_cli({"run", sweep, "--point", "moe-i", "--out", out.string(),
                              "--estimate", "2"});
  CHECK(est.status == 0);
  const int64_t left = 400 - c.state.step;
  int64_t evals = 0;  // the manifest evaluates every 25 steps and after the last
  for (int64_t step = c.state.step + 1; step <= 400; ++step) evals += step % 25 == 0 || step == 400;
  CHECK_MESSAGE(est.out.find(fmt::format("(median of 2, after 1 warm-up) x {} remaining steps + "
                                         "{} evaluations x ",
                                         left, evals)) != std::string::npos,
                est.out);
  CHECK_MESSAGE(est.out.find("estimate for 1 point(s) on cpu: ") != std::string::npos, est.out);
  CHECK(read_file(out / "moe-i" / "record.json") == before);
  CHECK(read_checkpoint(out / "moe-i" / "checkpoint" / "state.ckpt").state.step == c.state.step);
  // A checkpoint trained with another CPU thread count (Eigen blocks its products by it, so the
  // sums run in another order): refused by name, in a copy, the original left to resume.
  {
    const fs::path copy = dir / "threads-copy";
    fs::copy(out, copy, fs::copy_options::recursive);
    const fs::path ckpt = copy / "moe-i" / "checkpoint" / "state.ckpt";
    Checkpoint edited = read_checkpoint(ckpt);
    CHECK(edited.state.threads == 1);  // a model this small runs its products on one thread
    edited.state.threads = 3;
    write_checkpoint(ckpt, edited);
    const Result r =
        run_cli({"run", sweep, "--point", "moe-i", "--out", copy.string(), "--threads", "1"});
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("was trained with 3 CPU threads, this run has 1; resume with "
                             "--threads 3") != std::string::npos,
                  r.err);
    CHECK(read_checkpoint(ckpt).state.step == c.state.step);
    // The whole sweep: refused before its first point (dense, untrained in this folder) trains,
    // not when moe-i's turn comes after it.
    REQUIRE_FALSE(fs::exists(copy / "dense" / "record.json"));
    const Result all = run_cli({"run", sweep, "--out", copy.string(), "--threads", "1"});
    CHECK(all.status == 2);
    CHECK_MESSAGE(all.err.find("was trained with 3 CPU threads") != std::string::npos, all.err);
    CHECK_FALSE(fs::exists(copy / "dense" / "record.json"));
    {  // --elastic goes on with 1 thread; the notice and the record's layouts name both counts.
      const fs::path el = dir / "threads-elastic";
      fs::copy(copy, el, fs::copy_options::recursive);
      const Result go = run_cli(
          {"run", sweep, "--point", "moe-i", "--out", el.string(), "--threads", "1", "--elastic"});
      REQUIRE_MESSAGE(go.status == 0, go.err);
      CHECK_MESSAGE(go.out.find(fmt::format("resuming at step {} in another layout (CPU threads 3 "
                                            "-> 1): the steps from here sum in another order, so",
                                            c.state.step)) != std::string::npos,
                    go.out);
      const json re = record(el, "moe-i");
      REQUIRE(re["layouts"].size() == 2);
      CHECK(re["layouts"][0]["threads"] == 3);
      CHECK(re["layouts"][1]["threads"] == 1);
      CHECK(re["threads_requested"] == 1);
    }
    // Another --kernels than the checkpoint's: refused the same way, before anything trains.
    edited.state.threads = 1;
    edited.state.kernels_requested = "attention=cublas";
    write_checkpoint(ckpt, edited);
    const Result k = run_cli({"run", sweep, "--out", copy.string()});
    CHECK(k.status == 2);
    CHECK_MESSAGE(k.err.find("was trained with --kernels 'attention=cublas', this run asks for "
                             "''; resume with --kernels 'attention=cublas'") != std::string::npos,
                  k.err);
    CHECK_FALSE(fs::exists(copy / "dense" / "record.json"));
    CHECK(read_checkpoint(out / "moe-i" / "checkpoint" / "state.ckpt").state.kernels ==
          "eigen-fp32");  // what the engine chose is kept beside the request
    // A step past the plan's end (an edited head, its checksum made again) would "resume" into
    // a complete record of too few tokens: refused, as a negative one is.
    edited.state.kernels_requested.reset();
    for (const int64_t step : {edited.plan.at("steps").get<int64_t>() + 100, int64_t{-5}}) {
      edited.state.step = step;
      write_checkpoint(ckpt, edited);
      const Result past = run_cli({"run", sweep, "--out", copy.string()});
      CHECK(past.status == 2);
      CHECK_MESSAGE(past.err.find(fmt::format("is at step {}, outside the plan's 0 to", step)) !=
                        std::string::npos,
                    past.err);
    }
  }
  // A resume under another auxiliary loss would train half the point with each: refused, and the
  // checkpoint and record are left as they were.
  {
    Manifest z = read_manifest(sweep);
    z.train.z_loss = 1e-3;
    write_manifest_atomic(z, dir / "z.toml");
    const std::vector<std::string> args{"run", (dir / "z.toml").string(), "--point", "moe-i",
                                        "--out", out.string()};
    const Result r = run_cli(args);
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("z_loss = 0.0 (the manifest: 0.001)") != std::string::npos, r.err);
    CHECK(read_file(out / "moe-i" / "record.json") == before);
    // The checkpoint says so on its own (a crash can leave one without its record).
    fs::rename(out / "moe-i" / "record.json", dir / "record.json.aside");
    const Result k = run_cli(args);
    CHECK(k.status == 2);
    CHECK_MESSAGE(k.err.find("checkpoint '") != std::string::npos, k.err);
    CHECK_MESSAGE(k.err.find("z_loss = 0.0 (the manifest: 0.001)") != std::string::npos, k.err);
    fs::rename(dir / "record.json.aside", out / "moe-i" / "record.json");
    CHECK(read_file(out / "moe-i" / "record.json") == before);
    CHECK(read_checkpoint(out / "moe-i" / "checkpoint" / "state.ckpt").state.step ==
          c.state.step);
  }
  // A resume on other hardware (a preempted job restarted elsewhere) goes on, says so, and keeps
  // both: the record names each, and the report compares its time with no other point's.
  {
    const fs::path copy = dir / "hardware-copy";
    fs::copy(out, copy, fs::copy_options::recursive);
    const fs::path ckpt = copy / "moe-i" / "checkpoint" / "state.ckpt";
    Checkpoint edited = read_checkpoint(ckpt);
    REQUIRE(edited.state.hardware.size() == 1);  // one session so far, on this machine
    const std::string here = edited.state.hardware[0];
    CHECK(here == record(out, "moe-i")["hardware"][0]);
    edited.state.hardware = {"Elsewhere CPU 9000"};
    write_checkpoint(ckpt, edited);
    const Result r = run_cli({"run", sweep, "--out", copy.string()});  // dense trains here
    REQUIRE_MESSAGE(r.status == 0, r.err);
    CHECK_MESSAGE(r.out.find(fmt::format("trained on Elsewhere CPU 9000 until step {}, and now on "
                                         "{}: the record's time and FLOP rate are a mix",
                                         c.state.step, here)) != std::string::npos,
                  r.out);
    const json moe = record(copy, "moe-i");
    CHECK(moe["hardware"] == json::array({"Elsewhere CPU 9000", here}));
    CHECK(record(copy, "dense")["hardware"] == json::array({here}));
    CHECK_FALSE(moe.contains("mfu"));  // no peak is known for a CPU
    const Result rep = run_cli({"report", copy.string()});
    REQUIRE_MESSAGE(rep.status == 0, rep.err);
    const size_t row = rep.out.find("\nmoe-i ", rep.out.find("train time vs dense"));
    REQUIRE(row != std::string::npos);
    const std::string line = rep.out.substr(row + 1, rep.out.find('\n', row + 1) - row - 1);
    CHECK_MESSAGE(line.find("(Elsewhere CPU 9000 then " + here + ")") != std::string::npos, line);
    CHECK_MESSAGE(line.ends_with(" -"), line);  // no time ratio against the dense baseline
    // A checkpoint from before the hardware was kept: the first part's is "not recorded".
    const fs::path older = dir / "hardware-older";
    fs::copy(out, older, fs::copy_options::recursive);
    const fs::path ck2 = older / "moe-i" / "checkpoint" / "state.ckpt";
    Checkpoint old = read_checkpoint(ck2);
    old.state.hardware.clear();
    write_checkpoint(ck2, old);
    const Result o = run_cli({"run", sweep, "--point", "moe-i", "--out", older.string()});
    REQUIRE_MESSAGE(o.status == 0, o.err);
    CHECK_MESSAGE(o.out.find("trained on hardware its checkpoint does not name until step") !=
                      std::string::npos,
                  o.out);
    CHECK(record(older, "moe-i")["hardware"] == json::array({"not recorded", here}));
  }
  const Result again = run_cli({"run", sweep, "--point", "moe-i", "--out", out.string()});
  CHECK(again.status == 0);
  CHECK(record(out, "moe-i")["status"] == "complete");
  CHECK(record(out, "moe-i")["measured"]["tokens"]["consumed"].get<int64_t>() == 400 * 4 * 16);
  // Resumed on the same hardware: named once, and no notice.
  CHECK(record(out, "moe-i")["hardware"].size() == 1);
  CHECK(again.out.find("and now on") == std::string::npos);
}

TEST_CASE("a record gives its MFU only for one kind of hardware whose peak is known") {
  using namespace moeplan::backend;
  const Plan p = tiny_plan("dense", true, 10, 4, 50);
  const json pj = moeplan::plan_to_json(p);
  RunState st;
  // One product of 2·1000·1000·500 = 1e9 FLOPs [exact/causal] in 2 s on 2 devices: 2.5e8 FLOP/s
  // a device, a quarter of a 1e9 FLOP/s peak.
  st.train_flops.add_gemm(moeplan::FlopCategory::dense_ffn, moeplan::Phase::forward, 1000, 1000,
                          500);
  st.train_seconds = 2.0;
  st.hardware = {"GPU X"};
  RecordInputs in;
  in.plan = &p;
  in.plan_json = &pj;
  in.state = &st;
  in.status = "running";
  in.device = "cuda";
  in.world_size = 2;
  in.peak_flops_per_second = 1e9;
  json r = make_record(in);
  CHECK(r["hardware"] == json::array({"GPU X"}));
  CHECK(r["peak_flops_per_second_per_device"].get<double>() == 1e9);
  CHECK(r["mfu"].get<double>() == doctest::Approx(0.25).epsilon(1e-12));
  // Resumed on other hardware: which peak would it be? None is given.
  st.hardware.push_back("GPU Y");
  r = make_record(in);
  CHECK(r["hardware"] == json::array({"GPU X", "GPU Y"}));
  CHECK_FALSE(r.contains("mfu"));
  CHECK_FALSE(r.contains("peak_flops_per_second_per_device"));
  // A peak not known (a CPU, a GPU moeplan has no figure for): none either.
  st.hardware = {"GPU X"};
  in.peak_flops_per_second = 0;
  CHECK_FALSE(make_record(in).contains("mfu"));
  // Resumed under --elastic on 4 ranks, then on 2: 2 s were not spent on 2 devices throughout,
  // so no MFU. Passes changed alone (2 ranks throughout): the devices' seconds are whole, the
  // MFU stands.
  in.peak_flops_per_second = 1e9;
  st.layouts = {{0, 4, 0, 0, false, ""}, {7, 2, 0, 0, false, ""}};
  r = make_record(in);
  CHECK(r["layouts"] == json::parse(R"([
      {"from_step":0,"world_size":4,"micro_batch":0,"threads":0,"optimizer_sharded":false,
       "kernels":""},
      {"from_step":7,"world_size":2,"micro_batch":0,"threads":0,"optimizer_sharded":false,
       "kernels":""}])"));
  CHECK_FALSE(r.contains("mfu"));
  st.layouts = {{0, 2, 0, 0, false, ""}, {7, 2, 3, 0, false, ""}};
  r = make_record(in);
  CHECK(r["layouts"][1]["micro_batch"] == 3);
  CHECK(r["mfu"].get<double>() == doctest::Approx(0.25).epsilon(1e-12));
  st.layouts.clear();
  CHECK_FALSE(make_record(in).contains("layouts"));
  // Which peak it is: the maker's, or one given (--peak-tflops).
  CHECK(make_record(in)["peak_source"] == "built-in");
  in.peak_given = true;
  CHECK(make_record(in)["peak_source"] == "given");
  in.peak_flops_per_second = 0;
  CHECK_FALSE(make_record(in).contains("peak_source"));
  // The evaluations' training seconds, one a val_curve entry; none where a resume began from a
  // checkpoint that had none (its first evaluations' times are not known).
  CHECK_FALSE(make_record(in).contains("val_curve_train_seconds"));  // no evaluation yet
  st.val_curve = json::array({{{"step", 2}, {"val_loss", 1.4}, {"val_bpc", 2.0}},
                              {{"step", 4}, {"val_loss", 1.3}, {"val_bpc", 1.9}}});
  st.val_seconds = {0.75, 1.5};
  CHECK(make_record(in)["val_curve_train_seconds"] == json::array({0.75, 1.5}));
  st.val_seconds = {1.5};
  CHECK_FALSE(make_record(in).contains("val_curve_train_seconds"));
}

TEST_CASE("moeplan run --peak-tflops: a CPU run's MFU against the peak given, said so") {
  const fs::path dir = fresh_dir("peak_tflops");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 8, 2, 20), {tiny_plan("moe-a", false, 8, 2, 20)}),
      dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  // 1e-3 TFLOP/s: a peak of 1e9 FLOP/s a device.
  const Result r = run_cli({"run", sweep, "--point", "dense", "--out", (dir / "runs").string(),
                            "--peak-tflops", "1e-3"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const json got = record(dir / "runs", "dense");
  CHECK(got["peak_flops_per_second_per_device"].get<double>() == 1e9);
  CHECK(got["peak_source"] == "given");
  // MFU by hand from the record's C [exact/causal] and training time, one device.
  const double c_exact = got["measured"]["flops"]["conventions"]["exact/causal"].get<double>();
  const double secs = got["train_seconds"].get<double>();
  REQUIRE(secs > 0);
  CHECK(got["mfu"].get<double>() == doctest::Approx(c_exact / secs / 1e9).epsilon(1e-9));
  CHECK_MESSAGE(r.out.find(" % of the given peak") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find(fmt::format("(training at MFU {:.1f} % [exact/causal] of the given "
                                       "peak) -> ",
                                       100 * got["mfu"].get<double>())) != std::string::npos,
                r.out);
  // The report gives the column, marks the cell and says what "(given)" means.
  const Result rep = run_cli({"report", (dir / "runs").string()});
  REQUIRE_MESSAGE(rep.status == 0, rep.err);
  CHECK_MESSAGE(rep.out.find(fmt::format("{:.1f}% (given)", 100 * got["mfu"].get<double>())) !=
                    std::string::npos,
                rep.out);
  CHECK_MESSAGE(rep.out.find("(given): over the peak given to moeplan run --peak-tflops") !=
                    std::string::npos,
                rep.out);
  // A peak far below what the run reached (1 FLOP/s): over 100 %, and the line asks whether the
  // figure was one device's in TFLOP/s. The estimate says the same.
  const Result low = run_cli({"run", sweep, "--point", "dense", "--out", (dir / "low").string(),
                              "--peak-tflops", "1e-12", "--estimate", "2"});
  REQUIRE_MESSAGE(low.status == 0, low.err);
  CHECK_MESSAGE(low.out.find("% of the given peak: over 100 %; is --peak-tflops one device's "
                             "peak in TFLOP/s?)") != std::string::npos,
                low.out);
  // Without the flag a CPU has no peak, so no MFU.
  const Result plain =
      run_cli({"run", sweep, "--point", "dense", "--out", (dir / "plain").string()});
  REQUIRE_MESSAGE(plain.status == 0, plain.err);
  CHECK_FALSE(record(dir / "plain", "dense").contains("mfu"));
  CHECK_FALSE(record(dir / "plain", "dense").contains("peak_source"));
  CHECK(plain.out.find("MFU") == std::string::npos);  // a CPU is not told it has no peak
  // Refused in one line naming the value, before anything is written.
  for (const auto& [value, needle] : std::vector<std::pair<std::string, std::string>>{
           {"0", "--peak-tflops 0 must be > 0: one device's dense peak in TFLOP/s"},
           {"-5", "--peak-tflops -5 must be > 0"},
           {"fast", "--peak-tflops: 'fast' is not a number"},
           {"nan", "--peak-tflops: 'nan' is not a number"},
           {"9.89e14", "--peak-tflops 9.89e14 is no device's peak in TFLOP/s"},
           {"", "'' is empty"}}) {
    INFO("--peak-tflops '" << value << "'");
    const Result bad =
        run_cli({"run", sweep, "--out", (dir / "bad").string(), "--peak-tflops", value});
    CHECK(bad.status == 2);
    CHECK_MESSAGE(one_line(bad.err), bad.err);
    CHECK_MESSAGE(bad.err.find(needle) != std::string::npos, bad.err);
    CHECK_FALSE(fs::exists(dir / "bad"));
  }
}

TEST_CASE("moeplan run --estimate N --profile on the cpu: where a step's time goes, by phase") {
  const fs::path dir = fresh_dir("profile_cpu");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 8, 2, 20), {tiny_plan("moe-a", false, 12, 2, 20)}),
      dir / "sweep.toml");
  const Result r = run_cli({"run", (dir / "sweep.toml").string(), "--out", (dir / "runs").string(),
                            "--estimate", "3", "--profile"});
  REQUIRE_MESSAGE(r.status == 0, r.err);
  CHECK_FALSE(fs::exists(dir / "runs"));  // an estimate writes nothing
  const PhaseTable dense = phase_table(r.out, "[dense 1/2]", 3);
  const PhaseTable moe = phase_table(r.out, "[moe-a 2/2]", 3);
  for (const PhaseTable* t : {&dense, &moe}) {
    REQUIRE_MESSAGE(t->heading_sum > 0, r.out);
    CHECK_MESSAGE(t->adds_up(), r.out);
    for (const char* phase : {"zero grads", "fwd embedding", "fwd attention core", "fwd lm head",
                              "cross-entropy", "bwd attention core", "grad norm + adamw"})
      CHECK_MESSAGE(t->ms.count(phase) == 1, phase, "\n", r.out);
  }
  // The MoE point's layers have a router, experts and the rest; the dense point's none of them.
  for (const char* phase : {"fwd router + sort", "fwd routed experts", "fwd moe rest",
                            "bwd shared expert + combine", "bwd routed experts", "bwd moe rest"}) {
    CHECK_MESSAGE(moe.ms.count(phase) == 1, phase, "\n", r.out);
    CHECK_MESSAGE(dense.ms.count(phase) == 0, phase, "\n", r.out);
  }
  CHECK(dense.ms.count("fwd dense ffn") == 1);
  CHECK(dense.ms.count("erc loss") == 0);  // no ERC loss in this manifest
  // The estimate's last line: the MoE point's projected training time against the baseline's,
  // (12 steps x its median step) over (8 x the baseline's), by hand from the figures it prints.
  const std::string head = "projected train time vs dense (dense: 8 steps x ";
  const size_t at = r.out.find(head);
  REQUIRE_MESSAGE(at != std::string::npos, r.out);
  const double dense_ms = std::stod(r.out.substr(at + head.size()));
  const std::string aside = "evaluations aside; work: useful FLOPs [exact/causal]): moe-a ";
  const size_t moe_at = r.out.find(aside, at);
  REQUIRE_MESSAGE(moe_at != std::string::npos, r.out);
  const std::string rest = r.out.substr(moe_at + aside.size());
  const double ratio = std::stod(rest);
  const size_t x = rest.find("x (12 steps x ");
  REQUIRE_MESSAGE(x != std::string::npos, rest);
  const double moe_ms = std::stod(rest.substr(x + std::string("x (12 steps x ").size()));
  REQUIRE(dense_ms > 0);
  const double want = 12 * moe_ms / (8 * dense_ms);
  // Printed to 0.01 (the ratio) and 0.001 ms (each step): within what those roundings allow.
  CHECK(std::abs(ratio - want) <= 0.005 + want * (0.0005 / moe_ms + 0.0005 / dense_ms) + 1e-9);
  // Why: the work (12 steps of useful FLOPs each) over the dense's (8), at a rate that is the
  // work's ratio over the time's. The work by hand from the analytic ledger of a step of 2
  // sequences (dropless, as the manifest trains), not from the engine's count.
  const size_t w = rest.find("; work ");
  REQUIRE_MESSAGE(w != std::string::npos, rest);
  const double work = std::stod(rest.substr(w + 7));
  const size_t at_rate = rest.find("x at ", w);
  REQUIRE_MESSAGE(at_rate != std::string::npos, rest);
  const double rate = std::stod(rest.substr(at_rate + 5));
  CHECK_MESSAGE(rest.find("x the rate)", at_rate) != std::string::npos, rest);
  const double step_dense = double(moeplan::exact_step_ledger(tiny_arch(true, 8), 2).useful());
  const double step_moe = double(moeplan::exact_step_ledger(tiny_arch(false, 8), 2).useful());
  CHECK(work == doctest::Approx(12 * step_moe / (8 * step_dense)).epsilon(0.005 / work));
  CHECK(rate == doctest::Approx(work / ratio).epsilon(0.02));  // both printed to 0.01
  // One point alone (--point) has nothing to be compared with: no such line.
  const Result one = run_cli({"run", (dir / "sweep.toml").string(), "--out",
                              (dir / "runs").string(), "--point", "moe-a", "--estimate", "1"});
  REQUIRE_MESSAGE(one.status == 0, one.err);
  CHECK(one.out.find("projected train time vs dense") == std::string::npos);
}

TEST_CASE("the CPU's model name is the first 'model name' line of /proc/cpuinfo's text") {
  // Written as Linux prints it on x86 (a tab before the colon) and with a key that only begins
  // with the same words.
  CHECK(moeplan::backend::cpu_model_name("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: "
                                         "85\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz  \n"
                                         "model name\t: another\n") ==
        "Intel(R) Xeon(R) CPU @ 2.20GHz");
  CHECK(moeplan::backend::cpu_model_name("model names: x\nmodel name : AMD EPYC 7B13\r\n") ==
        "AMD EPYC 7B13");
  // An ARM kernel's text has no such line; an empty value is none either.
  CHECK(moeplan::backend::cpu_model_name("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: "
                                         "0xd0c\n") == "");
  CHECK(moeplan::backend::cpu_model_name("model name\t:   \n") == "");
  CHECK(moeplan::backend::cpu_model_name("") == "");
}

// Gradient accumulation end to end: the same points in passes of 2 sequences (2+2+1 of a batch
// of 5) read the same windows and execute the same products as in one pass a step.
TEST_CASE("moeplan run --micro-batch 2: the one-pass run's tokens and ledger; resumes keep it") {
  const fs::path dir = fresh_dir("micro_batch");
  write_manifest_atomic(
      tiny_manifest(tiny_plan("dense", true, 20, 5, 50), {tiny_plan("moe-m", false, 400, 5, 50)}),
      dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const Result one = run_cli({"run", sweep, "--point", "dense", "--out", (dir / "a").string()});
  REQUIRE_MESSAGE(one.status == 0, one.err);
  const Result acc = run_cli({"run", sweep, "--point", "dense", "--out", (dir / "b").string(),
                              "--micro-batch", "2"});
  REQUIRE_MESSAGE(acc.status == 0, acc.err);
  CHECK_MESSAGE(acc.out.find("[dense 1/1] cpu (eigen-fp32): passes of 2 sequences\n") !=
                    std::string::npos,
                acc.out);
  const json ra = record(dir / "a", "dense"), rb = record(dir / "b", "dense");
  CHECK(ra["pass_seqs"] == 5);
  CHECK(rb["pass_seqs"] == 2);
  CHECK(ra["kernels_requested"] == "");  // none asked for: auto
  CHECK(ra["threads_requested"] == 0);
  CHECK(ra["measured"]["tokens"] == rb["measured"]["tokens"]);
  CHECK(ra["measured"]["flops"] == rb["measured"]["flops"]);
  for (auto& [k, v] : rb["measured"]["matches_plan"].items()) CHECK_MESSAGE(v == true, k);
  // The dense model's step is the same sum in another order: the curves agree to rounding.
  const double la = ra["loss_curve"].back()["train_loss"].get<double>();
  const double lb = rb["loss_curve"].back()["train_loss"].get<double>();
  CHECK(lb == doctest::Approx(la).epsilon(1e-4));
  CHECK(rb["final_val_bpc"].get<double>() ==
        doctest::Approx(ra["final_val_bpc"].get<double>()).epsilon(1e-4));
  // The report keeps times of runs in passes apart from one-pass runs' (its device label).
  const Result rep = run_cli({"report", (dir / "b").string()});
  CHECK(rep.status == 0);
  CHECK_MESSAGE(
      rep.out.find(fmt::format("cpu ({}) eigen-fp32 passes of 2",
                               rb["hardware"][0].get<std::string>())) != std::string::npos,
      rep.out);

  // Interrupted in passes of 2, the point resumes only in passes of 2.
  const fs::path out = dir / "c";
  const pid_t pid = spawn({"run", sweep, "--point", "moe-m", "--out", out.string(),
                           "--checkpoint-every", "50", "--micro-batch", "2"},
                          dir / "c.out", dir / "c.err");
  wait_for_file(out / "moe-m" / "record.json");
  ::kill(pid, SIGINT);
  CHECK(wait_status(pid) == 130);
  REQUIRE_MESSAGE(record(out, "moe-m")["status"] == "running", "finished before the interrupt");
  const std::string before = read_file(out / "moe-m" / "record.json");
  const Result other = run_cli({"run", sweep, "--point", "moe-m", "--out", out.string(),
                                "--micro-batch", "3"});
  CHECK(other.status == 2);
  CHECK(one_line(other.err));
  CHECK_MESSAGE(other.err.find("was trained with --micro-batch 2, this run asks for 3; resume "
                               "with --micro-batch 2") != std::string::npos,
                other.err);
  CHECK(read_file(out / "moe-m" / "record.json") == before);
  CHECK_MESSAGE(other.err.find("or add --elastic to go on in the new passes") != std::string::npos,
                other.err);
  {  // --elastic: the point goes on in passes of 3, says so, and its record keeps each layout.
    const fs::path copy = dir / "elastic";
    fs::copy(out, copy, fs::copy_options::recursive);
    const int64_t at = read_checkpoint(copy / "moe-m" / "checkpoint" / "state.ckpt").state.step;
    const Result go = run_cli({"run", sweep, "--point", "moe-m", "--out", copy.string(),
                               "--micro-batch", "3", "--elastic"});
    REQUIRE_MESSAGE(go.status == 0, go.err);
    CHECK_MESSAGE(go.out.find(fmt::format("resuming at step {} in another layout (--micro-batch "
                                          "2 -> 3): the steps from here sum in another order "
                                          "and take the auxiliary losses over other groups of "
                                          "sequences, so",
                                          at)) != std::string::npos,
                  go.out);
    const json re = record(copy, "moe-m");
    CHECK(re["status"] == "complete");
    CHECK(re["pass_seqs"] == 3);
    REQUIRE(re["layouts"].size() == 2);
    CHECK(re["layouts"][0]["from_step"] == 0);
    CHECK(re["layouts"][0]["micro_batch"] == 2);
    CHECK(re["layouts"][1]["from_step"] == at);
    CHECK(re["layouts"][1]["micro_batch"] == 3);
    CHECK(re["layouts"][1]["threads"] == re["layouts"][0]["threads"]);
    // The ledgers are the plan's whatever the passes: 400 steps of 5 windows of 16.
    CHECK(re["measured"]["tokens"]["consumed"].get<int64_t>() == 400 * 5 * 16);
    for (auto& [k, v] : re["measured"]["matches_plan"].items()) CHECK_MESSAGE(v == true, k);
    const Result rep = run_cli({"report", copy.string()});
    CHECK(rep.status == 0);
    CHECK_MESSAGE(rep.out.find(fmt::format("passes of 3, another layout from step {}", at)) !=
                      std::string::npos,
                  rep.out);
  }
  {  // The optimizer's sharding is part of the layout too. (A CPU run cannot shard: the
     // checkpoint is edited to say it was, as a --nproc 2 --shard-optimizer run's would.)
    const fs::path copy = dir / "was-sharded";
    fs::copy(out, copy, fs::copy_options::recursive);
    const fs::path ck = copy / "moe-m" / "checkpoint" / "state.ckpt";
    Checkpoint c = read_checkpoint(ck);
    REQUIRE(c.state.optimizer_sharded == std::optional<bool>(false));
    c.state.optimizer_sharded = true;
    write_checkpoint(ck, c);
    const Result no =
        run_cli({"run", sweep, "--point", "moe-m", "--out", copy.string(), "--micro-batch", "2"});
    CHECK(no.status == 2);
    CHECK(one_line(no.err));
    CHECK_MESSAGE(no.err.find("was trained with --shard-optimizer, this run goes without it; "
                              "resume with it (the sharded step sums the gradient norm in another "
                              "order), add --elastic to go on without it") != std::string::npos,
                  no.err);
    const Result go = run_cli({"run", sweep, "--point", "moe-m", "--out", copy.string(),
                               "--micro-batch", "2", "--elastic"});
    REQUIRE_MESSAGE(go.status == 0, go.err);
    CHECK_MESSAGE(go.out.find(fmt::format("resuming at step {} in another layout "
                                          "(--shard-optimizer on -> off): the steps from here "
                                          "sum in another order, so this is not",
                                          c.state.step)) != std::string::npos,
                  go.out);
    const json re = record(copy, "moe-m");
    REQUIRE(re["layouts"].size() == 2);
    CHECK(re["layouts"][0]["optimizer_sharded"] == true);
    CHECK(re["layouts"][1]["optimizer_sharded"] == false);
    CHECK(re["optimizer_sharded"] == false);
  }
  {  // Asking for the whole batch or more is one pass, as 0 is: a one-pass checkpoint resumes.
    const fs::path copy = dir / "one-pass";
    fs::copy(out, copy, fs::copy_options::recursive);
    const fs::path ck = copy / "moe-m" / "checkpoint" / "state.ckpt";
    Checkpoint c = read_checkpoint(ck);
    c.state.micro_batch_seqs = 0;
    write_checkpoint(ck, c);
    const Result more = run_cli({"run", sweep, "--point", "moe-m", "--out", copy.string(),
                                 "--micro-batch", "9"});  // the plan's batch is 5
    CHECK_MESSAGE(more.status == 0, more.err);
    CHECK(record(copy, "moe-m")["status"] == "complete");
  }
  // The whole sweep is refused as well, and before the dense point (first, untrained) trains.
  const Result sweep_other = run_cli({"run", sweep, "--out", out.string(), "--micro-batch", "3"});
  CHECK(sweep_other.status == 2);
  CHECK(one_line(sweep_other.err));
  CHECK_MESSAGE(sweep_other.err.find("was trained with --micro-batch 2, this run asks for 3") !=
                    std::string::npos,
                sweep_other.err);
  CHECK_FALSE(fs::exists(out / "dense"));
  {  // A checkpoint whose body is damaged is refused before the dense point trains, too.
    const fs::path ck = out / "moe-m" / "checkpoint" / "state.ckpt";
    const std::string good = read_file(ck);
    std::string bad = good;
    bad[bad.size() / 2] ^= 0x5a;
    write_file_atomic(ck, bad);
    const Result corrupt = run_cli({"run", sweep, "--out", out.string(), "--micro-batch", "2"});
    CHECK(corrupt.status == 2);
    CHECK(one_line(corrupt.err));
    CHECK_MESSAGE(corrupt.err.find("is corrupt (checksum mismatch)") != std::string::npos,
                  corrupt.err);
    CHECK_FALSE(fs::exists(out / "dense"));
    write_file_atomic(ck, good);
  }
  // Nor on another device: the record's times would mix two devices'.
  const Result cuda = run_cli({"run", sweep, "--point", "moe-m", "--out", out.string(),
                               "--micro-batch", "2", "--device", "cuda"},
                              MOEPLAN_EMULATED_BINARY);
  CHECK(cuda.status == 2);
  CHECK(one_line(cuda.err));
  CHECK_MESSAGE(cuda.err.find("was trained with --device cpu, this run asks for cuda; resume "
                              "with --device cpu") != std::string::npos,
                cuda.err);
  CHECK(read_file(out / "moe-m" / "record.json") == before);
  const Result same = run_cli({"run", sweep, "--point", "moe-m", "--out", out.string(),
                               "--micro-batch", "2"});
  REQUIRE_MESSAGE(same.status == 0, same.err);
  const json rc = record(out, "moe-m");
  CHECK(rc["status"] == "complete");
  CHECK(rc["pass_seqs"] == 2);
  CHECK_FALSE(rc.contains("layouts"));  // resumed in the layout it began in
  CHECK(same.out.find("another layout") == std::string::npos);
  CHECK(rc["measured"]["tokens"]["consumed"].get<int64_t>() == 400 * 5 * 16);

  // A fresh estimate: every point's whole plan; the --out folder is not even made.
  const Result est = run_cli({"run", sweep, "--out", (dir / "e").string(), "--estimate", "1"});
  REQUIRE_MESSAGE(est.status == 0, est.err);
  CHECK_MESSAGE(est.out.find("[dense 1/2] estimate: ") != std::string::npos, est.out);
  CHECK_MESSAGE(est.out.find("(median of 1, after 1 warm-up) x 20 steps + 1 evaluations x ") !=
                    std::string::npos,
                est.out);  // 20 steps, evaluated every 25 and after the last: once
  CHECK_MESSAGE(est.out.find("x 400 steps + 16 evaluations x ") != std::string::npos, est.out);
  // Totals under 10 s to 0.1 s: a 0.38 s estimate read "= 0s".
  for (size_t at = est.out.find(" s = "); at != std::string::npos;
       at = est.out.find(" s = ", at + 1)) {
    const std::string total = est.out.substr(at + 5, est.out.find(';', at) - at - 5);
    // Seconds without a decimal point are 10 or more ("12s"); under 10, one decimal ("0.4s").
    if (total.find_first_of("mhdy") == std::string::npos && total.find('.') == std::string::npos)
      CHECK_MESSAGE(std::stod(total) >= 10, total);
  }
  CHECK_MESSAGE(est.out.find("estimate for 2 point(s) on cpu: ") != std::string::npos, est.out);
  CHECK_FALSE(fs::exists(dir / "e"));
  // More steps asked for than a point has: its own 20 are timed (1000 ran 1000 steps of it).
  const Result est_more = run_cli(
      {"run", sweep, "--point", "dense", "--out", (dir / "e").string(), "--estimate", "1000"});
  REQUIRE_MESSAGE(est_more.status == 0, est_more.err);
  CHECK_MESSAGE(
      est_more.out.find("(median of 20, after 1 warm-up) x 20 steps") != std::string::npos,
      est_more.out);
  const Result est_bad = run_cli({"run", sweep, "--estimate", "-2"});
  CHECK(est_bad.status == 2);
  CHECK(one_line(est_bad.err));
  CHECK_MESSAGE(est_bad.err.find("--estimate -2 must be >= 1") != std::string::npos, est_bad.err);
  // --estimate 0 is refused too: it once meant "train", and trained the whole sweep unasked.
  const Result est_zero = run_cli({"run", sweep, "--out", (dir / "z").string(), "--estimate", "0"});
  CHECK(est_zero.status == 2);
  CHECK(one_line(est_zero.err));
  CHECK_MESSAGE(est_zero.err.find("--estimate 0 must be >= 1 (steps to time each point by); "
                                  "leave it out to train") != std::string::npos,
                est_zero.err);
  CHECK_FALSE(fs::exists(dir / "z"));
  const Result bad = run_cli({"run", sweep, "--out", (dir / "d").string(), "--micro-batch", "-1"});
  CHECK(bad.status == 2);
  CHECK(one_line(bad.err));
  CHECK_MESSAGE(bad.err.find("--micro-batch -1 must be >= 1 (or 0: the whole batch in one pass)") !=
                    std::string::npos,
                bad.err);
  CHECK_FALSE(fs::exists(dir / "d" / "dense" / "record.json"));
}

// The CUDA engine end to end on the CPU emulation of CUDA (tests/backend_cuda/emu): the same
// point through `moeplan run --device cpu` and `--device cuda` with the default and with the
// register-resident attention and tiled expert kernels, and with the strided-batched experts.
// The ledgers equal the CPU's but for what only the CUDA kernels execute (padding: the masked half
// of cuBLAS's attention squares and the experts' zero rows, tiled or padded; recompute: the fused
// backward's scores), and tokens are identical.
TEST_CASE("moeplan run --device cuda (emulated): the CPU's tokens and ledger, kernels recorded") {
  const fs::path dir = fresh_dir("cuda_emulated");
  // Head width 16: the fused kernels take 16, 32, 64 or 128.
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 12, 4, 40, 3e-3, 16),
                                      {tiny_plan("moe-a", false, 12, 4, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const Result cpu = run_cli({"run", sweep, "--out", (dir / "cpu").string(), "--point", "moe-a"});
  REQUIRE_MESSAGE(cpu.status == 0, cpu.err);
  const json want = record(dir / "cpu", "moe-a");
  struct Variant {
    std::string kernels, label;
  };
  for (const Variant& v :
       {Variant{"", "attention=fused_mma_lean,experts=tiled128"},  // auto at head width 16
        Variant{"attention=cublas,experts=grouped", "attention=cublas,experts=grouped"},
        Variant{"experts=batched", "attention=fused_mma_lean,experts=batched"},
        Variant{"experts=wgmma", "attention=fused_mma_lean,experts=wgmma"},
        Variant{"launch=pdl", "attention=fused_mma_lean,experts=tiled128,launch=pdl"},
        Variant{"router=tiled", "attention=fused_mma_lean,experts=tiled128,router=tiled"}}) {
    INFO("kernels " << v.label);
    const fs::path out = dir / ("cuda-" + std::to_string(v.kernels.size()));
    std::vector<std::string> args = {"run",     sweep,   "--out",    out.string(),
                                     "--point", "moe-a", "--device", "cuda"};
    if (!v.kernels.empty()) args.insert(args.end(), {"--kernels", v.kernels});
    const Result r = run_cli(args, MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(r.status == 0, r.err);
    const json got = record(out, "moe-a");
    CHECK(got["status"] == "complete");
    CHECK(got["device"] == "cuda");
    CHECK(got["hardware"] == json::array({"moeplan CUDA emulator (CPU)"}));
    CHECK_FALSE(got.contains("mfu"));  // no peak known for it: no MFU against a guessed one
    CHECK_MESSAGE(r.out.find("no MFU: moeplan has no dense peak figure for 'moeplan CUDA emulator "
                             "(CPU)'; give one device's with --peak-tflops X") != std::string::npos,
                  r.out);
    CHECK(got["kernels"] == v.label);
    // The most memory its buffers held, of the emulated device's 1 GiB; the CPU's has none.
    REQUIRE(got.contains("device_memory"));
    const json& memory = got["device_memory"];
    CHECK(memory["device_bytes"] == int64_t(1) << 30);
    CHECK(memory["peak_bytes"].get<int64_t>() > 0);
    CHECK(memory["peak_bytes"] < memory["device_bytes"]);
    CHECK_FALSE(want.contains("device_memory"));
    CHECK_MESSAGE(r.out.find(", device memory at most ") != std::string::npos, r.out);
    CHECK_MESSAGE(r.out.find(" of 1.00 GiB -> ") != std::string::npos, r.out);
    CHECK(got["measured"]["tokens"] == want["measured"]["tokens"]);
    for (auto& [k, val] : got["measured"]["matches_plan"].items()) CHECK_MESSAGE(val == true, k);
    for (auto& [cat, phases] : got["measured"]["flops"]["by_category"].items())
      if (cat != "padding" && cat != "recompute") {
        INFO(cat);
        CHECK(phases == want["measured"]["flops"]["by_category"][cat]);
      }
    // C is the useful work in every convention: the device's padding (cuBLAS attention's full
    // squares, tiled experts' unfilled rows) and recompute are executed, not C. Same C as the
    // CPU's, which executes neither (it once counted them under exact: +5 % to several times).
    const json& gf = got["measured"]["flops"];
    const json& wf = want["measured"]["flops"];
    CHECK(gf["total"] != wf["total"]);  // the device executed more: the check below means something
    for (const char* key : {"conventions", "per_token"})
      for (auto& [conv, v] : wf[key].items()) {
        INFO(key << " " << conv);
        CHECK(gf[key][conv].get<double>() == doctest::Approx(v.get<double>()).epsilon(1e-12));
      }
    CHECK(got["measured"]["compute"]["paper"] == want["measured"]["compute"]["paper"]);
    // bf16 products against the CPU's fp32 over 12 steps: the same curve within bf16 tolerance.
    const double lc = want["loss_curve"].back()["train_loss"].get<double>();
    const double lg = got["loss_curve"].back()["train_loss"].get<double>();
    CHECK(std::abs(lg - lc) / lc < 2e-2);
  }
  // experts=wgmma and launch=pdl on a device of another compute capability (the emulation
  // pretends): refused in one line that names the device's, before the point trains or writes a
  // record.
  for (const char* kernels : {"experts=wgmma", "launch=pdl"}) {
    INFO(kernels);
    setenv("MOEPLAN_EMU_COMPUTE", "8.0", 1);
    const Result r = run_cli({"run", sweep, "--out", (dir / "cuda-8.0").string(), "--point",
                              "moe-a", "--device", "cuda", "--kernels", kernels},
                             MOEPLAN_EMULATED_BINARY);
    unsetenv("MOEPLAN_EMU_COMPUTE");
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    CHECK_MESSAGE(r.err.find("compute capability 9.0") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("is 8.0") != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(dir / "cuda-8.0" / "moe-a" / "record.json"));
  }
  // A GPU older than the kernels' compute capability 8.0 (a V100's 7.0, a T4's 7.5): the build
  // has no code it runs (the emulation follows a default build's, sm_80 and sm_90 code and
  // compute_90 PTX), refused in one line naming the GPU and the code, before the point trains.
  setenv("MOEPLAN_EMU_COMPUTE", "7.5", 1);
  {
    const Result r = run_cli({"run", sweep, "--out", (dir / "cuda-7.5").string(), "--point",
                              "moe-a", "--device", "cuda"},
                             MOEPLAN_EMULATED_BINARY);
    unsetenv("MOEPLAN_EMU_COMPUTE");
    CHECK(r.status == 2);
    CHECK_MESSAGE(one_line(r.err), r.err);
    for (const char* part :
         {"GPU 0 (moeplan CUDA emulator (CPU), compute capability 7.5) cannot run moeplan's "
          "kernels, which need compute capability 8.0 or later",
          "this build's code: 80-real,90-real,90-virtual (cudaErrorNoKernelImageForDevice",
          "train with --device cpu"})
      CHECK_MESSAGE(r.err.find(part) != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(dir / "cuda-7.5" / "moe-a" / "record.json"));
  }
  unsetenv("MOEPLAN_EMU_COMPUTE");
  // Head width 128 on a GPU that allows a block 99 KiB of shared memory (compute capability 8.6,
  // as an A40 or an RTX 3090): fused_mma's backward asks 120.5 KiB, so auto takes cuBLAS's
  // attention, the engine's line says why, and the point trains to the CPU's ledger; asked for
  // by name, fused_mma is refused in one line. On an A100 (8.0, 163 KiB) auto takes fused_mma.
  {
    write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 4, 2, 40, 3e-3, 128),
                                        {tiny_plan("moe-w", false, 4, 2, 40, 3e-3, 128)}),
                          dir / "wide.toml");
    const std::string wide = (dir / "wide.toml").string();
    const Result cpu128 =
        run_cli({"run", wide, "--out", (dir / "cpu-128").string(), "--point", "dense"});
    REQUIRE_MESSAGE(cpu128.status == 0, cpu128.err);
    struct Gpu {
      const char* compute;
      std::string kernels;
    };
    for (const Gpu& g : {Gpu{"8.6", "attention=cublas,experts=tiled128"},
                         Gpu{"8.0", "attention=fused_mma,experts=tiled128"}}) {
      INFO(g.compute);
      setenv("MOEPLAN_EMU_COMPUTE", g.compute, 1);
      const fs::path out = dir / (std::string("cuda-128-") + g.compute);
      const Result r =
          run_cli({"run", wide, "--out", out.string(), "--point", "dense", "--device", "cuda"},
                  MOEPLAN_EMULATED_BINARY);
      unsetenv("MOEPLAN_EMU_COMPUTE");
      REQUIRE_MESSAGE(r.status == 0, r.err);
      const bool small = std::string(g.compute) == "8.6";
      CHECK_MESSAGE((r.out.find(g.kernels + ", cuBLAS attention since fused_mma asks 120.5 KiB "
                                            "of shared memory a block at head width 128 and this "
                                            "GPU allows 99.0 KiB") != std::string::npos) == small,
                    r.out);
      const json got = record(out, "dense");
      CHECK(got["kernels"] == g.kernels);
      CHECK(got["measured"]["compute"]["paper"] ==
            record(dir / "cpu-128", "dense")["measured"]["compute"]["paper"]);
    }
    setenv("MOEPLAN_EMU_COMPUTE", "8.6", 1);
    const Result asked =
        run_cli({"run", wide, "--out", (dir / "cuda-128-asked").string(), "--point", "dense",
                 "--device", "cuda", "--kernels", "attention=fused_mma"},
                MOEPLAN_EMULATED_BINARY);
    unsetenv("MOEPLAN_EMU_COMPUTE");
    CHECK(asked.status == 2);
    CHECK_MESSAGE(one_line(asked.err), asked.err);
    CHECK_MESSAGE(asked.err.find("--kernels attention=fused_mma: its kernels ask 120.5 KiB of "
                                 "shared memory a block at head width 128; this device (moeplan "
                                 "CUDA emulator (CPU), compute capability 8.6) allows 99.0 KiB "
                                 "(valid here: cublas)") != std::string::npos,
                  asked.err);
    CHECK_FALSE(fs::exists(dir / "cuda-128-asked" / "dense" / "record.json"));
  }
  // A GPU whose dense bf16 peak the engine knows (the emulation pretends an H200's name): the
  // record names it and gives its MFU against 989 TFLOP/s (issue 6's figure for the H200's dense
  // bf16 peak), as do the progress and estimate lines.
  {
    setenv("MOEPLAN_EMU_DEVICE_NAME", "NVIDIA H200", 1);
    const Result h = run_cli(
        {"run", sweep, "--out", (dir / "h200").string(), "--point", "moe-a", "--device", "cuda"},
        MOEPLAN_EMULATED_BINARY);
    const Result he = run_cli({"run", sweep, "--out", (dir / "h200-estimate").string(), "--point",
                               "moe-a", "--device", "cuda", "--estimate", "1"},
                              MOEPLAN_EMULATED_BINARY);
    // A peak given for it replaces the maker's (a GPU held below its clocks, say).
    const Result hg =
        run_cli({"run", sweep, "--out", (dir / "h200-estimate").string(), "--point", "moe-a",
                 "--device", "cuda", "--estimate", "1", "--peak-tflops", "1e-9"},
                MOEPLAN_EMULATED_BINARY);
    unsetenv("MOEPLAN_EMU_DEVICE_NAME");
    REQUIRE_MESSAGE(h.status == 0, h.err);
    const json got = record(dir / "h200", "moe-a");
    CHECK(got["hardware"] == json::array({"NVIDIA H200"}));
    CHECK(got["peak_flops_per_second_per_device"].get<double>() == 989e12);
    // MFU by hand from the record's C [exact/causal] and training time, one device.
    const double c_exact = got["measured"]["flops"]["conventions"]["exact/causal"].get<double>();
    const double secs = got["train_seconds"].get<double>();
    REQUIRE(secs > 0);
    CHECK(got["mfu"].get<double>() == doctest::Approx(c_exact / secs / 989e12).epsilon(1e-9));
    CHECK_MESSAGE(h.out.find("FLOP/s [exact/causal] (MFU ") != std::string::npos, h.out);
    CHECK_MESSAGE(h.out.find(" % of the device peak)  ETA ") != std::string::npos, h.out);
    CHECK(h.out.find("no MFU") == std::string::npos);
    CHECK_MESSAGE(h.out.find(fmt::format("s (training at MFU {:.1f} % [exact/causal]), device "
                                         "memory at most ",
                                         100 * got["mfu"].get<double>())) != std::string::npos,
                  h.out);
    REQUIRE_MESSAGE(he.status == 0, he.err);
    CHECK_MESSAGE(he.out.find("FLOP/s [exact/causal] (MFU ") != std::string::npos, he.out);
    CHECK_MESSAGE(he.out.find(" % of the device peak)") != std::string::npos, he.out);
    REQUIRE_MESSAGE(hg.status == 0, hg.err);
    CHECK_MESSAGE(hg.out.find(" % of the given peak: over 100 %") != std::string::npos, hg.out);
    CHECK(hg.out.find("no MFU") == std::string::npos);
    const Result rep = run_cli({"report", (dir / "h200").string()});
    REQUIRE_MESSAGE(rep.status == 0, rep.err);
    CHECK_MESSAGE(
        rep.out.find("MFU [exact/causal useful, of the device peak]") != std::string::npos,
        rep.out);
    CHECK_MESSAGE(rep.out.find("cuda (NVIDIA H200) attention=") != std::string::npos, rep.out);
  }
  // --profile: as many steps again, phase by phase. Each phase a row of its milliseconds and its
  // share; the shares add to 100 % and the rows to the sum the heading gives.
  {
    const Result pr = run_cli({"run", sweep, "--out", (dir / "profile").string(), "--point",
                               "moe-a", "--device", "cuda", "--estimate", "1", "--profile"},
                              MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(pr.status == 0, pr.err);
    CHECK_FALSE(fs::exists(dir / "profile"));  // an estimate writes nothing
    const PhaseTable t = phase_table(pr.out, "[moe-a 1/1]", 1);
    REQUIRE_MESSAGE(t.heading_sum > 0, pr.out);
    for (const char* phase : {"fwd router + sort", "fwd routed experts", "bwd routed experts",
                              "cross-entropy", "all-reduce + grad norm + adamw"})
      CHECK_MESSAGE(t.ms.count(phase) == 1, phase, "\n", pr.out);
    CHECK_MESSAGE(t.adds_up(), pr.out);
    // Refused in one line without --estimate (a training run is not profiled).
    const Result alone = run_cli({"run", sweep, "--out", (dir / "profile").string(), "--point",
                                  "moe-a", "--device", "cuda", "--profile"},
                                 MOEPLAN_EMULATED_BINARY);
    CHECK(alone.status == 2);
    CHECK_MESSAGE(one_line(alone.err), alone.err);
    CHECK_MESSAGE(alone.err.find("give --estimate N too") != std::string::npos, alone.err);
    CHECK_FALSE(fs::exists(dir / "profile"));
  }
  // An estimate on the device: the engine says what it holds, the point is timed, nothing written.
  const Result est = run_cli({"run", sweep, "--out", (dir / "estimate").string(), "--point",
                              "moe-a", "--device", "cuda", "--estimate", "1"},
                             MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(est.status == 0, est.err);
  CHECK_MESSAGE(
      est.out.find("[moe-a 1/1] cuda (moeplan CUDA emulator (CPU)): ") != std::string::npos,
      est.out);
  CHECK_MESSAGE(est.out.find("[moe-a 1/1] estimate: ") != std::string::npos, est.out);
  CHECK_MESSAGE(est.out.find("x 12 steps + 1 evaluations x ") != std::string::npos, est.out);
  CHECK_MESSAGE(est.out.find("estimate for 1 point(s) on cuda: ") != std::string::npos, est.out);
  CHECK_FALSE(fs::exists(dir / "estimate"));
}

// The training options the cuda device once refused: a capacity factor (drops) and the ERC loss.
// bf16 routing may tip a token to another expert where the CPU's fp32 does not, so the drops are
// compared within a margin; the ERC products depend on the shapes alone, so their ledger equals.
TEST_CASE(
    "moeplan run --device cuda (emulated): a capacity factor and the ERC loss, as on the CPU") {
  const fs::path dir = fresh_dir("cuda_capacity_erc");
  Manifest m = tiny_manifest(tiny_plan("dense", true, 8, 4, 40, 3e-3, 16),
                             {tiny_plan("moe-a", false, 8, 4, 40, 3e-3, 16)});
  m.train.capacity_factor = 0.75;
  m.train.erc_loss = 0.3;
  write_manifest_atomic(m, dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const Result cpu = run_cli({"run", sweep, "--out", (dir / "cpu").string(), "--point", "moe-a"});
  REQUIRE_MESSAGE(cpu.status == 0, cpu.err);
  const Result gpu = run_cli(
      {"run", sweep, "--out", (dir / "cuda").string(), "--point", "moe-a", "--device", "cuda"},
      MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(gpu.status == 0, gpu.err);
  const json want = record(dir / "cpu", "moe-a"), got = record(dir / "cuda", "moe-a");
  CHECK(got["status"] == "complete");
  const int64_t dc = want["measured"]["tokens"]["dropped_assignments"].get<int64_t>();
  const int64_t dg = got["measured"]["tokens"]["dropped_assignments"].get<int64_t>();
  INFO("dropped assignments: cpu " << dc << ", cuda " << dg);
  CHECK(dc > 0);
  CHECK(std::abs(double(dg - dc)) <= 0.05 * double(dc));
  CHECK(got["measured"]["tokens"]["consumed"] == want["measured"]["tokens"]["consumed"]);
  CHECK(got["measured"]["tokens"]["unique"] == want["measured"]["tokens"]["unique"]);
  const json& aux = got["measured"]["flops"]["by_category"]["aux-loss"];
  CHECK(aux.at("forward").get<int64_t>() > 0);
  CHECK(aux == want["measured"]["flops"]["by_category"]["aux-loss"]);
  const double lc = want["loss_curve"].back()["train_loss"].get<double>();
  const double lg = got["loss_curve"].back()["train_loss"].get<double>();
  CHECK(std::abs(lg - lc) / lc < 2e-2);
  // The ERC loss is in the curve (it is on); the z-loss is not (it is off).
  const json& last = got["loss_curve"].back();
  REQUIRE(last.contains("aux_erc"));
  CHECK(last["aux_erc"].get<double>() > 0);
  CHECK(std::abs(last["aux_erc"].get<double>() -
                 want["loss_curve"].back()["aux_erc"].get<double>()) <=
        0.05 * last["aux_erc"].get<double>());
  CHECK_FALSE(last.contains("aux_z"));
  // The report states the drops: dropped / (consumed tokens · K · MoE layers).
  const Result rep = run_cli({"report", (dir / "cpu").string()});
  REQUIRE_MESSAGE(rep.status == 0, rep.err);
  const json& arch = want["plan"]["arch"];
  const double share =
      100.0 * double(dc) /
      double(want["measured"]["tokens"]["consumed"].get<int64_t>() * arch["top_k"].get<int64_t>() *
             (arch["layers"].get<int64_t>() - arch["dense_layers"].get<int64_t>()));
  CHECK_MESSAGE(rep.out.find(fmt::format("capacity drops (routed assignments over an expert's "
                                         "capacity, computed by no expert): moe-a {:.1f} % (",
                                         share)) != std::string::npos,
                rep.out);
}

// --kernels gemm=FILE on the emulated device: the first run tunes the point's products into a new
// table, a later run reads it unchanged; the emulation's cuBLASLt multiplies as its cublasGemmEx
// does, so the loss curve must equal the run without a table bit for bit (on a GPU another
// algorithm sums in another order).
TEST_CASE("moeplan run --device cuda --kernels gemm=FILE (emulated): tuned once, then the same") {
  const fs::path dir = fresh_dir("cuda_gemm_table");
  Manifest m = tiny_manifest(tiny_plan("dense", true, 6, 4, 40, 3e-3, 16),
                             {tiny_plan("moe-a", false, 6, 4, 40, 3e-3, 16)});
  // With the ERC loss on, a probe that drew noise would move every later step's: the table's
  // probe must give the generator back.
  m.train.erc_loss = 0.5;
  write_manifest_atomic(m, dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string(), table = (dir / "t.json").string();
  auto run = [&](const std::string& out, const std::string& kernels) {
    std::vector<std::string> args = {"run",     sweep,   "--out",    (dir / out).string(),
                                     "--point", "moe-a", "--device", "cuda"};
    if (!kernels.empty()) args.insert(args.end(), {"--kernels", kernels});
    return run_cli(args, MOEPLAN_EMULATED_BINARY);
  };
  const Result plain = run("plain", "");
  REQUIRE_MESSAGE(plain.status == 0, plain.err);
  const json want = record(dir / "plain", "moe-a");
  // gemm=auto takes a built-in table only where one was made (the emulator has none), and says so.
  CHECK_MESSAGE(plain.out.find(", no GEMM table (none built in for 'moeplan CUDA emulator (CPU)' "
                               "with cuBLASLt 900000)") != std::string::npos,
                plain.out);
  CHECK(want["kernels"] == "attention=fused_mma_lean,experts=tiled128");
  const Result none = run("none", "gemm=none");
  REQUIRE_MESSAGE(none.status == 0, none.err);
  CHECK_MESSAGE(none.out.find(", no GEMM table)") != std::string::npos, none.out);
  CHECK(record(dir / "none", "moe-a")["kernels"] == want["kernels"]);
  CHECK(record(dir / "none", "moe-a")["loss_curve"] == want["loss_curve"]);
  // Asked for by name, a built-in table made elsewhere is refused in one line, before any step.
  for (const std::string asked : {"builtin", "builtin:h200-2026-12-04"}) {
    const Result refused = run("builtin", "gemm=" + asked);
    CHECK(refused.status != 0);
    CHECK_MESSAGE(refused.err.find("--kernels gemm=" + asked + ": no built-in GEMM table ") !=
                      std::string::npos,
                  refused.err);
    CHECK_MESSAGE(
        refused.err.find("h200-2026-12-04 ('NVIDIA H200', cuBLASLt 130100)") != std::string::npos,
        refused.err);
    CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(dir / "builtin" / "moe-a" / "record.json"));
  }

  const Result first = run("first", "gemm=" + table);
  REQUIRE_MESSAGE(first.status == 0, first.err);
  REQUIRE(fs::exists(table));
  const json t = json::parse(read_file(table));
  CHECK(t["format"] == "moeplan-gemm-table-1");
  CHECK(t["entries"].size() >= 5);  // qkv, attention out, shared expert, router, LM head, ...
  CHECK_MESSAGE(first.out.find(", GEMM table " + table + ": ") != std::string::npos, first.out);
  CHECK_MESSAGE(first.out.find(fmt::format(" product shapes through cuBLASLt ({} tuned now)",
                                           t["entries"].size())) != std::string::npos,
                first.out);
  const json got = record(dir / "first", "moe-a");
  CHECK(got["kernels"] == "attention=fused_mma_lean,experts=tiled128,gemm=" + table);
  CHECK(got["loss_curve"] == want["loss_curve"]);
  CHECK(got["measured"]["flops"] == want["measured"]["flops"]);

  const std::string bytes = read_file(table);
  const Result again = run("again", "gemm=" + table);
  REQUIRE_MESSAGE(again.status == 0, again.err);
  CHECK(read_file(table) == bytes);  // nothing left to tune: the file is not rewritten
  CHECK(again.out.find("tuned now") == std::string::npos);
  CHECK(record(dir / "again", "moe-a")["loss_curve"] == want["loss_curve"]);

  // A table chosen elsewhere is refused in one line, before any step; the file stays as it was.
  json foreign = json::parse(bytes);
  foreign["device"] = "NVIDIA H200";
  const std::string other = (dir / "other.json").string();
  write_file_atomic(other, foreign.dump());
  const Result refused = run("refused", "gemm=" + other);
  CHECK(refused.status != 0);
  CHECK_MESSAGE(refused.err.find("gemm table: chosen on 'NVIDIA H200'") != std::string::npos,
                refused.err);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(read_file(other) == foreign.dump());
  CHECK_FALSE(fs::exists(dir / "refused" / "moe-a" / "record.json"));
  const Result empty = run("empty", "gemm=");
  CHECK(empty.status != 0);
  CHECK_MESSAGE(empty.err.find("'gemm=' is not name=value") != std::string::npos, empty.err);
}

// Data parallelism end to end: `moeplan run --device cuda` as two processes with WORLD_SIZE=2,
// started the way torchrun starts them (the same command line; RANK and LOCAL_RANK differ), on
// the emulated machine's two devices (MOEPLAN_EMU_DEVICES) and the emulated NCCL.
namespace {

// gpu_names: the GPU name each rank's emulated device reports (MOEPLAN_EMU_DEVICE_NAME), where
// given.
std::array<pid_t, 2> spawn_ranks(const std::vector<std::string>& args, const fs::path& dir,
                                 const std::string& tag,
                                 std::array<const char*, 2> gpu_names = {nullptr, nullptr}) {
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);  // a lost rank fails the test, not hangs it
  ::setenv("MOEPLAN_NCCL_ID_FILE", (dir / (tag + ".nccl-id")).c_str(), 1);
  std::array<pid_t, 2> pids{};
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    ::setenv("RANK", r.c_str(), 1);
    ::setenv("LOCAL_RANK", r.c_str(), 1);
    if (gpu_names[size_t(rank)])
      ::setenv("MOEPLAN_EMU_DEVICE_NAME", gpu_names[size_t(rank)], 1);
    else
      ::unsetenv("MOEPLAN_EMU_DEVICE_NAME");
    pids[size_t(rank)] =
        spawn(args, dir / (tag + r + ".out"), dir / (tag + r + ".err"), MOEPLAN_EMULATED_BINARY);
  }
  for (const char* v :
       {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MOEPLAN_EMU_DEVICES", "MOEPLAN_EMU_NCCL_TIMEOUT",
        "MOEPLAN_NCCL_ID_FILE", "MOEPLAN_EMU_DEVICE_NAME"})
    ::unsetenv(v);
  return pids;
}

// Both ranks' exit statuses; stderr of a rank that failed goes into the test's message.
std::array<int, 2> wait_ranks(const std::array<pid_t, 2>& pids, const fs::path& dir,
                              const std::string& tag) {
  std::array<int, 2> st{};
  for (int rank = 0; rank < 2; ++rank) {
    st[size_t(rank)] = wait_status(pids[size_t(rank)]);
    INFO("rank " << rank << " stderr: " << read_file(dir / (tag + std::to_string(rank) + ".err")));
    CHECK(st[size_t(rank)] >= 0);
  }
  return st;
}

}  // namespace

TEST_CASE("moeplan run --device cuda, WORLD_SIZE=2 (emulated): the job's ledgers, rank 0 writes") {
  const fs::path dir = fresh_dir("cuda_dp2");
  // Two points: each builds its own NCCL group through the id file, so the second point also
  // checks that no rank joins the first point's stale group.
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 12, 4, 40, 3e-3, 16),
                                      {tiny_plan("moe-a", false, 12, 4, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const Result one = run_cli({"run", sweep, "--out", (dir / "one").string(), "--device", "cuda"},
                             MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(one.status == 0, one.err);
  const auto pids =
      spawn_ranks({"run", sweep, "--out", (dir / "two").string(), "--device", "cuda"}, dir, "dp");
  const auto st = wait_ranks(pids, dir, "dp");
  REQUIRE(st[0] == 0);
  REQUIRE(st[1] == 0);
  const std::string out0 = read_file(dir / "dp0.out"), out1 = read_file(dir / "dp1.out");
  CHECK(out0.find("moe-a 2/2] complete:") != std::string::npos);
  CHECK(out1.find("moe-a 2/2] complete on this rank; rank 0 wrote") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "dp.nccl-id"));  // removed once both ranks had joined
  // The emulated NCCL's shared memory (named after rank 0's pid) is gone too.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec))
    CHECK(e.path().filename().string().find("moeplan-emu-nccl-" + std::to_string(pids[0]) + "-") ==
          std::string::npos);

  for (const std::string id : {"dense", "moe-a"}) {
    INFO(id);
    const json want = record(dir / "one", id), got = record(dir / "two", id);
    CHECK(got["status"] == "complete");
    CHECK(want["world_size"] == 1);
    CHECK(got["world_size"] == 2);  // the rates are the job's, over two devices
    CHECK(got["achieved_flops_per_second_per_device"].get<double>() ==
          doctest::Approx(got["achieved_flops_per_second"].get<double>() / 2));
    // Tokens: the job's, as one process reads them (each window once per epoch over the ranks).
    CHECK(got["measured"]["tokens"] == want["measured"]["tokens"]);
    for (auto& [k, val] : got["measured"]["matches_plan"].items()) CHECK_MESSAGE(val == true, k);
    // FLOPs: the sum over ranks of each rank's products equals one process's; only AdamW's
    // elementwise update runs once per rank.
    // Padding aside: the automatic kernels' tiled experts round each rank's rows per expert up
    // to whole 64-row tiles, so two ranks pad at least what one process does (a sum of
    // round-ups is at least the round-up of the sum), and a dense point (no experts) the same.
    const json& gf = got["measured"]["flops"];
    const json& wf = want["measured"]["flops"];
    const auto same_but_padding = [&](const json& g, const json& w) {
      for (auto& [cat, phases] : w.items()) {
        INFO(cat);
        if (cat != "padding") CHECK(g[cat] == phases);
      }
      for (const char* ph : {"forward", "input-grad", "weight-grad"}) {
        INFO(ph);
        if (id == "dense")
          CHECK(g["padding"][ph] == w["padding"][ph]);
        else
          CHECK(g["padding"][ph].get<int64_t>() >= w["padding"][ph].get<int64_t>());
      }
    };
    same_but_padding(gf["by_category"], wf["by_category"]);
    const int64_t n = got["measured"]["trainable_params"].get<int64_t>();
    CHECK(gf["elementwise"].get<int64_t>() == wf["elementwise"].get<int64_t>() + 12 * n);
    // The same training within rounding: the ranks' mean gradient is the batch's (the MoE's
    // load-balance loss is each rank's own, over half the tokens, hence the looser bound).
    const double lw = want["loss_curve"].back()["train_loss"].get<double>();
    const double lg = got["loss_curve"].back()["train_loss"].get<double>();
    CHECK(std::abs(lg - lw) / lw < (id == "dense" ? 1e-4 : 1e-2));
    MESSAGE(id, ": last train loss one process ", lw, ", two ranks ", lg);
    // Evaluation is split over the ranks too: the job's validation products are one process's
    // (each sequence evaluated once; padding as above), and the same weights would give the same
    // figure.
    same_but_padding(gf["validation"]["by_category"], wf["validation"]["by_category"]);
    const double vw = want["val_curve"].back()["val_bpc"].get<double>();
    const double vg = got["val_curve"].back()["val_bpc"].get<double>();
    CHECK(std::abs(vg - vw) / vw < (id == "dense" ? 1e-4 : 1e-2));
  }
  // The report labels the job with its device count, and compares times only within a label.
  const Result rep = run_cli({"report", (dir / "two").string()});
  REQUIRE_MESSAGE(rep.status == 0, rep.err);
  CHECK_MESSAGE(
      rep.out.find(
          "cuda (moeplan CUDA emulator (CPU)) x2 attention=fused_mma_lean,experts=tiled128") !=
          std::string::npos,
      rep.out);
}

TEST_CASE("WORLD_SIZE=2 (emulated): MFU over both GPUs' peak; ranks on other GPUs get none") {
  const fs::path dir = fresh_dir("cuda_dp2_gpus");
  // A manifest has MoE points; the dense one alone is trained.
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 8, 4, 40, 3e-3, 16),
                                      {tiny_plan("moe-a", false, 8, 4, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  // Two H200s (the emulation pretends the name): the job's FLOP/s per device over 989 TFLOP/s.
  const auto same = spawn_ranks(
      {"run", sweep, "--out", (dir / "same").string(), "--device", "cuda", "--point", "dense"}, dir,
      "same", {"NVIDIA H200", "NVIDIA H200"});
  const auto st = wait_ranks(same, dir, "same");
  REQUIRE(st[0] == 0);
  REQUIRE(st[1] == 0);
  const json rec = record(dir / "same", "dense");
  CHECK(rec["hardware"] == json::array({"NVIDIA H200"}));
  CHECK(rec["world_size"] == 2);
  const double c_exact = rec["measured"]["flops"]["conventions"]["exact/causal"].get<double>();
  CHECK(rec["mfu"].get<double>() ==
        doctest::Approx(c_exact / rec["train_seconds"].get<double>() / 2 / 989e12).epsilon(1e-9));
  CHECK_MESSAGE(
      read_file(dir / "same0.out").find("cuda (NVIDIA H200) rank 0 of 2: ") != std::string::npos,
      read_file(dir / "same0.out"));
  // An H200 and an H100 PCIe: no one name for the record, no one peak, so no MFU.
  const auto mixed = spawn_ranks(
      {"run", sweep, "--out", (dir / "mixed").string(), "--device", "cuda", "--point", "dense"},
      dir, "mixed", {"NVIDIA H200", "NVIDIA H100 PCIe"});
  const auto sm = wait_ranks(mixed, dir, "mixed");
  REQUIRE(sm[0] == 0);
  REQUIRE(sm[1] == 0);
  const json mr = record(dir / "mixed", "dense");
  CHECK(mr["hardware"] == json::array({"NVIDIA H200 on rank 0, other GPUs on other ranks"}));
  CHECK_FALSE(mr.contains("mfu"));
  CHECK_MESSAGE(read_file(dir / "mixed0.out").find("(MFU ") == std::string::npos,
                read_file(dir / "mixed0.out"));
}

TEST_CASE("WORLD_SIZE=2 (emulated): SIGINT to one rank stops both at one step; resume is exact") {
  const fs::path dir = fresh_dir("cuda_dp2_sigint");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 10, 4, 50, 3e-3, 16),
                                      {tiny_plan("moe-i", false, 32, 4, 50, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"run",      sweep,   "--point",
                                    "moe-i",    "--out", (dir / out).string(),
                                    "--device", "cuda",  "--checkpoint-every",
                                    "4"};
  };
  const auto whole = wait_ranks(spawn_ranks(args("a"), dir, "a"), dir, "a");
  REQUIRE(whole[0] == 0);
  REQUIRE(whole[1] == 0);

  const auto pids = spawn_ranks(args("b"), dir, "b");
  wait_for_file(dir / "b" / "moe-i" / "record.json");
  ::kill(pids[1], SIGINT);  // rank 1 only: rank 0 must learn of it and stop at the same step
  const auto st = wait_ranks(pids, dir, "b");
  CHECK(st[0] == 130);
  CHECK(st[1] == 130);
  const json rec = record(dir / "b", "moe-i");
  REQUIRE_MESSAGE(rec["status"] == "running", "the run finished before the interrupt");
  const Checkpoint c = read_checkpoint(dir / "b" / "moe-i" / "checkpoint" / "state.ckpt");
  CHECK(rec["measured"]["steps"].get<int64_t>() == c.state.step);
  MESSAGE("interrupted at step ", c.state.step, " of 32");
  CHECK(c.state.world_size == 2);
  // On one rank: refused, naming both counts and what to run; the checkpoint is left as it was.
  const Result one = run_cli(args("b"), MOEPLAN_EMULATED_BINARY);
  CHECK(one.status == 2);
  CHECK_MESSAGE(one.err.find("was trained on 2 data-parallel rank(s), this run has 1; resume "
                             "with as many (--nproc 2, or WORLD_SIZE=2") != std::string::npos,
                one.err);
  CHECK(read_checkpoint(dir / "b" / "moe-i" / "checkpoint" / "state.ckpt").state.step ==
        c.state.step);
  CHECK_MESSAGE(one.err.find("add --elastic to go on with 1 (not the bit-for-bit continuation)") !=
                    std::string::npos,
                one.err);
  {  // The whole sweep on one rank is refused with the checkpoint's other checks, before the
     // dense point (first, untrained) trains.
    const Result all = run_cli({"run", sweep, "--out", (dir / "b").string(), "--device", "cuda"},
                               MOEPLAN_EMULATED_BINARY);
    CHECK(all.status == 2);
    CHECK(one_line(all.err));
    CHECK_MESSAGE(
        all.err.find("was trained on 2 data-parallel rank(s), this run has 1") != std::string::npos,
        all.err);
    CHECK_FALSE(fs::exists(dir / "b" / "dense"));
  }
  {  // --elastic: a preempted job restarted on one GPU goes on, with the ledgers of the whole run.
    fs::copy(dir / "b", dir / "e", fs::copy_options::recursive);
    std::vector<std::string> elastic = args("e");
    elastic.push_back("--elastic");
    const Result go = run_cli(elastic, MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(go.status == 0, go.err);
    CHECK_MESSAGE(go.out.find(fmt::format("resuming at step {} in another layout (data-parallel "
                                          "ranks 2 -> 1)",
                                          c.state.step)) != std::string::npos,
                  go.out);
    const json ra = record(dir / "a", "moe-i"), re = record(dir / "e", "moe-i");
    CHECK(re["status"] == "complete");
    CHECK(re["world_size"] == 1);
    // The same kernels on one rank as on two ('auto' chooses by the model and the device).
    CHECK(re["layouts"] ==
          json::parse(fmt::format(R"([
              {{"from_step":0,"world_size":2,"micro_batch":0,"threads":0,
                "optimizer_sharded":false,"kernels":{}}},
              {{"from_step":{},"world_size":1,"micro_batch":0,"threads":0,
                "optimizer_sharded":false,"kernels":{}}}
            ])",
                                  ra["kernels"].dump(), c.state.step, ra["kernels"].dump())));
    // Every window once per epoch across the ranks and then the one: the uninterrupted run's
    // token ledger. Its products' useful FLOPs too; only the tiles' padding follows the passes.
    CHECK(re["measured"]["tokens"] == ra["measured"]["tokens"]);
    json fa = ra["measured"]["flops"]["by_category"], fe = re["measured"]["flops"]["by_category"];
    fa.erase("padding");
    fe.erase("padding");
    CHECK(fa == fe);
    for (auto& [k, v] : re["measured"]["matches_plan"].items()) CHECK_MESSAGE(v == true, k);
    // The same training but for the order of sums and the load-balance loss's groups (each
    // rank's 2 sequences, now all 4): the final losses agree closely, not to the bit.
    const double la = ra["loss_curve"].back()["train_loss"].get<double>();
    const double le = re["loss_curve"].back()["train_loss"].get<double>();
    MESSAGE("final train loss: ", la, " uninterrupted on 2 ranks, ", le, " resumed on 1");
    CHECK(le == doctest::Approx(la).epsilon(1e-4));
  }

  {  // Other kernels on the same two ranks (another GPU where `auto` chooses otherwise, or another
     // --kernels): refused, then under --elastic kept as a layout of their own.
    fs::copy(dir / "b", dir / "k", fs::copy_options::recursive);
    std::vector<std::string> other = args("k");
    other.insert(other.end(), {"--kernels", "experts=grouped"});
    const auto no = wait_ranks(spawn_ranks(other, dir, "k"), dir, "k");
    CHECK(no[0] == 2);
    CHECK_MESSAGE(read_file(dir / "k0.err").find("add --elastic to go on with 'experts=grouped'") !=
                      std::string::npos,
                  read_file(dir / "k0.err"));
    other.push_back("--elastic");
    const auto go = wait_ranks(spawn_ranks(other, dir, "l"), dir, "l");
    REQUIRE(go[0] == 0);
    REQUIRE(go[1] == 0);
    const json ra = record(dir / "a", "moe-i"), rk = record(dir / "k", "moe-i");
    const std::string was = ra["kernels"].get<std::string>(),
                      now = rk["kernels"].get<std::string>();
    CHECK(now.find("experts=grouped") != std::string::npos);
    CHECK_MESSAGE(read_file(dir / "l0.out")
                          .find(fmt::format("in another layout (kernels {} -> {}): the steps from "
                                            "here sum in another order, so",
                                            was, now)) != std::string::npos,
                  read_file(dir / "l0.out"));
    REQUIRE(rk["layouts"].size() == 2);
    CHECK(rk["layouts"][0]["kernels"] == was);
    CHECK(rk["layouts"][1]["kernels"] == now);
    CHECK(rk["measured"]["tokens"] == ra["measured"]["tokens"]);
  }

  const auto again = wait_ranks(spawn_ranks(args("b"), dir, "c"), dir, "c");
  REQUIRE(again[0] == 0);
  REQUIRE(again[1] == 0);
  CHECK(read_file(dir / "c0.out").find("resumed at step") != std::string::npos);
  const json ra = record(dir / "a", "moe-i"), rb = record(dir / "b", "moe-i");
  CHECK(rb["status"] == "complete");
  CHECK(rb["resumes"].get<int>() == 1);
  CHECK(ra["loss_curve"] == rb["loss_curve"]);
  CHECK(ra["val_curve"] == rb["val_curve"]);
  CHECK(ra["measured"]["tokens"] == rb["measured"]["tokens"]);
  CHECK(ra["measured"]["flops"] == rb["measured"]["flops"]);
}

TEST_CASE("a rank waiting for a peer that never comes: a second signal 3 s on stops it at once") {
  // Rank 0 of WORLD_SIZE=2 alone: it publishes the NCCL id and waits in the group's start-up for
  // rank 1 (up to the emulated NCCL's timeout, as a real rank waits in a collective). The first
  // SIGINT can only ask for a stop at the end of a step it never reaches; a SIGTERM 3 s later
  // ends it at once with 130. (A second signal within 3 s of the first is the same stop: a
  // terminal's Ctrl-C and a launcher's forward reach a rank together; the launcher tests above
  // stop gracefully with it.)
  const fs::path dir = fresh_dir("cuda_stuck_rank");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 10, 4, 50, 3e-3, 16),
                                      {tiny_plan("moe-w", false, 32, 4, 50, 3e-3, 16)}),
                        dir / "sweep.toml");
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "40", 1);
  ::setenv("MOEPLAN_NCCL_ID_FILE", (dir / "w.nccl-id").c_str(), 1);
  const pid_t pid = spawn({"run", (dir / "sweep.toml").string(), "--point", "moe-w", "--out",
                           (dir / "runs").string(), "--device", "cuda"},
                          dir / "w.out", dir / "w.err", MOEPLAN_EMULATED_BINARY);
  for (const char* v : {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MOEPLAN_EMU_DEVICES",
                        "MOEPLAN_EMU_NCCL_TIMEOUT", "MOEPLAN_NCCL_ID_FILE"})
    ::unsetenv(v);
  // The id file (w.nccl-id.<point hash>) is written right before the group's start-up.
  const auto published = [&] {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("w.nccl-id.", 0) == 0) return true;
    return false;
  };
  const auto start = std::chrono::steady_clock::now();
  while (!published()) {
    int st = 0;
    REQUIRE_MESSAGE(::waitpid(pid, &st, WNOHANG) == 0, read_file(dir / "w.err"));
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(3300));
  int st = 0;
  CHECK_MESSAGE(::waitpid(pid, &st, WNOHANG) == 0, "it stopped without its peer");
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  CHECK(wait_status(pid) == 130);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("stopped ", took, " s after the second signal");
  CHECK(took < 15);  // at once, not at the emulated NCCL's 40 s timeout
  const std::string err = read_file(dir / "w.err");
  CHECK_MESSAGE(err.find("stopped at once by a second signal") != std::string::npos, err);
  // Its emulated NCCL group (a /dev/shm file named for rank 0's pid) is left by _exit: removed.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(fmt::format("moeplan-emu-nccl-{}-", pid), 0) == 0)
      fs::remove(e.path(), ec);
}

// The number an error line gives after `before` ("" when it has none).
std::string most_that_fit(const std::string& err, const std::string& before) {
  const size_t at = err.find(before);
  if (at == std::string::npos) return "";
  const size_t from = at + before.size();
  return err.substr(from, err.find_first_not_of("0123456789", from) - from);
}

// A batch that does not fit the device: one line that says so and what to run instead, then the
// same point in smaller passes. The emulated device holds MOEPLAN_EMU_MEMORY_KIB: 38 MiB, of
// which cuBLAS's workspace takes 32; 128 sequences a pass need more, 16 fit.
TEST_CASE("out of device memory (emulated): one line naming the passes; --micro-batch fits") {
  const fs::path dir = fresh_dir("cuda_oom");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 1, 128, 40, 3e-3, 16),
                                      {tiny_plan("moe-o", false, 1, 128, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  const auto run_dense = [&](const std::string& out, const char* micro) {
    return run_cli({"run", sweep, "--point", "dense", "--out", (dir / out).string(), "--device",
                    "cuda", "--micro-batch", micro, "--kernels", "attention=cublas,experts=grouped"},
                   MOEPLAN_EMULATED_BINARY);
  };
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "38912", 1);
  const Result whole = run_dense("runs", "0");
  // The most sequences a pass it names: that many trains.
  const std::string dense_most = most_that_fit(whole.err, "run smaller passes: --micro-batch ");
  REQUIRE_MESSAGE(!dense_most.empty(), whole.err);
  const Result at_most = run_dense("at_most", dense_most.c_str());
  const Result passes = run_dense("runs", "16");
  // The LM head in chunks of 64 of a pass's 256 rows: the same products, so the same ledger.
  const Result chunked =
      run_cli({"run", sweep, "--point", "dense", "--out", (dir / "chunked").string(), "--device",
               "cuda", "--micro-batch", "16", "--kernels",
               "attention=cublas,experts=grouped,logits=64"},
              MOEPLAN_EMULATED_BINARY);
  // The passes fit, but a GEMM table's tuning needs its own 32 MiB workspace and operands too.
  const std::string table = (dir / "table.json").string();
  const Result tune = run_cli(
      {"run", sweep, "--point", "dense", "--out", (dir / "tune").string(), "--device", "cuda",
       "--micro-batch", "16", "--kernels", "attention=cublas,experts=grouped,gemm=" + table},
      MOEPLAN_EMULATED_BINARY);
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "20480", 1);  // not even cuBLAS's workspace
  const Result none = run_dense("none", "1");
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  CHECK(whole.status == 2);
  CHECK(one_line(whole.err));
  CHECK_MESSAGE(whole.err.find("point dense: --device cuda: out of device memory (moeplan's "
                               "buffers held ") != std::string::npos,
                whole.err);
  // At S 16 the fused kernels would hold more, not less: the S×S buffers they spare are
  // 2 heads · 16² · (2·2 layers + 10) = 7,168 bytes a sequence, their bf16 dS tiles 2 heads · one
  // 64×64 tile · 2 bytes = 16,384. So the line offers smaller passes only.
  CHECK_MESSAGE(whole.err.find("the device has 38.0 MiB) with passes of 128 sequences of 16 "
                               "tokens; run smaller passes: --micro-batch " +
                               dense_most + " (at most " + dense_most +
                               " sequences a pass fit); found before any point trained\n") !=
                    std::string::npos,
                whole.err);
  CHECK_MESSAGE(whole.err.find("attention=fused_mma") == std::string::npos, whole.err);
  CHECK_MESSAGE(at_most.status == 0, at_most.err);
  CHECK(record(dir / "at_most", "dense")["pass_seqs"] == std::stoi(dense_most));
  REQUIRE_MESSAGE(passes.status == 0, passes.err);
  // Once built, the engine says what it holds: its memory out of the device's, the passes, and
  // the GEMM table (gemm=auto: none built in for the emulator).
  const std::string no_table =
      ", no GEMM table (none built in for 'moeplan CUDA emulator (CPU)' with cuBLASLt 900000))\n";
  CHECK_MESSAGE(passes.out.find(" of the device's 38.0 MiB for passes of 16 sequences "
                                "(attention=cublas,experts=grouped" +
                                no_table) != std::string::npos,
                passes.out);
  const json rec = record(dir / "runs", "dense");
  CHECK(rec["status"] == "complete");
  CHECK(rec["pass_seqs"] == 16);
  CHECK(rec["measured"]["tokens"]["consumed"].get<int64_t>() == 1 * 128 * 16);
  REQUIRE_MESSAGE(chunked.status == 0, chunked.err);
  CHECK_MESSAGE(chunked.out.find(" for passes of 16 sequences (attention=cublas,experts=grouped,"
                                 "logits=64, LM head in chunks of 64 of 256 rows" +
                                 no_table) != std::string::npos,
                chunked.out);
  const json crec = record(dir / "chunked", "dense");
  CHECK(crec["kernels"] == "attention=cublas,experts=grouped,logits=64");
  CHECK(crec["measured"]["flops"] == rec["measured"]["flops"]);
  CHECK(crec["measured"]["tokens"] == rec["measured"]["tokens"]);
  CHECK(std::abs(crec["loss_curve"].back()["train_loss"].get<double>() -
                 rec["loss_curve"].back()["train_loss"].get<double>()) < 1e-4);
  CHECK(tune.status == 2);
  CHECK(one_line(tune.err));
  CHECK_MESSAGE(tune.err.find("--kernels gemm=" + table +
                              ": timing the point's products needs a cuBLASLt workspace and "
                              "random operands beside the model's buffers, and 32.0 MiB more did "
                              "not fit") != std::string::npos,
                tune.err);
  CHECK_FALSE(fs::exists(table));
  CHECK_FALSE(fs::exists(dir / "tune" / "dense" / "record.json"));
  CHECK(none.status == 2);
  CHECK(one_line(none.err));
  CHECK_MESSAGE(none.err.find("with passes of 1 sequence of 16 tokens; the weights, gradients and "
                              "AdamW state alone take ") != std::string::npos,
                none.err);
  CHECK_FALSE(fs::exists(dir / "none" / "dense" / "record.json"));
}

// A sweep whose MoE points do not fit the device in their passes: refused in one line before any
// point trains (the dense point, which fits, first among them), naming each point that does not
// and the passes under which all fit; those train. The emulated device holds 68 MiB: the MoE
// model's two cuBLAS workspaces take 64 of it (the dense model has one).
TEST_CASE("points that do not fit (emulated): refused together before any trains; the passes fit") {
  const fs::path dir = fresh_dir("cuda_fit");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 1, 128, 40, 3e-3, 16),
                                      {tiny_plan("moe-o", false, 1, 128, 40, 3e-3, 16),
                                       tiny_plan("moe-p", false, 1, 96, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  const auto run = [&](std::vector<std::string> extra, const std::string& out = "runs") {
    std::vector<std::string> args = {"run",       (dir / "sweep.toml").string(),
                                     "--out",     (dir / out).string(),
                                     "--device",  "cuda",
                                     "--kernels", "attention=cublas,experts=grouped"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args, MOEPLAN_EMULATED_BINARY);
  };
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "69632", 1);
  const Result whole = run({});
  const bool folders = fs::exists(dir / "runs" / "dense") || fs::exists(dir / "runs" / "moe-o") ||
                       fs::exists(dir / "runs" / "moe-p");
  const std::string moe_o = most_that_fit(whole.err, "run smaller passes: --micro-batch ");
  const std::string moe_p = most_that_fit(whole.err, "moe-p (at most ");
  REQUIRE_MESSAGE(!moe_o.empty(), whole.err);
  REQUIRE_MESSAGE(!moe_p.empty(), whole.err);
  const std::string all = std::to_string(std::min(std::stoi(moe_o), std::stoi(moe_p)));
  const Result one_more =
      run({"--point", "moe-o", "--micro-batch", std::to_string(std::stoi(moe_o) + 1)});
  const Result fits = run({"--micro-batch", all});
  // An estimate in passes of 8 says how far each point's passes could grow on this GPU.
  const Result estimate = run({"--micro-batch", "8", "--estimate", "1"}, "estimate");
  // Data parallel, each rank checks its own share of the batch on its own GPU: moe-o's 128
  // sequences are 64 a rank over 2 ranks, which do not fit either; 43 (rank 0's of 3) do.
  ::setenv("MOEPLAN_EMU_DEVICES", "3", 1);
  const Result two = run({"--point", "moe-o", "--nproc", "2"}, "dp2");
  const Result three = run({"--point", "moe-o", "--nproc", "3"}, "dp3");
  ::unsetenv("MOEPLAN_EMU_DEVICES");
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  CHECK(whole.status == 2);
  CHECK(one_line(whole.err));
  CHECK_MESSAGE(whole.err.rfind("moeplan: error: point moe-o: --device cuda: out of device memory "
                                "(moeplan's buffers held ",
                                0) == 0,
                whole.err);
  CHECK_MESSAGE(
      whole.err.find("the device has 68.0 MiB) with passes of 128 sequences of 16 tokens; "
                     "run smaller passes: --micro-batch " +
                     moe_o + " (at most " + moe_o +
                     " sequences a pass fit); 1 more point does not fit: moe-p (at most " + moe_p +
                     " of its 96 sequences a pass fit); --micro-batch " + all +
                     " fits every point; found before any point trained\n") != std::string::npos,
      whole.err);
  CHECK(std::stoi(moe_o) < 96);  // so moe-p, of the same model, does not fit whole either
  CHECK(whole.out.find("dense 1/3") == std::string::npos);  // the dense point did not start
  CHECK_FALSE(folders);                                     // nothing made for any point
  CHECK(one_more.status == 2);
  CHECK_MESSAGE(
      one_more.err.find("run smaller passes: --micro-batch " + moe_o + " (") != std::string::npos,
      one_more.err);
  REQUIRE_MESSAGE(fits.status == 0, fits.err);
  for (const auto& [id, pass] : {std::pair<const char*, int64_t>{"dense", std::stoi(all)},
                                 {"moe-o", std::stoi(all)},
                                 {"moe-p", std::min<int64_t>(96, std::stoi(all))}}) {
    const json r = record(dir / "runs", id);
    CHECK(r["status"] == "complete");
    CHECK(r["pass_seqs"] == pass);
    // The most its buffers held, within the device's 68 MiB (69,632 KiB).
    REQUIRE(r.contains("device_memory"));
    CHECK(r["device_memory"]["device_bytes"] == int64_t{69632} * 1024);
    CHECK(r["device_memory"]["peak_bytes"] <= r["device_memory"]["device_bytes"]);
  }
  // The MoE points hold a second cuBLAS handle (the shared expert's stream), 32 MiB of workspace
  // more than the dense point's one.
  CHECK(record(dir / "runs", "moe-o")["device_memory"]["peak_bytes"].get<int64_t>() >=
        record(dir / "runs", "dense")["device_memory"]["peak_bytes"].get<int64_t>() +
            (int64_t{32} << 20));
  REQUIRE_MESSAGE(estimate.status == 0, estimate.err);
  // Each estimate line ends with the most memory the timed steps held.
  for (const char* id :
       {"[dense 1/3] estimate: ", "[moe-o 2/3] estimate: ", "[moe-p 3/3] estimate: "}) {
    const size_t at = estimate.out.find(id);
    REQUIRE_MESSAGE(at != std::string::npos, estimate.out);
    const std::string line = estimate.out.substr(at, estimate.out.find('\n', at) - at);
    CHECK_MESSAGE(line.find(", device memory at most ") != std::string::npos, line);
    CHECK_MESSAGE(line.ends_with(" of 68.0 MiB"), line);
  }
  // The dense model, with one cuBLAS workspace, fits its whole batch; the MoE points' passes
  // grow to the most the refusal named.
  CHECK_MESSAGE(estimate.out.find("[dense 1/3] passes of 8 sequences as timed; the step's whole "
                                  "batch of 128 fits this GPU in one pass (--micro-batch 0)\n") !=
                    std::string::npos,
                estimate.out);
  CHECK_MESSAGE(estimate.out.find("[moe-o 2/3] passes of 8 sequences as timed; up to " + moe_o +
                                  " of the step's 128 fit this GPU (--micro-batch " + moe_o +
                                  ")\n") != std::string::npos,
                estimate.out);
  CHECK_MESSAGE(estimate.out.find("[moe-p 3/3] passes of 8 sequences as timed; up to " + moe_p +
                                  " of the step's 96 fit this GPU (--micro-batch " + moe_p +
                                  ")\n") != std::string::npos,
                estimate.out);
  REQUIRE(std::stoi(moe_o) >= 43);
  REQUIRE(std::stoi(moe_o) < 64);
  CHECK(two.status == 2);
  CHECK_MESSAGE(two.err.find("point moe-o: --device cuda: out of device memory (moeplan's buffers "
                             "held ") != std::string::npos,
                two.err);
  CHECK_MESSAGE(two.err.find("with passes of 64 sequences of 16 tokens; run smaller passes: "
                             "--micro-batch " +
                             moe_o + " (") != std::string::npos,
                two.err);
  CHECK_MESSAGE(three.status == 0, three.err);
  const json r3 = record(dir / "dp3", "moe-o");
  CHECK(r3["status"] == "complete");
  CHECK(r3["world_size"] == 3);
  CHECK(r3["pass_seqs"] == 43);
}

// At S 256 the fused attention spares far more than its dS tiles take, and the line says so:
// 2 heads · 256² · (2·2 layers + 10) = 1,835,008 bytes of S×S buffers a sequence (1.75 MiB),
// less 2 heads · 10 tiles (64×64, on and below the diagonal) · 8,192 bytes = 163,840:
// 1,671,168 bytes, 1.6 MiB.
TEST_CASE("out of device memory (emulated): at S 256 the line also offers the fused attention") {
  const fs::path dir = fresh_dir("cuda_oom_long");
  Arch a = tiny_arch(true, 16), b = tiny_arch(false, 16);
  a.seq_len = b.seq_len = 256;  // a sweep's points share the baseline's S
  write_manifest_atomic(
      tiny_manifest(plan_for("dense", a, 1, 64, 64), {plan_for("moe-o", b, 1, 4, 40)}),
      dir / "sweep.toml");
  ::setenv("MOEPLAN_EMU_MEMORY_KIB", "38912", 1);
  const Result r = run_cli({"run", (dir / "sweep.toml").string(), "--point", "dense", "--out",
                            (dir / "runs").string(), "--device", "cuda", "--kernels",
                            "attention=cublas,experts=grouped"},
                           MOEPLAN_EMULATED_BINARY);
  ::unsetenv("MOEPLAN_EMU_MEMORY_KIB");
  CHECK(r.status == 2);
  CHECK(one_line(r.err));
  CHECK_MESSAGE(r.err.find("with passes of 64 sequences of 256 tokens; run smaller passes: "
                           "--micro-batch ") != std::string::npos,
                r.err);
  CHECK_MESSAGE(r.err.find(" sequences a pass fit), or --kernels attention=fused_mma (no S×S "
                           "buffers: 1.6 MiB less a sequence)") != std::string::npos,
                r.err);
}

// What cannot fit this machine's memory is refused in one line before it is allocated (a 3 TB
// built-in corpus, a cpu model whose state alone takes terabytes), not left to std::bad_alloc or
// the kernel's out-of-memory killer.
TEST_CASE("host memory: a built-in corpus or a cpu model larger than the machine, one line") {
  const fs::path dir = fresh_dir("host_memory");
  // The most unique data a point may read, 2^31 - 1 windows of 16 tokens = 34,359,738,352
  // tokens of the built-in corpus: 96 GiB generated in memory (skipped on a machine with twice
  // that or more, or whose memory is unknown).
  const int64_t windows = 2147483647;
  const Plan moe = tiny_plan("moe-h", false, 10, 4, 40);  // a manifest has MoE points
  const std::size_t host = moeplan::backend::host_memory_bytes();
  if (host > 0 && double(host) < 192.0 * 1073741824.0) {
    write_manifest_atomic(
        tiny_manifest(tiny_plan("dense", true, (windows + 3) / 4, 4, windows), {moe}),
        dir / "corpus.toml");
    const Result corpus = run_cli({"run", (dir / "corpus.toml").string(), "--point", "dense",
                                   "--out", (dir / "runs").string(), "--estimate", "1"});
    CHECK(corpus.status == 2);
    CHECK(one_line(corpus.err));
    // (one token more than the windows each: the last window's targets; 3·(34,359,738,353 +
    // 257) B = 103,079,215,830 B / 2^30 = 96.0000002 GiB)
    CHECK_MESSAGE(corpus.err.find("source builtin: 34359738353 training + 257 validation tokens "
                                  "are generated in memory (96.00 GiB at 3 bytes a token") !=
                      std::string::npos,
                  corpus.err);
    CHECK_MESSAGE(corpus.err.find("set [train] source = \"shards:GLOB\"") != std::string::npos,
                  corpus.err);
  }
  // Dm 65536, Dffn 262144, 2 layers: 2·(4·Dm² + 3·Dm·Dffn) + 2·V·Dm ≈ 1.4e11 parameters, whose
  // fp32 weights, gradients and two moments take 16 bytes each: about 2.2 TB.
  Arch huge = tiny_arch(true);
  huge.d_model = 65536;
  huge.heads = huge.kv_heads = 512;
  huge.head_dim = 128;
  huge.d_ffn = 262144;
  const Plan big = plan_for("dense", huge, 1, 1, 1);
  const double state = 16.0 * double(count_params(huge).trainable());
  REQUIRE(state > 2e12);
  write_manifest_atomic(tiny_manifest(big, {moe}), dir / "model.toml");
  const Result model = run_cli({"run", (dir / "model.toml").string(), "--point", "dense", "--out",
                                (dir / "runs").string()});
  CHECK(model.status == 2);
  CHECK(one_line(model.err));
  // Refused by the fit check, before any point trains: no pass can help.
  CHECK_MESSAGE(model.err.find(fmt::format("--device cpu: the model's weights, gradients and "
                                           "AdamW state alone take {:.2f} TiB (16 bytes a "
                                           "parameter); this machine has ",
                                           state / double(1ull << 40))) != std::string::npos,
                model.err);
  CHECK_MESSAGE(model.err.find("(use a larger machine, or --device cuda); found before any point "
                               "trained") != std::string::npos,
                model.err);
  CHECK_FALSE(fs::exists(dir / "runs" / "dense" / "record.json"));
}

TEST_CASE("WORLD_SIZE refusals (emulated): one line naming the value, exit 2, nothing written") {
  const fs::path dir = fresh_dir("cuda_dp_refusals");
  // 6 sequences a step cannot give each of 8 ranks one.
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 4, 6, 40, 3e-3, 16),
                                      {tiny_plan("moe-a", false, 4, 6, 40, 3e-3, 16)}),
                        dir / "sweep.toml");
  struct Case {
    std::vector<std::pair<const char*, const char*>> env;
    std::string needle;
  };
  const Case cases[] = {
      {{{"WORLD_SIZE", "8"}, {"RANK", "1"}, {"MOEPLAN_EMU_DEVICES", "8"}},
       "batch_seqs 6 is smaller than WORLD_SIZE=8; every rank needs at least one sequence"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "1"}},
       "LOCAL_RANK=1 (RANK: LOCAL_RANK is not set) but this machine shows 1 CUDA device"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}},
       "LOCAL_RANK=1 but this machine shows 1 CUDA device"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}}, "RANK=2 must be below WORLD_SIZE=2"},
      // Both processes of a job without RANK were rank 0; RANK alone trained on GPU 0 alone.
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE=2 but RANK is not set"},
      {{{"RANK", "1"}, {"LOCAL_RANK", "1"}}, "RANK=1 is set but WORLD_SIZE is not"},
      {{{"WORLD_SIZE", "two"}}, "WORLD_SIZE='two' is not a non-negative integer"},
  };
  for (const Case& c : cases) {
    INFO(c.needle);
    for (const auto& [k, v] : c.env) ::setenv(k, v, 1);
    const Result r = run_cli({"run", (dir / "sweep.toml").string(), "--point", "dense", "--out",
                              (dir / "runs").string(), "--device", "cuda"},
                             MOEPLAN_EMULATED_BINARY);
    for (const auto& [k, v] : c.env) ::unsetenv(k);
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find(c.needle) != std::string::npos, r.err);
    // Refused before the point's folder (its .lock, checkpoint/) is made, not only its record.
    CHECK_FALSE(fs::exists(dir / "runs" / "dense"));
  }
}

// `moeplan run --nproc 2`: moeplan starts the two ranks itself (emulated devices).
// ZeRO stage 1 end to end: the AdamW state split over two ranks, a batch of 5 split 3 + 2.
TEST_CASE("moeplan run --nproc 2 --shard-optimizer (emulated): the same training; exact resume") {
  const fs::path dir = fresh_dir("cuda_shard");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 4, 5, 40, 3e-3, 16),
                                      {tiny_plan("moe-s", false, 24, 5, 50, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
  auto args = [&](const std::string& out, bool shard) {
    std::vector<std::string> a{"run",  sweep,    "--point", "moe-s",   "--out",
                               (dir / out).string(), "--device", "cuda", "--nproc", "2",
                               "--checkpoint-every", "4"};
    if (shard) a.push_back("--shard-optimizer");
    return a;
  };
  const Result plain = run_cli(args("plain", false), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(plain.status == 0, plain.err);
  const Result sharded = run_cli(args("sharded", true), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(sharded.status == 0, sharded.err);
  CHECK_MESSAGE(sharded.out.find(", optimizer sharded, no GEMM table (none built in for") !=
                    std::string::npos,
                sharded.out);
  // Unsharded, the gradients' all-reduce runs beside the backward (Model::set_reduce_overlap).
  CHECK_MESSAGE(
      plain.out.find(", all-reduce beside the backward, no GEMM table") != std::string::npos,
      plain.out);
  CHECK(sharded.out.find("all-reduce beside") == std::string::npos);
  const json rp = record(dir / "plain", "moe-s"), rs = record(dir / "sharded", "moe-s");
  CHECK(rp["optimizer_sharded"] == false);
  CHECK(rs["optimizer_sharded"] == true);
  CHECK(rs["measured"]["tokens"] == rp["measured"]["tokens"]);
  CHECK(rs["measured"]["flops"]["by_category"] == rp["measured"]["flops"]["by_category"]);
  // Only the gradient norm's summation order differs (partial sums per chunk, added over ranks).
  const double lp = rp["loss_curve"].back()["train_loss"].get<double>();
  const double ls = rs["loss_curve"].back()["train_loss"].get<double>();
  CHECK(std::abs(ls - lp) / lp < 1e-4);

  // Interrupted and resumed sharded: every rank takes part in each checkpoint (the moments are
  // gathered) and loads its chunk back; the curves equal the uninterrupted sharded run's.
  const pid_t pid =
      spawn(args("resumed", true), dir / "r.out", dir / "r.err", MOEPLAN_EMULATED_BINARY);
  wait_for_file(dir / "resumed" / "moe-s" / "record.json");
  ::kill(pid, SIGINT);
  CHECK(wait_status(pid) == 130);
  REQUIRE_MESSAGE(record(dir / "resumed", "moe-s")["status"] == "running",
                  "the run finished before the interrupt");
  const Result again = run_cli(args("resumed", true), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(again.status == 0, again.err);
  CHECK(again.out.find("resumed at step") != std::string::npos);
  const json rr = record(dir / "resumed", "moe-s");
  CHECK(rr["loss_curve"] == rs["loss_curve"]);
  CHECK(rr["val_curve"] == rs["val_curve"]);
  CHECK(rr["measured"]["tokens"] == rs["measured"]["tokens"]);
  ::unsetenv("MOEPLAN_EMU_DEVICES");
  ::unsetenv("MOEPLAN_EMU_NCCL_TIMEOUT");

  // Without data parallelism there is nothing to shard over: one line, exit 2.
  for (const char* device : {"cpu", "cuda"}) {
    INFO(device);
    const Result r = run_cli({"run", sweep, "--point", "dense", "--out", (dir / "no").string(),
                              "--device", device, "--shard-optimizer"},
                             MOEPLAN_EMULATED_BINARY);
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find("--shard-optimizer splits the AdamW state over data-parallel") !=
                      std::string::npos,
                  r.err);
    // On the cpu it is refused before anything is made (it left an empty point folder).
    if (std::string(device) == "cpu") CHECK_FALSE(fs::exists(dir / "no"));
  }
  CHECK_FALSE(fs::exists(dir / "no" / "dense" / "record.json"));
}

TEST_CASE("moeplan run --nproc 2 (emulated): the ranks started, Ctrl-C forwarded, a lost rank") {
  const fs::path dir = fresh_dir("cuda_nproc");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 12, 4, 40, 3e-3, 16),
                                      {tiny_plan("moe-i", false, 32, 4, 50, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
  auto args = [&](const std::string& out, const std::string& point) {
    return std::vector<std::string>{"run",
                                    sweep,
                                    "--point",
                                    point,
                                    "--out",
                                    (dir / out).string(),
                                    "--device",
                                    "cuda",
                                    "--nproc",
                                    "2",
                                    "--checkpoint-every",
                                    "4"};
  };

  // The job's ledgers, as from one process (AdamW aside), and the one process's training.
  const Result one = run_cli(
      {"run", sweep, "--point", "dense", "--out", (dir / "one").string(), "--device", "cuda"},
      MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(one.status == 0, one.err);
  const Result two = run_cli(args("two", "dense"), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(two.status == 0, two.err);
  CHECK(two.out.find("2 data-parallel ranks started") != std::string::npos);
  CHECK(two.out.find("[dense 1/1] complete:") != std::string::npos);
  CHECK(two.out.find("complete on this rank") == std::string::npos);  // rank 1 is quiet
  {
    const json want = record(dir / "one", "dense"), got = record(dir / "two", "dense");
    CHECK(got["measured"]["tokens"] == want["measured"]["tokens"]);
    CHECK(got["measured"]["flops"]["by_category"] == want["measured"]["flops"]["by_category"]);
    const double lw = want["loss_curve"].back()["train_loss"].get<double>();
    const double lg = got["loss_curve"].back()["train_loss"].get<double>();
    CHECK(std::abs(lg - lw) / lw < 1e-4);
  }

  // Ctrl-C to the launcher: forwarded, both ranks stop at one step, exit 130; the same command
  // resumes.
  {
    const pid_t pid =
        spawn(args("runs", "moe-i"), dir / "i.out", dir / "i.err", MOEPLAN_EMULATED_BINARY);
    wait_for_file(dir / "runs" / "moe-i" / "record.json");
    ::kill(pid, SIGINT);
    CHECK(wait_status(pid) == 130);
    const json rec = record(dir / "runs", "moe-i");
    REQUIRE_MESSAGE(rec["status"] == "running", "the run finished before the interrupt");
    const Result again = run_cli(args("runs", "moe-i"), MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(again.status == 0, again.err);
    CHECK(again.out.find("resumed at step") != std::string::npos);
    CHECK(record(dir / "runs", "moe-i")["status"] == "complete");
    CHECK(record(dir / "runs", "moe-i")["measured"]["tokens"]["consumed"].get<int64_t>() ==
          32 * 4 * 16);
  }

  // The ranks' pids, from the launcher's "(pids 123, 124)" line.
  auto rank_pids = [](const fs::path& out_file) {
    std::vector<pid_t> ranks;
    for (int i = 0; i < 300000 && ranks.empty(); ++i) {
      std::string out;
      try {
        out = read_file(out_file);
      } catch (...) {  // not created yet
      }
      const size_t at = out.find("(pids ");
      if (at != std::string::npos && out.find(')', at) != std::string::npos) {
        size_t pos = at + 6;
        while (ranks.size() < 2) {
          ranks.push_back(pid_t(std::stol(out.substr(pos))));
          pos = out.find(", ", pos);
          if (pos == std::string::npos) break;
          pos += 2;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return ranks;
  };
  // Whether a process runs (a zombie no parent reaps is gone for this purpose).
  auto running = [](pid_t p) {
    std::string stat;
    try {
      stat = read_file(fs::path("/proc") / std::to_string(p) / "stat");
    } catch (...) {
      return false;
    }
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
  };

  // Started as nohup starts it (SIGHUP ignored): the ranks keep ignoring it, as one process does
  // (the launcher reset it to the default in each rank, and a hang-up stopped the job).
  {
    const pid_t pid =
        spawn(args("nohup", "moe-i"), dir / "n.out", dir / "n.err", MOEPLAN_EMULATED_BINARY, true);
    const std::vector<pid_t> ranks = rank_pids(dir / "n.out");
    REQUIRE(ranks.size() == 2);
    wait_for_file(dir / "nohup" / "moe-i" / "record.json");
    for (pid_t p : {pid, ranks[0], ranks[1]}) ::kill(p, SIGHUP);
    CHECK(wait_status(pid) == 0);
    CHECK(record(dir / "nohup", "moe-i")["status"] == "complete");
  }

  // The launcher killed (SIGKILL): its ranks do not train on as orphans, holding their GPUs and
  // the point's lock; each stops as on Ctrl-C, at a checkpoint.
  {
    const pid_t pid =
        spawn(args("orphan", "moe-i"), dir / "o.out", dir / "o.err", MOEPLAN_EMULATED_BINARY);
    const std::vector<pid_t> ranks = rank_pids(dir / "o.out");
    REQUIRE(ranks.size() == 2);
    wait_for_file(dir / "orphan" / "moe-i" / "record.json");
    ::kill(pid, SIGKILL);
    CHECK(wait_status(pid) == 128 + SIGKILL);
    for (int i = 0; i < 1200 && (running(ranks[0]) || running(ranks[1])); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(running(ranks[0]));
    CHECK_FALSE(running(ranks[1]));
    CHECK_MESSAGE(record(dir / "orphan", "moe-i")["status"] == "running",
                  "the ranks finished the point before they were stopped");
  }

  // A rank killed mid-run: the launcher stops the other (waiting in an all-reduce for it) after
  // its grace period, instead of leaving it there, and says which rank failed.
  {
    // The emulated NCCL's own timeout far away (600 s): a rank 0 that ends before it was ended
    // by the launcher, whatever the machine's speed (training before the kill is not counted).
    ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "600", 1);
    const pid_t pid =
        spawn(args("lost", "moe-i"), dir / "l.out", dir / "l.err", MOEPLAN_EMULATED_BINARY);
    const std::vector<pid_t> ranks = rank_pids(dir / "l.out");
    REQUIRE(ranks.size() == 2);
    wait_for_file(dir / "lost" / "moe-i" / "record.json");
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(ranks[1], SIGKILL);
    const int st = wait_status(pid);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(st == 128 + SIGKILL);
    const std::string err = read_file(dir / "l.err");
    CHECK(one_line(err));
    CHECK_MESSAGE(err.find("rank 1 of 2 was killed by signal 9; the other ranks were stopped") !=
                      std::string::npos,
                  err);
    CHECK(::kill(ranks[0], 0) != 0);  // rank 0 is gone (stopped and reaped by the launcher)
    MESSAGE("launcher returned ", took, " s after the kill (grace 10 s)");
    CHECK(took < 300);  // long before the emulated NCCL's 600 s timeout would have ended rank 0
  }
  ::unsetenv("MOEPLAN_EMU_DEVICES");
  ::unsetenv("MOEPLAN_EMU_NCCL_TIMEOUT");
}

using moeplan::test::occurrences;

// The lines of `out` that start with `start` and hold `part`.
std::vector<std::string> lines_with(const std::string& out, const std::string& start,
                                    const std::string& part) {
  std::vector<std::string> found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(start, 0) == 0 && line.find(part) != std::string::npos) found.push_back(line);
  return found;
}

TEST_CASE("moeplan run --points-at-once 2 (emulated): each point once, on one worker's GPUs") {
  const fs::path dir = fresh_dir("cuda_points_at_once");
  write_manifest_atomic(tiny_manifest(tiny_plan("dense", true, 24, 4, 50, 3e-3, 16),
                                      {tiny_plan("moe-a", false, 16, 4, 50, 3e-3, 16),
                                       tiny_plan("moe-b", false, 12, 4, 50, 3e-3, 16)}),
                        dir / "sweep.toml");
  const std::string sweep = (dir / "sweep.toml").string();
  ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
  auto args = [&](const std::string& out, std::vector<std::string> more) {
    std::vector<std::string> a{
        "run", sweep, "--out", (dir / out).string(), "--device", "cuda", "--checkpoint-every", "4"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const std::vector<std::string> ids{"dense", "moe-a", "moe-b"};

  // One process, point after point: the reference.
  const Result one = run_cli(args("one", {}), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(one.status == 0, one.err);

  // Two workers, one GPU each: every point trained once, by one of them, with the training and
  // the ledgers of the one process (the same kernels on the same shapes: the same bits).
  const Result two = run_cli(args("two", {"--points-at-once", "2"}), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(two.status == 0, (two.out + two.err));
  CHECK_MESSAGE(two.out.find("moeplan: 2 workers started, each training one point at a time: "
                             "GPU 0 (pid ") != std::string::npos,
                two.out);
  CHECK(two.out.find(", GPU 1 (pid ") != std::string::npos);
  for (const std::string& id : ids) {
    // Trained by exactly one worker: its plan line and its complete line once, under one GPU.
    const auto planned = lines_with(two.out, "[" + id + " ", "] N ");
    const auto done = lines_with(two.out, "[" + id + " ", "] complete:");
    REQUIRE_MESSAGE(planned.size() == 1, two.out);
    REQUIRE_MESSAGE(done.size() == 1, two.out);
    const bool gpu0 = planned[0].find(", GPU 0] N ") != std::string::npos;
    CHECK_MESSAGE((gpu0 || planned[0].find(", GPU 1] N ") != std::string::npos), planned[0]);
    CHECK(done[0].find(gpu0 ? ", GPU 0] " : ", GPU 1] ") != std::string::npos);
    const json want = record(dir / "one", id), got = record(dir / "two", id);
    CHECK(got["status"] == "complete");
    CHECK(got["measured"]["tokens"] == want["measured"]["tokens"]);
    CHECK(got["measured"]["flops"]["by_category"] == want["measured"]["flops"]["by_category"]);
    CHECK(got["loss_curve"] == want["loss_curve"]);
  }
  // Both GPUs trained: the second worker starts while the first trains the dense point (24
  // steps, seconds here), leaves it and takes the next.
  CHECK_MESSAGE(occurrences(two.out, ", GPU 0] N ") >= 1, two.out);
  CHECK_MESSAGE(occurrences(two.out, ", GPU 1] N ") >= 1, two.out);
  // The points one worker left to the other are not "left to another process".
  CHECK(two.out.find("being trained by another") == std::string::npos);
  CHECK(two.out.find("left to another") == std::string::npos);

  // Ctrl-C to the launcher: forwarded to both workers, which stop at a checkpoint; exit 130.
  // The same command resumes, and the points end where the one process's ended.
  auto point_of = [&](const fs::path& out_file, const std::string& gpu) {
    for (int i = 0; i < 300000; ++i) {
      std::string out;
      try {
        out = read_file(out_file);
      } catch (...) {  // not created yet
      }
      const auto lines = lines_with(out, "[", ", " + gpu + "] N ");
      if (!lines.empty()) return lines[0].substr(1, lines[0].find(' ') - 1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return std::string();
  };
  {
    const pid_t pid = spawn(args("stop", {"--points-at-once", "2"}), dir / "s.out", dir / "s.err",
                            MOEPLAN_EMULATED_BINARY);
    const std::string a = point_of(dir / "s.out", "GPU 0"), b = point_of(dir / "s.out", "GPU 1");
    REQUIRE_FALSE(a.empty());
    REQUIRE_FALSE(b.empty());
    wait_for_file(dir / "stop" / a / "record.json");
    wait_for_file(dir / "stop" / b / "record.json");
    ::kill(pid, SIGINT);
    CHECK(wait_status(pid) == 130);
    const std::string out = read_file(dir / "s.out");
    CHECK_MESSAGE(
        lines_with(out, "[" + a + " ", ", GPU 0] interrupted: checkpoint at step").size() == 1,
        out);
    CHECK_MESSAGE(
        lines_with(out, "[" + b + " ", ", GPU 1] interrupted: checkpoint at step").size() == 1,
        out);
    const Result resumed =
        run_cli(args("stop", {"--points-at-once", "2"}), MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(resumed.status == 0, (resumed.out + resumed.err));
    for (const std::string& id : ids) {
      CHECK(record(dir / "stop", id)["status"] == "complete");
      CHECK(record(dir / "stop", id)["loss_curve"] == record(dir / "one", id)["loss_curve"]);
    }
  }

  // A worker killed: the other trains on (its points wait on no other's), the launcher names the
  // lost worker in one line and returns its status; the same command then trains what is left.
  {
    const pid_t pid = spawn(args("lost", {"--points-at-once", "2"}), dir / "l.out", dir / "l.err",
                            MOEPLAN_EMULATED_BINARY);
    const std::string b = point_of(dir / "l.out", "GPU 1");
    REQUIRE_FALSE(b.empty());
    const std::string started = lines_with(read_file(dir / "l.out"), "moeplan: 2 workers", "")[0];
    const size_t at = started.find(", GPU 1 (pid ");
    REQUIRE(at != std::string::npos);
    const pid_t worker = pid_t(std::stol(started.substr(at + 13)));
    wait_for_file(dir / "lost" / b / "record.json");
    ::kill(worker, SIGKILL);
    CHECK(wait_status(pid) == 128 + SIGKILL);
    const std::string err = read_file(dir / "l.err");
    CHECK(one_line(err));
    CHECK_MESSAGE(err.find("the worker on GPU 1 (1 of 2) was killed by signal 9; the others "
                           "trained on") != std::string::npos,
                  err);
    // The other worker trained its points, and the lost one's too where it had not yet passed it
    // (its lock went with the worker: resumed from its checkpoint).
    size_t complete = 0;
    for (const std::string& id : ids)
      complete += fs::exists(dir / "lost" / id / "record.json") &&
                  record(dir / "lost", id)["status"] == "complete";
    CHECK(complete >= ids.size() - 1);
    MESSAGE("the lost worker's point was ", std::string(complete == ids.size() ? "" : "not "),
            "taken by the other");
    const Result rest = run_cli(args("lost", {"--points-at-once", "2"}), MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(rest.status == 0, rest.err);
    if (complete < ids.size())
      CHECK_MESSAGE(rest.out.find("1 point to train, so no workers: this process trains it") !=
                        std::string::npos,
                    rest.out);
    for (const std::string& id : ids)
      CHECK(record(dir / "lost", id)["loss_curve"] == record(dir / "one", id)["loss_curve"]);
  }

  // Workers of data-parallel ranks: --nproc 2 GPUs each, as many as four GPUs hold (0: two).
  // Each worker's ranks see its two GPUs only (CUDA_VISIBLE_DEVICES), and the ledgers are the
  // one process's.
  {
    ::setenv("MOEPLAN_EMU_DEVICES", "4", 1);
    ::setenv("MOEPLAN_EMU_NCCL_TIMEOUT", "60", 1);
    const Result dp =
        run_cli(args("dp", {"--points-at-once", "0", "--nproc", "2"}), MOEPLAN_EMULATED_BINARY);
    REQUIRE_MESSAGE(dp.status == 0, (dp.out + dp.err));
    CHECK_MESSAGE(dp.out.find("moeplan: 2 workers started, each training one point at a time "
                              "over 2 GPUs: GPUs 0,1 (pid ") != std::string::npos,
                  dp.out);
    CHECK(dp.out.find(", GPUs 2,3 (pid ") != std::string::npos);
    for (const std::string& id : ids) {
      const auto done = lines_with(dp.out, "[" + id + " ", "] complete:");
      REQUIRE_MESSAGE(done.size() == 1, dp.out);
      CHECK((done[0].find(", GPUs 0,1] ") != std::string::npos ||
             done[0].find(", GPUs 2,3] ") != std::string::npos));
      const json want = record(dir / "one", id), got = record(dir / "dp", id);
      CHECK(got["measured"]["tokens"] == want["measured"]["tokens"]);
      CHECK(got["world_size"] == 2);
    }
    ::setenv("MOEPLAN_EMU_DEVICES", "2", 1);
    ::unsetenv("MOEPLAN_EMU_NCCL_TIMEOUT");
  }

  // Run again: nothing to train, no workers; each point said skipped once.
  const Result again = run_cli(args("two", {"--points-at-once", "2"}), MOEPLAN_EMULATED_BINARY);
  REQUIRE_MESSAGE(again.status == 0, again.err);
  CHECK(again.out.find("workers started") == std::string::npos);
  CHECK(occurrences(again.out, "already complete") == ids.size());

  // Refused in one line, exit 2, nothing written: more GPUs than the machine shows (--nproc
  // GPUs a worker), --point, --estimate, the cpu device.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
      {{"--points-at-once", "3"},
       "--points-at-once 3 needs 3 GPUs but this machine shows 2 CUDA device(s); choose "
       "--points-at-once of at most 2"},
      {{"--points-at-once", "2", "--nproc", "2"},
       "--points-at-once 2 with --nproc 2 needs 4 GPUs but this machine shows 2"},
      {{"--points-at-once", "2", "--point", "moe-a"}, "with --point there is one"},
      {{"--points-at-once", "2", "--estimate", "2"}, "leave out --points-at-once"},
      {{"--points-at-once", "-1"},
       "--points-at-once -1 must be from 1 to 1024 (0: as many as the GPUs this process sees "
       "hold)"},
  };
  for (const auto& [more, line] : refused) {
    const Result r = run_cli(args("refused", more), MOEPLAN_EMULATED_BINARY);
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find(line) != std::string::npos, r.err);
    CHECK_FALSE(fs::exists(dir / "refused"));
  }
  {
    std::vector<std::string> cpu = args("refused", {"--points-at-once", "2"});
    cpu[5] = "cpu";
    const Result r = run_cli(cpu, MOEPLAN_EMULATED_BINARY);
    CHECK(r.status == 2);
    CHECK(one_line(r.err));
    CHECK_MESSAGE(r.err.find("it needs --device cuda (not 'cpu')") != std::string::npos, r.err);
  }
  ::unsetenv("MOEPLAN_EMU_DEVICES");
}
