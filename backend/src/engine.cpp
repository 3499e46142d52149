#include "moeplan/backend/engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <new>
#include <string_view>

#include <fmt/format.h>
#include <Eigen/Core>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/atomic_file.hpp"

namespace moeplan::backend {

namespace {

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(const EngineRequest& r) : model_(r.arch, r.options, r.seed, r.batch_seqs) {
    if (r.shard_optimizer)
      throw InputError(
          "--shard-optimizer splits the AdamW state over data-parallel GPUs; it needs --device "
          "cuda with --nproc N (or WORLD_SIZE)");
    if (!r.kernels.empty())
      throw InputError(fmt::format(
          "--kernels '{}' applies to --device cuda; the cpu device has one set of kernels",
          r.kernels));
  }
  std::string device() const override { return "cpu"; }
  std::string hardware() const override {
    static const std::string name = [] {
      try {
        return cpu_model_name(read_file("/proc/cpuinfo"));
      } catch (const InputError&) {
        return std::string();  // no /proc/cpuinfo: the model is not known ("unknown")
      }
    }();
    return name;
  }
  // The thread count where it is more than one: it decides speed, and Eigen's product blocking.
  std::string kernels() const override {
    return threads() == 1 ? "eigen-fp32" : fmt::format("eigen-fp32, {} threads", threads());
  }
  int threads() const override { return model_.threads(); }
  int64_t pass_seqs() const override { return model_.pass_seqs(); }
  std::string describe() const override {
    return fmt::format("cpu ({}): passes of {} sequences", kernels(), model_.pass_seqs());
  }
  StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                        const OptimConfig& cfg) override {
    return model_.train_step(inputs, targets, step, cfg);
  }
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                      double* per_position_loss) override {
    return model_.forward_loss(inputs, targets, n_seqs, per_position_loss);
  }
  std::vector<char> save_state() const override {
    std::vector<char> out;
    model_.save_state(out);
    return out;
  }
  void load_state(const std::vector<char>& state) override { model_.load_state(state); }
  std::vector<TensorInfo> tensors() const override { return model_.tensors(); }
  int64_t trainable_params() const override { return model_.trainable_params(); }
  FlopLedger eval_ledger() const override { return model_.eval_ledger(); }
  bool has_phases() const override { return true; }
  void set_profiling(bool on) override { model_.set_profiling(on); }
  std::vector<std::pair<std::string, double>> profile_ms_per_step() const override {
    return model_.profile_ms_per_step();
  }

 private:
  Model<float> model_;
};

// The cpu model in host memory: fp32 weights, gradients and both AdamW moments (16 bytes a
// parameter) before any activation. A model that cannot fit is refused before it is allocated.
// `run` checks every point's activations against the memory available first (the registered
// fit check, cpu_pass_fit); an allocation that fails all the same (memory taken meanwhile) is
// refused here. Where Linux overcommits, such a process may be killed instead: the check is
// what refuses it in words.
std::unique_ptr<Engine> make_cpu_engine(const EngineRequest& r) {
  const double state = 16.0 * double(count_params(r.arch).trainable());
  const std::size_t host = host_memory_bytes();
  if (host > 0 && state > double(host))
    throw InputError(fmt::format(
        "--device cpu: the model's weights, gradients and AdamW state alone take {} (16 bytes a "
        "parameter); this machine has {} of memory (use a larger machine, or --device cuda)",
        bytes_text(state), bytes_text(double(host))));
  try {
    return std::make_unique<CpuEngine>(r);
  } catch (const std::bad_alloc&) {
    const int64_t pass = r.options.micro_batch_seqs > 0
                             ? std::min(r.options.micro_batch_seqs, r.batch_seqs)
                             : r.batch_seqs;
    throw InputError(fmt::format(
        "--device cpu: out of host memory building the model with passes of {} sequences of {} "
        "tokens (its weights, gradients and AdamW state take {}; this machine has {}); run "
        "smaller passes, e.g. --micro-batch {}",
        pass, r.arch.seq_len, bytes_text(state), bytes_text(double(host)),
        std::max<int64_t>(1, pass / 2)));
  }
}

// --threads, as the cpu engine applies it before its model is built.
void apply_cpu_threads(const EngineRequest& r) {
  if (r.threads > 0) {
    Eigen::setNbThreads(r.threads);
#ifdef _OPENMP
    omp_set_num_threads(r.threads);  // the model sizes its scratch by the OpenMP count
#endif
  }
}

std::map<std::string, EngineFactory>& registry() {
  static std::map<std::string, EngineFactory> r = {
      {"cpu", [](const EngineRequest& r) -> std::unique_ptr<Engine> {
         apply_cpu_threads(r);
         return make_cpu_engine(r);
       }}};
  return r;
}

// The first of `text`'s lines that starts with `key` (e.g. "MemAvailable:"), its number times
// `unit`; 0 where there is none.
std::size_t field_bytes(const std::string& text, std::string_view key, std::size_t unit) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = std::string_view(text).substr(at, end - at);
    at = end + 1;
    if (!line.starts_with(key)) continue;
    std::size_t v = 0;
    bool digits = false;
    for (const char c : line.substr(key.size()))
      if (c >= '0' && c <= '9')
        v = v * 10 + std::size_t(c - '0'), digits = true;
      else if (digits)
        break;
    return v * unit;
  }
  return 0;
}

// A file of /proc or /sys, "" where it cannot be read (no cgroup v2, no /proc).
std::string read_or_empty(const char* path) {
  try {
    return read_file(path);
  } catch (const InputError&) {
    return std::string();
  }
}

}  // namespace

int64_t most_that_fit(int64_t fits, int64_t fails, const std::function<bool(int64_t)>& fails_at) {
  while (fails - fits > 1) {
    const int64_t mid = fits + (fails - fits) / 2;
    (fails_at(mid) ? fails : fits) = mid;
  }
  return fits;
}

std::size_t host_memory_available() {
  std::size_t avail = field_bytes(read_or_empty("/proc/meminfo"), "MemAvailable:", 1024);
  // A cgroup (v2) limit below it: its limit less what the group uses.
  const std::string max = read_or_empty("/sys/fs/cgroup/memory.max");
  const std::string current = read_or_empty("/sys/fs/cgroup/memory.current");
  const std::size_t limit = field_bytes(max, "", 1), used = field_bytes(current, "", 1);
  if (limit > 0 && !max.starts_with("max")) {
    const std::size_t left = limit > used ? limit - used : 1;
    avail = avail > 0 ? std::min(avail, left) : left;
  }
  return avail;
}

PassFit cpu_pass_fit(const EngineRequest& r, std::size_t available, bool up_to_share) {
  PassFit fit;
  fit.share = r.batch_seqs;
  fit.pass = r.options.micro_batch_seqs > 0 ? std::min(r.options.micro_batch_seqs, r.batch_seqs)
                                            : r.batch_seqs;
  const auto need = [&](int64_t pass) {
    ModelOptions o = r.options;
    o.micro_batch_seqs = pass;
    return Model<float>::memory_need(r.arch, o, r.batch_seqs);
  };
  const auto fits = [&](int64_t pass) {
    const Model<float>::MemoryNeed n = need(pass);
    return available == 0 || n.state + n.activations <= available;
  };
  const auto most = [&](int64_t fit_at, int64_t fails_at) {
    return most_that_fit(fit_at, fails_at, [&](int64_t pass) { return !fits(pass); });
  };
  if (fits(fit.pass)) {
    fit.largest = !up_to_share || fit.pass == fit.share ? fit.pass
                  : fits(fit.share)                     ? fit.share
                                                        : most(fit.pass, fit.share);
    return fit;
  }
  const Model<float>::MemoryNeed asked = need(fit.pass);
  // The model alone, before any pass: no --micro-batch helps (largest stays 0, no search).
  if (asked.state > available) {
    fit.why = fmt::format(
        "--device cpu: the model's weights, gradients and AdamW state alone take {} (16 bytes a "
        "parameter); this machine has {} available (use a larger machine, or --device cuda)",
        bytes_text(double(asked.state)), bytes_text(double(available)));
    return fit;
  }
  fit.largest = most(0, fit.pass);
  fit.why = fmt::format(
      "--device cpu: passes of {} sequence{} of {} tokens need about {} of host memory (weights, "
      "gradients and AdamW state {}, one pass's activations {}), more than the {} this machine "
      "has available",
      fit.pass, fit.pass == 1 ? "" : "s", r.arch.seq_len,
      bytes_text(double(asked.state + asked.activations)), bytes_text(double(asked.state)),
      bytes_text(double(asked.activations)), bytes_text(double(available)));
  if (fit.largest > 0) {
    fit.why +=
        fmt::format("; run smaller passes: --micro-batch {} (at most {} sequences a pass fit)",
                    fit.largest, fit.largest);
  } else {
    const Model<float>::MemoryNeed one = need(1);
    fit.why += fmt::format(
        "; not even passes of 1 sequence fit (about {}): use a machine with more memory, or "
        "--device cuda",
        bytes_text(double(one.state + one.activations)));
  }
  return fit;
}

namespace {

// Every cpu point's model against the host memory available now, before any point trains
// (check_points_fit): Linux overcommits, so a model whose pages outgrow the memory is not refused
// an allocation but killed, without a word, while it is built or in its first step.
const bool cpu_fit_checked = register_fit_check("cpu", [](const EngineRequest& r, bool up) {
  apply_cpu_threads(r);
  return cpu_pass_fit(r, host_memory_available(), up);
});

}  // namespace

bool register_engine(const std::string& device, EngineFactory factory) {
  registry()[device] = std::move(factory);
  return true;
}

namespace {
std::map<std::string, std::function<int()>>& counters() {
  static std::map<std::string, std::function<int()>> c;
  return c;
}
}  // namespace

bool register_device_counter(const std::string& device, std::function<int()> counter) {
  counters()[device] = std::move(counter);
  return true;
}

int visible_devices(const std::string& device) {
  const auto it = counters().find(device);
  return it == counters().end() ? -1 : it->second();
}

namespace {
// The checks a device registers, one map a kind of check (each its own std::function type).
using KernelsCheck = std::function<void(const std::string&, const Arch&)>;
using RanksCheck = std::function<void(int64_t)>;
using FitCheck = std::function<PassFit(const EngineRequest&, bool)>;
template <class Check>
std::map<std::string, Check>& checks() {
  static std::map<std::string, Check> c;
  return c;
}
template <class Check>
const Check* check_of(const std::string& device) {
  const auto it = checks<Check>().find(device);
  return it == checks<Check>().end() ? nullptr : &it->second;
}
}  // namespace

bool register_kernels_check(const std::string& device, KernelsCheck check) {
  checks<KernelsCheck>()[device] = std::move(check);
  return true;
}

void check_kernels(const std::string& device, const std::string& kernels, const Arch& arch) {
  if (const KernelsCheck* c = check_of<KernelsCheck>(device)) (*c)(kernels, arch);
}

bool register_ranks_check(const std::string& device, RanksCheck check) {
  checks<RanksCheck>()[device] = std::move(check);
  return true;
}

void check_ranks(const std::string& device, int64_t batch_seqs) {
  if (const RanksCheck* c = check_of<RanksCheck>(device)) (*c)(batch_seqs);
}

bool register_fit_check(const std::string& device, FitCheck check) {
  checks<FitCheck>()[device] = std::move(check);
  return true;
}

std::optional<PassFit> check_fit(const std::string& device, const EngineRequest& request,
                                 bool up_to_share) {
  if (const FitCheck* c = check_of<FitCheck>(device)) return (*c)(request, up_to_share);
  return std::nullopt;
}

std::vector<std::string> engine_devices() {
  std::vector<std::string> out;
  for (const auto& [name, f] : registry()) out.push_back(name);
  return out;
}

void require_device(const std::string& device) {
  if (!registry().contains(device)) {
    if (device == "cuda")
      throw InputError(
          "--device cuda: this build has no CUDA backend (rebuild with "
          "-DMOEPLAN_CUDA=ON on a machine with nvcc), use --device cpu");
    throw InputError(fmt::format("--device '{}' is not known; this build has: {}", device,
                                 fmt::join(engine_devices(), ", ")));
  }
}

std::size_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : 0;
}

std::string cpu_model_name(std::string_view cpuinfo) {
  constexpr std::string_view key = "model name";
  for (size_t at = 0; at < cpuinfo.size();) {
    const size_t end = std::min(cpuinfo.find('\n', at), cpuinfo.size());
    const std::string_view line = cpuinfo.substr(at, end - at);
    at = end + 1;
    const size_t colon = line.find(':');
    if (!line.starts_with(key) || colon == std::string_view::npos) continue;
    // Only blanks between the key and its colon ("model name\t: ..."), so that another key
    // beginning with these words is not read.
    if (line.substr(key.size(), colon - key.size()).find_first_not_of(" \t") !=
        std::string_view::npos)
      continue;
    std::string_view v = line.substr(colon + 1);
    const size_t first = v.find_first_not_of(" \t");
    if (first == std::string_view::npos) return {};
    v = v.substr(first, v.find_last_not_of(" \t\r") - first + 1);
    return std::string(v);
  }
  return {};
}

std::unique_ptr<Engine> make_engine(const std::string& device, const EngineRequest& request) {
  require_device(device);
  return registry().at(device)(request);
}

}  // namespace moeplan::backend
