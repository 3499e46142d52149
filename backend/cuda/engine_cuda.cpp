// Registers the "cuda" engine with the run loop's seam (engine.hpp). Compiled into every target
// that links moeplan::backend_cuda (an INTERFACE source), so no linker drops the registration.
// Data parallelism: when WORLD_SIZE is set the engine joins an NCCL group (RANK, LOCAL_RANK; the
// unique id travels through MOEPLAN_NCCL_ID_FILE, default /tmp/moeplan-nccl-<MASTER_PORT|id>,
// with "." and a hash of the point's id appended).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/cuda/attention.hpp"
#include "moeplan/backend/cuda/comm.hpp"
#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/gemm.hpp"
#include "moeplan/backend/cuda/kernels.hpp"
#include "moeplan/backend/cuda/model.hpp"
#include "moeplan/backend/engine.hpp"

namespace moeplan::backend::cuda {
namespace {

// The job's id file (--nproc's, or MASTER_PORT's), one per point: ranks on different points
// never join one group.
std::string nccl_id_file(const std::string& point_id) {
  // The point by a hash of its id (FNV-1a 64): an id may be 255 bytes, a file name no longer.
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : point_id) h = (h ^ c) * 0x100000001b3ull;
  const std::string point = point_id.empty() ? "" : fmt::format(".{:016x}", h);
  if (const char* f = std::getenv("MOEPLAN_NCCL_ID_FILE"); f && *f) return f + point;
  const char* port = std::getenv("MASTER_PORT");
  return std::string("/tmp/moeplan-nccl-") + (port && *port ? port : "id") + point;
}

// The model's buffers did not fit: say how far it got and what to run instead. `largest`: the
// most sequences a pass that fit, where the fit check found it (0: none; -1: not looked for).
std::string out_of_memory_message(const DeviceOutOfMemory& e, const EngineRequest& r,
                                  int64_t rank_batch, const KernelChoice& kernels, int shards,
                                  int64_t largest = -1) {
  const AttentionPath attention = kernels.attention.value_or(AttentionPath::cublas);
  const int64_t pass = r.options.micro_batch_seqs > 0
                           ? std::min(r.options.micro_batch_seqs, rank_batch)
                           : rank_batch;
  const std::string where = fmt::format(
      "--device cuda: out of device memory (moeplan's buffers held {} when {} more did not fit; "
      "the device has {})",
      bytes_text(double(e.in_use)), bytes_text(double(e.requested)),
      bytes_text(double(device_memory().second)));
  // fp32 weights, their bf16 copy, fp32 gradients and both AdamW moments (over `shards` ranks):
  // 18 bytes a parameter unsharded.
  const double fixed = (10.0 + 8.0 / double(shards)) * double(count_params(r.arch).trainable());
  if (pass <= 1 || largest == 0)
    return fmt::format(
        "{} with passes of {} sequence{} of {} tokens; {}the weights, gradients and AdamW state "
        "alone take {}: this point needs a larger device{}",
        where, pass, pass == 1 ? "" : "s", r.arch.seq_len,
        pass > 1 ? "not even passes of 1 sequence fit; " : "", bytes_text(fixed),
        shards == 1 ? " (or GPUs that share its AdamW state: --nproc N --shard-optimizer)" : "");
  std::string fused;
  if (attention == AttentionPath::cublas && attention::supported(r.arch.head_dim)) {
    // The cuBLAS attention keeps each layer's bf16 probabilities and one layer's fp32 scores,
    // fp32 dP and bf16 dS: S×S per head. The fused kernels keep none of them; the register-
    // resident backward (head widths up to 64) keeps one layer's bf16 dS in whole 64×64 tiles,
    // which at short sequences outweighs what it spares: then the line does not offer it.
    const double square = double(r.arch.heads) * double(r.arch.seq_len) * double(r.arch.seq_len);
    const double tiles =
        attention::backward_mma_supported(r.arch.head_dim)
            ? 2.0 * double(attention::backward_mma_scratch(1, r.arch.seq_len, r.arch.heads))
            : 0.0;
    const double saved = square * (2.0 * double(r.arch.layers) + 10.0) - tiles;
    if (saved > 0)
      fused = fmt::format(", or --kernels attention=fused_mma (no S×S buffers: {} less a sequence)",
                          bytes_text(saved));
  }
  // The LM head's bf16 logits and their bf16 gradient: V·4 bytes a row of the chunk.
  std::string logits;
  const int64_t rows = std::min(pass * r.arch.seq_len,
                                kernels.logit_rows > 0 ? kernels.logit_rows : kLogitRowsAuto);
  if (rows > 2048)
    logits = fmt::format(", or --kernels logits=2048 ({} less)",
                         bytes_text(4.0 * double(r.arch.vocab) * double(rows - 2048)));
  const std::string smaller =
      largest > 0
          ? fmt::format(": --micro-batch {} (at most {} sequences a pass fit)", largest, largest)
          : fmt::format(", e.g. --micro-batch {}", pass / 2);
  return fmt::format("{} with passes of {} sequences of {} tokens; run smaller passes{}{}{}", where,
                     pass, r.arch.seq_len, smaller, fused, logits);
}

// Data parallelism: every rank runs the same loop over the same global batch (so the token
// ledger is the job's on every rank) and trains on its share of it, the sequences r, r+W, r+2W, …
// of the batch; no window is read by two ranks. The model averages gradients and sums the FLOP
// ledger, routed counts and loss-bearing targets over ranks, so each step reports the job's
// figures. Evaluation is split over the ranks the same way (forward_loss); rank 0 writes files.
// A --kernels request as the engine for `arch` takes it; refused on any machine (no GPU needed).
KernelChoice checked_kernels(const std::string& kernels, const Arch& arch) {
  const KernelChoice asked = parse_kernel_choice(kernels);
  if (asked.attention && *asked.attention != AttentionPath::cublas &&
      !attention::supported(arch.head_dim))
    throw InputError(fmt::format(
        "--kernels {}: the fused attention kernels take head_dim 16, 32, 64 or 128; this "
        "point's is {} (use attention=cublas)",
        kernels, arch.head_dim));
  return asked;
}

// The rank variables as the engine reads them, refused as it would refuse them: RANK or
// LOCAL_RANK without WORLD_SIZE (rank_from_env), a LOCAL_RANK past this machine's GPUs, fewer
// sequences than ranks (before NCCL). Also run for every point before any folder is made.
RankInfo checked_ranks(int64_t batch_seqs) {
  const RankInfo info = rank_from_env();
  if (const char* ws = std::getenv("WORLD_SIZE"); ws && *ws) {
    if (const int n = device_count(); info.local_rank >= n && n > 0)
      throw InputError(
          fmt::format("LOCAL_RANK={}{} but this machine shows {} CUDA device(s)", info.local_rank,
                      info.local_rank_given ? "" : " (RANK: LOCAL_RANK is not set)", n));
    rank_batch(batch_seqs, info);
  }
  return info;
}

// --kernels launch: the process's launches of the project's kernels (launch.cuh), refused where
// the device cannot overlap them.
void set_launch_mode(LaunchMode mode, int device) {
  if (mode == LaunchMode::programmatic) {
    const DeviceInfo d = device_info(device);
    if (d.compute_major < 9)
      throw InputError(fmt::format(
          "--kernels launch=pdl needs compute capability 9.0 or later (programmatic dependent "
          "launch); this device ({}) is {}.{} (valid here: launch=plain or auto)",
          d.name, d.compute_major, d.compute_minor));
  }
  kernels::set_programmatic_launch(mode == LaunchMode::programmatic);
}

// A GPU this build carries no code for: one line naming it, its compute capability and the code
// the build has, before any buffer or NCCL group is made (`device` is already current). Without
// it the first kernel launch would fail mid-step with CUDA's own words.
void check_device_code(const DeviceInfo& d, int device) {
  const std::string error = kernels::code_load_error();
  if (error.empty()) return;
  const std::string gpu = fmt::format("GPU {} ({}, compute capability {}.{})", device, d.name,
                                      d.compute_major, d.compute_minor);
  if (d.compute_major < 8)
    throw InputError(fmt::format(
        "--device cuda: {} cannot run moeplan's kernels, which need compute capability 8.0 or "
        "later (bf16 tensor-core products); this build's code: {} ({}); train with --device cpu",
        gpu, built_architectures(), error));
  throw InputError(fmt::format(
      "--device cuda: this build has no code {} runs: CMAKE_CUDA_ARCHITECTURES was '{}' ({}); "
      "rebuild with its code added, e.g. -DCMAKE_CUDA_ARCHITECTURES=\"{}{}-real;90-real;"
      "90-virtual\" (or, if CUDA says the PTX is too new, update the driver)",
      gpu, built_architectures(), error, d.compute_major, d.compute_minor));
}

// --shard-optimizer splits the AdamW state over ranks: refused without them.
void require_ranks_to_shard(bool shard_optimizer) {
  const char* ws = std::getenv("WORLD_SIZE");
  if (shard_optimizer && !(ws && *ws))
    throw InputError(
        "--shard-optimizer splits the AdamW state over data-parallel ranks; it needs --nproc N "
        "(or WORLD_SIZE)");
}

// The model as the engine trains it, with its kernels' paths set as the engine sets them (each
// allocates what it needs), so that the fit check holds exactly the engine's buffers.
// sizing_world: see Model (the fit check's sharded model, without a communicator).
std::unique_ptr<Model> build_model(const EngineRequest& r, const KernelChoice& k,
                                   int64_t local_batch, Communicator* comm, bool sharded,
                                   int sizing_world = 0) {
  auto model =
      std::make_unique<Model>(r.arch, r.options, r.seed, local_batch, DType::bf16, comm,
                              *k.attention, sharded, k.logit_rows, *k.experts, sizing_world);
  model->set_router_path(*k.router);
  // Each step's AdamW update beside the next step's forward, and, data parallel, the
  // gradients' all-reduce beside the backward (the same bits; neither with the optimizer
  // sharded): see Model::set_update_overlap and set_reduce_overlap.
  model->set_update_overlap(true);
  model->set_reduce_overlap(true);
  return model;
}

// Where and with what a point's engine runs: this rank, its GPU (made current, its code
// checked) and the kernels asked and resolved for it; the engine's first refusals, in its order,
// shared with the fit check.
struct Placement {
  KernelChoice asked, kernels;
  RankInfo info;
  DeviceInfo device;
};
Placement place(const EngineRequest& r) {
  Placement p;
  p.asked = checked_kernels(r.kernels, r.arch);
  if (device_count() == 0)
    throw InputError("--device cuda: no CUDA device is visible on this machine");
  p.info = checked_ranks(r.batch_seqs);
  p.device = device_info(p.info.local_rank);
  set_device(p.info.local_rank);  // so that the check makes no context on another rank's GPU
  check_device_code(p.device, p.info.local_rank);
  p.kernels = resolve_kernels(p.asked, auto_target(r.arch, p.device), DType::bf16);
  return p;
}

// register_fit_check's check: the point's model built on this rank's GPU as the engine would
// build it (the same kernels, this rank's share of the batch, the optimizer sharded as it would
// be), then freed. Where it does not fit, the largest pass that does, by bisection: each try
// builds the model again in smaller passes (a model's buffers grow with its pass); up_to_share,
// likewise in larger passes where it fits. The engine's own refusals (kernels, ranks, the
// device's code) come first, as they would.
PassFit fit_check(const EngineRequest& r, bool up_to_share) {
  const Placement placed = place(r);
  const RankInfo& info = placed.info;
  const KernelChoice& kernels = placed.kernels;
  require_ranks_to_shard(r.shard_optimizer);
  const int64_t local = rank_batch(r.batch_seqs, info);
  const int shards = r.shard_optimizer ? info.world_size : 1;
  const auto fails_as = [&](int64_t pass, bool sharded) -> std::optional<DeviceOutOfMemory> {
    EngineRequest q = r;
    q.options.micro_batch_seqs = pass;
    try {
      build_model(q, kernels, local, nullptr, sharded, sharded ? info.world_size : 1);
      return std::nullopt;
    } catch (const DeviceOutOfMemory& e) {
      return e;
    }
  };
  const auto fails = [&](int64_t pass) { return fails_as(pass, r.shard_optimizer); };
  PassFit fit;
  fit.share = local;
  fit.pass = r.options.micro_batch_seqs > 0 ? std::min(r.options.micro_batch_seqs, local) : local;
  const std::optional<DeviceOutOfMemory> asked_fails = fails(fit.pass);
  // The most known to fit (0: none) and the least known not to (share + 1: none).
  int64_t fits = 0, fails_at = fit.pass;
  if (!asked_fails) {
    fits = fit.pass;
    if (!up_to_share || fit.pass == local)
      fails_at = fits + 1;     // not asked to look further
    else if (!fails(local)) {  // the whole share fits: the common case, one more try
      fits = local;
      fails_at = local + 1;
    } else {
      fails_at = local;
    }
  }
  fits = most_that_fit(fits, fails_at, [&](int64_t pass) { return fails(pass).has_value(); });
  fit.largest = fits;
  if (!asked_fails) return fit;
  fit.why = out_of_memory_message(*asked_fails, r, local, kernels, shards, fits);
  // Data parallel, unsharded: what splitting the AdamW state over the ranks would fit (at least
  // what fits now; 8 bytes a parameter become 8/W). Where no pass fits, the line already offers
  // it.
  if (!r.shard_optimizer && info.world_size > 1 && fits > 0) {
    const auto sharded_fails = [&](int64_t pass) { return fails_as(pass, true).has_value(); };
    const int64_t most =
        sharded_fails(fit.pass) ? most_that_fit(fits, fit.pass, sharded_fails) : fit.pass;
    if (most == fit.pass)
      fit.why += fmt::format(
          ", or --shard-optimizer (the AdamW state split over the {} ranks: these passes fit)",
          info.world_size);
    else if (most > fits)
      fit.why += fmt::format(
          ", or --shard-optimizer (the AdamW state split over the {} ranks: up to {} a pass fit)",
          info.world_size, most);
  }
  return fit;
}

class CudaEngine final : public Engine {
 public:
  explicit CudaEngine(const EngineRequest& r) {
    const Placement placed = place(r);
    reset_device_bytes_peak();  // from what this process holds now (the fit check's: nothing)
    info_ = placed.info;
    device_ = placed.device;
    kernels_ = placed.kernels;
    auto_note_ = passed_over_note(placed.asked, r.arch);
    if (const char* ws = std::getenv("WORLD_SIZE"); ws && *ws)
      comm_ = std::make_unique<Communicator>(info_, nccl_id_file(r.point_id));
    if (comm_ && info_.world_size > 1) same_gpus_ = ranks_share_gpu_name();
    local_batch_ = rank_batch(r.batch_seqs, info_);
    batch_ = r.batch_seqs;
    require_ranks_to_shard(r.shard_optimizer);
    sharded_ = r.shard_optimizer;
    seq_len_ = r.arch.seq_len;
    set_launch_mode(*kernels_.launch, info_.local_rank);
    try {
      model_ = build_model(r, kernels_, local_batch_, comm_.get(), sharded_);
      gemm_note_ = resolve_gemm_table();
    } catch (const DeviceOutOfMemory& e) {
      throw InputError(out_of_memory_message(e, r, local_batch_, kernels_,
                                             sharded_ ? info_.world_size : 1));
    }
    request_ = r;
  }

  // --kernels gemm: `auto` takes the built-in table made on this device name and cuBLASLt version
  // (and says when there is none); `builtin` and `builtin:NAME` require it; `none` takes none; a
  // file goes to use_gemm_table. A built-in table is lenient (Blas::set_table): timed for the
  // benchmark's points, it may list a shape that another point's buffers align less. Resolves
  // kernels_.gemm_table to what ran ("builtin:NAME", "" for none, or the file) and returns what
  // describe() says of it.
  std::string resolve_gemm_table() {
    std::string& asked = kernels_.gemm_table;
    if (asked == "none") {
      asked.clear();
      return ", no GEMM table";
    }
    const bool automatic = asked.empty();
    if (!automatic && asked != "builtin" && !asked.starts_with("builtin:"))
      return use_gemm_table(asked);
    const auto [device, version] = gemm_table_identity();
    const BuiltinGemmTable* chosen = builtin_gemm_table_for(device, version);
    if (asked.starts_with("builtin:")) {
      const std::string name = asked.substr(8);
      for (const BuiltinGemmTable& b : builtin_gemm_tables())
        if (b.name == name)
          chosen = b.table->device == device && b.table->cublaslt_version == version ? &b : nullptr;
    }
    if (!chosen && automatic)
      return fmt::format(", no GEMM table (none built in for '{}' with cuBLASLt {})", device,
                         version);
    if (!chosen) {
      std::string made;
      for (const BuiltinGemmTable& b : builtin_gemm_tables())
        made += fmt::format("{}{} ('{}', cuBLASLt {})", made.empty() ? "" : ", ", b.name,
                            b.table->device, b.table->cublaslt_version);
      throw InputError(fmt::format(
          "--kernels gemm={}: no built-in GEMM table {}for '{}' with cuBLASLt {} (built in: {}); "
          "use gemm=auto or none, or tune one here with gemm=<a new file>",
          asked, asked == "builtin" ? "" : "of that name ", device, version,
          made.empty() ? "none" : made));
    }
    model_->set_gemm_table(chosen->table, true);
    asked = "builtin:" + chosen->name;
    const auto listed = std::count_if(chosen->table->entries.begin(), chosen->table->entries.end(),
                                      [](const GemmTable::Entry& e) { return e.lt; });
    return fmt::format(
        ", GEMM table built-in '{}': cuBLASLt algorithms for {} product shapes (timed for the "
        "benchmark's points; any other shape by cuBLAS's default)",
        chosen->name, listed);
  }

  // --kernels gemm=FILE: the GEMM table in FILE (a new one when there is none yet), with the
  // point's products it does not list tuned and added first, so that every step of the point,
  // and every later run given FILE, multiplies the same way. One forward and backward on a batch
  // of token 0 records the products (it leaves no weight, moment, ledger or generator state
  // changed; the first step zeroes the gradients). Returns what describe() says of it.
  std::string use_gemm_table(const std::string& path) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    GemmTable table;
    if (exists) {
      table = load_gemm_table(path);
      model_->set_gemm_table(std::make_shared<const GemmTable>(table));  // refuses a foreign one
    }
    model_->record_gemm_shapes(true);
    const std::vector<int32_t> tokens(size_t(local_batch_ * seq_len_), 0);
    const auto rng = model_->rng_state();  // the probe's ERC noise draws are given back
    model_->compute_gradients(tokens.data(), tokens.data());
    model_->set_rng_state(rng);
    model_->record_gemm_shapes(false);
    const auto shapes = model_->gemm_shapes();
    const auto missing = untuned_shapes(table, shapes);
    if (!missing.empty()) {
      if (info_.world_size > 1)  // ranks timing apart could choose apart
        throw InputError(fmt::format(
            "--kernels gemm={}: the table does not list {} of this point's matrix-product shapes, "
            "and data-parallel ranks must not time them each on their own; add them in one "
            "process first (the same command without --nproc or WORLD_SIZE, e.g. with "
            "--estimate 1)",
            path, missing.size()));
      try {
        add_tuned_shapes(table, shapes, 0.03, 20);
      } catch (const DeviceOutOfMemory& e) {  // its operands come beside the model's buffers
        throw InputError(fmt::format(
            "--kernels gemm={}: timing the point's products needs a cuBLASLt workspace and random "
            "operands beside the "
            "model's buffers, and {} more did not fit next to the {} held (the device has {}); "
            "run in smaller passes (--micro-batch n: smaller products, so smaller operands to "
            "time), or without gemm=",
            path, bytes_text(double(e.requested)), bytes_text(double(e.in_use)),
            bytes_text(double(device_memory().second))));
      }
      save_gemm_table(path, table);
      model_->set_gemm_table(std::make_shared<const GemmTable>(table));
    }
    int64_t listed = 0, by_lt = 0;
    for (const auto& e : table.entries)
      if (std::any_of(shapes.begin(), shapes.end(),
                      [&](const auto& p) { return p.first == e.shape; })) {
        ++listed;
        by_lt += e.lt;
      }
    return fmt::format(", GEMM table {}: {} of the point's {} product shapes through cuBLASLt{}",
                       path, by_lt, listed,
                       missing.empty() ? "" : fmt::format(" ({} tuned now)", missing.size()));
  }
  std::string device() const override { return "cuda"; }
  // This rank's GPU; rank 0's is the one a record names. Ranks on GPUs of other names: no one
  // name, so the record and the report say so, and no peak, so no MFU.
  std::string hardware() const override {
    return same_gpus_ ? device_.name : device_.name + " on rank 0, other GPUs on other ranks";
  }
  // The products run in bf16 on tensor cores: the vendor's dense bf16 peak, where known.
  double peak_flops_per_second() const override {
    return same_gpus_ ? device_.peak_bf16_tflops * 1e12 : 0.0;
  }
  // Whether every rank's GPU has this rank's name (a collective): per byte of the name, the sum
  // over ranks of x and of x², which are W·x and W·x² exactly when all W ranks have the same x.
  bool ranks_share_gpu_name() {
    constexpr int64_t kBytes = 256;  // cudaDeviceProp::name
    std::vector<int64_t> sums(size_t(2 * kBytes), 0);
    for (int64_t i = 0; i < kBytes && i < int64_t(device_.name.size()); ++i) {
      const int64_t x = static_cast<unsigned char>(device_.name[size_t(i)]);
      sums[size_t(i)] = x;
      sums[size_t(kBytes + i)] = x * x;
    }
    comm_->all_reduce_sum_host(sums.data(), 2 * kBytes);
    const int64_t w = info_.world_size;
    for (int64_t i = 0; i < kBytes; ++i)  // (Σx)² = W·Σx² only when every x is the same
      if (sums[size_t(i)] * sums[size_t(i)] != w * sums[size_t(kBytes + i)]) return false;
    return true;
  }
  std::string kernels() const override { return to_string(kernels_); }
  // Buffers that grow with the routing (experts=batched) can run out of memory mid-run: the same
  // one line as at the start; the last checkpoint stays, so the point resumes.
  template <class F>
  auto out_of_memory_said(const std::string& when, F&& f) {
    try {
      return f();
    } catch (const DeviceOutOfMemory& e) {
      throw InputError(fmt::format("{}: {}", when,
                                   out_of_memory_message(e, request_, local_batch_, kernels_,
                                                         sharded_ ? info_.world_size : 1)));
    }
  }
  StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                        const OptimConfig& cfg) override {
    return out_of_memory_said(fmt::format("at step {}", step), [&] {
      if (info_.world_size == 1) return model_->train_step(inputs, targets, step, cfg);
      take_rank_share(in_, inputs, batch_, seq_len_, info_);
      take_rank_share(tg_, targets, batch_, seq_len_, info_);
      return model_->train_step(in_.data(), tg_.data(), step, cfg);
    });
  }
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                      double* per_position_loss) override {
    return out_of_memory_said("in evaluation", [&] {
      return evaluate(inputs, targets, n_seqs, per_position_loss);
    });
  }

  // Data parallel: each rank evaluates its share of the sequences (r, r+W, …); the per-position
  // losses are summed over ranks (each position is one rank's, the others add zero) and so is
  // the eval ledger, which is then the job's, as the training ledger is.
  double evaluate(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                  double* per_position_loss) {
    if (info_.world_size == 1) return model_->forward_loss(inputs, targets, n_seqs, per_position_loss);
    const int64_t S = seq_len_;
    const int64_t mine = windows_of_rank(n_seqs, info_.rank, info_.world_size);
    take_rank_share(in_, inputs, n_seqs, S, info_);
    take_rank_share(tg_, targets, n_seqs, S, info_);
    const FlopLedger before = model_->eval_ledger();
    std::vector<double> share(size_t(mine * S)), all(size_t(n_seqs * S), 0.0);
    if (mine > 0) model_->forward_loss(in_.data(), tg_.data(), mine, share.data());
    for (int64_t i = 0; i < mine; ++i)
      std::copy_n(share.begin() + i * S, S,
                  all.begin() + window_of_rank(i, info_.rank, info_.world_size) * S);
    DeviceBuffer sum(all.size() * 8);
    sum.upload(all.data(), all.size() * 8);
    comm_->all_reduce_sum(sum.as<double>(), int64_t(all.size()));
    sum.download(all.data(), all.size() * 8);
    FlopLedger job = model_->eval_ledger() - before;
    comm_->all_reduce_sum_host(job);
    eval_ledger_ += job;
    double total = 0;
    int64_t bearing = 0;
    for (int64_t t = 0; t < n_seqs * S; ++t) {
      total += all[size_t(t)];
      bearing += targets[t] >= 0;
    }
    if (per_position_loss) std::copy(all.begin(), all.end(), per_position_loss);
    return bearing > 0 ? total / double(bearing) : 0.0;
  }
  std::vector<char> save_state() const override {
    std::vector<char> out;
    if (!writes_files() && !sharded_) return out;  // only rank 0's is written
    model_->save_state(out);
    return out;
  }
  void load_state(const std::vector<char>& state) override { model_->load_state(state); }
  std::vector<TensorInfo> tensors() const override { return model_->tensors(); }
  int64_t trainable_params() const override { return model_->trainable_params(); }
  FlopLedger eval_ledger() const override {
    return info_.world_size == 1 ? model_->eval_ledger() : eval_ledger_;
  }
  bool writes_files() const override { return info_.rank == 0; }
  int world_size() const override { return info_.world_size; }
  int64_t pass_seqs() const override { return model_->pass_seqs(); }
  bool has_phases() const override { return true; }
  void set_profiling(bool on) override { model_->set_profiling(on); }
  std::vector<std::pair<std::string, double>> profile_ms_per_step() const override {
    return model_->profile_ms_per_step();
  }
  std::string describe() const override {
    const int64_t rows = model_->pass_seqs() * seq_len_;
    return fmt::format(
        "cuda ({}){}: {} of the device's {} for passes of {} sequences ({}{}{}{}{})", hardware(),
        info_.world_size > 1 ? fmt::format(" rank 0 of {}", info_.world_size) : "",
        bytes_text(double(device_bytes_in_use())), bytes_text(double(device_memory().second)),
        model_->pass_seqs(), to_string(kernels_), auto_note_,
        model_->logit_rows() < rows
            ? fmt::format(", LM head in chunks of {} of {} rows", model_->logit_rows(), rows)
            : "",
        sharded_                   ? ", optimizer sharded"
        : model_->reduce_overlap() ? ", all-reduce beside the backward"
                                   : "",
        gemm_note_);
  }
  MemoryUse memory_use() const override { return {device_bytes_peak(), device_memory().second}; }
  bool any_rank(bool flag) override {
    if (!comm_ || info_.world_size == 1) return flag;
    int64_t n = flag ? 1 : 0;
    comm_->all_reduce_sum_host(&n, 1);
    return n > 0;
  }

 private:
  RankInfo info_;
  DeviceInfo device_;
  bool same_gpus_ = true;  // every data-parallel rank's GPU has device_.name (ranks_share_gpu_name)
  EngineRequest request_;
  KernelChoice kernels_;
  std::string gemm_note_;  // describe()'s words on the GEMM table, if any
  std::string auto_note_;  // describe()'s words on a path `auto` passed over, if any

  // Where `auto` took cuBLAS's attention only because this device allows a block less shared
  // memory than the fused path it takes elsewhere asks (head width 128 on compute capability
  // 8.6, 8.9, 12.x): the engine's line says so, since the step may be slower than on an H100.
  std::string passed_over_note(const KernelChoice& asked, const Arch& arch) const {
    if (asked.attention || *kernels_.attention != AttentionPath::cublas) return "";
    AutoTarget unlimited = auto_target(arch, device_);
    unlimited.shared_optin = 0;
    const AttentionPath elsewhere = *resolve_kernels(asked, unlimited, DType::bf16).attention;
    if (elsewhere == AttentionPath::cublas) return "";
    return fmt::format(
        ", cuBLAS attention since {} asks {:.1f} KiB of shared memory a block at head width {} "
        "and this GPU allows {:.1f} KiB",
        attention_name(elsewhere), double(attention_shared_bytes(elsewhere, arch.head_dim)) / 1024,
        arch.head_dim, double(device_.shared_optin) / 1024);
  }
  int64_t local_batch_ = 0, batch_ = 0, seq_len_ = 0;
  bool sharded_ = false;
  FlopLedger eval_ledger_;  // data parallel: the job's evaluation products
  std::vector<int32_t> in_, tg_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
};

const bool registered = register_engine("cuda", [](const EngineRequest& r) {
  return std::unique_ptr<Engine>(std::make_unique<CudaEngine>(r));
});
const bool counted = register_device_counter("cuda", [] { return device_count(); });
const bool kernels_checked = register_kernels_check(
    "cuda", [](const std::string& kernels, const Arch& arch) { checked_kernels(kernels, arch); });
const bool ranks_checked =
    register_ranks_check("cuda", [](int64_t batch_seqs) { checked_ranks(batch_seqs); });
const bool fit_checked = register_fit_check("cuda", fit_check);

}  // namespace
}  // namespace moeplan::backend::cuda
