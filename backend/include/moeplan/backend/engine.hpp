#pragma once
// The seam between the run loop and a device: the loop only calls this interface. The CPU Model
// implements it here; a CUDA backend registers its own factory for "cuda" (register_engine from a
// static initialiser in an object that the executable links, e.g. an OBJECT library or
// $<LINK_LIBRARY:WHOLE_ARCHIVE,...>, so the linker keeps it).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/backend/model.hpp"

namespace moeplan::backend {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string device() const = 0;
  // The hardware it runs on as its maker names it ("NVIDIA H200"; a CPU's model name), "" when
  // it cannot be told. A record keeps it: a point's times are that hardware's, and the report
  // compares times only between records of the same hardware.
  virtual std::string hardware() const { return {}; }
  // The maker's dense peak rate of one device for the precision the products run in (the cuda
  // engine: bf16 tensor cores), in FLOP/s; 0 when not known, so that no MFU is given against a
  // guessed peak.
  virtual double peak_flops_per_second() const { return 0; }
  // See Model: one optimizer step on (batch_seqs, seq_len) row-major inputs and targets.
  virtual StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                                const OptimConfig& cfg) = 0;
  // Mean cross-entropy over n_seqs sequences, per-position losses if asked; no training FLOPs.
  virtual double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                              double* per_position_loss) = 0;
  // Bit-exact resume state. Called on every data-parallel rank (with a sharded optimizer it is a
  // collective); only rank 0's result is written, and other ranks may return an empty one.
  virtual std::vector<char> save_state() const = 0;
  virtual void load_state(const std::vector<char>& state) = 0;
  virtual std::vector<TensorInfo> tensors() const = 0;
  virtual int64_t trainable_params() const = 0;
  virtual FlopLedger eval_ledger() const = 0;  // cumulative products of forward_loss calls
  // The kernels in use, in the form EngineRequest::kernels takes, all names spelled out; the
  // record keeps it (they decide speed and rounding, not the ledger).
  virtual std::string kernels() const = 0;
  // False on the data-parallel ranks other than 0: they train in lockstep (the same global batch,
  // each its own share of it) and leave checkpoints, records and progress lines to rank 0.
  virtual bool writes_files() const { return true; }
  // Data-parallel ranks training this point together (1 without data parallelism).
  virtual int world_size() const { return 1; }
  // CPU threads the products run with (0: not a CPU engine); recorded in checkpoints.
  virtual int threads() const { return 0; }
  // Sequences of one forward/backward pass on this rank (EngineRequest::options
  // .micro_batch_seqs, or the rank's whole share of the batch when that is 0 or larger).
  virtual int64_t pass_seqs() const = 0;
  // One line for the user once the engine is built: the device, its memory in use, the passes.
  virtual std::string describe() const = 0;
  // The most device memory the engine's own buffers held at once since it was built, and the
  // size of its device, in bytes (data parallel: this rank's); {0, 0} for a device without
  // memory of its own (cpu). A record keeps them: a point's passes fit in what it held.
  struct MemoryUse {
    std::size_t peak_bytes = 0, device_bytes = 0;
  };
  virtual MemoryUse memory_use() const { return {}; }
  // True when `flag` is true on any data-parallel rank (every rank must call it at the same
  // point of the loop; it is a collective). The run loop asks it before each step whether any
  // rank was told to stop, so that all ranks stop at the same step instead of one waiting
  // forever in the next all-reduce for a rank that has left.
  virtual bool any_rank(bool flag) { return flag; }
  // Where a step's time goes, phase by phase (the cpu engine: host time between the phases; the
  // cuda engine: CUDA events between them, the phases running one after another while it is on,
  // without the step's overlaps). Whether the engine has phases to time; set_profiling(true)
  // starts a count, false ends it; the mean milliseconds a step by phase since it started, in the
  // order first seen ({} without phases).
  virtual bool has_phases() const { return false; }
  virtual void set_profiling(bool) {}
  virtual std::vector<std::pair<std::string, double>> profile_ms_per_step() const { return {}; }
};

struct EngineRequest {
  Arch arch;
  ModelOptions options;
  uint64_t seed = 0;
  int64_t batch_seqs = 0;  // the step's batch over all ranks; options.micro_batch_seqs splits it
  int threads = 0;         // 0: the device's default
  // Which kernels the device runs, as "name=value,..." ("" = the device's defaults). Only the
  // cuda device has a choice: attention=cublas|fused|fused_mma|fused_mma_wide|fused_mma_lean|
  // fused_wgmma, experts=grouped|loop|tiled|tiled128|wgmma|batched, logits=<rows> (and gemm,
  // docs/running.md); the cpu device refuses a non-empty value.
  std::string kernels;
  // cuda, data parallel: each rank keeps the AdamW moments of 1/W of the parameters (ZeRO
  // stage 1). Refused by the cpu device and without data parallelism.
  bool shard_optimizer = false;
  // The point it trains (its id): data-parallel ranks meet through an id file named for it, so
  // ranks that reached different points (one saw a point complete that another had not) fail
  // waiting, rather than average two points' gradients.
  std::string point_id;
};
using EngineFactory = std::function<std::unique_ptr<Engine>(const EngineRequest&)>;

bool register_engine(const std::string& device, EngineFactory factory);
// Throws InputError for an unknown device, and "this build has no CUDA backend" for cuda when
// no CUDA factory was linked in.
std::unique_ptr<Engine> make_engine(const std::string& device, const EngineRequest& request);
std::vector<std::string> engine_devices();  // registered device names, sorted
// How many units of `device` this machine shows (GPUs for cuda), for a device that registered a
// counter; -1 when unknown.
bool register_device_counter(const std::string& device, std::function<int()> counter);
int visible_devices(const std::string& device);
// The same errors as make_engine, without building anything (checked before a sweep starts).
void require_device(const std::string& device);
// The names and values `--kernels` takes on the CUDA device, for `moeplan run --help` (which a
// build without CUDA shows too); the CUDA host test holds it to the parser's own lists.
inline constexpr const char* kCudaKernelChoices =
    "attention=auto|cublas|fused|fused_mma|fused_mma_wide|fused_mma_lean|fused_wgmma, "
    "experts=auto|grouped|loop|tiled|tiled128|wgmma|batched, logits=auto|<rows>, "
    "gemm=auto|none|builtin[:NAME]|<table.json>, launch=auto|plain|pdl, router=auto|cublas|tiled";
// A device's check of a --kernels request for one point's arch (the errors its engine would give
// when built), registered by the device; check_kernels runs it, and does nothing for a device
// that registered none. `run` checks every point before it makes a folder or starts a rank.
bool register_kernels_check(
    const std::string& device,
    std::function<void(const std::string& kernels, const Arch& arch)> check);
void check_kernels(const std::string& device, const std::string& kernels, const Arch& arch);
// Likewise the data-parallel rank variables a process was started with (cuda: RANK without
// WORLD_SIZE, a LOCAL_RANK past the machine's GPUs, fewer sequences a step than ranks), for a
// point of batch_seqs sequences a step.
bool register_ranks_check(const std::string& device, std::function<void(int64_t batch_seqs)> check);
void check_ranks(const std::string& device, int64_t batch_seqs);

// Whether one point's model fits a device as its engine would build it (every buffer it holds
// from the start allocated, then freed), and if not, the most sequences a pass that do. `run`
// checks every point it will train before the first trains, so that a sweep does not stop at
// its fifth point after hours of the first four. Registered by a device whose memory is
// limited (cuda); check_fit returns nothing for a device that registered none.
// up_to_share: where the pass fits, also look for the most that fit up to the rank's whole share
// (`--estimate`, so that passes can be sized up as well as down).
struct PassFit {
  int64_t pass = 0;     // sequences a pass (on this rank) as asked
  int64_t share = 0;    // this rank's sequences of the step's batch (the most a pass can hold)
  int64_t largest = 0;  // the most that fit (0: not even one); `pass` for a pass that fits,
                        // unless up_to_share found more
  std::string why;      // when it does not fit: the device's one line, with what to run instead
};
bool register_fit_check(
    const std::string& device,
    std::function<PassFit(const EngineRequest& request, bool up_to_share)> check);
std::optional<PassFit> check_fit(const std::string& device, const EngineRequest& request,
                                 bool up_to_share = false);

// The most sequences a pass that fit, between `fits` (known to fit; 0: none) and `fails` (known
// not to), by bisection over fails_at (a model's buffers grow with its pass): the cuda fit check
// builds the model at each try, the cpu one counts it.
int64_t most_that_fit(int64_t fits, int64_t fails, const std::function<bool(int64_t)>& fails_at);

// This machine's physical memory in bytes (0 when unknown).
std::size_t host_memory_bytes();
// Host memory a new allocation may take without swapping: /proc/meminfo's MemAvailable, and no
// more than the cgroup's limit less its use where a cgroup (v2) limits this process; 0: not
// known.
std::size_t host_memory_available();
// The cpu device's fit check (registered; check_points_fit runs it for every point before any
// trains): whether a cpu model of the request fits in `available` bytes of host memory
// (Model::memory_need: its state and one pass's activations), and if not, the most sequences a
// pass that do and the one line to refuse it with. `available` 0: not known, taken to fit.
// up_to_share: where it fits, also the most up to the whole batch (`--estimate`).
PassFit cpu_pass_fit(const EngineRequest& request, std::size_t available, bool up_to_share);
// The processor's model name in the text of /proc/cpuinfo (its first "model name" line), "" when
// the text has none (some ARM kernels do not give one).
std::string cpu_model_name(std::string_view cpuinfo);
using moeplan::bytes_text;  // accounting/units.hpp

}  // namespace moeplan::backend
