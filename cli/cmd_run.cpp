// `moeplan run sweep.toml`: train every point of a manifest (or one), resuming interrupted points
// and skipping complete ones. Ctrl-C checkpoints and exits 130; a diverged loss exits 4.
// --nproc N (cuda) starts N data-parallel ranks of the same command and waits for them;
// --points-at-once K starts K workers of it, each on GPUs of its own, that share the sweep's
// points.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/runs.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/launch.hpp"
#include "moeplan/backend/run.hpp"
#include "moeplan/reports/text_table.hpp"
#include "moeplan/sweeps/manifest_io.hpp"

namespace moeplan::cli {
namespace {

constexpr int kExitInterrupted = 130;
constexpr int kExitDiverged = 4;
constexpr int kExitBusy = 3;  // every other point done; some left to another process training them
constexpr int kMaxRanks = 1024;  // --nproc: GPUs of one machine, with room

std::atomic<int> g_stop{0};
// Before the first point starts nothing has been written (the checks only read): a stop then
// ends the process at once, with the status a stop during training gives.
extern "C" void on_stop_before_training(int) {
  ::_exit(130);
}
// A second stop signal stops at once (exit 130; the point resumes from its last checkpoint, which
// is written atomically, so one cut short leaves the previous one), for a process that cannot
// reach the end of its step: a data-parallel rank waiting in NCCL for a peer that is gone, or a
// step far longer than the user will wait. Only a signal kForceAfterNs or more after the first:
// a terminal's Ctrl-C reaches every process of the job at once, and the --nproc launcher (or
// torchrun) then forwards its own to each rank, which must stay the same stop.
std::atomic<int64_t> g_stop_ns{0};  // when the first came (CLOCK_MONOTONIC)
constexpr int64_t kForceAfterNs = 3'000'000'000;
bool g_stop_hint = false;  // say on the first what a second does (not on data-parallel ranks)
constexpr char kStopHint[] =
    "moeplan: stopping at the end of this step (a checkpoint, then exit 130); a second Ctrl-C "
    "(or SIGTERM), 3 s or more after this one, stops at once\n";
constexpr char kStopForced[] =
    "moeplan: stopped at once by a second signal; the point resumes from its last checkpoint\n";
extern "C" void on_stop_signal(int sig) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe, as are write and _exit
  const int64_t ns = int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  int none = 0;
  if (g_stop.compare_exchange_strong(none, sig)) {
    g_stop_ns.store(ns);
    if (g_stop_hint) (void)!::write(STDERR_FILENO, kStopHint, sizeof kStopHint - 1);
    return;
  }
  if (ns - g_stop_ns.load() < kForceAfterNs) return;
  (void)!::write(STDERR_FILENO, kStopForced, sizeof kStopForced - 1);
  ::_exit(130);
}
// A stop signal the process was started to ignore stays ignored: `nohup moeplan run ...` must
// outlive the terminal (SIGHUP), and a job a script put in the background ignores SIGINT.
void on_stop(int sig, void (*handler)(int)) {
  struct sigaction now {};
  if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) return;
  std::signal(sig, handler);
}

struct RunFlags {
  std::string manifest;
  std::optional<std::string> point;  // given (even empty): only this point
  std::string out = "runs";
  std::string device;
  std::string kernels;
  int64_t checkpoint_every = 0;
  int threads = 0;
  int nproc = 1;
  int points_at_once = 1;  // workers, each training one point at a time on GPUs of its own
  int64_t micro_batch = 0;
  bool shard_optimizer = false;
  bool elastic = false;
  std::string peak_tflops;          // given: one device's peak for MFU, in TFLOP/s
  std::optional<int64_t> estimate;  // given: time this many steps a point, train nothing
  bool profile = false;             // with estimate: then the steps' time by phase
};

// The ranks' (or workers') arguments: this command line without `flag` and its value.
std::vector<std::string> args_without(const std::string& flag) {
  std::vector<std::string> out;
  const auto& a = program_args();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == flag) {
      ++i;  // and its value
      continue;
    }
    if (a[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(a[i]);
  }
  return out;
}

// Set in each worker that `--points-at-once` started ("w/K"), and in its ranks.
const char* points_worker() {
  const char* w = std::getenv("MOEPLAN_POINTS_WORKER");
  return w && *w ? w : nullptr;
}

// Progress rewrites one line of a terminal in place; not in a --points-at-once worker, whose
// lines share the terminal with the other workers' (each would overwrite the others').
bool rewrites_progress() {
  return ::isatty(STDOUT_FILENO) && !points_worker();
}

// `--nproc N` against the device and the points: refused before anything is made.
void check_nproc(const RunFlags& f, const std::string& device,
                 const std::vector<const Plan*>& points) {
  if (f.nproc < 1 || f.nproc > kMaxRanks)
    throw InputError(fmt::format("--nproc {} must be from 1 to {}", f.nproc, kMaxRanks));
  if (device != "cuda")
    throw InputError(fmt::format(
        "--nproc {} starts data-parallel ranks, one per GPU; it needs --device cuda (not '{}')",
        f.nproc, device));
  if (const char* ws = std::getenv("WORLD_SIZE"); ws && *ws && f.nproc > 1)  // before --out
    throw InputError(fmt::format(
        "--nproc {} with WORLD_SIZE={} already set: start the ranks yourself (WORLD_SIZE, RANK, "
        "LOCAL_RANK) or let --nproc start them, not both",
        f.nproc, ws));
  const int visible = backend::visible_devices(device);
  if (visible >= 0 && f.nproc > visible)
    throw InputError(
        fmt::format("--nproc {} but this machine shows {} CUDA device(s)", f.nproc, visible));
  for (const Plan* p : points)
    if (p->budget.batch_seqs < f.nproc)
      throw InputError(fmt::format(
          "--nproc {}: point '{}' has batch_seqs {}, fewer sequences than ranks; choose an "
          "--nproc of at most {}",
          f.nproc, p->id, p->budget.batch_seqs, p->budget.batch_seqs));
}

// `--nproc N`: start N data-parallel ranks of this command and wait for them.
int launch(const RunFlags& f) {
  backend::LaunchRequest req;
  req.nproc = f.nproc;
  req.args = args_without("--nproc");
  req.stop = &g_stop;
  req.on_started = [&](const std::vector<pid_t>& pids) {
    fmt::print("moeplan: {} data-parallel ranks started (pids {}); rank 0 prints and writes\n",
               pids.size(), fmt::join(pids, ", "));
    std::fflush(stdout);
  };
  const backend::LaunchOutcome out = backend::launch_ranks(req);
  if (!out.failure.empty()) std::fprintf(stderr, "moeplan: error: %s\n", out.failure.c_str());
  return out.status;
}

// `--points-at-once K` against the device and the command: refused before anything is made.
// Returns each worker's GPUs (--nproc of them) as its CUDA_VISIBLE_DEVICES, none for K = 1.
std::vector<std::string> worker_gpus(const RunFlags& f, const std::string& device, bool one_point,
                                     bool estimate) {
  if (f.points_at_once < 0 || f.points_at_once > kMaxRanks)
    throw InputError(fmt::format(
        "--points-at-once {} must be from 1 to {} (0: as many as the GPUs this process sees hold)",
        f.points_at_once, kMaxRanks));
  if (f.points_at_once == 1) return {};
  const int visible = backend::visible_devices(device);
  const int per = f.nproc;
  // 0: one worker for each --nproc GPUs this process sees.
  const int k = f.points_at_once > 0 ? f.points_at_once : std::max(1, visible / per);
  if (device != "cuda")
    throw InputError(fmt::format(
        "--points-at-once {} trains points side by side on GPUs of their own; it needs --device "
        "cuda (not '{}')",
        k, device));
  if (one_point)
    throw InputError(fmt::format(
        "--points-at-once {} shares a sweep's points between workers; with --point there is one "
        "(leave out --point, or --points-at-once)",
        k));
  if (estimate)
    throw InputError(fmt::format(
        "--points-at-once {}: --estimate times the points one after another in one process, so "
        "that their times compare; leave out --points-at-once",
        k));
  if (const char* ws = std::getenv("WORLD_SIZE"); ws && *ws)
    throw InputError(fmt::format(
        "--points-at-once {} with WORLD_SIZE={} already set: it starts processes of its own; "
        "unset WORLD_SIZE, RANK and LOCAL_RANK",
        k, ws));
  if (points_worker())
    throw InputError(fmt::format("--points-at-once {} inside a worker of --points-at-once", k));
  if (k == 1) return {};  // 0 on one GPU (or one --nproc group): this process trains them
  if (int64_t(k) * per > std::max(visible, 0))
    throw InputError(fmt::format(
        "--points-at-once {}{} needs {} GPUs but this machine shows {} CUDA device(s); choose "
        "--points-at-once of at most {}",
        k, per > 1 ? fmt::format(" with --nproc {}", per) : "", int64_t(k) * per,
        std::max(visible, 0), std::max(1, visible / per)));
  // The GPUs as CUDA numbers them for this process: its CUDA_VISIBLE_DEVICES's entries (numbers
  // or UUIDs), the first `visible` of them (CUDA stops at one it cannot find), else 0..n-1.
  std::vector<std::string> all;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd && *cvd) {
    std::istringstream list(cvd);
    for (std::string entry; int(all.size()) < visible && std::getline(list, entry, ',');)
      all.push_back(entry);
  } else {
    for (int i = 0; i < visible; ++i) all.push_back(std::to_string(i));
  }
  std::vector<std::string> out;
  for (int w = 0; w < k; ++w) {
    std::string d;
    for (int r = 0; r < per; ++r) d += (r ? "," : "") + all[size_t(w * per + r)];
    out.push_back(d);
  }
  return out;
}

// `--points-at-once K`: start the workers, wait for them, and say what is left. Each worker is
// this command on its own GPUs; the points' locks share the sweep out between them (a worker
// leaves a point another holds and takes the next), so no point trains twice.
int launch_workers(const RunFlags& f, const std::vector<std::string>& gpus,
                   const std::function<std::vector<std::string>()>& unfinished) {
  backend::LaunchRequest req;
  req.worker_devices = gpus;
  req.args = args_without("--points-at-once");
  req.stop = &g_stop;
  req.on_started = [&](const std::vector<pid_t>& pids) {
    std::string each;
    for (size_t w = 0; w < pids.size(); ++w)
      each += fmt::format("{}{} (pid {})", w ? ", " : "", backend::gpus_named(gpus[w]), pids[w]);
    fmt::print("moeplan: {} workers started, each training one point at a time{}: {}\n",
               pids.size(), f.nproc > 1 ? fmt::format(" over {} GPUs", f.nproc) : "", each);
    std::fflush(stdout);
  };
  const backend::LaunchOutcome out = backend::launch_ranks(req);
  if (!out.failure.empty()) {
    std::fprintf(stderr, "moeplan: error: %s\n", out.failure.c_str());
    return out.status;
  }
  if (out.status != 0 && out.status != kExitBusy) return out.status;  // interrupted
  // Each worker leaves the points the others train, and exits 3 if one was unfinished when it
  // ended: left to another process only if still unfinished now that every worker has ended.
  const std::vector<std::string> left = unfinished();
  if (left.empty()) return kExitOk;
  fmt::print(
      "{} point{} left to another moeplan process ({}); run the same command again when it has "
      "finished\n",
      left.size(), left.size() == 1 ? "" : "s", fmt::join(left, ", "));
  return kExitBusy;
}

std::string duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  // A published-scale point on one device runs for months: days, then years, not "?".
  if (seconds >= 365.25 * 86400) return fmt::format("{:.1f} years", seconds / (365.25 * 86400));
  if (seconds >= 4 * 86400) return fmt::format("{:.1f} days", seconds / 86400);
  // Under 10 s to 0.1 s: an estimate of 0.38 s read "0s".
  if (seconds < 9.95) return fmt::format("{:.1f}s", seconds);
  const auto s = int64_t(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// ", device memory at most 51.40 GiB of 140.00 GiB": the most a point's buffers held at once on
// its GPU (rank 0's), of the device's size.
std::string memory_text(std::size_t peak_bytes, std::size_t device_bytes) {
  return fmt::format(", device memory at most {} of {}", bytes_text(double(peak_bytes)),
                     bytes_text(double(device_bytes)));
}

// " (MFU 41.2 % of the device peak)" for a FLOP rate where the devices' dense peak is known (the
// rate and the peak both of all the job's devices), " (MFU 41.2 % of the given peak)" where
// --peak-tflops gave it; "" otherwise (a CPU, a GPU of unknown peak). Over 100 % of a given peak
// the line asks whether the figure was one device's in TFLOP/s.
std::string mfu_text(double flops_per_second, double peak_flops_per_second, bool given) {
  if (!(peak_flops_per_second > 0)) return "";
  const double mfu = flops_per_second / peak_flops_per_second;
  return fmt::format(" (MFU {:.1f} % of the {} peak{})", 100 * mfu, given ? "given" : "device",
                     given && mfu > 1 ? ": over 100 %; is --peak-tflops one device's peak in "
                                        "TFLOP/s?"
                                      : "");
}

// --peak-tflops: one device's peak in TFLOP/s, > 0. Above 10^5 (100 PFLOP/s, a hundred times any
// GPU's dense bf16 peak) it was written in FLOP/s or for many devices: refused, not taken.
double peak_tflops_of(const std::string& text) {
  const double v = parse_quantity(text, "--peak-tflops");
  if (!(v > 0))
    throw InputError(fmt::format(
        "--peak-tflops {} must be > 0: one device's dense peak in TFLOP/s for the products' "
        "precision (e.g. 989, an H200's in bf16)",
        text));
  if (v > 1e5)
    throw InputError(fmt::format(
        "--peak-tflops {} is no device's peak in TFLOP/s (at most 1e5 is taken): give one "
        "device's in TFLOP/s, e.g. 989 for an H200 in bf16, not FLOP/s or a job's",
        text));
  return v;
}

// An estimated point's whole training time as projected: its median step times its plan's steps
// (evaluations aside, as the report's train time vs dense sets them aside).
struct TrainProjection {
  std::string id;
  bool dense = false;
  double step_seconds = 0;
  int64_t steps = 0;
  double flops_per_step = 0;  // useful, [exact/causal]
  double seconds() const { return step_seconds * double(steps); }
  double flops() const { return flops_per_step * double(steps); }
};

// After an estimate of the dense baseline and some MoE points: each point's projected training
// time against the baseline's, with the figures it comes from. Equal C is not equal time, and
// this says how unequal before the time is spent, and why: the time ratio is the work's (the
// plan's steps times a step's useful FLOPs [exact/causal], which equal C in the paper convention
// does not make equal) over the rate's.
void print_time_against_dense(const std::vector<TrainProjection>& points) {
  const auto dense =
      std::find_if(points.begin(), points.end(), [](const TrainProjection& p) { return p.dense; });
  if (dense == points.end() || !(dense->seconds() > 0) || points.size() < 2) return;
  std::vector<std::string> parts;
  for (const TrainProjection& p : points) {
    if (p.dense) continue;
    const double time = p.seconds() / dense->seconds();
    const double work = dense->flops() > 0 ? p.flops() / dense->flops() : 0.0;
    parts.push_back(fmt::format(
        "{} {:.2f}x ({} steps x {:.3f} ms{})", p.id, time, p.steps, 1e3 * p.step_seconds,
        work > 0 ? fmt::format("; work {:.2f}x at {:.2f}x the rate", work, work / time) : ""));
  }
  fmt::print(
      "projected train time vs dense (dense: {} steps x {:.3f} ms; the median step times the "
      "plan's steps, evaluations aside; work: useful FLOPs [exact/causal]): {}\n",
      dense->steps, 1e3 * dense->step_seconds, fmt::join(parts, ", "));
}

// An estimate's line on its passes where they are not the whole batch (the fit check looked up
// to the rank's share): the most that fit this GPU (on a cpu, this machine's memory), so that
// passes can be sized up as well as down. Empty where the passes hold the whole share.
std::string passes_text(const backend::PassFit& fit, int64_t batch_seqs,
                        const std::string& device) {
  const char* where = device == "cpu" ? "this machine's memory" : "this GPU";
  if (fit.pass >= fit.share) return "";
  const bool whole_batch = fit.share == batch_seqs;  // one process, not a rank's share
  if (fit.largest >= fit.share)
    return fmt::format(
        "passes of {} sequences as timed; {} of {} fits {} in one pass "
        "(--micro-batch 0)",
        fit.pass, whole_batch ? "the step's whole batch" : "this rank's whole share", fit.share,
        where);
  const std::string of = whole_batch ? fmt::format("the step's {}", fit.share)
                                     : fmt::format("this rank's {} a step", fit.share);
  if (fit.largest > fit.pass)
    return fmt::format(
        "passes of {} sequences as timed; up to {} of {} fit {} "
        "(--micro-batch {})",
        fit.pass, fit.largest, of, where, fit.largest);
  return fmt::format("passes of {} sequences as timed, the most of {} that fit {}", fit.pass, of,
                     where);
}

// --profile's table under a point's estimate line: each phase's mean milliseconds a step, its
// share of their sum, and that sum against the unprofiled step's time (on cuda the phases run
// one after another while timed, so the sum may exceed it).
void print_phases(const std::string& label, const backend::Estimate& e) {
  double sum = 0;
  size_t width = 0;
  for (const auto& [name, ms] : e.phases) {
    sum += ms;
    width = std::max(width, name.size());
  }
  fmt::print(
      "{} time of a step by phase (mean of {} more step{}: sum {:.3f} ms, against {:.3f} ms a "
      "step unprofiled):\n",
      label, e.steps_profiled, e.steps_profiled == 1 ? "" : "s", sum, 1e3 * e.step_seconds);
  for (const auto& [name, ms] : e.phases)
    fmt::print("    {:<{}}  {:9.3f} ms  {:5.1f} %\n", name, width, ms,
               sum > 0 ? 100 * ms / sum : 0.0);
}

// A step's progress line, for a terminal `width` columns wide (0: whole). Rewritten in place, a
// line wider than the terminal wraps, and each rewrite clears only its last row: the rows above
// stay, one more each time, and fill the screen. So the fields a narrow terminal can spare go in
// turn (the FLOP rate and MFU, the tokens consumed, the token rate, the loss's unit), then the
// line is cut, a column short of the edge (a character in the last column wraps on some).
std::string progress_line(const backend::Progress& p, const std::string& label, size_t width) {
  const std::string tokens = fmt::format("  {} tokens consumed", human(double(p.tokens_consumed)));
  const std::string rate = fmt::format("  {} tok/s consumed", human(p.tokens_per_second));
  const std::string flops =
      fmt::format("  {} FLOP/s [exact/causal]{}", human(p.flops_per_second),
                  mfu_text(p.flops_per_second, p.peak_flops_per_second, p.peak_given));
  bool with_flops = true, with_tokens = true, with_rate = true, with_unit = true;
  auto line = [&] {
    return fmt::format("{} step {}/{}{}  loss {:.4f}{}{}{}  ETA {}", label, p.step, p.steps,
                       with_tokens ? tokens : "", p.train_loss, with_unit ? " nats/token" : "",
                       with_rate ? rate : "", with_flops ? flops : "", duration(p.eta_seconds));
  };
  if (width == 0) return line();
  for (bool* spare : {&with_flops, &with_tokens, &with_rate, &with_unit}) {
    if (display_width(line()) < width) return line();
    *spare = false;
  }
  return truncate_to_width(line(), width - 1);
}

// Rewritten in place on a terminal, fitted to its width; plain lines about every 10 % or 30 s
// otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter(std::string label) : label_(std::move(label)), tty_(rewrites_progress()) {}
  void operator()(const backend::Progress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = p.step == p.steps;
    const int64_t tenth = std::max<int64_t>(1, p.steps / 10);
    if (tty_) {
      if (!last && now - last_print_ < std::chrono::milliseconds(200)) return;
    } else if (!last && p.step % tenth != 0 && now - last_print_ < std::chrono::seconds(30)) {
      return;
    }
    last_print_ = now;
    const std::string line = progress_line(p, label_, tty_ ? terminal_width() : 0);
    if (tty_) {
      fmt::print("\r\033[K{}", line);
      if (last) fmt::print("\n");
    } else {
      fmt::print("{}\n", line);
    }
    std::fflush(stdout);
  }

 private:
  std::string label_;
  bool tty_;
  std::chrono::steady_clock::time_point last_print_{};
};

// A complete record is skipped, not trained again: it must read as the audit reads it (a damaged
// one is refused before anything trains, exit 2, with `remedy`: record_remedy, its checkpoint
// when that can rebuild the record, else moving the folder away) and hold to its plan. One that
// does not (a `run` writes none such: an edit, or a record of an older moeplan) is still skipped,
// and a warning on stderr says which check fails and the same remedy. Returns that warning.
std::string check_complete_record(const nlohmann::json& rec, const std::string& path,
                                  const std::function<std::string()>& remedy) {
  // The remedy reads the point's checkpoint through (its checksum): only for a record that
  // needs one, not for every finished point of a sweep run again.
  audit::RunRecord r;
  try {
    r = audit::parse_run_record(rec.dump(), path);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}; {}", e.what(), remedy()));
  }
  const audit::AuditReport report = audit::audit_runs({r}, {}, {});
  std::vector<const audit::Finding*> errors;
  for (const audit::Finding& f : report.findings)
    if (f.severity == audit::Severity::error) errors.push_back(&f);
  if (errors.empty()) return {};
  return fmt::format(
      "record '{}' is complete but does not hold to its plan: {}{} (`moeplan audit {}` lists "
      "every finding); it is skipped as it is: to train the point again, {}",
      path, errors.front()->message,
      errors.size() > 1 ? fmt::format(" (and {} more)", errors.size() - 1) : "",
      std::filesystem::path(path).parent_path().parent_path().string(), remedy());
}

int run(const RunFlags& f) {
  namespace fs = std::filesystem;
  // A closed terminal (SIGHUP) stops like Ctrl-C; a closed pipe (`run ... | head`) is no reason
  // to stop training: progress lines to a reader that left are dropped, not fatal (SIGPIPE
  // killed the run between checkpoints, losing the steps since the last).
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) on_stop(sig, on_stop_before_training);
  std::signal(SIGPIPE, SIG_IGN);
  const Manifest m = read_manifest(f.manifest);
  std::vector<const Plan*> points{&m.dense};
  for (const Plan& p : m.points) points.push_back(&p);
  std::vector<const Plan*> siblings;  // the sweep's points --point leaves out
  if (f.point) {
    std::vector<const Plan*> one;
    std::string ids;
    for (const Plan* p : points) {
      if (p->id == *f.point) one.push_back(p);
      ids += (ids.empty() ? "" : ", ") + p->id;
    }
    if (one.empty())
      throw InputError(
          fmt::format("--point '{}' is not in {}; its points are: {}", *f.point, f.manifest, ids));
    for (const Plan* p : points)
      if (p != one.front()) siblings.push_back(p);
    points = one;
  }
  if (f.checkpoint_every < 0)
    throw InputError(
        fmt::format("--checkpoint-every {} must be >= 1 (or 0 for auto)", f.checkpoint_every));
  if (f.threads < 0) throw InputError(fmt::format("--threads {} must be >= 0", f.threads));
  // More threads than the machine has only time-slice one core between them (--threads 100000
  // trained 300x slower): a typo, refused before anything runs.
  if (const unsigned hw = std::thread::hardware_concurrency(); hw > 0 && f.threads > int(hw))
    throw InputError(fmt::format(
        "--threads {} is more than this machine's {} hardware threads; give at most {} (or 0 "
        "for the default)",
        f.threads, hw, hw));
  if (f.micro_batch < 0)
    throw InputError(fmt::format(
        "--micro-batch {} must be >= 1 (or 0: the whole batch in one pass)", f.micro_batch));
  backend::RunOptions opt;
  if (!f.peak_tflops.empty()) opt.peak_tflops = peak_tflops_of(f.peak_tflops);
  opt.out_dir = f.out;
  opt.device = f.device.empty() ? m.train.device : f.device;
  opt.checkpoint_every = f.checkpoint_every;
  opt.threads = f.threads;
  opt.kernels = f.kernels;
  opt.micro_batch_seqs = f.micro_batch;
  opt.shard_optimizer = f.shard_optimizer;
  opt.elastic = f.elastic;
  opt.n_tolerance = m.n_tolerance;
  opt.compute_tolerance = m.compute_tolerance;
  opt.equal_resources = m.equal_resources;
  // A relative text:/bytes:/shards: path is the manifest's neighbour, wherever run is started.
  opt.source_base = backend::source_base_of(f.manifest);
  opt.stop = &g_stop;
  // --estimate 0 must not quietly train the whole sweep: leaving the flag out trains.
  if (f.estimate && *f.estimate < 1)
    throw InputError(fmt::format(
        "--estimate {} must be >= 1 (steps to time each point by); leave it out to train",
        *f.estimate));
  opt.estimate_steps = f.estimate.value_or(0);
  // --profile times the phases of an estimate's steps on a fresh model: apart from training, whose
  // times and records it would change (the phases then run one after another).
  if (f.profile && !f.estimate)
    throw InputError(
        "--profile times a point's steps phase by phase on a fresh model beside --estimate's; "
        "give --estimate N too (a training run is not profiled: its phases would lose their "
        "overlaps and its record the time)");
  opt.profile = f.profile;
  // Everything that can be refused is refused before the first step of the first point: the
  // plans, the source's size, every point's record and checkpoint (all but the source's
  // fingerprints, compared when a point resumes).
  backend::require_device(opt.device);
  // Refused here, before a point's folder is made (the cpu engine said so only when built).
  if (opt.shard_optimizer && opt.device != "cuda")
    throw InputError(fmt::format(
        "--shard-optimizer splits the AdamW state over data-parallel GPUs; it needs --device "
        "cuda with --nproc N (or WORLD_SIZE), not --device {}",
        opt.device));
  // Likewise --kernels, and on a sweep whose points are all complete too (it trained nothing,
  // so the engine never said so).
  if (!opt.kernels.empty() && opt.device != "cuda")
    throw InputError(
        fmt::format("--kernels '{}' applies to --device cuda; the {} device has one set of kernels",
                    opt.kernels, opt.device));
  // A --kernels the engine would refuse (a misspelt name, fused attention at an odd head_dim):
  // refused here for every point to train, before a folder, lock or rank is made (each rank
  // said so after the launch, and a single process left its .lock and checkpoint/ behind).
  for (const Plan* p : points) backend::check_kernels(opt.device, opt.kernels, p->arch);
  // A build with the backend on a machine without the device: refused here, before a point's
  // plan line is printed and its folder made (make_engine said so only inside the first point).
  if (backend::visible_devices(opt.device) == 0)
    throw InputError(fmt::format("--device {}: no {} device is visible on this machine", opt.device,
                                 opt.device == "cuda" ? "CUDA" : opt.device));
  if (f.nproc != 1) check_nproc(f, opt.device, points);
  std::vector<std::string> worker_devices =
      worker_gpus(f, opt.device, f.point.has_value(), f.estimate.has_value());
  // Rank variables the engine would refuse (RANK without WORLD_SIZE, a LOCAL_RANK past the GPUs,
  // fewer sequences than ranks), likewise before any folder: after --nproc's own checks, which
  // name a WORLD_SIZE set beside --nproc first (the launcher sets them for its ranks).
  if (f.nproc == 1)
    for (const Plan* p : points) backend::check_ranks(opt.device, p->budget.batch_seqs);
  // Ranks started by hand (torchrun's variables) train data parallel on cuda only: on cpu each
  // "rank" trained whole points alone, and the job split the sweep between them in silence.
  if (const auto ws = backend::data_parallel_world(); ws && opt.device != "cuda")
    throw InputError(fmt::format(
        "WORLD_SIZE={} is set: data-parallel ranks need --device cuda; the {} device trains a "
        "point in one process (unset WORLD_SIZE, RANK and LOCAL_RANK)",
        *ws, opt.device));
  // The ranks each point trains on, known before any engine is built (WORLD_SIZE was checked
  // above): a checkpoint of another count is refused with its other checks, before any point
  // trains, not once its turn comes.
  opt.ranks = f.nproc;
  if (const auto ws = backend::data_parallel_world(); ws && f.nproc == 1)
    if (std::from_chars(ws->data(), ws->data() + ws->size(), opt.ranks).ec != std::errc())
      opt.ranks = 0;
  std::map<std::string, std::string> skip_warnings;  // point id: what its complete record fails
  std::vector<const Plan*> pending;                  // to train (or to resume)
  for (const Plan* p : points) {
    backend::check_plan_consistent(*p);
    const nlohmann::json rec = backend::existing_record(*p, plan_to_json(*p), m.train, opt);
    const bool complete = rec.is_object() && rec.value("status", "") == "complete";
    // A complete point is skipped before it touches checkpoint/ or .lock: only one to train.
    if (!f.estimate && !complete) backend::check_point_folder(opt.out_dir, p->id);
    // A complete point reads nothing: its source may be gone (a runs folder moved elsewhere).
    if (!complete) backend::check_source_fits(*p, m.train, opt.source_base);
    if (!complete) pending.push_back(p);
    if (complete)
      skip_warnings[p->id] = check_complete_record(
          rec, (opt.out_dir / p->id / "record.json").string(),
          [&] { return backend::record_remedy(*p, plan_to_json(*p), m.train, opt.out_dir); });
    else if (!f.estimate) {  // an estimate may time another device or passes than the checkpoint's
      backend::check_resumable(*p, plan_to_json(*p), m.train, opt);
      backend::check_point_lock(*p, plan_to_json(*p), m.train, opt.out_dir);
    }
  }
  if (!f.estimate) backend::check_source_tokens(pending, m.train, opt.source_base);
  // No more workers than points to train (a sweep with one left trains it here, on the GPUs
  // the first worker would have had).
  if (!worker_devices.empty() && pending.size() < worker_devices.size()) {
    if (!pending.empty())
      fmt::print("moeplan: --points-at-once {}: {} point{} to train, so {}\n", f.points_at_once,
                 pending.size(), pending.size() == 1 ? "" : "s",
                 pending.size() > 1 ? fmt::format("{} workers", pending.size())
                                    : "no workers: this process trains it");
    worker_devices.resize(pending.size() > 1 ? pending.size() : 0);
  }
  // The points --point leaves out are not trained, but they share the folder: a record or a
  // trainer there of another sweep's [train] settings (another seed) is refused as the point's
  // own would be (after the point's own checks, which name its own problems first).
  if (!f.estimate)
    for (const Plan* p : siblings) backend::check_sibling_point(*p, m.train, opt);
  // A cpu model below 2^16 token·width a pass runs on one thread, a larger one on the default
  // count: one sweep's points can train on different counts, and then the report times none of
  // them against the dense baseline's (a run's time is one device label's).
  if (opt.device == "cpu" && pending.size() > 1) {
    std::map<int, std::vector<std::string>> by_threads;
    for (const Plan* p : pending) by_threads[backend::cpu_threads_of(*p, opt)].push_back(p->id);
    if (by_threads.size() > 1) {
      std::string counts;
      for (const auto& [n, ids] : by_threads)
        counts += fmt::format("{}{} on {} thread{}", counts.empty() ? "" : "; ",
                              fmt::join(ids, ", "), n, n == 1 ? "" : "s");
      fmt::print(stderr,
                 "moeplan: warning: these points train on different CPU thread counts ({}): "
                 "their times will not compare (the report times a point only against a dense "
                 "run of its own device label); --threads 1 trains every point on one\n",
                 counts);
    }
  }
  // Said before training, as `grid` and `show` say it (a hand-edited [train]): once a job, by a
  // process that runs alone or by rank 0 (not by --nproc's launcher, whose rank 0 says it too).
  const char* rank = std::getenv("RANK");
  const bool rank0 =
      !backend::data_parallel_world() || !rank || !*rank || std::string_view(rank) == "0";
  const char* worker = points_worker();
  if (std::any_of(pending.begin(), pending.end(), [](const Plan* p) { return p->role == "moe"; }) &&
      (!worker_devices.empty() || (rank0 && f.nproc == 1 && !worker)))
    if (const std::string w = capacity_factor_warning(m); !w.empty())
      fmt::print(stderr, "moeplan: warning: {}\n", w);
  // An estimate writes nothing, and a sweep whose points are all complete has nothing to write
  // (it reruns from a read-only archive).
  if (!f.estimate && !pending.empty()) backend::ensure_writable_dir(opt.out_dir);

  const char* world = std::getenv("WORLD_SIZE");
  // One process, or the --nproc or --points-at-once launcher.
  g_stop_hint = (world == nullptr || *world == '\0') && !worker;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) on_stop(sig, on_stop_signal);
  // Whether a point's record is complete now (another process may have finished it meanwhile).
  const auto complete_now = [&](const Plan* p) {
    try {
      const nlohmann::json rec = backend::existing_record(*p, plan_to_json(*p), m.train, opt);
      return rec.is_object() && rec.value("status", "") == "complete";
    } catch (const InputError&) {
      return false;  // said when the command is run again
    }
  };
  if (!worker_devices.empty())
    return launch_workers(f, worker_devices, [&] {
      std::vector<std::string> left;
      for (const Plan* p : pending)
        if (!complete_now(p)) left.push_back(p->id);
      return left;
    });
  if (f.nproc != 1) return launch(f);
  // Every point's model on this process's device, as its engine will build it, before the first
  // trains (by each training process: a launcher holds no GPU its ranks or workers train on).
  const std::map<std::string, backend::PassFit> fits =
      backend::check_points_fit(pending, m.train, opt);
  // A worker's lines name its GPUs; the points the others train are theirs, not "left".
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string on_gpus =
      worker ? ", " + backend::gpus_named(cvd ? cvd : "(CUDA_VISIBLE_DEVICES unset)")
             : std::string();
  const bool first_worker = !worker || std::string_view(worker).rfind("0/", 0) == 0;
  int index = 0;
  double estimated_seconds = 0;
  int estimated = 0;
  std::vector<TrainProjection> projected;  // an estimate's points, for the time against dense
  std::vector<std::string> busy;  // points another process is training
  for (const Plan* p : points) {
    ++index;
    const std::string label = fmt::format("[{} {}/{}{}]", p->id, index, points.size(), on_gpus);
    // A stop between points (the last one's checkpoint just written) starts no other. Alone
    // only: data-parallel ranks decide a stop together (run_point's first check, which writes
    // nothing before the first step); one rank returning here would leave the others waiting in
    // the next point's NCCL start-up.
    if (!backend::data_parallel_world() && g_stop.load() != 0) {
      fmt::print("{} not started: stopped; run the same command again to continue\n", label);
      return kExitInterrupted;
    }
    const std::string plan_line = fmt::format(
        "{} N {} (r_a {:.3f}), {} steps x {} seqs x {} = {} tokens consumed, {} unique, "
        "C {} FLOPs [{}]\n",
        label, human(double(p->counts.total_params)), p->counts.activation_rate(), p->budget.steps,
        p->budget.batch_seqs, p->budget.seq_len, human(double(p->budget.tokens_consumed)),
        human(double(p->budget.tokens_unique)), human(p->budget.compute),
        flops_label(p->arch, p->convention, p->mask));
    // A worker says it once the point is its own (its engine made: the lock taken), not for the
    // points it leaves to the others.
    const auto plan_unsaid = std::make_shared<bool>(worker != nullptr);
    if (!worker) fmt::print("{}", plan_line);
    std::fflush(stdout);
    opt.on_progress = ProgressPrinter(label);
    opt.on_engine = [&label, plan_line, plan_unsaid](const std::string& what) {
      if (*plan_unsaid) fmt::print("{}", plan_line);
      *plan_unsaid = false;
      fmt::print("{} {}\n", label, what);
      std::fflush(stdout);
    };
    opt.on_notice = opt.on_engine;
    backend::PointOutcome out;
    try {
      out = backend::run_point(*p, plan_to_json(*p), m.train, opt);
    } catch (const backend::TrainingDiverged& e) {
      if (rewrites_progress()) std::fputs("\n", stdout);  // end the progress line
      std::fflush(stdout);
      std::fprintf(stderr, "moeplan: error: %s\n", e.what());
      return kExitDiverged;
    }
    switch (out.status) {
      case backend::PointStatus::estimated: {
        const backend::Estimate& e = out.estimate;
        if (e.interrupted) {
          if (out.wrote_files) {
            if (rewrites_progress()) std::fputs("\n", stdout);  // end the progress line
            fmt::print("{} estimate interrupted; nothing was written\n", label);
          }
          return kExitInterrupted;
        }
        if (!out.wrote_files) break;  // rank 0 says it
        fmt::print(
            "{} estimate: {:.3f} s a step (median of {}, after 1 warm-up) x {} {}steps + {} "
            "evaluations x {:.2f} s = {}; {} tokens/s consumed, {} FLOP/s [exact/causal]{}{}\n",
            label, e.step_seconds, e.steps_timed, e.steps_remaining,
            e.steps_remaining < p->budget.steps ? "remaining " : "", e.evals_remaining,
            e.eval_seconds, duration(e.seconds()),
            human(double(e.tokens_per_step) / e.step_seconds),
            human(e.flops_per_step / e.step_seconds),
            mfu_text(e.flops_per_step / e.step_seconds, e.peak_flops_per_second, e.peak_given),
            e.memory_peak > 0 ? memory_text(e.memory_peak, e.memory_device) : std::string());
        if (const auto it = fits.find(p->id); it != fits.end())
          if (const std::string passes = passes_text(it->second, p->budget.batch_seqs, opt.device);
              !passes.empty())
            fmt::print("{} {}\n", label, passes);
        if (!e.phases.empty()) print_phases(label, e);
        estimated_seconds += e.seconds();
        ++estimated;
        projected.push_back(
            {p->id, p->role == "dense", e.step_seconds, p->budget.steps, e.flops_per_step});
        break;
      }
      case backend::PointStatus::busy:
        if (!out.wrote_files) break;  // rank 0 says it
        busy.push_back(p->id);
        if (worker) break;  // left to another worker: the launcher says what is left at the end
        fmt::print(
            "{} is being trained by another moeplan process into '{}' (it holds {}); left "
            "to it\n",
            label, opt.out_dir.string(), (opt.out_dir / p->id / ".lock").string());
        break;
      case backend::PointStatus::skipped:
        if (!first_worker) break;  // said once
        fmt::print("{} already complete ({}), skipped\n", label, out.record_path.string());
        if (!skip_warnings[p->id].empty() && rank0) {  // once a job, not once a rank
          std::fflush(stdout);
          fmt::print(stderr, "moeplan: warning: {}\n", skip_warnings[p->id]);
        }
        break;
      case backend::PointStatus::interrupted:
        if (rewrites_progress()) std::fputs("\n", stdout);  // end the progress line
        if (out.checkpoint_step < 0)
          fmt::print(
              "{} interrupted before its first step: nothing written; run the same "
              "command again to train it\n",
              label);
        else
          fmt::print(
              "{} interrupted: checkpoint at step {}; run the same command again to "
              "resume\n",
              label, out.checkpoint_step);
        return kExitInterrupted;
      case backend::PointStatus::completed: {
        if (!out.wrote_files) {  // a data-parallel rank other than 0
          fmt::print("{} complete on this rank; rank 0 wrote {}\n", label,
                     out.record_path.string());
          break;
        }
        const auto& r = out.record;
        const auto& tok = r.at("measured").at("tokens");
        // C in the convention the point was planned in (its plan line's), as measured: a sweep
        // planned in exact/causal is equal there, not in paper C.
        std::string c_label = flops_label(p->arch, Convention::paper, AttentionMask::causal);
        double c = r.at("measured").at("compute").at("paper").get<double>();
        if (p->convention != Convention::paper) {
          const std::string own = flops_label(p->arch, p->convention, p->mask);
          const auto& conv = r.at("measured").at("flops").value("conventions", nlohmann::json());
          if (conv.is_object() && conv.contains(own) && conv[own].is_number())
            c_label = own, c = conv[own].get<double>();
        }
        // On a GPU: the most its buffers held at once, of the device's memory.
        std::string memory;
        if (const nlohmann::json m = r.value("device_memory", nlohmann::json()); m.is_object())
          memory = memory_text(m.value("peak_bytes", std::size_t{0}),
                               m.value("device_bytes", std::size_t{0}));
        fmt::print(
            "{} complete{}: val {} {:.4f}, {} tokens consumed, {} unique, {:.3f} epochs, "
            "C {} FLOPs [{}] measured, {:.1f} s{}{} -> {}\n",
            label,
            out.resumed_from_step >= 0 ? fmt::format(" (resumed at step {})", out.resumed_from_step)
                                       : "",
            // Bits per byte on byte data; a shards: source's tokens are not bytes.
            r.value("data", nlohmann::json::object()).value("byte_tokens", true) ? "BPC"
                                                                                 : "bits/token",
            r.value("final_val_bpc", 0.0), human(double(tok.at("consumed").get<int64_t>())),
            human(double(tok.at("unique").get<int64_t>())), tok.at("epochs").get<double>(),
            human(c), c_label, r.at("wall_seconds").get<double>(),
            r.contains("mfu")
                ? fmt::format(" (training at MFU {:.1f} % [exact/causal]{})",
                              100 * r.at("mfu").get<double>(),
                              r.value("peak_source", "") == "given" ? " of the given peak" : "")
                : "",
            memory, out.record_path.string());
        break;
      }
    }
    std::fflush(stdout);
  }
  if (f.estimate && estimated > 0)
    fmt::print("estimate for {} point(s) on {}: {} of training and evaluation (checkpoint writes "
               "and start-up not included; nothing was written)\n",
               estimated, opt.device, duration(estimated_seconds));
  if (f.estimate) print_time_against_dense(projected);
  // Points left to another process may have finished while this one trained others: only those
  // still unfinished are said to be left (both processes of a shared sweep exited 3 on a sweep
  // that was complete).
  std::erase_if(busy, [&](const std::string& id) {
    for (const Plan* p : points)
      if (p->id == id) return complete_now(p);
    return false;
  });
  if (!busy.empty() && worker) return kExitBusy;  // the launcher says what is left
  if (!busy.empty()) {
    fmt::print(
        "{} point{} left to another moeplan process ({}); run the same command again when "
        "it has finished\n",
        busy.size(), busy.size() == 1 ? "" : "s", fmt::join(busy, ", "));
    return kExitBusy;
  }
  return kExitOk;
}

const bool registered = register_command(
    {"run", "Train a sweep's points on the built-in backend, writing runs/<point>/record.json", 30,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<RunFlags>();
       app.add_option("manifest", f->manifest, "sweep.toml made by `moeplan grid`")
           ->required()
           ->check(non_empty_path("file name"));
       app.add_option("--point", f->point, "run only this point id (e.g. dense, moe-ra0.200)");
       app.add_option("--out", f->out, "folder for runs/<point-id>/ (record.json, checkpoint/)")
           ->capture_default_str()
           ->check(non_empty_path("folder name"));
       app.add_option("--device", f->device, "cpu or cuda (default: the manifest's [train].device)")
           ->check(non_empty_value());
       app.add_option("--kernels", f->kernels,
                      fmt::format("cuda only: {} (default: auto for each: fused_mma_lean and "
                                  "tiled128 in bf16 where they apply, LM head chunks of 8192 "
                                  "rows, the built-in GEMM table made on this GPU and cuBLASLt "
                                  "if any, plain launches, the router on cuBLAS; "
                                  "docs/running.md)",
                                  backend::kCudaKernelChoices))
           ->check(non_empty_value());
       app.add_option("--checkpoint-every", f->checkpoint_every,
                      "steps between checkpoints (default: the manifest's, else ~20 per point)")
           ->transform(decimal_integer(std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(), 0));
       app.add_option("--threads", f->threads,
                      "CPU threads (0: OpenMP's default, this machine's hardware threads or "
                      "OMP_NUM_THREADS; a model under 2^16 tokens x d_model a pass runs on one)")
           ->transform(decimal_integer(std::numeric_limits<int>::max(),
                                       std::numeric_limits<int>::min(), 0));
       app.add_option("--micro-batch", f->micro_batch,
                      "sequences per forward/backward pass on each rank; a step accumulates "
                      "its batch's gradients over the passes (0: the whole batch in one pass); "
                      "on cuda, every point's passes are checked against its GPU before the "
                      "first trains")
           ->transform(decimal_integer(std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(), 0));
       app.add_option("--estimate", f->estimate,
                      "time N steps of each point (after one warm-up step) and one evaluation, "
                      "print the projected time of its remaining steps, train nothing and write "
                      "nothing")
           ->transform(decimal_integer(std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(), 1));
       app.add_flag("--profile", f->profile,
                    "with --estimate N: then time N more steps phase by phase (on cuda with CUDA "
                    "events, the phases one after another) and print where a step's time goes");
       app.add_flag("--shard-optimizer", f->shard_optimizer,
                    "cuda, data parallel: each rank keeps the AdamW state of 1/N of the "
                    "parameters (ZeRO stage 1: 8 bytes a parameter become 8/N)");
       app.add_flag("--elastic", f->elastic,
                    "resume a checkpoint made with other data-parallel ranks (--nproc), "
                    "--micro-batch passes, --shard-optimizer, kernels or CPU --threads, as a "
                    "preempted job restarts on what it gets: the ledgers stay exact, the rest is "
                    "not the bit-for-bit continuation, and the record keeps each layout");
       app.add_option("--peak-tflops", f->peak_tflops,
                      "one device's peak in TFLOP/s that MFU is measured against, for a CPU or "
                      "a GPU whose peak moeplan does not know, or in place of the maker's "
                      "(default: the maker's dense bf16 peak of an H100 or H200; none on a CPU); "
                      "the record says it was given")
           ->check(non_empty_value());
       app.add_option("--nproc", f->nproc,
                      "cuda: train each point data-parallel over this many GPUs of this machine, "
                      "one rank process each (as torchrun would start them)")
           ->transform(decimal_integer(kMaxRanks, std::numeric_limits<int>::min(), 1));
       app.add_option("--points-at-once", f->points_at_once,
                      "cuda: train this many of the sweep's points side by side, each on GPUs of "
                      "its own (--nproc of them, default 1), one worker process each; the "
                      "workers share the points out as they finish them (0: as many as the "
                      "visible GPUs hold)")
           ->transform(decimal_integer(kMaxRanks, std::numeric_limits<int>::min(), 0));
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
