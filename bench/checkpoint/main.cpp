// Checkpoint cost at a model state of a given size: seconds and peak memory of writing one, of
// reading it to resume (read_checkpoint) and of the pre-check `moeplan run` makes of every point
// before the first trains (read_checkpoint_head). Each operation runs in a process of its own, so
// that its peak resident memory (getrusage) is its own; the ceiling is a plain read of the same
// file into one buffer. Medians over repeats; never a test, never fails on time.
// Usage: bench_checkpoint [MiB=512] [repeats=5] [folder=/tmp]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "moeplan/backend/checkpoint.hpp"

namespace fs = std::filesystem;
using namespace moeplan::backend;

namespace {

struct Cost {
  double seconds = 0;
  double peak_mib = 0;  // the child's peak resident memory
};

// Runs `op` in a child process; its wall seconds (sent back through a pipe) and peak RSS.
template <class F>
Cost in_child(F&& op) {
  int fds[2];
  if (::pipe(fds) != 0) std::exit(1);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (::write(fds[1], &s, sizeof s) != sizeof s) ::_exit(1);
    ::_exit(0);
  }
  ::close(fds[1]);
  Cost c;
  if (::read(fds[0], &c.seconds, sizeof c.seconds) != sizeof c.seconds) std::exit(1);
  ::close(fds[0]);
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(1);
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
  const double mib = argc > 1 ? std::atof(argv[1]) : 512;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const fs::path dir = fs::path(argc > 3 ? argv[3] : "/tmp") / "moeplan_bench_checkpoint";
  fs::create_directories(dir);
  const fs::path file = dir / "state.ckpt";
  const size_t bytes = size_t(mib * 1024 * 1024);

  const Cost idle = in_child([] {});  // the process itself, for reference
  std::vector<Cost> write, full, head, ceiling;
  for (int i = 0; i < repeats; ++i) {
    // Building the state is not timed; its memory is the child's own, counted once in the peak.
    write.push_back(in_child([&] {
      static Checkpoint ck = make_checkpoint(bytes);
      write_checkpoint(file, ck);
    }));
    full.push_back(in_child([&] { (void)read_checkpoint(file).model_state.size(); }));
    head.push_back(in_child([&] { (void)read_checkpoint_head(file).step; }));
    ceiling.push_back(in_child([&] {
      std::ifstream in(file, std::ios::binary);
      std::vector<char> buf(fs::file_size(file));
      in.read(buf.data(), std::streamsize(buf.size()));
    }));
  }
  auto median = [](std::vector<Cost> v, double Cost::*m) {
    std::sort(v.begin(), v.end(), [&](const Cost& a, const Cost& b) { return a.*m < b.*m; });
    return v[v.size() / 2].*m;
  };
  const double file_mib = double(fs::file_size(file)) / (1024.0 * 1024.0);
  const double ceiling_s = median(ceiling, &Cost::seconds);
  fmt::print(
      "bench_checkpoint: model state {:.0f} MiB (file {:.1f} MiB), {} repeats, medians; peak is the "
      "process's resident memory (an idle one: {:.1f} MiB)\n",
      mib, file_mib, repeats, idle.peak_mib);
  fmt::print("{:<34} {:>9} {:>10} {:>14} {:>16}\n", "operation", "seconds", "MiB/s",
             "x plain read", "peak MiB / state");
  auto row = [&](const char* name, const std::vector<Cost>& v) {
    const double s = median(v, &Cost::seconds), peak = median(v, &Cost::peak_mib);
    fmt::print("{:<34} {:>9.3f} {:>10.0f} {:>14.2f} {:>16.2f}\n", name, s, file_mib / s,
               s / ceiling_s, (peak - idle.peak_mib) / mib);
  };
  row("plain read into one buffer (ceiling)", ceiling);
  row("write_checkpoint (incl. fsync)", write);
  row("read_checkpoint (resume)", full);
  row("read_checkpoint_head (pre-check)", head);
  fs::remove_all(dir);
  return 0;
}
