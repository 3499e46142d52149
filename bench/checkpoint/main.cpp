// Checkpoint cost at a model state of a given size: seconds and peak memory of writing one, of
// reading it to resume (read_checkpoint) and of the pre-check `moeplan run` makes of every point
// before the first trains (read_checkpoint_head). Each operation runs in a process of its own, so
// that its peak resident memory (getrusage) is its own; the ceiling is a plain read of the same
// file into one buffer for reads, an atomic write of the state's bytes alone for writes.
// Medians over repeats; never a test, never fails on time.
// Usage: bench_checkpoint [MiB=512] [repeats=5] [folder=/tmp]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "moeplan/backend/checkpoint.hpp"
#include "moeplan/sweeps/atomic_file.hpp"

namespace fs = std::filesystem;
using namespace moeplan::backend;

namespace {

struct Cost {
  double seconds = 0;
  double peak_mib = 0;  // the child's peak resident memory
};

// Runs `setup` then `op` in a child process: the wall seconds of `op` alone (sent back through a
// pipe) and the child's peak RSS. A child that fails (a write refused: a full disk, a folder in
// the way) says why in one line and the benchmark exits 2; it ended with std::terminate's text.
template <class S, class F>
Cost in_child(S&& setup, F&& op) {
  int fds[2];
  if (::pipe(fds) != 0) {
    std::perror("bench_checkpoint: pipe");
    std::exit(1);
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      setup();
      const auto t0 = std::chrono::steady_clock::now();
      op();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (::write(fds[1], &s, sizeof s) != sizeof s) ::_exit(1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
      ::_exit(2);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  Cost c;
  const bool measured = ::read(fds[0], &c.seconds, sizeof c.seconds) == sizeof c.seconds;
  ::close(fds[0]);
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (!measured || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    std::exit(WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1);
  c.peak_mib = double(ru.ru_maxrss) / 1024.0;  // kilobytes on Linux
  return c;
}

Checkpoint make_checkpoint(size_t bytes) {
  Checkpoint ck;
  ck.plan = {{"id", "bench"}, {"steps", 100}};
  ck.state.tokens = TokenLedger(1024, 100000);
  ck.state.order = WindowOrder(100000, 7);
  ck.model_state.resize(bytes);
  for (size_t i = 0; i < bytes; i += 4096) ck.model_state[i] = char(i / 4096);
  return ck;
}

}  // namespace

int main(int argc, char** argv) {
  const moeplan::bench::Args args(argc, argv,
                                  "bench_checkpoint [MiB=512] [repeats=5] [folder=/tmp]", 3);
  const double mib = args.real(1, 512, 1, 1 << 20);
  const int repeats = int(args.integer(2, 5, 1, 1000));
  const fs::path dir = fs::path(args.text(3, "/tmp")) / "moeplan_bench_checkpoint";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) args.refuse(fmt::format("cannot write to '{}': {}", dir.string(), ec.message()));
  const fs::path file = dir / "state.ckpt", plain = dir / "plain.bin";
  const size_t bytes = size_t(mib * 1024 * 1024);

  const auto nothing = [] {};
  const Cost idle = in_child(nothing, nothing);  // the process itself, for reference
  std::vector<Cost> write, write_ceiling, full, head, ceiling;
  Checkpoint ck;  // built in each child, untimed: its memory is the child's, counted in the peak
  const auto build = [&] { ck = make_checkpoint(bytes); };
  for (int i = 0; i < repeats; ++i) {
    write.push_back(in_child(build, [&] { write_checkpoint(file, ck); }));
    // The ceiling of a write: the same bytes written as every file a run keeps is (a temp file,
    // fsync, rename over the old one, the folder fsynced), with no checksum or other sections.
    write_ceiling.push_back(in_child(build, [&] {
      moeplan::write_file_atomic(plain,
                                 std::string_view(ck.model_state.data(), ck.model_state.size()));
    }));
    full.push_back(in_child(nothing, [&] { (void)read_checkpoint(file).model_state.size(); }));
    head.push_back(in_child(nothing, [&] { (void)read_checkpoint_head(file).step; }));
    ceiling.push_back(in_child(nothing, [&] {
      std::ifstream in(file, std::ios::binary);
      std::vector<char> buf(fs::file_size(file));
      in.read(buf.data(), std::streamsize(buf.size()));
    }));
  }
  auto median = [](const std::vector<Cost>& v, double Cost::*m) {
    std::vector<double> x;
    for (const Cost& c : v) x.push_back(c.*m);
    return moeplan::bench::median(x);
  };
  const double file_mib = double(fs::file_size(file)) / (1024.0 * 1024.0);
  const double read_s = median(ceiling, &Cost::seconds),
               write_s = median(write_ceiling, &Cost::seconds);
  fmt::print(
      "bench_checkpoint: model state {:.0f} MiB (file {:.1f} MiB), {} repeats, medians; peak is "
      "the "
      "process's resident memory (an idle one: {:.1f} MiB); building the state is not timed\n",
      mib, file_mib, repeats, idle.peak_mib);
  fmt::print("{:<40} {:>9} {:>10} {:>12} {:>16}\n", "operation", "seconds", "MiB/s", "x ceiling",
             "peak MiB / state");
  // MiB/s over the bytes each operation moves: the write ceiling writes the model state alone.
  auto row = [&](const char* name, const std::vector<Cost>& v, double ceiling_s, double moved) {
    const double s = median(v, &Cost::seconds), peak = median(v, &Cost::peak_mib);
    fmt::print("{:<40} {:>9.3f} {:>10.0f} {:>12.2f} {:>16.2f}\n", name, s, moved / s, s / ceiling_s,
               (peak - idle.peak_mib) / mib);
  };
  const double state_mib = double(bytes) / (1024.0 * 1024.0);
  row("atomic write of the bytes (write ceiling)", write_ceiling, write_s, state_mib);
  row("write_checkpoint (incl. fsync)", write, write_s, file_mib);
  row("plain read into one buffer (read ceiling)", ceiling, read_s, file_mib);
  row("read_checkpoint (resume)", full, read_s, file_mib);
  row("read_checkpoint_head (pre-check)", head, read_s, file_mib);
  fs::remove_all(dir);
  return 0;
}
