#include "moeplan/backend/run.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numbers>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/backend/checkpoint.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/data.hpp"
#include "moeplan/backend/engine.hpp"
#include "moeplan/backend/record.hpp"
#include "moeplan/backend/rng.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "moeplan/sweeps/runs_folder.hpp"

namespace moeplan::backend {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

bool close_rel(double a, double b, double rel = 1e-9) {
  return std::abs(a - b) <= rel * std::max({std::abs(a), std::abs(b), 1.0});
}

[[noreturn]] void inconsistent(const Plan& p, const std::string& what) {
  throw InputError(
      fmt::format("point '{}': {}; the manifest is inconsistent (was it edited? "
                  "re-plan it with `moeplan grid`)",
                  p.id, what));
}

// N and N_a from the tensors the engine allocated (names from the Model), under the Arch's
// counting readings. Routed experts count fully in N and by K/E in N_a.
MeasuredParams measure_params(const Engine& engine, const Arch& arch) {
  MeasuredParams m;
  m.trainable = engine.trainable_params();
  int64_t routed = 0, other = 0;
  for (const TensorInfo& t : engine.tensors()) {
    const std::string& n = t.name;
    const bool vocab =
        n.find("embedding") != std::string::npos || n.find("lm_head") != std::string::npos;
    const bool router = n.find("router") != std::string::npos;
    const bool norm = n.find("norm") != std::string::npos;
    const bool shared = n.find("shared") != std::string::npos;
    const bool expert = !shared && n.find("expert") != std::string::npos;
    if (vocab) continue;
    if (router && !arch.count_router) continue;
    if (norm && !arch.count_norms) continue;
    (expert ? routed : other) += t.size();
  }
  m.total_params = other + routed;
  m.active_params = other + (arch.experts > 0 ? routed / arch.experts * arch.top_k : 0);
  return m;
}

OptimConfig optim_config(const Plan& p) {
  OptimConfig c;
  c.lr_peak = p.hyper.lr_peak;
  c.lr_min = p.hyper.lr_min;
  c.warmup_steps = p.hyper.warmup_steps;
  c.total_steps = p.budget.steps;
  c.beta1 = p.hyper.adam_beta1;
  c.beta2 = p.hyper.adam_beta2;
  c.weight_decay = p.hyper.weight_decay;
  c.grad_clip = p.hyper.grad_clip;
  return c;
}

ModelOptions model_options(const TrainSettings& t) {
  ModelOptions o;
  o.positions = t.positions;
  o.renormalize_gates = t.renormalize_gates;
  o.capacity_factor = t.capacity_factor;
  o.load_balance = t.load_balance;
  o.z_loss = t.z_loss;
  o.erc_loss = t.erc_loss;
  o.erc_alpha = t.erc_alpha;
  return o;
}

// One validation pass over the held-out windows: mean loss, BPC, and per-part BPC.
nlohmann::json evaluate(Engine& engine, const DataSplit& data, int64_t seq_len, int64_t windows,
                        int64_t step) {
  const size_t n = size_t(windows * seq_len);
  std::vector<int32_t> inputs(n), targets(n);
  for (size_t i = 0; i < n; ++i) {
    inputs[i] = data.validation.tokens[i];
    targets[i] = data.validation.tokens[i + 1];
  }
  std::vector<double> per_position(n);
  engine.forward_loss(inputs.data(), targets.data(), windows, per_position.data());
  // Sum in position order so the figure is the same bit for bit on every run.
  double total = 0;
  std::vector<double> part_sum(data.part_names.size(), 0.0);
  std::vector<int64_t> part_count(data.part_names.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    total += per_position[i];
    if (!data.validation.part.empty()) {
      const uint8_t part = data.validation.part[i + 1];  // the part of the target position
      part_sum[part] += per_position[i];
      ++part_count[part];
    }
  }
  const double loss = total / double(n);
  nlohmann::json parts = nlohmann::json::object(), parts_loss = nlohmann::json::object();
  for (size_t k = 0; k < part_sum.size(); ++k) {
    const double l = part_count[k] > 0 ? part_sum[k] / double(part_count[k]) : 0.0;
    parts[data.part_names[k]] = l / std::numbers::ln2;
    parts_loss[data.part_names[k]] = l;
  }
  return {{"step", step},
          {"val_loss", loss},
          {"val_bpc", loss / std::numbers::ln2},
          {"parts", parts},
          {"parts_loss", parts_loss}};
}

// A step whose objective or gradient is not finite: its parts, and the likelier cause. The
// cross-entropy alone can be finite while an auxiliary term (a coefficient of 1e300 is a valid
// double) is not, and then lr_peak is not what to lower.
std::string diverged_message(const std::string& id, const StepResult& r, const ModelOptions& o,
                             int64_t step, int64_t steps, int64_t last_saved_step) {
  struct Term {
    const char* name;  // the manifest's [train] key of its coefficient
    double coefficient, value;
  };
  const Term aux[] = {{"load_balance", o.load_balance, r.aux_load_balance},
                      {"z_loss", o.z_loss, r.aux_z},
                      {"erc_loss", o.erc_loss, r.aux_erc}};
  std::string parts = fmt::format("cross-entropy {}", r.loss);
  std::string culprit, large;
  for (const Term& t : aux) {
    if (t.coefficient == 0) continue;
    parts += fmt::format(", {} term {}", t.name, t.value);
    // A term alone not finite is the cause; with the cross-entropy not finite too, an overflow
    // (a learning rate too high) reaches the z-loss's squared logsumexp first.
    if (!std::isfinite(t.value) && std::isfinite(r.loss) && culprit.empty()) culprit = t.name;
    if (t.coefficient > 1)
      large += fmt::format("{}{} = {}", large.empty() ? "" : ", ", t.name, t.coefficient);
  }
  std::string remedy;
  if (!culprit.empty())
    remedy = fmt::format("its {} term is not finite: lower {} in the manifest's [train]", culprit,
                         culprit);
  else if (!large.empty())
    remedy = fmt::format("lower lr_peak in the manifest, or the [train] coefficient {}", large);
  else
    remedy = "lower lr_peak in the manifest?";
  return fmt::format(
      "point '{}': training objective not finite at step {} of {} ({}; lr {:.3g}, grad norm {}); "
      "stopped, {} and earlier records are kept ({})",
      id, step + 1, steps, parts, r.lr, r.grad_norm,
      last_saved_step >= 0 ? fmt::format("the last checkpoint (step {})", last_saved_step)
                           : std::string("no checkpoint was written yet"),
      remedy);
}

// The sequences of one pass that `--micro-batch m` asks for of a batch of `batch`: the whole
// batch for 0 or for a request of the batch or more (--micro-batch 16 or 100 of a batch of 16 is
// 0's one pass).
int64_t pass_of(int64_t m, int64_t batch) {
  return m > 0 ? std::min(m, batch) : batch;
}

}  // namespace

int cpu_threads_of(const Plan& plan, const RunOptions& opt) {
  return cpu_threads_for(plan.arch, pass_of(opt.micro_batch_seqs, plan.budget.batch_seqs),
                         opt.threads);
}

std::optional<std::string> data_parallel_world() {
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr || *world == '\0' || std::string_view(world) == "1") return std::nullopt;
  return std::string(world);
}

void check_plan_consistent(const Plan& p) {
  if (!is_point_id(p.id))
    throw InputError(fmt::format("point id {} cannot name a run folder: it must be {}",
                                 nlohmann::json(p.id).dump(), kPointIdRule));
  try {
    validate(p.arch);
  } catch (const InputError& e) {
    inconsistent(p, e.what());
  }
  const ParamCounts counts = count_params(p.arch);
  if (counts.total_params != p.counts.total_params)
    inconsistent(p, fmt::format("total_params = {} but its arch has {}", p.counts.total_params,
                                counts.total_params));
  if (counts.active_params != p.counts.active_params)
    inconsistent(p, fmt::format("active_params = {} but its arch has {}", p.counts.active_params,
                                counts.active_params));
  const Budget& b = p.budget;
  if (b.seq_len != p.arch.seq_len)
    inconsistent(p, fmt::format("seq_len = {} but arch.seq_len = {}", b.seq_len, p.arch.seq_len));
  if (b.steps <= 0 || b.batch_seqs <= 0)
    inconsistent(p,
                 fmt::format("steps = {} and batch_seqs = {} must be > 0", b.steps, b.batch_seqs));
  if (p.hyper.batch_seqs != 0 && p.hyper.batch_seqs != b.batch_seqs)
    inconsistent(p, fmt::format("batch_seqs = {} but the hyper-parameters say {}", b.batch_seqs,
                                p.hyper.batch_seqs));
  if (b.tokens_consumed != b.steps * b.batch_seqs * b.seq_len)
    inconsistent(p, fmt::format("tokens_consumed = {} but steps·batch_seqs·seq_len = {}·{}·{} = {}",
                                b.tokens_consumed, b.steps, b.batch_seqs, b.seq_len,
                                b.steps * b.batch_seqs * b.seq_len));
  if (b.tokens_unique <= 0 || b.tokens_unique % b.seq_len != 0 ||
      b.tokens_unique > b.tokens_consumed)
    inconsistent(p,
                 fmt::format("tokens_unique = {} must be a positive multiple of seq_len {} and at "
                             "most tokens_consumed {}",
                             b.tokens_unique, b.seq_len, b.tokens_consumed));
  if (!close_rel(b.epochs, double(b.tokens_consumed) / double(b.tokens_unique), 1e-6))
    inconsistent(p, fmt::format("epochs = {} but tokens_consumed/tokens_unique = {}", b.epochs,
                                double(b.tokens_consumed) / double(b.tokens_unique)));
  const double m = flops_per_token(p.arch, p.convention, p.mask).total;
  if (!close_rel(m, p.flops_per_token, 1e-6))
    inconsistent(p, fmt::format("flops_per_token = {} but its arch gives {} ({})",
                                p.flops_per_token, m, convention_label(p.convention, p.mask)));
  if (!close_rel(b.compute, p.flops_per_token * double(b.tokens_consumed), 1e-6))
    inconsistent(p, fmt::format("compute = {} but flops_per_token·tokens_consumed = {}", b.compute,
                                p.flops_per_token * double(b.tokens_consumed)));
  if (!(p.hyper.lr_peak > 0) || !std::isfinite(p.hyper.lr_peak))
    inconsistent(p, fmt::format("lr_peak = {} must be a positive number", p.hyper.lr_peak));
  if (p.hyper.warmup_steps < 0 || p.hyper.warmup_steps > b.steps)
    inconsistent(p, fmt::format("warmup_steps = {} must be within 0..steps ({})",
                                p.hyper.warmup_steps, b.steps));
}

int64_t eval_windows_for(const Plan& p, const TrainSettings& t) {
  const int64_t s = p.arch.seq_len;
  const int64_t tokens = t.eval_tokens > 0 ? t.eval_tokens : std::max<int64_t>(16384, 64 * s);
  return std::max<int64_t>(1, (tokens + s - 1) / s);
}

namespace {
// What a point's engine is asked to build: its arch, the [train] options, the run's passes,
// kernels and sharding.
EngineRequest engine_request(const Plan& plan, const TrainSettings& train, const RunOptions& opt) {
  if (opt.micro_batch_seqs < 0)
    throw InputError(fmt::format(
        "--micro-batch {} must be >= 1 (or 0: the whole batch in one pass)", opt.micro_batch_seqs));
  EngineRequest request;
  request.arch = plan.arch;
  request.options = model_options(train);
  request.options.micro_batch_seqs = opt.micro_batch_seqs;
  request.seed = train.seed;
  request.batch_seqs = plan.budget.batch_seqs;
  request.threads = opt.threads;
  request.kernels = opt.kernels;
  request.shard_optimizer = opt.shard_optimizer;
  request.point_id = plan.id;
  return request;
}
}  // namespace

std::map<std::string, PassFit> check_points_fit(const std::vector<const Plan*>& pending,
                                                const TrainSettings& train, const RunOptions& opt) {
  struct Misfit {
    const Plan* plan;
    PassFit fit;
  };
  std::vector<Misfit> misfits;
  std::map<std::string, PassFit> fits;
  for (const Plan* p : pending) {
    const std::optional<PassFit> fit =
        check_fit(opt.device, engine_request(*p, train, opt), opt.estimate_steps > 0);
    if (!fit) return {};  // a device without the check
    fits[p->id] = *fit;
    if (fit->largest < fit->pass) misfits.push_back({p, *fit});
  }
  if (misfits.empty()) return fits;
  // The first point that does not fit in the device's own words; the others by the most
  // sequences a pass that fit them; then the passes under which all fit (a pass that fits one
  // point's model fits it in smaller passes too).
  std::string others;
  int64_t all_fit = 0;  // 0: no pass fits some point
  bool some_fit = false;
  for (const Misfit& m : misfits) {
    if (m.fit.largest > 0) all_fit = some_fit ? std::min(all_fit, m.fit.largest) : m.fit.largest;
    some_fit = some_fit || m.fit.largest > 0;
    if (&m != &misfits.front())
      others += fmt::format(
          "{}{} ({})", others.empty() ? "" : ", ", m.plan->id,
          m.fit.largest > 0
              ? fmt::format("at most {} of its {} sequences a pass fit", m.fit.largest, m.fit.pass)
              : std::string("not even one sequence a pass fits"));
  }
  std::string then;
  if (misfits.size() > 1 && some_fit)
    then = fmt::format("; --micro-batch {} fits every point{}", all_fit,
                       std::any_of(misfits.begin(), misfits.end(),
                                   [](const Misfit& m) { return m.fit.largest == 0; })
                           ? " that can fit"
                           : "");
  throw InputError(fmt::format(
      "point {}: {}{}{}; found before any point trained", misfits.front().plan->id,
      misfits.front().fit.why,
      others.empty()
          ? ""
          : fmt::format("; {} more point{} do{} not fit: {}", misfits.size() - 1,
                        misfits.size() == 2 ? "" : "s", misfits.size() == 2 ? "es" : "", others),
      then));
}

void check_source_fits(const Plan& p, const TrainSettings& t, const std::filesystem::path& base) {
  // The window order is a permutation of 32-bit window indices (checkpointed as int32).
  const int64_t windows = p.budget.tokens_unique / p.arch.seq_len;
  if (windows > INT32_MAX)
    throw InputError(fmt::format(
        "point '{}': D̂ = {} unique tokens is {} windows of {} tokens; the backend numbers "
        "windows in 32 bits (at most {}, D̂ up to {} at this seq_len): moeplan cannot yet train "
        "a point with this many unique tokens",
        p.id, p.budget.tokens_unique, windows, p.arch.seq_len, INT32_MAX,
        int64_t(INT32_MAX) * p.arch.seq_len));
  // Checked for every point before any trains: an error here from a relative path says where it
  // was read from.
  const std::string from = source_from(t.source, base);
  int64_t have = 0;
  try {
    have = source_token_count(from);
  } catch (const InputError& e) {
    // Where the file (a pattern's folder) was found, the relative path was not the trouble.
    std::error_code ec;
    const auto file = source_file(from);
    const bool pattern =
        file && file->path.filename().string().find_first_of("*?[") != std::string::npos;
    if (from == t.source ||
        (file && fs::exists(pattern ? file->path.parent_path() : file->path, ec)))
      throw;
    throw InputError(
        fmt::format("{} (a relative source path is read from the manifest's folder, "
                    "'{}')",
                    e.what(), base.string()));
  }
  const int64_t train = p.budget.tokens_unique + 1;
  const int64_t validation = eval_windows_for(p, t) * p.arch.seq_len + 1;
  if (have < 0) return check_builtin_fits(train, validation);  // generated to size, in memory
  if (have < train + validation)
    throw InputError(fmt::format(
        "point '{}': source '{}' has {} tokens; the plan needs {} for training (D̂ + 1 target) "
        "plus {} held-out validation tokens = {}: give a larger source, or plan fewer unique "
        "tokens (grid --unique-tokens, --dense-tpp) or fewer held-out ones (--train "
        "eval_tokens=N)",
        p.id, t.source, have, train, validation, train + validation));
}

void check_source_tokens(const std::vector<const Plan*>& pending, const TrainSettings& t,
                         const std::filesystem::path& base) {
  if (pending.empty() || !source_file(t.source)) return;
  // The regions the points read, largest first; one that another covers (a training prefix and
  // a held-out tail no longer than it) is read with it. The first point to train reads its own
  // first thing, before it trains: what it covers is not read here (under strict reuse, the
  // whole sweep: no extra pass over the source).
  struct Region {
    int64_t train, validation, vocab;
  };
  const auto region = [&](const Plan* p) {
    return Region{p->budget.tokens_unique + 1, eval_windows_for(*p, t) * p->arch.seq_len + 1,
                  p->arch.vocab};
  };
  std::vector<Region> regions;
  for (const Plan* p : pending) regions.push_back(region(p));
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.train > b.train; });
  std::vector<Region> read{region(pending.front())};
  for (const Region& r : regions) {
    if (std::any_of(read.begin(), read.end(), [&](const Region& d) {
          return d.train >= r.train && d.validation >= r.validation && d.vocab <= r.vocab;
        }))
      continue;
    load_source(source_from(t.source, base), r.train, r.validation, t.data_seed, r.vocab);
    read.push_back(r);
  }
}

int64_t eval_every_for(const Plan& p, const TrainSettings& t) {
  if (t.eval_every > 0) return t.eval_every;
  return std::max<int64_t>(1, p.budget.steps / 10);
}

namespace {

// The order in which a point's training windows are read (resumes restore it from the checkpoint).
WindowOrder training_order(int64_t windows, const TrainSettings& train) {
  return WindowOrder(windows, mix_seed(train.seed, 0xDA7A));
}

// One device's peak FLOP rate that MFU is measured against: the one given (--peak-tflops), else
// the engine's (the maker's dense peak where it knows the device; 0 where it does not).
double peak_per_device(const Engine& engine, const RunOptions& opt) {
  return opt.peak_tflops > 0 ? opt.peak_tflops * 1e12 : engine.peak_flops_per_second();
}

// Time opt.estimate_steps steps after one warm-up step (the first steps pay one-off set-up:
// allocations, cuBLAS's per-shape choices) on the point's first batches, and one evaluation; the
// model is thrown away. `record`: an interrupted point's record (null when none), whose steps are
// done already. At most the plan's steps are timed (a point of 156 steps is not timed over 1000);
// Ctrl-C (opt.stop, agreed across ranks as training does) ends the timing at the next step.
Estimate estimate_point(Engine& engine, const Plan& plan, const DataSplit& data,
                        const TrainSettings& train, const RunOptions& opt,
                        const nlohmann::json& record) {
  const int64_t n = opt.estimate_steps;
  const std::atomic<int>* stop = opt.stop;
  const Budget& b = plan.budget;
  const int64_t seq_len = b.seq_len, batch = b.batch_seqs;
  const int64_t windows = b.tokens_unique / seq_len;
  const int64_t eval_every = eval_every_for(plan, train);
  TokenLedger tokens(seq_len, windows);
  WindowOrder order = training_order(windows, train);
  const OptimConfig cfg = optim_config(plan);
  std::vector<int32_t> inputs(size_t(batch * seq_len)), targets(size_t(batch * seq_len));
  std::vector<double> secs;
  Estimate e;
  e.peak_flops_per_second = peak_per_device(engine, opt) * engine.world_size();
  e.peak_given = opt.peak_tflops > 0;
  const int64_t timed = std::min(n, b.steps);
  for (int64_t i = 0; i <= timed; ++i) {
    if (engine.any_rank(stop && stop->load() != 0)) {
      e.interrupted = true;
      return e;
    }
    fill_batch(data.train, seq_len, batch, order, tokens, inputs.data(), targets.data());
    const auto t0 = Clock::now();
    const StepResult r = engine.train_step(inputs.data(), targets.data(), i, cfg);
    if (i > 0) secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    e.flops_per_step = double(r.flops.useful());  // C [exact/causal]: padding, recompute out
  }
  std::sort(secs.begin(), secs.end());
  e.steps_timed = timed;
  e.step_seconds = secs[secs.size() / 2];
  const auto e0 = Clock::now();
  evaluate(engine, data, seq_len, eval_windows_for(plan, train), 0);
  e.eval_seconds = std::chrono::duration<double>(Clock::now() - e0).count();
  const Engine::MemoryUse memory = engine.memory_use();  // over the steps and the evaluation
  e.memory_peak = memory.peak_bytes;
  e.memory_device = memory.device_bytes;
  // Where the steps' time goes: as many steps again, each phase timed (apart from the steps timed
  // above: on cuda the phases then run one after another).
  if (opt.profile) {
    engine.set_profiling(true);
    for (int64_t i = 0; i < timed; ++i) {
      if (engine.any_rank(stop && stop->load() != 0)) {
        e.interrupted = true;
        return e;
      }
      fill_batch(data.train, seq_len, batch, order, tokens, inputs.data(), targets.data());
      engine.train_step(inputs.data(), targets.data(), timed + 1 + i, cfg);
    }
    e.phases = engine.profile_ms_per_step();
    e.steps_profiled = timed;
    engine.set_profiling(false);
  }
  const int64_t done =
      record.is_object() ? record.at("measured").at("steps").get<int64_t>() : int64_t(0);
  e.steps_remaining = b.steps - done;
  // Evaluations run at every multiple of eval_every and after the last step.
  e.evals_remaining = b.steps / eval_every - done / eval_every +
                      (b.steps % eval_every != 0 && done < b.steps ? 1 : 0);
  e.tokens_per_step = batch * seq_len;
  return e;
}

// An exclusive advisory lock on runs/<point>/.lock for as long as a process trains the point:
// a second `moeplan run` of the same point into the same folder is refused instead of training
// beside it and overwriting its checkpoints. flock is released by the kernel when the process
// ends, however it ends, so a killed run leaves no stale lock.
class PointLock {
 public:
  // False when another process holds it. A lock file that cannot be opened (another user's) is
  // an error, not "busy": no one may be training the point, and waiting would not change it.
  bool acquire(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw InputError(
          fmt::format("cannot open the point's lock file '{}' ({}); check its owner "
                      "and permissions, or choose another --out",
                      path.string(), std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return true;
    // Held: by a trainer, or for a moment by another run's up-front check (check_point_lock's
    // shared lock, a few microseconds). A second try after 20 ms tells the two apart.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
  }
  // Held: what it trains (the plan and [train] settings), for a process that finds the point
  // busy to tell whether it is the same point of the same sweep before any record exists.
  void write_owner(const nlohmann::json& plan_json, const nlohmann::json& train_json) {
    owner_ = nlohmann::json{{"plan", plan_json}, {"train", train_json}}.dump() + "\n";
    write_owner();
  }
  // Before each save: the lock file at `path` is still the one held. A user who removed .lock
  // while the point trained (taking it for a stale lock) let a second run lock a new file and
  // train the point beside this one. Removed, it is taken again; replaced, this run stops
  // without writing: the point is another process's now.
  void keep(const fs::path& path) {
    struct stat held {};
    struct stat now {};
    if (fd_ < 0 || ::fstat(fd_, &held) != 0) return;
    if (::stat(path.c_str(), &now) == 0) {
      if (now.st_ino == held.st_ino && now.st_dev == held.st_dev) return;
      throw std::runtime_error(replaced(path));
    }
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST)  // the folder moved or removed, or made read-only
      throw std::runtime_error(fmt::format(
          "cannot take the point's lock file '{}' again ({}) after it was removed while this run "
          "trained the point: stopped without writing",
          path.string(), std::strerror(errno)));
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (fd >= 0) ::close(fd);
      throw std::runtime_error(replaced(path));
    }
    ::close(fd_);
    fd_ = fd;
    write_owner();
  }
  ~PointLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  void write_owner() {
    if (::ftruncate(fd_, 0) == 0) {
      const ssize_t n = ::pwrite(fd_, owner_.data(), owner_.size(), 0);
      (void)n;  // informative only: an unwritten owner reads as unknown, the point as busy
    }
  }
  static std::string replaced(const fs::path& path) {
    return fmt::format(
        "the point's lock file '{}' was removed and taken by another process while this run "
        "trained the point (another moeplan run may be training it now): stopped without "
        "writing; the point's last checkpoint is kept. A killed run leaves no stale lock, so "
        ".lock never needs removing",
        path.string());
  }
  int fd_ = -1;
  std::string owner_;
};

// Empty when `stored` (a record's or checkpoint's [train] settings) trained what `wanted` asks
// for, else "key = stored (the manifest: wanted)" for each that differs. A record or checkpoint
// written before they were stored (no "train") is taken as it is.
std::string settings_differ(const nlohmann::json& stored, const nlohmann::json& wanted) {
  if (!stored.is_object()) return {};
  const nlohmann::json a = result_settings(stored), b = result_settings(wanted);
  std::string out;
  for (const auto& [key, value] : b.items()) {
    const auto it = a.find(key);
    if (it != a.end() && *it == value) continue;
    out += fmt::format("{}{} = {} (the manifest: {})", out.empty() ? "" : ", ", key,
                       it == a.end() ? std::string("unset") : it->dump(), value.dump());
  }
  return out;
}

// Empty when a record was written under this manifest's sweep-wide settings (its tolerances and
// equal_resources), else "n_tolerance = 0.01 (the manifest: 0.02)" for each that differs: a
// folder of records under two readings of "equal" fails its own audit. A record written before
// they were stored, or a run that does not know them (0), is taken as it is.
std::string sweep_differ(const nlohmann::json& rec, const RunOptions& opt) {
  std::string out;
  const auto add = [&](std::string_view key, const nlohmann::json& stored,
                       const nlohmann::json& wanted) {
    out += fmt::format("{}{} = {} (the manifest: {})", out.empty() ? "" : ", ", key, stored.dump(),
                       wanted.dump());
  };
  if (const auto it = rec.find("sweep_equal_resources");
      it != rec.end() && it->is_boolean() && it->get<bool>() != opt.equal_resources)
    add("equal_resources", *it, opt.equal_resources);
  const auto tol = rec.find("sweep_tolerances");
  if (tol != rec.end() && tol->is_object() && opt.n_tolerance > 0 && opt.compute_tolerance > 0) {
    for (const auto& [key, wanted] :
         {std::pair{"n", opt.n_tolerance}, std::pair{"compute", opt.compute_tolerance}}) {
      const auto it = tol->find(key);
      if (it == tol->end() || !it->is_number() || it->get<double>() != wanted)
        add(fmt::format("{}_tolerance", key), it == tol->end() ? nlohmann::json() : *it, wanted);
    }
  }
  return out;
}

}  // namespace

// Whether this process tells the user about the point (data parallel: rank 0 only).
static bool writer_notice(const RunOptions& opt, const Engine& engine) {
  return opt.on_notice && engine.writes_files();
}

// What differs between two layouts of a point's steps ("" if nothing does): data-parallel ranks,
// passes (a request of the whole batch or more is one pass, as 0 is), on the cpu threads, the
// optimizer's sharding and elsewhere the kernels the engine chose (a cpu's name only its threads).
// What an older checkpoint did not keep (0, "") is not compared.
static std::string layout_change(const Layout& was, const Layout& now, int64_t batch,
                                 const std::string& device) {
  std::vector<std::string> parts;
  if (was.world_size > 0 && was.world_size != now.world_size)
    parts.push_back(fmt::format("data-parallel ranks {} -> {}", was.world_size, now.world_size));
  if (pass_of(was.micro_batch_seqs, batch) != pass_of(now.micro_batch_seqs, batch))
    parts.push_back(
        fmt::format("--micro-batch {} -> {}", was.micro_batch_seqs, now.micro_batch_seqs));
  if (device == "cpu" && was.threads > 0 && was.threads != now.threads)
    parts.push_back(fmt::format("CPU threads {} -> {}", was.threads, now.threads));
  if (was.optimizer_sharded != now.optimizer_sharded)
    parts.push_back(fmt::format("--shard-optimizer {} -> {}", was.optimizer_sharded ? "on" : "off",
                                now.optimizer_sharded ? "on" : "off"));
  if (device != "cpu" && !was.kernels.empty() && was.kernels != now.kernels)
    parts.push_back(fmt::format("kernels {} -> {}", was.kernels, now.kernels));
  return fmt::format("{}", fmt::join(parts, "; "));
}

static std::string other_ranks(const fs::path& ckpt_path, const std::string& id, int64_t was,
                               int64_t now) {
  return fmt::format(
      "checkpoint '{}' of point '{}' was trained on {} data-parallel rank(s), this run has {}; "
      "resume with as many (--nproc {}, or WORLD_SIZE={} under a launcher: a step's passes and "
      "the record's rates are that many devices'), add --elastic to go on with {} (not the "
      "bit-for-bit continuation), or move the folder away to start the point over",
      ckpt_path.string(), id, was, now, was, was, now);
}

// A checkpoint resumes only under the plan, [train] settings, device and passes it was made with
// (passes, ranks, threads and the optimizer's sharding may change under --elastic).
static void check_checkpoint_head(const CheckpointHead& h, const fs::path& ckpt_path,
                                  const Plan& plan, const nlohmann::json& plan_json,
                                  const TrainSettings& train, const RunOptions& opt) {
  if (const std::string d = plan_differ(h.plan, plan_json); !d.empty())
    throw InputError(
        fmt::format("checkpoint '{}' was made for a different plan of point '{}': {}; "
                    "move the folder away or choose another --out",
                    ckpt_path.string(), plan.id, d));
  if (const std::string d = settings_differ(h.train, train_to_json(train)); !d.empty())
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' was trained with other [train] settings: {}; move the "
        "folder away or choose another --out",
        ckpt_path.string(), plan.id, d));
  // A step outside the plan's (an edited head with its checksum made again) would "resume" past
  // the end into a complete record of too few tokens, or before the start.
  if (h.step < 0 || h.step > plan.budget.steps)
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' is at step {}, outside the plan's 0 to {}: it was edited "
        "or belongs to another run; move the folder away to train the point again",
        ckpt_path.string(), plan.id, h.step, plan.budget.steps));
  if (!h.device.empty() && h.device != opt.device)
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' was trained with --device {}, this run asks for {}; "
        "resume with --device {} (a point's times are one device's), or move the folder away "
        "to start the point over",
        ckpt_path.string(), plan.id, h.device, opt.device, h.device));
  // Passes decide the auxiliary losses, not only rounding: a resume runs the same ones. (The
  // request is compared, not a rank's pass: ranks of an uneven split run different passes.)
  const int64_t batch = plan.budget.batch_seqs;
  if (pass_of(h.micro_batch_seqs, batch) != pass_of(opt.micro_batch_seqs, batch) && !opt.elastic)
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' was trained with --micro-batch {}, this run asks for {}; "
        "resume with --micro-batch {}, or add --elastic to go on in the new passes (not the "
        "bit-for-bit continuation)",
        ckpt_path.string(), plan.id, h.micro_batch_seqs, opt.micro_batch_seqs, h.micro_batch_seqs));
  // The thread count sets how a cpu model's products sum: checked here, before any point
  // trains, by the rule the model applies (cpu_threads_for), not when this point's turn comes.
  if (h.device == "cpu" && h.threads > 0 && !opt.elastic) {
    if (const int now = cpu_threads_of(plan, opt); now != h.threads)
      throw InputError(fmt::format(
          "checkpoint '{}' of point '{}' was trained with {} CPU threads, this run has {}; "
          "resume with --threads {} (the thread count sets how the products sum, so another "
          "would not continue the same run), add --elastic to go on with {} (not the bit-for-bit "
          "continuation), or move the folder away to start the point over",
          ckpt_path.string(), plan.id, h.threads, now, h.threads, now));
  }
  if (h.world_size > 0 && opt.ranks > 0 && h.world_size != opt.ranks && !opt.elastic)
    throw InputError(other_ranks(ckpt_path, plan.id, h.world_size, opt.ranks));
  if (h.optimizer_sharded && *h.optimizer_sharded != opt.shard_optimizer && !opt.elastic)
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' was trained {} --shard-optimizer, this run {} it; resume "
        "{} it (the sharded step sums the gradient norm in another order), add --elastic to go "
        "on {} it (not the bit-for-bit continuation), or move the folder away to start the "
        "point over",
        ckpt_path.string(), plan.id, *h.optimizer_sharded ? "with" : "without",
        opt.shard_optimizer ? "asks for" : "goes without",
        *h.optimizer_sharded ? "with" : "without", opt.shard_optimizer ? "with" : "without"));
  if (h.kernels_requested && *h.kernels_requested != opt.kernels && !opt.elastic)
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' was trained with --kernels '{}', this run asks for '{}'; "
        "resume with --kernels '{}' (a point's kernels, and the record's `kernels`, are one "
        "choice), add --elastic to go on with '{}' (not the bit-for-bit continuation), or move "
        "the folder away to start the point over",
        ckpt_path.string(), plan.id, *h.kernels_requested, opt.kernels, *h.kernels_requested,
        opt.kernels));
}

std::string record_remedy(const Plan& plan, const nlohmann::json& plan_json,
                          const TrainSettings& train, const std::filesystem::path& out_dir) {
  // The checkpoint, not the record, holds a run's state: when one is there, readable and made
  // for this plan and these settings, the point resumes from it with record.json removed (the
  // record is rebuilt from it), and moving the whole folder away would throw that work away.
  // Read only for a damaged record: checking a checkpoint reads every byte of it.
  const std::string move = "move the point's folder away to train it again";
  const fs::path ckpt = out_dir / plan.id / "checkpoint" / "state.ckpt";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(ckpt, ec))) return move;
  try {
    const CheckpointHead h = read_checkpoint_head(ckpt);
    if (!plan_differ(h.plan, plan_json).empty() ||
        !settings_differ(h.train, train_to_json(train)).empty())
      return move;
    return fmt::format(
        "remove only record.json to resume from '{}' (step {}), which rebuilds it, or {}",
        ckpt.string(), h.step, move);
  } catch (const std::exception&) {
    return move;  // the checkpoint is damaged or unreadable too: nothing resumes
  }
}

nlohmann::json existing_record(const Plan& plan, const nlohmann::json& plan_json,
                               const TrainSettings& train, const RunOptions& opt) {
  const fs::path& out_dir = opt.out_dir;
  const fs::path path = out_dir / plan.id / "record.json";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  // A record that cannot be looked at (a folder without permission) is not "no record": an
  // estimate read a complete point as untrained.
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw InputError(
        fmt::format("cannot read '{}' ({}); {}", path.string(), ec.message(),
                    ec == std::errc::too_many_symbolic_link_levels
                        ? "a link in its path leads back to itself: remove it or choose another "
                          "--out"
                        : "fix the point folder's permissions or choose another --out"));
  if (!fs::exists(st)) return nullptr;  // a dangling link is not "none"
  const auto remedy = [&] { return record_remedy(plan, plan_json, train, out_dir); };
  if (!fs::is_regular_file(path, ec))
    throw InputError(fmt::format("record '{}' is not a file; {}", path.string(), remedy()));
  nlohmann::json rec;
  try {
    rec = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("record '{}' is unreadable ({}); {}", path.string(),
                                 json_error_text(e), remedy()));
  }
  if (!rec.is_object())
    throw InputError(fmt::format("record '{}' is not a JSON object; {}", path.string(), remedy()));
  if (const auto st = rec.find("status");
      st == rec.end() || !st->is_string() || (*st != "running" && *st != "complete"))
    throw InputError(fmt::format(
        "record '{}': 'status' is {} (valid: \"running\", \"complete\"); {}", path.string(),
        st == rec.end() ? std::string("missing") : st->dump(), remedy()));
  if (const std::string d = plan_differ(rec.value("plan", nlohmann::json()), plan_json); !d.empty())
    throw InputError(fmt::format(
        "'{}' was made from a different plan for point '{}': {}; move the folder away or "
        "choose another --out",
        path.string(), plan.id, d));
  if (const std::string d =
          settings_differ(rec.value("train", nlohmann::json()), train_to_json(train));
      !d.empty())
    throw InputError(fmt::format(
        "'{}' was trained with other [train] settings: {}; move the folder away or choose "
        "another --out (a sweep with another seed or data belongs in a folder of its own)",
        path.string(), d));
  if (const std::string d = sweep_differ(rec, opt); !d.empty())
    throw InputError(fmt::format(
        "'{}' was written under other sweep settings: {}; a folder holds one sweep's records "
        "(its audit fails a mix): move the folder away or choose another --out",
        path.string(), d));
  return rec;
}

void check_point_folder(const fs::path& out_dir, const std::string& id) {
  // What only the point's own turn would have found, after the points before it trained.
  if (id.size() > 255)
    throw InputError(fmt::format(
        "point id '{}...' is {} bytes, longer than a folder name may be (255); give it a shorter "
        "id in the manifest",
        id.substr(0, 40), id.size()));
  const fs::path dir = out_dir / id;
  std::error_code ec;
  for (const fs::path& p : {dir, dir / "checkpoint"}) {
    if (!fs::exists(fs::symlink_status(p, ec))) break;  // made when the point trains
    if (!fs::is_directory(fs::status(p, ec)))
      throw InputError(fmt::format(
          "'{}' is in the way of point '{}': it must be a folder (the point writes its record "
          "and checkpoint/ there); move it away",
          p.string(), id));
  }
  // A folder it cannot write into (another user's, read-only): found here, not after the
  // points before it trained.
  for (const fs::path& p : {dir, dir / "checkpoint"}) {
    if (!fs::is_directory(fs::status(p, ec))) break;
    if (::access(p.c_str(), W_OK | X_OK) != 0)
      throw InputError(fmt::format(
          "cannot write to '{}' ({}): point '{}' writes its record and checkpoint there; fix its "
          "permissions or choose another --out",
          p.string(), std::strerror(errno), id));
  }
  const fs::path lock = dir / ".lock";
  if (fs::exists(fs::symlink_status(lock, ec)) && fs::is_directory(fs::status(lock, ec)))
    throw InputError(
        fmt::format("'{}' is a folder: point '{}' takes its lock in that file; move it away",
                    lock.string(), id));
  if (fs::exists(fs::symlink_status(lock, ec)) && ::access(lock.c_str(), R_OK | W_OK) != 0)
    throw InputError(fmt::format(
        "cannot open the point's lock file '{}' ({}); check its owner and permissions, or "
        "choose another --out",
        lock.string(), std::strerror(errno)));
}

namespace {
// Whether another process holds the lock (a shared lock cannot be had beside its exclusive one);
// false for no lock file.
bool lock_held(const fs::path& lock) {
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

// What a held lock's owner trains that this run would not ("" when the same, or unknown: an
// owner from before locks said, or one not written yet). `plan_json` null: the [train] settings
// alone (the sweep-wide ones, for a point this run does not train).
std::string lock_owner_differs(const fs::path& lock, const nlohmann::json* plan_json,
                               const nlohmann::json& train_json) {
  std::ifstream in(lock);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json owner = nlohmann::json::parse(text, nullptr, false);
  if (!owner.is_object() || !owner.contains("plan")) return {};
  if (plan_json)
    if (std::string d = plan_differ(owner["plan"], *plan_json); !d.empty())
      return "another plan: " + d;
  if (std::string d = settings_differ(owner.value("train", nlohmann::json()), train_json);
      !d.empty())
    return "other [train] settings: " + d;
  return {};
}

[[noreturn]] void refuse_other_owner(const fs::path& lock, const std::string& id,
                                     const std::string& what) {
  throw InputError(fmt::format(
      "point '{}' is being trained into this folder by another moeplan process under {} (it "
      "holds '{}'); a sweep with another plan or settings belongs in a folder of its own: choose "
      "another --out",
      id, what, lock.string()));
}
}  // namespace

void check_point_lock(const Plan& plan, const nlohmann::json& plan_json, const TrainSettings& train,
                      const fs::path& out_dir) {
  const fs::path lock = out_dir / plan.id / ".lock";
  if (!lock_held(lock)) return;  // no lock file, or no one holds it: no one trains the point
  if (const std::string d = lock_owner_differs(lock, &plan_json, train_to_json(train)); !d.empty())
    refuse_other_owner(lock, plan.id, d);
}

void check_step_ledger(const Arch& arch, int64_t batch_seqs, bool erc_loss, const StepResult& r,
                       int64_t step) {
  ExactStepOptions eo;
  eo.erc_loss = erc_loss;
  if (!r.routed_per_moe_layer.empty()) eo.routed_per_moe_layer = r.routed_per_moe_layer;
  const FlopLedger want = exact_step_ledger(arch, batch_seqs, eo);
  for (int c = 0; c < kFlopCategories; ++c) {
    const auto cat = FlopCategory(c);
    if (beyond_useful(cat)) continue;
    for (int p = 0; p < kPhases; ++p)
      if (!(r.flops.flops[size_t(c)][size_t(p)] == want.flops[size_t(c)][size_t(p)]))
        throw std::logic_error(fmt::format(
            "step {}: the FLOP ledger's {} {} is {}, the analytic exact count of the step's "
            "routing {}: the backend counted products it did not run, or ran products it did "
            "not count (please report it)",
            step, name(cat), name(Phase(p)), to_string(r.flops.flops[size_t(c)][size_t(p)]),
            to_string(want.flops[size_t(c)][size_t(p)])));
  }
}

void check_sibling_point(const Plan& plan, const TrainSettings& train, const RunOptions& opt) {
  const fs::path& out_dir = opt.out_dir;
  const fs::path path = out_dir / plan.id / "record.json";
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(read_file(path));
    } catch (const std::exception&) {
      rec = nullptr;  // damaged: the run that trains the point says so
    }
    // The sweep-wide settings only: another plan for that one point is its own run's to refuse.
    if (rec.is_object()) {
      if (const std::string d =
              settings_differ(rec.value("train", nlohmann::json()), train_to_json(train));
          !d.empty())
        throw InputError(fmt::format(
            "'{}' was trained with other [train] settings: {}; this folder holds another sweep "
            "(--point trains one point, but into the whole sweep's folder): move it away or "
            "choose another --out (a sweep with another seed or data belongs in a folder of its "
            "own)",
            path.string(), d));
      if (const std::string d = sweep_differ(rec, opt); !d.empty())
        throw InputError(fmt::format(
            "'{}' was written under other sweep settings: {}; this folder holds another sweep "
            "(--point trains one point, but into the whole sweep's folder): move it away or "
            "choose another --out",
            path.string(), d));
    }
  }
  const fs::path lock = out_dir / plan.id / ".lock";
  if (!lock_held(lock)) return;
  if (const std::string d = lock_owner_differs(lock, nullptr, train_to_json(train)); !d.empty())
    refuse_other_owner(lock, plan.id, d);
}

void check_resumable(const Plan& plan, const nlohmann::json& plan_json, const TrainSettings& train,
                     const RunOptions& opt) {
  const fs::path path = opt.out_dir / plan.id / "checkpoint" / "state.ckpt";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return;
  if (!fs::is_regular_file(fs::status(path, ec)))
    throw InputError(fmt::format(
        "checkpoint '{}' of point '{}' is not a file ({}); move it away to train the point from "
        "step 0",
        path.string(), plan.id,
        fs::is_directory(fs::status(path, ec)) ? "a folder" : "a link to nothing, or no file"));
  // The whole file, checksum included: a damaged checkpoint is refused before any point trains.
  // Only its head is kept: the weights and optimizer state are read again when the point resumes.
  check_checkpoint_head(read_checkpoint_head(path), path, plan, plan_json, train, opt);
}

PointOutcome run_point(const Plan& plan, const nlohmann::json& plan_json,
                       const TrainSettings& train, const RunOptions& opt) {
  check_plan_consistent(plan);
  const fs::path dir = opt.out_dir / plan.id;
  const fs::path ckpt_dir = dir / "checkpoint";
  const fs::path ckpt_path = ckpt_dir / "state.ckpt";
  PointOutcome outcome;
  outcome.record_path = dir / "record.json";

  if (nlohmann::json rec = existing_record(plan, plan_json, train, opt); rec.is_object()) {
    const bool complete = rec.value("status", "") == "complete";
    outcome.record = std::move(rec);  // an interrupted point's: an estimate counts what is left
    if (complete) {
      outcome.status = PointStatus::skipped;
      return outcome;
    }
  }
  std::error_code ec;
  const bool estimating = opt.estimate_steps > 0;
  if (!estimating) ensure_writable_dir(ckpt_dir);
  // One trainer a point. A process of its own (not a data-parallel rank) decides before it loads
  // data or builds a model: a point another process trains is left at once, without a second
  // copy of its model in memory. Ranks decide together once their engine exists (below).
  PointLock lock;
  const bool solo = !data_parallel_world();
  if (!estimating && solo && !lock.acquire(dir / ".lock")) {
    if (const std::string d = lock_owner_differs(dir / ".lock", &plan_json, train_to_json(train));
        !d.empty())
      refuse_other_owner(dir / ".lock", plan.id, d);
    outcome.status = PointStatus::busy;
    return outcome;
  }
  if (!estimating && solo) lock.write_owner(plan_json, train_to_json(train));

  const Budget& b = plan.budget;
  const int64_t seq_len = b.seq_len, batch = b.batch_seqs, steps = b.steps;
  const int64_t windows = b.tokens_unique / seq_len;
  const int64_t eval_windows = eval_windows_for(plan, train);
  const int64_t eval_every = eval_every_for(plan, train);
  const int64_t ckpt_every = opt.checkpoint_every > 0     ? opt.checkpoint_every
                             : train.checkpoint_every > 0 ? train.checkpoint_every
                                                          : std::max<int64_t>(1, steps / 20);
  const int64_t log_every = std::max<int64_t>(1, steps / 1000);

  // Data first: a source too small or corrupt fails before any training.
  const DataSplit data =
      load_source(source_from(train.source, opt.source_base), b.tokens_unique + 1,
                  eval_windows * seq_len + 1, train.data_seed, plan.arch.vocab);
  const nlohmann::json data_json = {{"source", train.source},
                                    {"description", data.description},
                                    {"source_tokens", data.source_tokens},
                                    {"training_region_tokens", b.tokens_unique + 1},
                                    {"validation_tokens", eval_windows * seq_len},
                                    {"unused_source_tokens", data.unused_tokens},
                                    {"byte_tokens", data.byte_tokens},
                                    {"parts", data.part_names},
                                    {"training_fingerprint", token_fingerprint(data.train)},
                                    {"validation_fingerprint", token_fingerprint(data.validation)}};

  const EngineRequest request = engine_request(plan, train, opt);
  const ModelOptions& model_opt = request.options;
  std::unique_ptr<Engine> engine = make_engine(opt.device, request);
  const MeasuredParams params = measure_params(*engine, plan.arch);
  if (opt.on_engine && engine->writes_files()) {
    opt.on_engine(engine->describe());
    // A GPU moeplan has no peak figure for: its MFU is one flag away, said where it is missing
    // (a CPU never has one, and is not told so at every point).
    if (opt.device != "cpu" && !(peak_per_device(*engine, opt) > 0))
      opt.on_engine(fmt::format(
          "no MFU: moeplan has no dense peak figure for {}; give one device's with --peak-tflops "
          "X (in TFLOP/s, for the products' precision)",
          engine->hardware().empty() ? std::string("this device")
                                     : "'" + engine->hardware() + "'"));
  }

  if (estimating) {
    if (opt.profile && !engine->has_phases())  // before any step is timed
      throw InputError(
          fmt::format("--profile: the {} device has no phases to time", engine->device()));
    outcome.status = PointStatus::estimated;
    outcome.wrote_files = engine->writes_files();
    outcome.estimate = estimate_point(*engine, plan, data, train, opt, outcome.record);
    return outcome;
  }

  // Data-parallel ranks: decided by every rank together (rank 0 holds the lock), before the
  // checkpoint is read.
  const bool taken = !solo && engine->writes_files() && !lock.acquire(dir / ".lock");
  if (!solo && engine->writes_files() && !taken) lock.write_owner(plan_json, train_to_json(train));
  if (engine->any_rank(taken)) {
    // Left to its trainer: the rest of the sweep goes on (two `moeplan run`s of one sweep into
    // one folder share its points out between them).
    outcome.status = PointStatus::busy;
    outcome.wrote_files = engine->writes_files();
    return outcome;
  }

  // Temp files of writes a killed run left unfinished (write_file_atomic's ".NAME.tmp.XXXXXX";
  // a checkpoint's is a checkpoint's size): no one else writes here while we hold the lock.
  // Only the two files a run writes have them (".record.json.tmp.", ".state.ckpt.tmp." and six
  // characters): a user's own ".notes.tmp.txt" in the folder is not ours to delete. A record or
  // checkpoint that is a symlink is written through, its temp files beside the link's target.
  if (engine->writes_files()) {
    const auto clear_stale = [&](const fs::path& folder, const std::string& target) {
      const std::string stem = "." + target + ".tmp.";
      for (const auto& e : fs::directory_iterator(folder, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() == stem.size() + 6 && name.starts_with(stem)) fs::remove(e.path(), ec);
      }
    };
    for (const fs::path& file : {dir / "record.json", ckpt_path}) {
      clear_stale(file.parent_path(), file.filename().string());
      if (!fs::is_symlink(file, ec)) continue;
      const fs::path target = fs::weakly_canonical(file, ec);
      if (!ec) clear_stale(target.parent_path(), target.filename().string());
    }
  }
  const nlohmann::json fingerprints = {
      {"training_fingerprint", data_json.at("training_fingerprint")},
      {"validation_fingerprint", data_json.at("validation_fingerprint")}};
  RunState st;
  if (fs::exists(ckpt_path, ec)) {
    Checkpoint ck = read_checkpoint(ckpt_path);
    // The same source by name must still hold the same tokens, or the resumed half of the point
    // trains on other data than the first half did.
    if (ck.data.is_object() && ck.data != fingerprints)
      throw InputError(fmt::format(
          "checkpoint '{}' of point '{}' was trained on other tokens than source '{}' holds now "
          "(fingerprints: training region {} then, {} now; held-out set {} then, {} now): the "
          "source changed; restore it, or move the folder away to start the point over",
          ckpt_path.string(), plan.id, train.source, ck.data.value("training_fingerprint", "?"),
          fingerprints.at("training_fingerprint").get<std::string>(),
          ck.data.value("validation_fingerprint", "?"),
          fingerprints.at("validation_fingerprint").get<std::string>()));
    check_checkpoint_head({ck.plan, ck.train, ck.state.step, ck.state.micro_batch_seqs,
                           ck.state.device, ck.state.threads, ck.state.kernels_requested,
                           ck.state.optimizer_sharded, ck.state.world_size},
                          ckpt_path, plan, plan_json, train, opt);
    // The same request may resolve otherwise (`auto` on another GPU, another cuBLASLt).
    if (!ck.state.kernels.empty() && ck.state.kernels != engine->kernels() && !opt.elastic)
      throw InputError(fmt::format(
          "checkpoint '{}' of point '{}' was trained with kernels '{}', this run's engine chose "
          "'{}'; resume where the same kernels are chosen (--kernels naming each), add --elastic "
          "to go on with these (not the bit-for-bit continuation), or move the folder away to "
          "start the point over",
          ckpt_path.string(), plan.id, ck.state.kernels, engine->kernels()));
    // Every rank reads the same checkpoint, so every rank refuses alike.
    if (ck.state.world_size > 0 && ck.state.world_size != engine->world_size() && !opt.elastic)
      throw InputError(other_ranks(ckpt_path, plan.id, ck.state.world_size, engine->world_size()));
    engine->load_state(ck.model_state);
    st = std::move(ck.state);
    ++st.resumes;
    outcome.resumed_from_step = st.step;
    if (writer_notice(opt, *engine))
      opt.on_notice(
          fmt::format("resuming at step {} of {} from '{}'", st.step, steps, ckpt_path.string()));
  } else {
    // An interrupted point's record without its checkpoint (removed by hand): the record cannot
    // resume, so the point trains from step 0 and the record is rewritten; say so first.
    if (const nlohmann::json& rec = outcome.record;
        rec.is_object() && writer_notice(opt, *engine)) {
      const int64_t done = rec.contains("measured") && rec["measured"].is_object()
                               ? rec["measured"].value("steps", int64_t(0))
                               : int64_t(0);
      if (done > 0)
        opt.on_notice(fmt::format(
            "'{}' is at step {} of {} but '{}' is missing: the point trains again from step 0 "
            "and its record is rewritten",
            outcome.record_path.string(), done, steps, ckpt_path.string()));
    }
    st.tokens = TokenLedger(seq_len, windows);
    st.order = training_order(windows, train);
  }
  // The layout this session trains in against the checkpoint's: another one only under
  // --elastic (refused above otherwise), said and kept from the step it starts at.
  const Layout was{.from_step = 0,
                   .world_size = st.world_size,
                   .micro_batch_seqs = st.micro_batch_seqs,
                   .threads = st.threads,
                   .optimizer_sharded = st.optimizer_sharded.value_or(opt.shard_optimizer),
                   .kernels = st.kernels};
  const Layout now{.from_step = st.step,
                   .world_size = engine->world_size(),
                   .micro_batch_seqs = opt.micro_batch_seqs,
                   .threads = engine->threads(),
                   .optimizer_sharded = opt.shard_optimizer,
                   .kernels = engine->kernels()};
  if (const std::string moved = layout_change(was, now, plan.budget.batch_seqs, opt.device);
      st.step > 0 && !moved.empty()) {
    if (st.layouts.empty()) st.layouts.push_back(was);
    st.layouts.push_back(now);
    // Each rank's passes change with the rank count or --micro-batch; the auxiliary losses are
    // taken per pass.
    const bool passes =
        was.world_size != now.world_size ||
        pass_of(was.micro_batch_seqs, batch) != pass_of(now.micro_batch_seqs, batch);
    if (writer_notice(opt, *engine))
      opt.on_notice(fmt::format(
          "resuming at step {} in another layout ({}): the steps from here sum in another "
          "order{}, so this is not the bit-for-bit continuation of the run; its ledgers stay "
          "exact, and the record keeps each layout and compares its time with no other point's",
          st.step, moved,
          passes ? " and take the auxiliary losses over other groups of sequences" : ""));
  }
  st.micro_batch_seqs = opt.micro_batch_seqs;
  st.device = opt.device;
  st.threads = engine->threads();
  st.kernels_requested = opt.kernels;
  st.kernels = engine->kernels();
  st.world_size = engine->world_size();
  st.optimizer_sharded = opt.shard_optimizer;
  // The hardware of this session after those before it: a resume elsewhere is allowed (a
  // preempted job restarts where it can), said, and kept, so that the record's times are not
  // read as one device's.
  constexpr const char* kNotRecorded = "not recorded";  // a checkpoint from before the field
  const std::string named = engine->hardware();
  const std::string hardware = named.empty() ? "unknown" : named;
  if (st.hardware.empty() && st.step > 0) st.hardware.push_back(kNotRecorded);
  if (!st.hardware.empty() && st.hardware.back() != hardware && writer_notice(opt, *engine))
    opt.on_notice(fmt::format(
        "trained on {} until step {}, and now on {}: the record's time and FLOP rate are a mix "
        "of the two, and the report compares them with no other point's",
        st.hardware.back() == kNotRecorded ? "hardware its checkpoint does not name"
                                           : st.hardware.back(),
        st.step, hardware));
  if (st.hardware.empty() || st.hardware.back() != hardware) st.hardware.push_back(hardware);

  RecordInputs rin;
  rin.plan = &plan;
  rin.plan_json = &plan_json;
  rin.state = &st;
  rin.device = opt.device;
  rin.kernels = engine->kernels();
  rin.kernels_requested = opt.kernels;
  rin.threads_requested = opt.threads;
  rin.world_size = engine->world_size();
  rin.peak_flops_per_second = peak_per_device(*engine, opt);
  rin.peak_given = opt.peak_tflops > 0;
  rin.pass_seqs = engine->pass_seqs();
  rin.optimizer_sharded = opt.shard_optimizer;
  rin.params = params;
  rin.data = data_json;
  rin.train = train_to_json(train);
  rin.checkpoint_every = ckpt_every;
  rin.eval_every = eval_every;
  rin.eval_tokens = eval_windows * seq_len;
  rin.n_tolerance = opt.n_tolerance;
  rin.compute_tolerance = opt.compute_tolerance;
  rin.equal_resources = opt.equal_resources;
  int64_t last_saved_step = outcome.resumed_from_step;
  const bool writer = engine->writes_files();  // data parallel: rank 0 only
  outcome.wrote_files = writer;
  auto save = [&](const std::string& status) {
    const int64_t kept_step = last_saved_step;
    last_saved_step = st.step;
    rin.status = status;
    const Engine::MemoryUse memory = engine->memory_use();
    rin.device_memory_peak = memory.peak_bytes;
    rin.device_memory_total = memory.device_bytes;
    outcome.record = make_record(rin);
    std::vector<char> state = engine->save_state();  // every rank: a collective when sharded
    if (writer) {
      if (!estimating && solo) lock.keep(dir / ".lock");
      // A write that fails mid-run (a full disk) loses nothing written before: the atomic writes
      // leave the last checkpoint whole. Said so, as a failure of the run (70), not of its input.
      bool checkpoint_written = false;
      try {
        write_checkpoint(ckpt_path, {plan_json, rin.train, fingerprints, st, std::move(state)});
        checkpoint_written = true;
        write_file_atomic(outcome.record_path, outcome.record.dump(1) + "\n");
      } catch (const InputError& e) {
        const int64_t whole = checkpoint_written ? st.step : kept_step;
        throw std::runtime_error(fmt::format(
            "{} (point '{}' at step {}); {}; free space or fix the folder and run the same "
            "command to resume",
            e.what(), plan.id, st.step,
            whole > 0 ? fmt::format("its checkpoint of step {} is whole", whole)
                      : std::string("it has no checkpoint yet, and starts again at step 0")));
      }
    }
    // Every rank leaves a save together. After the last one the others went straight on to the
    // next point's NCCL id file (a 120 s wait) while rank 0 was still writing: at 6.5B
    // parameters, tens of GB.
    engine->any_rank(false);
  };

  const OptimConfig cfg = optim_config(plan);
  std::vector<int32_t> inputs(size_t(batch * seq_len)), targets(size_t(batch * seq_len));
  const auto session_start = Clock::now();
  const int64_t session_first_step = st.step;
  const double session_first_flops = double(st.train_flops.useful());
  const double session_first_eval_seconds = st.eval_seconds;
  Progress progress;
  progress.point_id = plan.id;
  progress.steps = steps;
  progress.peak_flops_per_second = peak_per_device(*engine, opt) * engine->world_size();
  progress.peak_given = opt.peak_tflops > 0;

  while (st.step < steps) {
    if (engine->any_rank(opt.stop && opt.stop->load() != 0)) {
      // Only what is new: a stop right after a checkpoint (or before the first step of a point
      // with none) writes nothing; at 16 bytes a parameter a checkpoint is no small write to make
      // after a stop was asked for.
      if (last_saved_step != st.step && st.step > 0) save("running");
      outcome.status = PointStatus::interrupted;
      outcome.checkpoint_step = last_saved_step;
      return outcome;
    }
    fill_batch(data.train, seq_len, batch, st.order, st.tokens, inputs.data(), targets.data());
    const auto t0 = Clock::now();
    const StepResult r = engine->train_step(inputs.data(), targets.data(), st.step, cfg);
    st.train_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
      throw TrainingDiverged(
          diverged_message(plan.id, r, model_opt, st.step, steps, last_saved_step));
    if (r.loss_bearing_targets != batch * seq_len)  // the model and the token ledger must agree
      throw std::logic_error(
          fmt::format("point '{}': the model counted {} loss-bearing targets in "
                      "step {}, the token ledger {}",
                      plan.id, r.loss_bearing_targets, st.step + 1, batch * seq_len));
    check_step_ledger(plan.arch, batch, model_opt.erc_loss > 0, r, st.step + 1);
    st.train_flops += r.flops;
    st.dropped_assignments += r.dropped_assignments;
    ++st.step;
    st.loss_sum_since_log += r.loss;
    ++st.steps_since_log;
    if (st.step % log_every == 0 || st.step == steps) {
      st.loss_curve.push_back(
          {{"step", st.step},
           {"tokens_consumed", st.tokens.consumed},
           {"train_loss", r.loss},
           {"train_loss_mean", st.loss_sum_since_log / double(st.steps_since_log)},
           {"lr", r.lr},
           {"aux_load_balance", r.aux_load_balance},
           {"grad_norm", r.grad_norm}});
      // The optional auxiliary losses, when on (coefficient-weighted, summed over MoE layers).
      if (model_opt.z_loss > 0) st.loss_curve.back()["aux_z"] = r.aux_z;
      if (model_opt.erc_loss > 0) st.loss_curve.back()["aux_erc"] = r.aux_erc;
      st.loss_sum_since_log = 0;
      st.steps_since_log = 0;
    }
    progress.evaluated = false;
    if (st.step % eval_every == 0 || st.step == steps) {
      const auto e0 = Clock::now();
      const FlopLedger eval_before = engine->eval_ledger();
      st.val_curve.push_back(evaluate(*engine, data, seq_len, eval_windows, st.step));
      st.val_seconds.push_back(st.train_seconds);
      st.eval_flops += engine->eval_ledger() - eval_before;
      st.eval_seconds += std::chrono::duration<double>(Clock::now() - e0).count();
      progress.evaluated = true;
      progress.val_bpc = st.val_curve.back().at("val_bpc").get<double>();
    }
    if (opt.on_progress && writer) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - session_start).count();
      const int64_t done = st.step - session_first_step;
      progress.step = st.step;
      progress.tokens_consumed = st.tokens.consumed;
      progress.train_loss = r.loss;
      // Rates over training time, as the record's: evaluations take wall time but their FLOPs
      // and tokens are not in these counts (they ran ~27 % low on a small CPU point).
      const double training = elapsed - (st.eval_seconds - session_first_eval_seconds);
      progress.tokens_per_second = training > 0 ? double(done * batch * seq_len) / training : 0;
      progress.flops_per_second =
          training > 0 ? (double(st.train_flops.useful()) - session_first_flops) / training : 0;
      progress.eta_seconds = done > 0 ? elapsed / double(done) * double(steps - st.step) : 0;
      opt.on_progress(progress);
    }
    if (st.step % ckpt_every == 0 && st.step < steps) save("running");
  }
  save("complete");
  outcome.status = PointStatus::completed;
  return outcome;
}

}  // namespace moeplan::backend
