#pragma once
// The CUDA model: the same transformer, parameter layout, initial weights and training step as
// the CPU reference (moeplan::backend::Model), with fp32 master weights and AdamW state on the
// GPU and matrix-product inputs in bf16 (or fp32 for the tight tests). No CUDA header needed.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/ledger.hpp"
#include "moeplan/backend/cuda/device.hpp"
#include "moeplan/backend/cuda/gemm.hpp"
#include "moeplan/backend/model.hpp"

namespace moeplan::backend::cuda {

class Communicator;

// Attention: in bf16 with a supported head width, fused kernels (attention.hpp) over 64×64 tiles
// on and below the diagonal; otherwise (fp32, the tight tests) cuBLAS products over the full S×S
// square. Either way the ledger records the causal part under attention-core (as the CPU does),
// the executed masked rest under `padding` and recomputed backward products under `recompute`,
// so every executed product is counted once and nothing is hidden.
// A capacity factor drops what the CPU drops (each expert keeps its first ceil(cf·T·K/E)
// assignments of a pass) on every expert path, with one host wait per MoE layer (the kept rows
// size the products). The ERC loss runs in fp32 whatever the matrix type, its noise drawn from
// the CPU reference's generator, continued (rng_state).
// Which attention kernels a bf16 model runs (fp32 models and unsupported head widths always run
// the cuBLAS path): `fused`, the WMMA kernels forward and backward; `fused_mma`, the same tiles
// with register-resident fragments (attention::forward_mma, and backward_mma for head widths up to
// 64; wider heads take the WMMA backward); `fused_mma_wide`, fused_mma with the forward at 32
// query rows a warp (attention::forward_mma_wide: the same bits; head widths 16, 32 and 64 only,
// else an InputError); `fused_mma_lean`, fused_mma with the backward's dK/dV kernel holding fewer
// registers at once (attention::backward_mma's DkdvKernel::lean: the same bits; head widths 16,
// 32 and 64 only, else an InputError); `fused_wgmma`, fused_mma with the forward and the
// backward's dK/dV on Hopper's warpgroup MMA (attention::forward_wgmma, DkdvKernel::wgmma:
// another summation order, held to the CPU by tolerance; head width 64 on compute capability 9.0
// only, else an InputError); `cublas`.
enum class AttentionPath { fused, cublas, fused_mma, fused_mma_wide, fused_mma_lean, fused_wgmma };
enum class ExpertPath { grouped, loop, tiled, tiled128, batched, wgmma };
// How the project's own kernels are launched: `plain`, or `pdl` (programmatic dependent launch,
// each launch overlapping the end of the kernel before it in its stream; compute capability 9.0;
// backend/cuda/launch.cuh). Process-wide (kernels::set_programmatic_launch).
enum class LaunchMode { plain, programmatic };
// How a MoE layer's router products run (its logits, and in the backward its input and weight
// gradients; 0.55 GFLOP each at 8 × 1024 tokens, E 66, d_model 512): `cublas`, or `tiled`, the
// routed experts' mma.sync kernels (expert_gemm::rows and weight_grads, bf16 only), the pass's
// tokens as one expert and, for the weight gradient, chunks of 256 tokens (more past 64 chunks)
// as experts whose partial products are added in chunk order. Another summation order than
// cuBLAS's: the same products within rounding. No effect on a dense model.
enum class RouterPath { cublas, tiled };

// The LM head and cross-entropy run over chunks of token rows, so that the logits and their
// gradient (V·(2 + 2) bytes a row in bf16: 201 KB at V 50304) are held for one chunk rather than
// the whole pass. Unless the run says otherwise, a chunk is at most this many rows (1.6 GB of
// logits and gradient at V 50304); a pass of 8 sequences of 1024 tokens is one chunk.
inline constexpr int64_t kLogitRowsAuto = 8192;

// The kernel choice of a run, from EngineRequest::kernels: "attention=fused_mma,experts=tiled,
// logits=2048,gemm=table.json"; any key may be left out or given as `auto`. `logits` is the LM
// head's chunk in rows (a positive count, or `auto` for kLogitRowsAuto). `gemm` names a GEMM
// table file (gemm.hpp; `auto`: none): the engine tunes the point's products that the file does
// not list yet, adds them to it, and runs the listed ones through cuBLASLt. Anything else is an
// InputError naming the valid spellings. `launch` is plain or pdl (LaunchMode); `router` cublas
// or tiled (RouterPath). to_string gives the canonical form: attention and experts always
// (`auto` while unresolved), logits and gemm only when asked for, launch only when pdl, router
// only when tiled.
struct KernelChoice {
  std::optional<AttentionPath> attention;  // unset: automatic (resolve_kernels)
  std::optional<ExpertPath> experts;       // unset: automatic
  int64_t logit_rows = 0;                  // 0: kLogitRowsAuto
  // The GEMM table: "" (auto: the built-in one made on this device and cuBLASLt, if any),
  // "none", "builtin" (the same, required), "builtin:NAME" (that built-in one, required), or
  // a file (Blas::set_table; docs/running.md). The engine resolves auto to "builtin:NAME" or "".
  std::string gemm_table;
  std::optional<LaunchMode> launch;  // unset: automatic (plain until pdl is measured faster)
  std::optional<RouterPath> router;  // unset: automatic (cublas until tiled is measured faster)
};
KernelChoice parse_kernel_choice(const std::string& spec);
// The options `auto` may take beyond the kernels below once an H200 run has measured them: each
// is switched on in kAutoMeasured when its tests passed on the GPU and it saved at least 0.5 % of
// the goals' step at batch 8 and at batch 32 (bench/gpu/decisions.py's "yes"), and is then taken
// only where it can run (AutoTarget).
struct AutoOptions {
  bool wgmma_experts = false;    // experts=wgmma: compute capability 9.0, MoE, d_model and
                                 // d_expert multiples of 8
  bool wgmma_attention = false;  // attention=fused_wgmma: compute capability 9.0, head width 64
  bool pdl = false;              // launch=pdl: compute capability 9.0 and later
  bool tiled_router = false;     // router=tiled: bf16, MoE
};
// None measured yet (bench/gpu/NOTES.md, "The next GPU session").
inline constexpr AutoOptions kAutoMeasured{};
// What `auto` chooses for: the point's shapes and the device's compute capability (0.0: not
// known, so nothing that needs a particular device is taken) and shared memory a block may opt in
// to (0: not known, so no attention path is left out for its shared memory).
struct AutoTarget {
  int64_t head_dim = 0;
  int64_t d_model = 0;
  int64_t d_expert = 0;  // 0: a dense model
  int compute_major = 0, compute_minor = 0;
  std::size_t shared_optin = 0;
};
// The most dynamic shared memory a block of an attention path's kernels asks at a head width, in
// bytes (0 for cublas, and for a fused path without kernels at that width). At head width 128
// `fused` and `fused_mma` need about 120 KiB (their backward keeps the 64×64 scores and dP in
// fp32), more than the 99 KiB a block gets on compute capability 8.6, 8.9 and 12.x.
std::size_t attention_shared_bytes(AttentionPath path, int64_t head_dim);
AutoTarget auto_target(const Arch& arch, const DeviceInfo& device);
// The automatic choices made: the kernels measured fastest on an H200 that can run the point
// (bench/gpu/RESULTS.md: fused_mma and tiled on 2026-11-30, dense 31.3 against 35.7 ms a step,
// MoE at r_a 0.2 22.6 against 28.6 ms; the lean dK/dV kernel and 128-row tiles on 2026-12-04,
// run E, dK/dV 2.27 against 2.41 ms a dense step and the MoE step at batch 32 46.2 against
// 47.5 ms): attention in bf16 `fused_mma_lean` at head widths 16, 32 and 64, `fused_mma` at 128,
// else `cublas`; experts `tiled128` in bf16, else `grouped`; launch `plain`; router `cublas`. An
// attention path whose kernels ask more shared memory than the target's device allows is passed
// over for the next (fused_mma_lean, fused_mma, cublas): cublas at head width 128 on 8.6 and 8.9.
// Each option that `options` switches on replaces these where the target can run it. What was
// asked for is kept.
KernelChoice resolve_kernels(const KernelChoice& asked, const AutoTarget& target, DType matmul,
                             const AutoOptions& options = kAutoMeasured);
std::string to_string(const KernelChoice& k);
// An attention path's --kernels name ("fused_mma_lean").
const char* attention_name(AttentionPath path);

class Model {
 public:
  // Initial weights are the CPU reference's for the same (arch, options, seed). `comm`: data
  // parallelism (gradients averaged, ledgers and counters summed over ranks); may be null.
  // shard_optimizer (needs `comm`): ZeRO stage 1, each rank keeps and updates the AdamW moments
  // of 1/W of the parameters (8 bytes a parameter become 8/W); gradients are reduce-scattered and
  // the updated weights all-gathered, so every rank still holds all weights. save_state and
  // load_state then are collectives (every rank calls them) and read or write the full state, so
  // a checkpoint resumes sharded or not, at any world size.
  // logit_rows: the LM head's chunk in rows (0: kLogitRowsAuto); at most the pass's rows.
  // experts: the routed experts' path from the start, as set_expert_path sets it later (which
  // frees what the old path needed); given here, a tiled path's model never allocates the
  // gathered-rows buffers of the cuBLAS paths, so its peak is its steady size.
  // sizing_world > 0: a model built only to see whether its buffers fit the device (the engine's
  // fit check): every buffer allocated, no weights drawn (zeros), and, with shard_optimizer and
  // no `comm`, sharded as rank 0 of sizing_world ranks (no NCCL group before training). It
  // refuses to step or save.
  Model(const Arch& arch, const ModelOptions& options, uint64_t seed, int64_t batch_seqs,
        DType matmul = DType::bf16, Communicator* comm = nullptr,
        AttentionPath attention = AttentionPath::cublas, bool shard_optimizer = false,
        int64_t logit_rows = 0, ExpertPath experts = ExpertPath::grouped, int sizing_world = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  StepResult train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                        const OptimConfig& cfg);
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                      double* per_position_loss = nullptr);
  // Forward + backward; gradients() then holds d(objective)/d(parameters). Returns the objective.
  double compute_gradients(const int32_t* inputs, const int32_t* targets,
                           StepResult* result = nullptr);

  const std::vector<TensorInfo>& tensors() const;
  std::vector<float> parameters() const;  // copied from the device
  void set_parameters(std::span<const float> values);
  std::vector<float> gradients() const;

  void save_state(std::vector<char>& out) const;
  void load_state(const std::vector<char>& in);
  // The generator the ERC noise is drawn from (the CPU reference's, continued; in the state). A
  // pass that must leave the run as it was (the engine's GEMM-shape probe) puts it back after.
  std::array<uint64_t, 4> rng_state() const;
  void set_rng_state(const std::array<uint64_t, 4>& state);

  const FlopLedger& ledger() const;
  const FlopLedger& eval_ledger() const;
  int64_t trainable_params() const;
  int64_t adam_steps() const;
  const Arch& arch() const;
  int64_t batch_seqs() const;  // sequences a train_step reads
  int64_t pass_seqs() const;   // sequences one forward/backward pass holds (micro_batch_seqs)
  int64_t logit_rows() const;  // rows of one LM-head chunk (see kLogitRowsAuto)
  DType matmul_type() const;
  // How the routed-expert products run (the benchmark measures each). On every path the
  // row-varying results are stored in the matrix type, as the SwiGLU inputs are (h13): the routed
  // rows' outputs (ye, read only by the combine kernels) and their input gradients (dxg, read
  // only by the scatter-add into the fp32 dln, as a bf16 autocast framework keeps them). The
  // weight gradients are fp32.
  //  - grouped (a Model's until set; runs take resolve_kernels'): one grouped cuBLAS call per
  //    product; the host waits for the routed counts once per MoE layer to size it. In bf16 its
  //    weight gradients come back in bf16 (the grouped call has no bf16 → fp32 form) and are
  //    added to the fp32 gradients.
  //  - loop: one cublasGemmEx per expert (fp32 weight gradients directly).
  //  - tiled (bf16 only): our own kernels (expert_gemm.hpp) reading the row ranges on the device;
  //    no host wait inside the step, fp32 weight gradients directly; the rows of each expert's
  //    last tile are booked as padding. Tiles of 64 rows.
  //  - tiled128 (bf16 only): tiled with tiles of 128 rows (8 warps a block): half the operand
  //    traffic per product, up to 127 padded rows per expert where tiled pads up to 63 (the
  //    runs' automatic choice in bf16 since the H200 measured it faster, 2026-12-04).
  //  - wgmma (bf16, compute capability 9.0 only; Dm and the expert width multiples of 8): the
  //    tiled products on Hopper's warpgroup MMA (expert_gemm::rows_wgmma), tiles of 128 rows
  //    walking the depth 64 at a time, so depth past a multiple of 64 is booked as padding. Not
  //    the tiled paths' bits (another order of each depth sum): the same products within
  //    rounding.
  //  - batched: the rows in an expert-padded layout (each expert's rows padded with zero rows to
  //    the pass's largest count, rounded up to 64), each product one strided-batched cuBLAS call
  //    over the experts, fp32 weight gradients directly; one host wait per MoE layer, as grouped;
  //    the zero rows' work is booked as padding.
  // set_expert_path(tiled, tiled128 or wgmma) on an fp32 model is an InputError, and so is wgmma
  // on another device than compute capability 9.0 or with shapes not in multiples of 8.
  void set_expert_path(ExpertPath path);
  ExpertPath expert_path() const;
  // How the MoE layers' router products run (RouterPath; cublas until set). tiled on an fp32
  // model is an InputError.
  void set_router_path(RouterPath path);
  RouterPath router_path() const;
  // Whether attention runs as the fused kernels (bf16 with head_dim 16/32/64/128) rather than
  // cuBLAS batched products over the full S×S square with a separate softmax.
  bool fused_attention() const;
  // Per-phase device time of train_step (CUDA events between phases; costs a little itself):
  // mean milliseconds per step since set_profiling(true), phases in first-seen order. With
  // per_kernel, an event after every kernel and cuBLAS call too (one model at a time): the times
  // are then by kernel name, plus what ran between a kernel and a phase's end (memory copies).
  void set_profiling(bool on, bool per_kernel = false);
  // Whether each MoE layer's shared expert runs on a second stream beside the routing and the
  // routed experts (forward) and beside the combine and routed backward (backward): on by
  // default; the same products in the same order on the same data either way, so the same bits.
  // Not while profiling (the times are then one stream's). No effect without shared experts.
  void set_shared_overlap(bool on);
  bool shared_overlap() const;  // whether a step overlaps now
  // Whether the weight gradients of the dense FFN, attention-out and qkv products run on the
  // second stream beside the input gradients that follow them (each layer's before its norm1
  // backward). Off by default until a GPU has measured it; the same bits either way. Costs a
  // second cuBLAS workspace (32 MiB) and a T·Dm residual-gradient buffer, taken when first set.
  void set_weight_grad_overlap(bool on);
  bool weight_grad_overlap() const;  // whether a step overlaps them now
  // Whether a step's AdamW update runs on a stream of its own, in stages (the embedding, each
  // layer, the final norm and LM head), beside the next step's forward: train_step returns once
  // the gradient norm is read, and the next forward waits for each stage before it reads that
  // stage's weights; every other reader of the parameters, gradients or moments (parameters(),
  // gradients(), save_state, the ERC loss, ...) waits for all of it. The embedding's stage waits
  // for the next step's tokens and updates the rows they read first: the lookup waits for those
  // only, the final norm and LM head for all of it. The same arithmetic on the same values, so
  // the same bits. Under data parallelism too (each rank updates every parameter, after the
  // all-reduce), but not with the optimizer sharded (its all-gather follows the update); not while
  // profiling.
  void set_update_overlap(bool on);
  bool update_overlap() const;  // whether a step's update runs beside now
  // Under data parallelism (a communicator, the optimizer not sharded): whether the gradients'
  // mean over ranks runs in buckets on a stream of its own beside the backward, as each bucket's
  // gradients are final in the step's last pass: the final norm and LM head after their backward,
  // each layer after its own, the embedding last; the gradient norm waits for all of them. The
  // same all-reduce per float as one over the whole buffer (bit for bit at two ranks; at more,
  // NCCL may sum a float's ranks in another order in another bucket). Off unless asked; not with
  // the weight gradients beside (set_weight_grad_overlap: a layer's are not final after its
  // backward), nor while profiling.
  void set_reduce_overlap(bool on);
  bool reduce_overlap() const;  // whether a step's all-reduce runs beside its backward now
  // Whether the gradient norm's sums of squares run beside the backward, a bucket at a time
  // (the final norm and LM head, each layer, the embedding) as each is final in the step's last
  // pass: on a stream of their own, or, with the all-reduce beside, on its stream after each
  // bucket's mean. On by default. The sums are made per bucket and added in bucket order either
  // way, so the same bits beside or after. Not with the weight gradients beside, the optimizer
  // sharded, data parallelism without the all-reduce beside (the mean comes after the backward),
  // nor while profiling.
  void set_norm_overlap(bool on);
  bool norm_overlap() const;  // whether a step's norm sums run beside its backward now
  // cuBLASLt algorithms for the products a GemmTable lists (Blas::set_table, strict or lenient;
  // null: none), on both streams. Throws InputError for a table chosen on another device or
  // cuBLASLt version.
  void set_gemm_table(std::shared_ptr<const GemmTable> table, bool lenient = false);
  // Whether the products remember their shapes from now on (for tune_gemm_table), and what they
  // remembered: each (shape, least operand alignment in bytes), both streams' (a shape may come
  // twice). gemm_counts: the products run and how many went through the table.
  void record_gemm_shapes(bool on);
  std::vector<std::pair<GemmShape, int64_t>> gemm_shapes() const;
  Blas::Counts gemm_counts() const;
  std::vector<std::pair<std::string, double>> profile_ms_per_step() const;
  size_t device_bytes() const;
  // MoE layer `layer`'s routed counts in the last pass (the kept assignments of each expert),
  // read from the device as the sort left them (for tests of what the host books from them).
  std::vector<int32_t> routed_counts(int64_t layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::backend::cuda
