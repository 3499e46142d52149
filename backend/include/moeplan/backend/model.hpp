#pragma once
// The decoder-only dense/MoE transformer of BACKEND.md and its training step (CPU reference).
// Eigen stays behind the pimpl: this header is what the run and CUDA helpers code against.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/ledger.hpp"

namespace moeplan::backend {

// Training choices that are not shape (shape is Arch).
struct ModelOptions {
  std::string positions = "alibi";  // "alibi" or "rope"
  bool renormalize_gates = false;   // g_i = p_i / Σ_topK p (off: g_i = p_i, the paper's choice)
  double capacity_factor = 0;       // 0 = dropless; else capacity ceil(cf·T·K/E) per expert
  double load_balance = 0.01;       // λ of λ·E·Σ f_i·P_i, summed over MoE layers
  double z_loss = 0;                // coefficient of mean_t logsumexp(router logits)², per layer
  double erc_loss = 0;              // coefficient of the expert-router coupling loss, per layer
  double erc_alpha = 1.0;           // α of the ERC loss
  // Gradient accumulation: 0 runs a step's batch as one forward/backward pass; n > 0 runs it in
  // passes of at most n sequences (the last one may be shorter), with activations sized for one
  // pass, and updates once. The cross-entropy is the mean over the whole batch's loss-bearing
  // targets either way; the auxiliary losses (load balance, z-loss) are per pass, weighted by the
  // pass's share of the batch's sequences, and a capacity limit applies per pass. ERC is per step.
  int64_t micro_batch_seqs = 0;
};

struct OptimConfig {
  double lr_peak = 0, lr_min = 1e-5;
  int64_t warmup_steps = 0, total_steps = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};

// Learning rate at 0-based `step`: linear warm-up to lr_peak over warmup_steps (step+1)/warmup,
// then cosine decay to lr_min at total_steps (held at lr_min after).
double scheduled_lr(const OptimConfig& cfg, int64_t step);

struct StepResult {
  double loss = 0;              // mean cross-entropy over loss-bearing targets (nats)
  double aux_load_balance = 0;  // λ-weighted, summed over MoE layers
  double aux_z = 0;             // z-loss coefficient-weighted, summed over MoE layers
  double aux_erc = 0;           // ERC coefficient-weighted, summed over MoE layers
  double grad_norm = 0;         // global L2 norm before clipping
  double lr = 0;
  FlopLedger flops;                           // this step's matrix products (delta)
  std::vector<int64_t> routed_per_moe_layer;  // assignments the routed experts computed
  int64_t dropped_assignments = 0;            // over capacity, all MoE layers
  int64_t loss_bearing_targets = 0;           // targets >= 0 in the batch
};

// One trainable tensor inside the flat parameter vector (row-major rows × cols).
struct TensorInfo {
  std::string name;  // e.g. "layer0.qkv", "layer1.expert3.w13", "embedding"
  int64_t offset = 0, rows = 0, cols = 0;
  bool weight_decay = true;  // false for RMSNorm scales
  int64_t size() const { return rows * cols; }
};

template <class Scalar>  // float (training) or double (gradient checks)
class Model {
 public:
  // Allocates every parameter, optimizer and activation buffer once. train_step reads batches of
  // batch_seqs sequences of arch.seq_len; activations hold one pass (options.micro_batch_seqs
  // sequences when set, else the whole batch). Throws InputError on an unusable Arch/options.
  Model(const Arch& arch, const ModelOptions& options, uint64_t seed, int64_t batch_seqs);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // inputs/targets: (batch_seqs, seq_len) row-major; a negative target bears no loss.
  // Forward + backward + global-norm clip + AdamW at the learning rate of `step`.
  StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                        const OptimConfig& cfg);

  // Mean cross-entropy of any number of sequences (processed in chunks of batch_seqs); no
  // gradients, no aux losses. per_position_loss, if given, receives (n_seqs, seq_len) values
  // (0 where the target is negative). FLOPs go to eval_ledger(), not ledger().
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                      double* per_position_loss = nullptr);

  // Forward + backward on one full batch: gradients() holds d(objective)/d(parameters), where
  // objective = loss + aux terms; nothing is updated and ledger() is not touched (the result's
  // flops hold the products). Returns the objective. For gradient checks and for train_step.
  double compute_gradients(const int32_t* inputs, const int32_t* targets,
                           StepResult* result = nullptr);

  // Parameter access by tensor (finite-difference checks, weight copies between models).
  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo& tensor(std::string_view name) const;  // throws InputError if unknown
  std::span<Scalar> parameters();
  std::span<const Scalar> parameters() const;
  std::span<const Scalar> gradients() const;
  // Where train_step's time goes (Engine::set_profiling): on, each phase's host time (the
  // embedding, each layer's norm and qkv, attention, out projection, FFN or router, experts and
  // the rest of the MoE layer, the LM head, the cross-entropy, each backward, the update) is
  // added up by name until it is switched off or on again; profile_ms_per_step is the mean
  // milliseconds a step since, phases in the order first seen. Evaluations are not timed.
  void set_profiling(bool on);
  std::vector<std::pair<std::string, double>> profile_ms_per_step() const;
  // Test hook: when frozen, the ERC noise δ drawn last is reused instead of drawing a new one.
  void freeze_erc_noise(bool frozen);
  // The state of the generator the ERC noise is drawn from (xoshiro256**, four words), which
  // after construction has drawn the initial weights: the CUDA model continues from it, so that
  // both draw the same noise.
  std::array<uint64_t, 4> rng_state() const;

  // What a model of these arguments starts from, and no more: the parameter layout, the initial
  // weights and the generator's state after drawing them, validated as the constructor does.
  // A Model holds 16 bytes a parameter (weights, gradients, AdamW moments) and one pass's
  // activations; this holds the weights alone. The CUDA model starts from it. layout_only: the
  // layout alone (params empty, the generator's state the seed's): no weights drawn, for a model
  // built only to see what it holds (2e9 weights take about a minute to draw on one core).
  struct InitialWeights {
    std::vector<TensorInfo> tensors;
    std::span<const Scalar> params;  // valid while `owner` lives
    std::array<uint64_t, 4> rng_state{};
    std::shared_ptr<const void> owner;
  };
  static InitialWeights initial_weights(const Arch& arch, const ModelOptions& options,
                                        uint64_t seed, bool layout_only = false);

  // The host memory a model of these arguments holds once built, found without building it:
  // `state`, 4 scalars a parameter (weights, gradients, both AdamW moments), and `activations`,
  // every activation and scratch buffer of one pass (options.micro_batch_seqs sequences, else the
  // whole batch), counted from the list the constructor sizes them by. A step's temporaries
  // (Eigen's product blocks) and the position tables are not in it.
  struct MemoryNeed {
    std::size_t state = 0, activations = 0;
  };
  static MemoryNeed memory_need(const Arch& arch, const ModelOptions& options, int64_t batch_seqs);

  // Weights, Adam m/v, Adam step count, RNG state and both ledgers: a bit-exact resume.
  void save_state(std::vector<char>& out) const;
  void load_state(const std::vector<char>& in);  // throws InputError on a mismatched state

  const FlopLedger& ledger() const;       // cumulative over train_step calls
  const FlopLedger& eval_ledger() const;  // cumulative over forward_loss calls
  int64_t trainable_params() const;       // every allocated scalar (= count_params().trainable())
  int64_t adam_steps() const;
  const Arch& arch() const;
  const ModelOptions& options() const;
  int64_t batch_seqs() const;        // sequences a train_step reads
  int64_t pass_seqs() const;         // sequences one forward/backward pass holds
  // Threads its products run with: 1 for a model small enough to run serially, else Eigen's
  // count (--threads, or the OpenMP default). Eigen sizes its product blocks by it, so another
  // count may sum in another order: a resume keeps it.
  int threads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The threads a cpu model of `arch` with passes of `pass_seqs` sequences runs its products with:
// 1 when its residual stream is small enough to run serially, else `requested` (--threads) or,
// when 0, Eigen's count now (the OpenMP default). Model::threads() is this rule; `run` applies it
// before any point trains, to refuse a checkpoint made with another count.
int cpu_threads_for(const Arch& arch, int64_t pass_seqs, int requested);

extern template class Model<float>;
extern template class Model<double>;

}  // namespace moeplan::backend
