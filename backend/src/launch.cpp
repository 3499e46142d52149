#include "moeplan/backend/launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan::backend {
namespace {

using Clock = std::chrono::steady_clock;

int exit_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::string describe(int wait_status) {
  if (WIFEXITED(wait_status)) return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  return fmt::format("was killed by signal {}", WTERMSIG(wait_status));
}

// The child side of fork: environment, quiet stdout for ranks > 0, then exec. A worker
// (`devices` given) gets its GPUs and its place instead of rank variables, and keeps stdout.
[[noreturn]] void exec_rank(int rank, int nproc, const std::string& id_file,
                            const std::vector<std::string>& args, pid_t parent,
                            const std::string* devices) {
  const std::string r = std::to_string(rank), w = std::to_string(nproc);
  if (devices) {
    ::setenv("CUDA_VISIBLE_DEVICES", devices->c_str(), 1);
    ::setenv("MOEPLAN_POINTS_WORKER", (r + "/" + w).c_str(), 1);
  } else {
    ::setenv("WORLD_SIZE", w.c_str(), 1);
    ::setenv("RANK", r.c_str(), 1);
    ::setenv("LOCAL_RANK", r.c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", w.c_str(), 1);
    ::setenv("MOEPLAN_NCCL_ID_FILE", id_file.c_str(), 1);
  }
  if (rank > 0 && !devices) {  // rank 0 alone prints progress and results; errors reach stderr
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
  }
  // The launcher's stop handlers are not the rank's; a signal the job was started to ignore
  // (nohup's SIGHUP) stays ignored, as it does for a single process (exec keeps SIG_IGN).
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_IGN) ::signal(sig, SIG_DFL);
  }
  // A launcher that dies (SIGKILL) leaves no rank training on alone: each is told to stop as if
  // by Ctrl-C (a checkpoint, then exit), also when it died before this line.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::raise(SIGTERM);
  std::vector<std::string> copy = args;
  std::string self = "/proc/self/exe";
  std::vector<char*> argv{self.data()};
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(self.c_str(), argv.data());
  std::fprintf(stderr, "moeplan: error: rank %d could not start /proc/self/exe\n", rank);
  ::_exit(127);
}

}  // namespace

std::string gpus_named(const std::string& devices) {
  return fmt::format("GPU{} {}", devices.find(',') == std::string::npos ? "" : "s", devices);
}

LaunchOutcome launch_ranks(const LaunchRequest& req) {
  const bool workers = !req.worker_devices.empty();
  const int nproc = workers ? int(req.worker_devices.size()) : req.nproc;
  const char* flag = workers ? "--points-at-once" : "--nproc";
  if (nproc < 2 || nproc > 1024)
    throw InputError(fmt::format("{} {} must be from 2 to 1024 (1: leave it out)", flag, nproc));
  if (const char* ws = std::getenv("WORLD_SIZE"); ws && *ws)
    throw InputError(fmt::format(
        "{} {} with WORLD_SIZE={} already set: start the ranks yourself (WORLD_SIZE, RANK, "
        "LOCAL_RANK) or let moeplan start them, not both",
        flag, nproc, ws));
  const char* what = workers ? "worker" : "rank";
  // A name no other job uses: a stale file of a crashed job can never be read by this one.
  const auto now = Clock::now().time_since_epoch().count();
  const std::string id_file =
      (std::filesystem::temp_directory_path() /
       fmt::format("moeplan-nccl-{}-{}", long(::getpid()), static_cast<long long>(now)))
          .string();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(size_t(nproc), -1);
  std::vector<bool> live(size_t(nproc), false);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0)
      exec_rank(r, nproc, id_file, req.args, launcher,
                workers ? &req.worker_devices[size_t(r)] : nullptr);
    if (pid < 0) {
      for (int q = 0; q < r; ++q) ::kill(pids[size_t(q)], SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(pids[size_t(q)], nullptr, 0);
      throw std::runtime_error(fmt::format("could not start {} {} of {}", what, r, nproc));
    }
    pids[size_t(r)] = pid;
    live[size_t(r)] = true;
  }
  if (req.on_started) req.on_started(pids);

  LaunchOutcome out;
  int remaining = nproc, forwarded = 0, interrupted = 0;
  bool left_to_other = false;
  bool killed_rest = false;
  int failed = 0;  // children that failed (not stopped by us, not interrupted, not exit 3)
  Clock::time_point deadline{};
  while (remaining > 0) {
    const int sig = req.stop ? req.stop->load() : 0;
    if (sig != 0 && forwarded == 0) {
      forwarded = sig;
      for (int r = 0; r < nproc; ++r)
        if (live[size_t(r)]) ::kill(pids[size_t(r)], sig);
    }
    if (out.failed_rank >= 0 && !killed_rest && Clock::now() > deadline) {
      killed_rest = true;  // the others are likely stuck in a collective: SIGKILL
      for (int r = 0; r < nproc; ++r)
        if (live[size_t(r)]) ::kill(pids[size_t(r)], SIGKILL);
    }
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < nproc; ++r)
      if (pids[size_t(r)] == pid) rank = r;
    if (rank < 0 || !live[size_t(rank)]) continue;  // not one of ours
    live[size_t(rank)] = false;
    --remaining;
    const int code = exit_code(st);
    if (code == 0) continue;
    if (code == 130) {
      ++interrupted;
      continue;
    }
    // `moeplan run`'s 3: the sweep done but for points another process is training (rank 0
    // says which). Not a failed rank.
    if (code == 3) {
      left_to_other = true;
      continue;
    }
    if (killed_rest && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) continue;  // stopped by us
    ++failed;
    if (out.failed_rank < 0) {
      out.failed_rank = rank;
      out.status = code;
      // A worker's points wait on no other's: the rest train on (the deadline never comes).
      deadline = workers ? Clock::time_point::max()
                         : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(req.grace_seconds));
      out.failure = workers ? fmt::format("the worker on {} ({} of {}) {}",
                                          gpus_named(req.worker_devices[size_t(rank)]), rank, nproc,
                                          describe(st))
                            : fmt::format("rank {} of {} {}", rank, nproc, describe(st));
    }
  }
  // Rank 0 removes each point's id file (id_file.<point>) once all join; not if one failed.
  std::error_code ec;
  const std::filesystem::path id_path(id_file);
  const std::string prefix = id_path.filename().string() + ".";
  for (const auto& e : std::filesystem::directory_iterator(id_path.parent_path(), ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path(), ec);
  if (out.failed_rank >= 0) {
    if (killed_rest) out.failure += "; the other ranks were stopped";
    // Workers: whether the others trained on, or failed too (a point that fits no GPU fails
    // every worker's check before any trains).
    if (workers)
      out.failure += failed == 1       ? "; the others trained on"
                     : failed == nproc ? (nproc == 2 ? "; the other worker failed too"
                                                     : "; every other worker failed too")
                                       : fmt::format(
                                             "; {} other workers failed too, the rest "
                                             "trained on",
                                             failed - 1);
    return out;
  }
  if (interrupted > 0) out.status = 130;
  else if (left_to_other)
    out.status = 3;
  return out;
}

}  // namespace moeplan::backend
