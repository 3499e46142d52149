// The CUDA model: parameter layout and initial weights taken from the CPU reference, buffers
// allocated once, forward and backward as the CPU's sequence of layer calls with cuBLAS products
// and our kernels, AdamW on the device. The host waits for the device once per step, and on the
// cuBLAS expert paths once per MoE layer too (the routed token counts size the grouped expert
// products and the ledger); the tiled expert path reads them on the device.
#include "moeplan/backend/cuda/model.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "../cpu/layers.hpp"
#include "../cpu/moe.hpp"
#include "../cpu/rng.hpp"
#include "check.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/cuda/attention.hpp"
#include "moeplan/backend/cuda/comm.hpp"
#include "moeplan/backend/cuda/expert_gemm.hpp"
#include "moeplan/backend/cuda/gemm.hpp"
#include "moeplan/backend/cuda/kernels.hpp"
#include "moeplan/backend/phase_times.hpp"

namespace moeplan::backend::cuda {

namespace k = kernels;

namespace {

// The device this thread's CUDA calls go to (the wgmma paths ask its compute capability).
DeviceInfo current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device_info(device);
}

// A fused attention path whose kernels ask more shared memory a block than the device allows:
// refused in one line before anything is allocated (its opt-in would fail at the first step).
void check_attention_fits(AttentionPath path, int64_t Dh) {
  const std::size_t need = attention_shared_bytes(path, Dh);
  const DeviceInfo d = current_device();
  if (need == 0 || d.shared_optin == 0 || need <= d.shared_optin) return;
  std::string valid;
  for (const AttentionPath p : {AttentionPath::fused_mma_lean, AttentionPath::fused_mma,
                                AttentionPath::fused, AttentionPath::cublas})
    if ((p != AttentionPath::fused_mma_lean || attention::backward_mma_supported(Dh)) &&
        attention_shared_bytes(p, Dh) <= d.shared_optin)
      valid += (valid.empty() ? "" : ", ") + std::string(attention_name(p));
  throw InputError(fmt::format(
      "--kernels attention={}: its kernels ask {:.1f} KiB of shared memory a block at head width "
      "{}; this device ({}, compute capability {}.{}) allows {:.1f} KiB (valid here: {})",
      attention_name(path), double(need) / 1024, Dh, d.name, d.compute_major, d.compute_minor,
      double(d.shared_optin) / 1024, valid));
}

struct LayerParams {
  int64_t norm1 = -1, qkv = -1, attn_out = -1, norm2 = -1, w13 = -1, w2 = -1;
  int64_t router = -1, shared_w13 = -1, shared_w2 = -1;
  std::vector<int64_t> expert_w13, expert_w2;
};

// Pinned host memory for pointer tables that travel to the device with the stream.
struct PinnedBuffer {
  void* ptr = nullptr;
  explicit PinnedBuffer(size_t bytes) {
    if (bytes) check_cuda(cudaMallocHost(&ptr, bytes), "cudaMallocHost");
  }
  ~PinnedBuffer() {
    if (ptr) cudaFreeHost(ptr);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

// Attention pointer tables of one layer: forward in (b, h) order, backward in (g, b, kvh) order
// (h = kvh·group + g) so that the query heads of a group add into dK/dV one batched call at a time.
enum AttnTable {
  fQ,
  fK,
  fV,
  fScore,
  fP,
  fO,
  bP,
  bdO,
  bV,
  bdP,
  bdV,
  bdS,
  bK,
  bdQ,
  bQ,
  bdK,
  kTables
};

// Optional per-phase timing (Model::set_profiling): CUDA events recorded between phases; the
// time between two marks goes to the later mark's name, host waits inside a phase included.
struct Profiler {
  bool on = false;
  std::vector<cudaEvent_t> pool;
  std::vector<const char*> names;
  size_t used = 0;
  PhaseTimes times;
  void mark(const char* name) {
    if (!on) return;
    if (used == pool.size()) {
      cudaEvent_t e;
      check_cuda(cudaEventCreate(&e), "cudaEventCreate");
      pool.push_back(e);
      names.push_back(name);
    }
    names[used] = name;
    check_cuda(cudaEventRecord(pool[used]), "cudaEventRecord");
    ++used;
  }
  void collect() {  // after a synchronising call
    if (!on) return;
    for (size_t i = 1; i < used; ++i) {
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, pool[i - 1], pool[i]), "cudaEventElapsedTime");
      times.add(names[i], double(t));
    }
    used = 0;
    ++times.steps;
  }
  ~Profiler();
};

// The profiler that check_launch's hook marks after every launch (per-kernel profiling).
Profiler* per_kernel_profiler = nullptr;
void mark_launch(const char* name) {
  if (per_kernel_profiler) per_kernel_profiler->mark(name);
}
Profiler::~Profiler() {
  if (per_kernel_profiler == this) {
    per_kernel_profiler = nullptr;
    launch_hook() = nullptr;
  }
  for (cudaEvent_t e : pool) cudaEventDestroy(e);
}

// Where a part of the step runs: a cuBLAS handle and a stream (nullptrs: the default stream's).
struct Lane {
  Blas* blas = nullptr;
  void* stream = nullptr;
};

constexpr int kExpertProducts = 6;  // W13 fwd, W2 fwd, W2 dX, W2 dW, W13 dX, W13 dW
// Pointer operands per expert product: A, B, the fp32 result C, and the bf16 scratch result the
// grouped call writes in bf16 mode (cublasGemmGroupedBatchedEx has no bf16 → fp32 form).
constexpr int kOperands = 4;

}  // namespace

struct Model::Impl {
  Arch a;
  ModelOptions opt;
  DType mm;
  Communicator* comm = nullptr;
  // Optimizer sharding (ZeRO stage 1): over W ranks each holds the AdamW moments of one chunk of
  // the parameters (chunk = ceil(n/W), in multiples of 64) and updates only that chunk; the
  // gradients are reduce-scattered and the updated weights all-gathered. `params` and `grads`
  // hold W·chunk floats (the tail past n_params is zero).
  bool sharded = false;
  bool sizing_only = false;  // built only to see what it holds: no weights, never stepped
  int64_t chunk = 0, shard_begin = 0, shard_len = 0;
  double last_ce_sum = 0;  // this rank's summed cross-entropy of the last training step
  int64_t B = 0, S = 0, Dm = 0, H = 0, Hkv = 0, Dh = 0, W = 0, V = 0, E = 0, K = 0, De = 0, Dse = 0,
          Dffn = 0, L = 0, T = 0, n_params = 0;
  // B and T size the activations (one pass); a train_step reads step_B sequences in passes of at
  // most B (ModelOptions::micro_batch_seqs). Bp and Tp are the pass in flight: set by forward(),
  // read by the backward of the same pass.
  int64_t step_B = 0, Bp = 0, Tp = 0;
  // The LM head and cross-entropy run over chunks of at most logit_rows token rows, so the logits
  // and their gradient are held for one chunk, not the whole pass (KernelChoice).
  int64_t logit_rows = 0;
  double aux_grad_w = 1;  // the weight of the pass's auxiliary-loss gradients (see compute_gradients)
  bool rope = false;
  bool flash = false;             // bf16 with a compiled head width: the fused attention kernels
  bool forward_mma = false;       // ... with the register-resident forward
  bool forward_mma_wide = false;  // ... at 32 query rows a warp
  bool backward_mma = false;      // ... and backward (head widths up to 64)
  // ... whose dK/dV kernel: mma.sync (held or lean, the same bits) or wgmma
  attention::DkdvKernel dkdv_kernel = attention::DkdvKernel::held;
  size_t mm_size = 4;

  std::vector<TensorInfo> tensors;
  std::vector<LayerParams> lp;
  int64_t embedding = 0, final_norm = 0, lm_head = -1;
  int64_t adam_steps = 0;
  FlopLedger ledger, eval_ledger;
  Blas blas;
  size_t bytes = 0;
  // A second stream with a cuBLAS handle of its own, for work beside the default stream's:
  // - the MoE layers' shared expert beside the routing and routed experts (overlap_shared, with
  //   backward scratch of its own; set up when the model has shared experts);
  // - the weight gradients of the dense FFN, attention-out and qkv products beside the input
  //   gradients that follow them (overlap_wgrad, off unless asked; set up then, with a second
  //   residual-gradient buffer for the attention block, dresid_mm_attn).
  // Neither while profiling, so that the phase and kernel times stay one stream's.
  bool overlap_shared = true, overlap_wgrad = false;
  std::unique_ptr<SideStream> side;
  std::unique_ptr<Blas> side_blas;
  DeviceBuffer side_dact, side_dh13, dresid_mm_attn;
  bool wgrad_side = false;  // this backward's weight gradients go to the side stream
  // The side stream's fence slots (SideStream::mark/wait) while they do: the buffer each slot's
  // weight-gradient product reads.
  enum : int { kReadsDresid, kReadsDh13, kReadsDresidAttn, kReadsDqkv };
  static_assert(SideStream::kSlots >= 4);
  bool overlapping() const { return overlap_shared && side_dact.data() && !prof.on; }
  bool overlapping_wgrad() const { return overlap_wgrad && dresid_mm_attn.data() && !prof.on; }
  // What Model::set_gemm_table and record_gemm_shapes asked, for both handles.
  std::shared_ptr<const GemmTable> gemm_table;
  bool gemm_lenient = false;
  bool record_shapes = false;
  void ensure_side() {
    if (side) return;
    side = std::make_unique<SideStream>();
    side_blas = std::make_unique<Blas>();
    side_blas->set_stream(side->handle());
    side_blas->set_table(gemm_table, gemm_lenient);
    side_blas->record_shapes(record_shapes);
  }

  DeviceBuffer params, params_mm, grads, adam_m, adam_v, decay;
  DeviceBuffer rope_table, slopes;

  // ---- the AdamW update beside the next step's forward (set_update_overlap) -------------------
  // Unless the optimizer is sharded (its all-gather follows the update) and while not profiling,
  // the update runs on a stream of its own in stages over the parameter buffer in layout order:
  // the embedding, each layer, the final norm and LM head (each stage's end rounded down to a
  // multiple of 4, so that all but the last take the 16-byte kernel). The step returns once its
  // gradient norm is read; the next step's forward waits for a stage before the first kernel that
  // reads its weights, the zeroing of the next step's gradients for the stages that read them, and
  // everything else that touches the parameters, gradients or moments (the host's copies, a
  // checkpoint, the ERC loss) for all of it (settle). The same kernel on the same values, so the
  // same bits; the next forward's first layers run while the last layers are still updated.
  //
  // The embedding's stage (stage 0: the floats before layer 0) is not issued with the others. The
  // next compute_gradients issues it on a stream of its own (emb_upd) once its tokens say which
  // rows the forward reads: those rows first (hot), then the rest (cold). The lookup waits for the
  // hot rows only, so the forward no longer starts after the whole embedding's update (a quarter
  // of the dense 124M's parameters); the cold rows have the layers' forward to finish, and are
  // waited for before the final norm and LM head (a tied head reads every row) and before
  // anything else that reads or writes floats of stage 0: the zeroing of the embedding's gradient
  // moves there from the step's start. Issued without tokens (an evaluation, a host copy, a
  // checkpoint), the stage runs whole. Each float takes AdamW's step once, in the same
  // arithmetic: the same bits.
  bool overlap_update = false;
  std::unique_ptr<StagedStream> upd;
  std::vector<int64_t> stage_end;  // floats; the last is n_params
  std::vector<int64_t> use_end;    // where the embedding's, each layer's and the rest's weights end
  int update_waited = 0;           // the highest stage the default stream waits for already
  bool update_pending = false;     // stages issued that the default stream does not wait for yet
  struct UpdateArgs {              // what run_update's kernels take besides the buffers
    const float* norm;
    float lr, b1, b2, eps, wd, ibc1, ibc2;
  };
  std::optional<UpdateArgs> emb_deferred;  // the last update's stage 0, not issued yet
  std::unique_ptr<StagedStream> emb_upd;   // events: 0 the hot rows updated, 1 all of stage 0
  bool emb_pending = false;                // issued; the default stream has not waited for all
  bool emb_hot_waited = false;
  std::vector<uint8_t> emb_hot_host;  // V flags: the batch reads the row
  DeviceBuffer emb_hot;
  std::vector<std::pair<int64_t, int64_t>> emb_zero_later;  // stage-0 gradient runs to zero
  bool updating_beside() const { return overlap_update && !(comm && sharded) && !prof.on; }
  int64_t emb_stage_end() const { return stage_end.empty() ? 0 : stage_end[0]; }
  void plan_update_stages() {
    std::vector<int64_t> starts = {0};  // each use's first float: embedding, layers, final norm
    for (int64_t l = 0; l < L; ++l) {
      int64_t first = n_params;
      const std::string p = fmt::format("layer{}.", l);
      for (const TensorInfo& t : tensors)
        if (t.name.rfind(p, 0) == 0) first = std::min(first, t.offset);
      starts.push_back(first);
    }
    starts.push_back(final_norm);
    use_end.assign(starts.begin() + 1, starts.end());
    use_end.push_back(n_params);
    stage_end.clear();
    for (size_t i = 1; i < starts.size(); ++i) {
      const int64_t e = starts[i] / 4 * 4;
      if (starts[i] < starts[i - 1] || e <= (stage_end.empty() ? 0 : stage_end.back()))
        throw std::logic_error(
            "parameter layout: the embedding, layers and final norm are not "
            "in order");
      stage_end.push_back(e);
    }
    stage_end.push_back(n_params);
    check_buckets();  // use_end also bounds the all-reduce's buckets (set_reduce_overlap)
  }
  void adamw_range(int64_t b, int64_t e, const UpdateArgs& u, void* stream) {
    k::adamw(P(b), mm == DType::bf16 ? params_mm.as<uint16_t>() + b : nullptr,
             adam_m.as<float>() + b, adam_v.as<float>() + b, grads.as<float>() + b,
             decay.as<uint8_t>() + b, u.norm, e - b, u.lr, u.b1, u.b2, u.eps, u.wd, u.ibc1, u.ibc2,
             stream);
  }
  // The deferred stage 0 on emb_upd, after the default stream's work so far: split by the rows
  // of `tokens` (n of them) when given, else whole.
  void issue_embedding_update(const int32_t* tokens, int64_t n) {
    if (!emb_deferred) return;
    const UpdateArgs u = *emb_deferred;
    emb_deferred.reset();
    const int64_t end = emb_stage_end();
    if (prof.on) {  // profiling times one stream
      adamw_range(0, end, u, nullptr);
      return;
    }
    if (!emb_upd) emb_upd = std::make_unique<StagedStream>(2);
    // Split only where stage 0 is the token embedding's rows (it comes first in the layout).
    const bool split = tokens && embedding == 0 && end <= V * Dm;
    if (split) {
      emb_hot_host.assign(size_t(V), 0);
      for (int64_t t = 0; t < n; ++t) emb_hot_host[size_t(tokens[t])] = 1;
      if (!emb_hot.data()) emb_hot = alloc(size_t(V));
      // A synchronous copy: the default stream has waited for the last split's cold rows (the
      // flags' last reader) before its final norm.
      emb_hot.upload(emb_hot_host.data(), size_t(V));
    }
    emb_upd->begin();
    if (split) {
      for (const uint8_t want : {uint8_t(1), uint8_t(0)}) {
        k::adamw_rows(P(0), mm == DType::bf16 ? params_mm.as<uint16_t>() : nullptr,
                      adam_m.as<float>(), adam_v.as<float>(), grads.as<float>(),
                      decay.as<uint8_t>(), u.norm, end, Dm, emb_hot.as<uint8_t>(), want, u.lr, u.b1,
                      u.b2, u.eps, u.wd, u.ibc1, u.ibc2, emb_upd->handle());
        emb_upd->mark(want ? 0 : 1);
      }
    } else {
      adamw_range(0, end, u, emb_upd->handle());
      emb_upd->mark(0);
      emb_upd->mark(1);
    }
    emb_pending = true;
    emb_hot_waited = false;
  }
  // The default stream waits for stage 0's hot rows (hot_only) or all of it, issuing it whole
  // first if it is still deferred; after all of it, the stage-0 gradient runs held back are
  // zeroed (start_gradients).
  void await_embedding(bool hot_only) {
    issue_embedding_update(nullptr, 0);
    if (emb_pending && hot_only && !emb_hot_waited) {
      emb_upd->wait(0);
      emb_hot_waited = true;
    }
    if (hot_only) return;
    if (emb_pending) {
      emb_upd->wait(1);
      emb_pending = false;
    }
    for (const auto& [b, n] : emb_zero_later)
      check_cuda(cudaMemsetAsync(G(b), 0, size_t(n) * 4, nullptr), "memset gradients");
    emb_zero_later.clear();
  }
  // The default stream waits for the staged update of floats [stage_end[0], end) (the stages
  // are in order on one stream).
  void await_stages(int64_t end) {
    if (!update_pending || end <= emb_stage_end()) return;
    const auto it = std::lower_bound(stage_end.begin(), stage_end.end(), std::min(end, n_params));
    const int stage = int(it - stage_end.begin());
    if (stage <= update_waited) return;
    upd->wait(stage);
    update_waited = stage;
    if (stage + 1 == int(stage_end.size())) update_pending = false;
  }
  // The default stream waits for the update of floats [begin, end).
  void await_params(int64_t begin, int64_t end) {
    if (end <= begin) return;
    if (begin < emb_stage_end()) await_embedding(false);
    await_stages(end);
  }
  void settle() { await_params(0, n_params); }
  // An update still running reads the gradient norm and writes the weights and moments: it ends
  // before any of those buffers is freed (members go in reverse order, the norm before upd).
  ~Impl() {
    if (emb_upd) emb_upd->finish();
    if (upd) upd->finish();
    if (red) red->finish();
    if (nrm) nrm->finish();
  }
  // Before the forward's first read of use u's weights: 0 the embedding (the rows the step's
  // tokens read), 1 + l layer l, L + 1 the final norm and LM head (and, tied, every embedding
  // row).
  void await_use(int64_t u) {
    if (u == 0 || u == L + 1) await_embedding(u == 0);
    if (update_pending) await_stages(use_end[size_t(u)]);
  }
  void run_update(const float* norm_dev, float lr, const OptimConfig& cfg, double bc1, double bc2) {
    const UpdateArgs u{norm_dev,         lr,
                       float(cfg.beta1), float(cfg.beta2),
                       float(cfg.eps),   float(cfg.weight_decay),
                       float(1.0 / bc1), float(1.0 / bc2)};
    if (!updating_beside()) {
      settle();
      adamw_range(0, n_params, u, nullptr);
      return;
    }
    if (stage_end.empty()) plan_update_stages();
    if (!upd) upd = std::make_unique<StagedStream>(int(stage_end.size()));
    settle();  // the last step's update is in every stage's way (it is long done by now)
    upd->begin();
    for (size_t i = 1; i < stage_end.size(); ++i) {
      adamw_range(stage_end[i - 1], stage_end[i], u, upd->handle());
      upd->mark(int(i));
    }
    emb_deferred = u;  // stage 0: issued by the next compute_gradients, or whole when needed
    update_pending = true;
    update_waited = 0;
  }

  // ---- the gradients' all-reduce beside the backward (set_reduce_overlap) -------------------
  // Data parallel, the optimizer not sharded: in the step's last pass each bucket of the gradient
  // buffer is averaged over the ranks on a stream of its own (red) as soon as the backward has
  // written it for the last time: the final norm and LM head (use_end[L] to the end) after the
  // final norm's backward, layer l (use_end[l] to use_end[l + 1]) after its norm1 backward, the
  // embedding (to use_end[0]) after its own. red->begin() orders each after the default stream's
  // work so far (the shared expert's side stream is joined inside its layer); the default stream
  // waits for the last before anything reads the mean (the gradient norm, the update). Every
  // rank issues the same buckets in the same order, as NCCL requires.
  bool overlap_reduce = false;
  std::unique_ptr<StagedStream> red;
  bool reduce_in_backward = false;  // this pass reduces its buckets (the step's last pass)
  bool reduce_pending = false;      // buckets issued that the default stream has not waited for
  bool reduced_beside = false;      // this step's gradients were reduced in its backward
  bool reducing_beside() const {
    return overlap_reduce && comm && !sharded && !prof.on && !overlapping_wgrad();
  }
  // Use u's bucket, numbered as await_use numbers them: 0 the embedding, 1 + l layer l, L + 1
  // the final norm and LM head; the backward has just written it for the last time. In the
  // step's last pass it is averaged over the ranks here (reduce beside), and its part of the
  // gradient norm summed (set_norm_overlap, below), each when the step does so.
  // Bucket u's floats [first, second).
  std::pair<int64_t, int64_t> bucket_range(int64_t u) const {
    return {u == 0 ? 0 : use_end[size_t(u - 1)], use_end[size_t(u)]};
  }
  void bucket_written(int64_t u) {
    if (reduce_in_backward) {
      const auto [b, e] = bucket_range(u);
      red->begin();
      if (e > b) comm->all_reduce_mean(grads.as<float>() + b, e - b, red->handle());
      if (sum_in_backward) sum_bucket(u, red->handle());  // the mean's sums
      red->mark(0);
      reduce_pending = true;
    } else if (sum_in_backward) {
      nrm->begin();
      sum_bucket(u, nrm->handle());
      nrm->mark(0);
      norm_pending = true;
    }
  }
  void await_reduce() {
    if (reduce_pending) {
      red->wait(0);  // marks on one stream: its last covers every bucket before it
      reduce_pending = false;
    }
    if (norm_pending) {
      nrm->wait(0);
      norm_pending = false;
    }
  }
  // The buckets are where each tensor's last gradient write falls: a layer's tensors all inside
  // its bucket, every other tensor in the embedding's (before layer 0) or the tail's.
  void check_buckets() const {
    for (const TensorInfo& t : tensors) {
      int64_t b = use_end[size_t(L)], e = n_params;  // the tail
      for (int64_t l = 0; l < L; ++l)
        if (t.name.rfind(fmt::format("layer{}.", l), 0) == 0) {
          b = use_end[size_t(l)];
          e = use_end[size_t(l + 1)];
        }
      if (t.offset < use_end[0] && t.name.rfind("layer", 0) != 0) b = 0, e = use_end[0];
      if (t.offset < b || t.offset + t.size() > e)
        throw std::logic_error("parameter layout: " + t.name + " outside its reduce bucket");
    }
  }

  // ---- the gradient norm, a bucket at a time (set_norm_overlap) -----------------------------
  // The norm's sums of squares are made per bucket (bucket_written's) into a part of
  // norm_scratch each, which grad_norm_finish adds in bucket order: the same bits whether a
  // bucket was summed beside the backward or after it, and with the optimizer sharded over one
  // rank (its chunk is every bucket whole). Beside: in the step's last pass, as each bucket is
  // written for the last time, on nrm (no communicator) or on red right after the bucket's
  // all-reduce (the reduce beside); the default stream waits before the step's gradients are
  // done (await_reduce), since the next step zeroes what the sums read. Then only the
  // embedding's bucket and the finish are left at the step's end: run F's whole-buffer sums
  // took 0.24 (dense) and 0.38 ms (MoE, with a gap) of the batch-8 step there. Not with the
  // weight gradients beside (a layer's are not final at its bucket's site), nor sharded (each
  // rank's chunk, after the reduce-scatter), nor profiling (one stream).
  bool overlap_norm = true;
  std::unique_ptr<StagedStream> nrm;
  bool sum_in_backward = false;  // this pass sums its buckets (the step's last pass)
  bool norm_pending = false;     // sums issued on nrm that the default stream has not waited for
  bool summed_beside = false;    // this step's sums were made in its backward
  bool summing_beside() const {
    if (!overlap_norm || sharded || prof.on || overlapping_wgrad()) return false;
    return comm ? reducing_beside() : true;
  }
  int64_t norm_parts() const { return L + 2; }
  // Bucket u's part of the sums; sharded, of the bucket's floats in this rank's chunk (none:
  // zeros).
  void sum_bucket(int64_t u, void* stream) {
    auto [b, e] = bucket_range(u);
    if (sharded) {
      b = std::max(b, shard_begin);
      e = std::min(e, shard_begin + shard_len);
    }
    k::grad_norm_partial(norm_scratch.as<double>() + u * k::grad_norm_scratch_doubles(),
                         grads.as<float>() + (e > b ? b : 0), std::max<int64_t>(e - b, 0), stream);
  }
  // The norm and clip factor into `norm` from this step's gradients (the mean over the ranks
  // by now), summing the buckets not summed in the backward.
  void finish_norm(float max_norm) {
    if (!summed_beside)
      for (int64_t u = 0; u < norm_parts(); ++u) sum_bucket(u, nullptr);
    summed_beside = false;
    if (sharded)  // every rank's chunks: the parts added over the ranks
      comm->all_reduce_sum(norm_scratch.as<double>(),
                           norm_parts() * k::grad_norm_scratch_doubles());
    k::grad_norm_finish(norm.as<float>(), norm_scratch.as<double>(), norm_parts(), max_norm);
  }

  // Activations saved for backward, per layer.
  struct Acts {
    DeviceBuffer resid_in;  // (T,Dm) f32, the layer's input
    DeviceBuffer ln1, rstd1, qkv, P, attn_lse, atty, mid, ln2, rstd2;
    DeviceBuffer h13, act;  // dense (T,2Dffn), (T,Dffn) in mm; routed (TK,2De), (TK,De)
    DeviceBuffer probs, lse, idx, gate, counts, offsets, sorted, slot_of, xg, ye, sh13, sact;
    DeviceBuffer aux, p_mean;        // (2) (E)
    DeviceBuffer tile_map, n_tiles;  // tiled expert path: the row tiles of this step's routing
    std::vector<int32_t> counts_host;
    // With a capacity factor: every expert's assignments before the drop (the load balance's
    // f_i; `counts` holds the kept ones), and the pass's kept rows (rows, set by the forward).
    DeviceBuffer assigned;
    int64_t rows = 0;
    int64_t cap = 0;  // batched expert path: rows per expert in the padded layout, this pass
    DeviceBuffer attn_ptrs;  // kTables × B·H device pointers
  };
  std::vector<Acts> acts;
  DeviceBuffer resid_out, lnf, rstdf, logits, losses, dlogits, loss_sum;
  DeviceBuffer tokens, targets, emb_ids, emb_seg, emb_pos;
  // Scratch shared by all layers.
  DeviceBuffer qkv_f32, scores, dP, dS, dresid, dresid_mm, dln, dact, dh13, dqkv, dqkv_mm, datty_mm,
      dye, dgate, dxg, dlog, router_logits, col_scratch, norm_scratch, norm, delta, ds_tiles,
      sort_scratch;
  // Grouped expert products: pointer tables per (MoE layer, product), host (pinned) and device.
  std::unique_ptr<PinnedBuffer> expert_ptrs_host;
  DeviceBuffer expert_ptrs_dev;
  DeviceBuffer expert_scratch;  // the grouped weight gradients in bf16, before the fp32 add
  // Batched expert path: the routed rows in the expert-padded layout (E·cap rows), shared by the
  // layers, grown when a pass's routing needs more; the maps between the two layouts.
  DeviceBuffer pad_map, unpad_map, pad_x, pad_h13, pad_act, pad_dact, pad_y;
  int64_t pad_rows = 0;
  int64_t expert_stride = 0;  // elements from expert e's weights to e+1's (w13 and w2 alike)
  ExpertPath expert_path = ExpertPath::grouped;
  RouterPath router_path = RouterPath::cublas;
  // Tiled path: per MoE layer, E pointers each to W13_e, W2_e (bf16 copies) and their fp32
  // gradients, fixed for the model's life; and the products launched since the last wait, whose
  // padding is booked once the counts can be read.
  DeviceBuffer expert_wtab;
  struct TiledProduct {
    int64_t layer;
    bool weight_grad;
    int64_t d1, d2;  // row product: N, K; weight gradient: M, N
    Phase phase;
  };
  std::vector<TiledProduct> tiled_pending;

  // ---- where each step's gradients start from: no zeroing of the whole buffer -----------------
  // A tensor whose first writer in a step can overwrite is "first-written": that writer runs with
  // beta 0 (or without accumulating), later writers of the step add. These are the projections,
  // the dense and shared FFNs, the LM head (the embedding, when tied: its LM-head product comes
  // before the embedding's scatter), the norms, the router unless the ERC loss adds to it first,
  // and on the tiled expert paths the expert weights (W13 only without ERC). Every other tensor
  // (the untied embedding, the experts on the cuBLAS paths) and the buffer's tail past n_params
  // are zeroed when the step starts, in merged runs. The host keeps which tensors a step has
  // written: a writer that only adds to a first-written tensor nothing has written yet, or a
  // first-written tensor nothing wrote by the step's end, is a logic_error (so a writer added
  // later without its part here fails the tests, it does not leave a step's gradient behind).
  std::vector<char> grad_first, grad_written;          // per tensor (index in `tensors`)
  std::unordered_map<int64_t, size_t> tensor_at;       // a tensor's offset -> its index
  std::vector<std::pair<int64_t, int64_t>> zero_runs;  // (first float, count), zeroed a step
  std::optional<ExpertPath> planned_for;  // the expert path grad_first and zero_runs were made for

  size_t tensor_index(int64_t off) const {
    const auto it = tensor_at.find(off);
    if (it == tensor_at.end())
      throw std::logic_error(fmt::format("no tensor starts at parameter offset {}", off));
    return it->second;
  }
  void plan_gradient_start() {
    grad_first.assign(tensors.size(), 0);
    const auto first = [&](int64_t off) {
      if (off >= 0) grad_first[tensor_index(off)] = 1;
    };
    for (int64_t l = 0; l < L; ++l) {
      const LayerParams& q = lp[size_t(l)];
      for (const int64_t off :
           {q.norm1, q.qkv, q.attn_out, q.norm2, q.w13, q.w2, q.shared_w13, q.shared_w2})
        first(off);
      if (l < a.dense_layers) continue;
      if (!erc_on()) first(q.router);
      if (tiled_path()) {
        for (const int64_t off : q.expert_w2) first(off);
        if (!erc_on())
          for (const int64_t off : q.expert_w13) first(off);
      }
    }
    first(final_norm);
    first(lm_head >= 0 ? lm_head : embedding);
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!grad_first[i]) runs.push_back({tensors[i].offset, tensors[i].size()});
    runs.push_back({n_params, int64_t(grads.bytes() / 4) - n_params});  // the tail (sharding)
    std::sort(runs.begin(), runs.end());
    zero_runs.clear();
    for (const auto& [b, n] : runs) {
      if (n <= 0) continue;
      if (!zero_runs.empty() && zero_runs.back().first + zero_runs.back().second == b)
        zero_runs.back().second += n;
      else
        zero_runs.push_back({b, n});
    }
  }
  void start_gradients() {
    if (planned_for != expert_path) {  // the plan depends on nothing else that can change
      plan_gradient_start();
      planned_for = expert_path;
    }
    grad_written.assign(tensors.size(), 0);
    for (auto [b, n] : zero_runs) {
      // Stage 0's part while the embedding's update may still read it: zeroed once that ends
      // (await_embedding), before the final norm and LM head.
      if (const int64_t e0 = emb_stage_end(); b < e0 && emb_pending) {
        const int64_t cut = std::min(b + n, e0);
        emb_zero_later.push_back({b, cut - b});
        n -= cut - b;
        b = cut;
        if (n <= 0) continue;
      }
      await_params(b, std::min(b + n, n_params));  // the last update reads them
      check_cuda(cudaMemsetAsync(G(b), 0, size_t(n) * 4, nullptr), "memset gradients");
    }
  }
  // A writer of the tensor at `off` that can overwrite: whether it is the step's first writer
  // of a first-written tensor (then it overwrites).
  bool overwrites(int64_t off) {
    const size_t i = tensor_index(off);
    const bool first = grad_first[i] && !grad_written[i];
    grad_written[i] = 1;
    return first;
  }
  float grad_beta(int64_t off) { return overwrites(off) ? 0.f : 1.f; }
  // The same for the E experts of a layer, written by one launch: all first, or none.
  bool overwrites_all(const std::vector<int64_t>& offs) {
    const bool first = !offs.empty() && overwrites(offs[0]);
    for (size_t e = 1; e < offs.size(); ++e)
      if (overwrites(offs[e]) != first)
        throw std::logic_error("the experts of a layer are planned apart (gradient start)");
    return first;
  }
  // A writer that only adds into the tensor at `off`.
  void adds_to(int64_t off) {
    const size_t i = tensor_index(off);
    if (grad_first[i] && !grad_written[i])
      throw std::logic_error(
          fmt::format("gradient of {}: a writer adds to it before the product that overwrites it",
                      tensors[i].name));
    grad_written[i] = 1;
  }
  void check_gradients_written() const {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (grad_first[i] && !grad_written[i])
        throw std::logic_error(fmt::format(
            "gradient of {}: planned to be overwritten by its first writer, but nothing wrote it "
            "this step",
            tensors[i].name));
  }
  // The expert-router coupling loss (ModelOptions::erc_loss): the CPU reference's generator,
  // continued (the noise is drawn on the host in the CPU's order), and scratch shared by the MoE
  // layers, taken at construction when the loss is on.
  cpu::Rng rng;
  std::vector<double> erc_u_host;
  DeviceBuffer erc_u, erc_delta, erc_rt, erc_drt, erc_wg, erc_dwg, erc_act, erc_m, erc_dm,
      erc_losses;
  Profiler prof;
  // Per-step outputs.
  std::vector<int64_t> routed;
  int64_t dropped = 0;  // assignments over capacity, this step (all MoE layers and passes)
  std::vector<float> aux_host;

  DeviceBuffer alloc(size_t n_bytes) {
    bytes += n_bytes;
    return DeviceBuffer(n_bytes);
  }
  DeviceBuffer alloc_f(int64_t n) { return alloc(size_t(n) * 4); }
  DeviceBuffer alloc_mm(int64_t n) { return alloc(size_t(n) * mm_size); }

  float* P(int64_t off) { return params.as<float>() + off; }
  float* G(int64_t off) { return grads.as<float>() + off; }
  const void* Wm(int64_t off) const {  // weights as matrix-product input
    return mm == DType::f32 ? static_cast<const void*>(params.as<float>() + off)
                            : static_cast<const void*>(params_mm.as<uint16_t>() + off);
  }
  static const void* at(const DeviceBuffer& b, int64_t elems, size_t esize) {
    return static_cast<const char*>(b.data()) + size_t(elems) * esize;
  }
  void* at_mut(DeviceBuffer& b, int64_t elems, size_t esize) {
    return static_cast<char*>(b.data()) + size_t(elems) * esize;
  }

  Impl(const Arch& arch, const ModelOptions& o, uint64_t seed, int64_t batch_seqs, DType matmul,
       Communicator* c, AttentionPath attn, bool shard, int64_t logit_rows_asked,
       ExpertPath experts, int sizing_world)
      : a(arch), opt(o), mm(matmul), comm(c), sharded(shard) {
    if (logit_rows_asked < 0)
      throw std::logic_error("logit_rows must be 0 (automatic) or a row count");
    if (shard && !c && sizing_world < 1)
      throw std::logic_error("optimizer sharding needs a communicator (data parallelism)");
    sizing_only = sizing_world > 0;
    // The CPU reference validates the options and gives the layout, the initial weights and the
    // generator's state after drawing them (the ERC noise continues from it): the weights alone,
    // not a whole CPU model (16 bytes a parameter and its activations, on every rank).
    const auto init = backend::Model<float>::initial_weights(arch, o, seed, sizing_only);
    tensors = init.tensors;
    rng.state() = init.rng_state;
    step_B = batch_seqs;
    B = o.micro_batch_seqs > 0 ? std::min(o.micro_batch_seqs, batch_seqs) : batch_seqs;
    S = a.seq_len;
    Dm = a.d_model;
    H = a.heads;
    Hkv = a.kv_heads;
    Dh = a.head_dim;
    W = (H + 2 * Hkv) * Dh;
    V = a.vocab;
    E = a.experts;
    K = a.top_k;
    De = a.d_expert;
    Dse = a.d_shared;
    Dffn = a.d_ffn;
    L = a.layers;
    T = B * S;
    logit_rows = std::min(T, logit_rows_asked > 0 ? logit_rows_asked : kLogitRowsAuto);
    rope = o.positions == "rope";
    mm_size = dtype_size(mm);
    flash = attn != AttentionPath::cublas && mm == DType::bf16 && attention::supported(Dh);
    // The wide forward and the lean backward exist for head widths 16, 32 and 64 only.
    const bool wide = attn == AttentionPath::fused_mma_wide,
               lean = attn == AttentionPath::fused_mma_lean,
               wg = attn == AttentionPath::fused_wgmma;
    if (mm == DType::bf16 && ((wide && !attention::forward_mma_wide_supported(Dh)) ||
                              (lean && !attention::backward_mma_supported(Dh))))
      throw InputError(fmt::format(
          "--kernels attention={} needs a head width of 16, 32 or 64 (this model: {}); use "
          "attention=fused_mma",
          wide ? "fused_mma_wide" : "fused_mma_lean", Dh));
    if (mm == DType::bf16 && wg) {
      if (!attention::backward_wgmma_supported(Dh))
        throw InputError(fmt::format(
            "--kernels attention=fused_wgmma needs a head width of 64 (this model: {}); use "
            "attention=fused_mma_lean or fused_mma",
            Dh));
      const DeviceInfo d = current_device();
      if (!expert_gemm::wgmma_supported(d.compute_major, d.compute_minor))
        throw InputError(fmt::format(
            "--kernels attention=fused_wgmma runs on compute capability 9.0 (H100/H200) only; "
            "this device ({}) is {}.{} (valid here: fused_mma_lean, fused_mma, fused, cublas)",
            d.name, d.compute_major, d.compute_minor));
    }
    forward_mma = flash && (attn == AttentionPath::fused_mma || wide || lean || wg);
    forward_mma_wide = flash && wide;
    backward_mma = forward_mma && attention::backward_mma_supported(Dh);
    dkdv_kernel = backward_mma && lean ? attention::DkdvKernel::lean
                  : backward_mma && wg ? attention::DkdvKernel::wgmma
                                       : attention::DkdvKernel::held;
    if (flash) check_attention_fits(attn, Dh);
    n_params = tensors.back().offset + tensors.back().size();
    locate_tensors();

    int64_t moments = n_params, padded = n_params;
    if (sharded) {
      const int64_t world = sizing_only ? sizing_world : comm->info().world_size;
      chunk = (n_params + world - 1) / world;
      chunk = (chunk + 63) / 64 * 64;
      padded = chunk * world;
      shard_begin = std::min(n_params, chunk * (sizing_only ? 0 : comm->info().rank));
      shard_len = std::min(n_params, shard_begin + chunk) - shard_begin;
      moments = chunk;
    }
    params = alloc_f(padded);
    params.fill_zero();
    if (!sizing_only) params.upload(init.params.data(), size_t(n_params) * 4);
    if (mm == DType::bf16) params_mm = alloc(size_t(n_params) * 2);
    grads = alloc_f(padded);
    adam_m = alloc_f(moments);
    adam_v = alloc_f(moments);
    adam_m.fill_zero();
    adam_v.fill_zero();
    decay = alloc(size_t(padded));
    if (!sizing_only) {
      std::vector<uint8_t> decay_host(size_t(padded), 0);
      for (const TensorInfo& t : tensors)
        std::fill_n(decay_host.begin() + t.offset, t.size(), uint8_t(t.weight_decay ? 1 : 0));
      decay.upload(decay_host.data(), decay_host.size());
    }
    refresh_mm_weights();

    if (rope) {  // the CPU's table: (S, Dh/2, 2), angles in double
      std::vector<float> cs(size_t(S * Dh));
      for (int64_t p = 0; p < S; ++p)
        for (int64_t i = 0; i < Dh / 2; ++i) {
          const double th = double(p) * std::pow(10000.0, -2.0 * double(i) / double(Dh));
          cs[size_t((p * Dh / 2 + i) * 2)] = float(std::cos(th));
          cs[size_t((p * Dh / 2 + i) * 2 + 1)] = float(std::sin(th));
        }
      rope_table = alloc_f(S * Dh);
      rope_table.upload(cs.data(), cs.size() * 4);
    } else {
      std::vector<double> s(static_cast<size_t>(H));
      std::vector<float> sf(static_cast<size_t>(H));
      cpu::alibi_slopes(s.data(), H);  // the CPU reference's slopes, so both models agree
      for (int64_t h = 0; h < H; ++h) sf[size_t(h)] = float(s[size_t(h)]);
      slopes = alloc_f(H);
      slopes.upload(sf.data(), sf.size() * 4);
    }
    // A tiled path given at construction allocates no xg (set_expert_path checks the path and
    // sets up the others after construction).
    if (tiled(experts) && mm == DType::bf16) expert_path = experts;
    allocate_activations();
    if (erc_on()) allocate_erc();
  }

  // A model built only to be measured (sizing_world) has no weights, nor ranks to reduce or
  // gather with.
  void require_trainable() const {
    if (sizing_only)
      throw std::logic_error(
          "a model built with sizing_world only measures its buffers; it does "
          "not step or save");
  }

  int64_t offset_of(const std::string& name) const {
    for (const TensorInfo& t : tensors)
      if (t.name == name) return t.offset;
    return -1;
  }

  void locate_tensors() {
    tensor_at.clear();
    for (size_t i = 0; i < tensors.size(); ++i) tensor_at[tensors[i].offset] = i;
    embedding = offset_of("embedding");
    final_norm = offset_of("final_norm");
    lm_head = offset_of("lm_head");
    lp.resize(size_t(L));
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("layer{}.", l);
      LayerParams& q = lp[size_t(l)];
      q.norm1 = offset_of(p + "norm1");
      q.qkv = offset_of(p + "qkv");
      q.attn_out = offset_of(p + "attn_out");
      q.norm2 = offset_of(p + "norm2");
      q.w13 = offset_of(p + "ffn.w13");
      q.w2 = offset_of(p + "ffn.w2");
      q.router = offset_of(p + "router");
      q.shared_w13 = offset_of(p + "shared.w13");
      q.shared_w2 = offset_of(p + "shared.w2");
      if (l >= a.dense_layers)
        for (int64_t e = 0; e < E; ++e) {
          q.expert_w13.push_back(offset_of(fmt::format("{}expert{}.w13", p, e)));
          q.expert_w2.push_back(offset_of(fmt::format("{}expert{}.w2", p, e)));
        }
    }
    if (embedding < 0 || final_norm < 0)
      throw std::logic_error("CPU reference layout lacks embedding/final_norm");
  }

  // Sharded: the AdamW moments of all chunks, every rank's in turn broadcast through a staging
  // buffer of one chunk (a collective: every rank calls it and gets the whole vector).
  std::vector<float> gather_moments(const DeviceBuffer& mine) const {
    const Impl& m = *this;
    std::vector<float> full(size_t(m.n_params));
    DeviceBuffer staging(size_t(m.chunk) * 4);
    const int world = m.comm->info().world_size;
    for (int r = 0; r < world; ++r) {
      if (r == m.comm->info().rank)
        check_cuda(cudaMemcpy(staging.data(), mine.data(), size_t(m.chunk) * 4,
                              cudaMemcpyDeviceToDevice),
                   "cudaMemcpy D2D");
      m.comm->broadcast(staging.as<float>(), m.chunk, r);
      const int64_t begin = std::min(m.n_params, m.chunk * r);
      const int64_t len = std::min(m.n_params, begin + m.chunk) - begin;
      if (len > 0) staging.download(full.data() + begin, size_t(len) * 4);
    }
    return full;
  }

  void refresh_mm_weights() {
    if (mm == DType::bf16) k::cast(params_mm.data(), DType::bf16, params.as<float>(), n_params);
  }

  void allocate_activations() {
    const int64_t TK = T * K;
    acts.resize(size_t(L));
    int64_t widest_h = 0;
    for (int64_t l = 0; l < L; ++l) {
      Acts& x = acts[size_t(l)];
      x.resid_in = alloc_f(T * Dm);
      x.ln1 = alloc_mm(T * Dm);
      x.rstd1 = alloc_f(T);
      x.qkv = alloc_mm(T * W);
      if (flash)
        x.attn_lse = alloc_f(B * H * S);
      else
        x.P = alloc_mm(B * H * S * S);
      x.atty = alloc_mm(T * H * Dh);
      x.mid = alloc_f(T * Dm);
      x.ln2 = alloc_mm(T * Dm);
      x.rstd2 = alloc_f(T);
      if (l < a.dense_layers) {
        x.h13 = alloc_mm(T * 2 * Dffn);
        x.act = alloc_mm(T * Dffn);
        widest_h = std::max(widest_h, T * Dffn);
      } else {
        x.h13 = alloc_mm(TK * 2 * De);
        x.act = alloc_mm(TK * De);
        x.probs = alloc_f(T * E);
        x.lse = alloc_f(T);
        x.idx = alloc(size_t(TK) * 4);
        x.gate = alloc_f(TK);
        x.counts = alloc(size_t(E) * 4);
        x.offsets = alloc(size_t(E + 1) * 4);
        x.sorted = alloc(size_t(TK) * 4);
        x.slot_of = alloc(size_t(TK) * 4);
        if (!tiled_path()) x.xg = alloc_mm(TK * Dm);  // the tiled paths read ln2 (gathered)
        x.ye = alloc_mm(TK * Dm);  // the routed rows' outputs, in mm (as the grouped path rounded)
        if (Dse > 0) {
          x.sh13 = alloc_mm(T * 2 * Dse);
          x.sact = alloc_mm(T * Dse);
        }
        x.aux = alloc_f(2);
        x.p_mean = alloc_f(E);
        x.counts_host.assign(size_t(E), 0);
        if (opt.capacity_factor > 0) {
          x.assigned = alloc(size_t(E) * 4);
        }
        if (mm == DType::bf16) {
          x.tile_map = alloc(size_t(3 * expert_gemm::max_row_tiles(TK, E, 64)) * 4);  // the larger
          x.n_tiles = alloc(4);
        }
        widest_h = std::max({widest_h, TK * De, T * Dse});
      }
      if (!flash) x.attn_ptrs = alloc(size_t(kTables * B * H) * sizeof(void*));
    }
    resid_out = alloc_f(T * Dm);
    lnf = alloc_mm(T * Dm);
    rstdf = alloc_f(T);
    logits = alloc_mm(logit_rows * V);
    losses = alloc_f(T);
    dlogits = alloc_mm(logit_rows * V);
    loss_sum = alloc(8);
    pass_out = alloc(size_t(8 + (E > 0 ? L - a.dense_layers : 0) * (8 + 4 * E)));  // collect_pass
    tokens = alloc(size_t(T) * 4);
    targets = alloc(size_t(T) * 4);
    emb_ids = alloc(size_t(T) * 4);
    emb_seg = alloc(size_t(T + 1) * 4);
    emb_pos = alloc(size_t(T) * 4);
    if (rope) qkv_f32 = alloc_f(T * W);  // the qkv product's fp32 result, before the rotation
    if (flash) {
      delta = alloc_f(B * H * S);
      if (backward_mma) ds_tiles = alloc_mm(attention::backward_mma_scratch(B, S, H));
    } else {
      scores = alloc_f(B * H * S * S);
      dP = alloc_f(B * H * S * S);
      dS = alloc_mm(B * H * S * S);
    }
    dresid = alloc_f(T * Dm);
    dresid_mm = alloc_mm(T * Dm);
    dln = alloc_f(T * Dm);
    dact = alloc_mm(std::max<int64_t>(widest_h, 1));
    dh13 = alloc_mm(std::max<int64_t>(2 * widest_h, 1));
    if (E > 0 && Dse > 0) {
      ensure_side();
      side_dact = alloc_mm(T * Dse);
      side_dh13 = alloc_mm(T * 2 * Dse);
    }
    if (!dqkv_direct()) dqkv = alloc_f(T * W);
    dqkv_mm = alloc_mm(T * W);
    datty_mm = alloc_mm(T * H * Dh);
    if (E > 0) {
      dye = alloc_mm(TK * Dm);
      dgate = alloc_f(TK);
      dxg = alloc_mm(TK * Dm);  // the routed rows' input gradients, in mm (as ye)
      dlog = alloc_mm(T * E);
      router_logits = alloc_f(T * E);
      sort_scratch = alloc(size_t(k::sort_scratch_ints(T, K, E)) * 4);
      const size_t n_ptrs = size_t(a.moe_layers() * kExpertProducts * kOperands * E);
      expert_ptrs_host = std::make_unique<PinnedBuffer>(n_ptrs * sizeof(void*));
      expert_ptrs_dev = alloc(n_ptrs * sizeof(void*));
      if (mm == DType::bf16) {  // the grouped path's bf16 weight gradients: E of W13's (the wider)
        expert_scratch = alloc(size_t(E * Dm * 2 * De) * 2);
        expert_wtab = alloc(size_t(a.moe_layers() * 4 * E) * sizeof(void*));
      }
    }
    col_scratch =
        alloc_f(std::max(k::rmsnorm_scratch_floats(T, Dm), k::colsum_scratch_floats(E)));
    norm_scratch = alloc(size_t(norm_parts() * k::grad_norm_scratch_doubles()) * 8);
    norm = alloc_f(2);
    routed.assign(size_t(a.moe_layers()), 0);
    aux_host.assign(2, 0.f);
  }

  // Pointer tables of the batched attention products, per layer: built once, after every
  // buffer they point into exists.
  void build_attention_tables() {
    if (flash) return;  // the fused kernels index qkv themselves
    const int64_t BH = B * H, group = H / Hkv;
    for (int64_t l = 0; l < L; ++l) {
      Acts& x = acts[size_t(l)];
      std::vector<const void*> t(size_t(kTables * BH));
      auto put = [&](int table, int64_t i, const void* p) { t[size_t(table * BH + i)] = p; };
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t i = b * H + h, kvh = h / group, row0 = b * S * W;
          put(fQ, i, at(x.qkv, row0 + h * Dh, mm_size));
          put(fK, i, at(x.qkv, row0 + (H + kvh) * Dh, mm_size));
          put(fV, i, at(x.qkv, row0 + (H + Hkv + kvh) * Dh, mm_size));
          put(fScore, i, at(scores, i * S * S, 4));
          put(fP, i, at(x.P, i * S * S, mm_size));
          put(fO, i, at(x.atty, b * S * H * Dh + h * Dh, mm_size));
        }
      for (int64_t g = 0; g < group; ++g)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
            const int64_t i = (g * B + b) * Hkv + kvh, h = kvh * group + g, bh = b * H + h;
            const int64_t row0 = b * S * W;
            put(bP, i, at(x.P, bh * S * S, mm_size));
            put(bQ, i, at(x.qkv, row0 + h * Dh, mm_size));
            put(bK, i, at(x.qkv, row0 + (H + kvh) * Dh, mm_size));
            put(bV, i, at(x.qkv, row0 + (H + Hkv + kvh) * Dh, mm_size));
            put(bdO, i, at(datty_mm, b * S * H * Dh + h * Dh, mm_size));
            put(bdP, i, at(dP, bh * S * S, 4));
            put(bdS, i, at(dS, bh * S * S, mm_size));
            put(bdQ, i, at(dqkv, row0 + h * Dh, 4));
            put(bdK, i, at(dqkv, row0 + (H + kvh) * Dh, 4));
            put(bdV, i, at(dqkv, row0 + (H + Hkv + kvh) * Dh, 4));
          }
      x.attn_ptrs.upload(t.data(), t.size() * sizeof(void*));
    }
  }

  const void* const* table(Acts& x, int which, int64_t first = 0) {
    return static_cast<const void* const*>(x.attn_ptrs.data()) + which * B * H + first;
  }

  // ---- forward ------------------------------------------------------------------------------
  void attention_forward(Acts& x, int64_t nb, FlopLedger& lg) {
    const int64_t BH = nb * H;
    if (flash) {
      const auto forward = forward_mma_wide ? attention::forward_mma_wide
                           : dkdv_kernel == attention::DkdvKernel::wgmma ? attention::forward_wgmma
                           : forward_mma                                 ? attention::forward_mma
                                                                         : attention::forward;
      forward(x.atty.as<uint16_t>(), x.attn_lse.as<float>(), x.qkv.as<uint16_t>(),
              rope ? nullptr : slopes.as<float>(), nb, S, H, Hkv, Dh);
      record_fused_attention(lg, Phase::forward, BH);
      return;
    }
    const float scale = 1.f / std::sqrt(float(Dh));
    blas.gemm_batched(false, true, S, S, Dh, table(x, fQ), W, table(x, fK), W,
                      const_cast<void* const*>(table(x, fScore)), S, 0.f, mm, DType::f32, BH);
    k::attention_softmax_forward(x.P.data(), mm, scores.as<float>(),
                                 rope ? nullptr : slopes.as<float>(), BH, H, S, scale);
    blas.gemm_batched(false, false, S, Dh, S, table(x, fP), S, table(x, fV), W,
                      const_cast<void* const*>(table(x, fO)), H * Dh, 0.f, mm, mm, BH);
    record_attention(lg, Phase::forward, 2 * BH);
  }

  // `products` causal products of S×S with inner/outer Dh: the causal part as the CPU counts it,
  // the executed masked rest as padding.
  void record_attention(FlopLedger& lg, Phase ph, int64_t products) const {
    lg.flops[int(FlopCategory::attention_core)][int(ph)] += products * Dh * S * (S + 1);
    lg.flops[int(FlopCategory::padding)][int(ph)] += products * Dh * S * (S - 1);
  }

  // The fused kernels run whole 64×64 tiles on and below the diagonal: per product, the causal
  // triangle is attention-core (as the CPU counts it) and the rest of those tiles padding. The
  // WMMA backward executes 7 products per tile (S and dP in both kernels, dV, dK, dQ), the
  // register-resident one 5 (S and dP once; its dQ kernel reads the stored dS): 4 are the CPU's
  // (dP, dV, dK, dQ; the CPU keeps P from the forward), the other 3 or 1 are booked as recompute.
  void record_fused_attention(FlopLedger& lg, Phase ph, int64_t BH) const {
    const int64_t causal = Dh * S * (S + 1);
    const int64_t executed =
        2 * Dh * attention::tiles_per_head(S) * attention::kTile * attention::kTile;
    auto& f = lg.flops;
    if (ph == Phase::forward) {
      f[int(FlopCategory::attention_core)][int(ph)] += 2 * BH * causal;
      f[int(FlopCategory::padding)][int(ph)] += 2 * BH * (executed - causal);
    } else {
      const int64_t recomputed = backward_mma ? 1 : 3;
      f[int(FlopCategory::attention_core)][int(ph)] += 4 * BH * causal;
      f[int(FlopCategory::recompute)][int(ph)] += recomputed * BH * causal;
      f[int(FlopCategory::padding)][int(ph)] += (4 + recomputed) * BH * (executed - causal);
    }
  }

  LedgerEntry rec(FlopLedger& lg, FlopCategory c, Phase p) { return LedgerEntry{&lg, c, p}; }

  // The products below go to `on`, or to the default stream's handle when it is null.
  // out (T,OC) in mm = inp (T,C) mm · w (C,OC): an intermediate that only feeds element-wise work
  void matmul_forward_mm(void* out, const void* inp, int64_t w, int64_t Tn, int64_t C, int64_t OC,
                         FlopLedger& lg, FlopCategory cat, Blas* on = nullptr) {
    (on ? *on : blas)
        .gemm(rec(lg, cat, Phase::forward), false, false, Tn, OC, C, inp, C, Wm(w), OC, out, OC,
              0.f, mm, mm);
  }
  // out (T,OC) f32 [+]= inp (T,C) mm · w (C,OC)
  void matmul_forward(float* out, const void* inp, int64_t w, int64_t Tn, int64_t C, int64_t OC,
                      bool accumulate, FlopLedger& lg, FlopCategory cat, Blas* on = nullptr) {
    (on ? *on : blas)
        .gemm(rec(lg, cat, Phase::forward), false, false, Tn, OC, C, inp, C, Wm(w), OC, out, OC,
              accumulate ? 1.f : 0.f, mm);
  }
  // dinp (T,C) [+]= dout (T,OC) mm · w^T, dinp in `out`; dw (C,OC) += inp^T · dout
  void matmul_backward_as(void* dinp, DType out, bool accumulate, int64_t w, const void* dout,
                          const void* inp, int64_t Tn, int64_t C, int64_t OC, FlopLedger& lg,
                          FlopCategory cat, Blas* on = nullptr) {
    Blas& b = on ? *on : blas;
    b.gemm(rec(lg, cat, Phase::input_grad), false, true, Tn, C, OC, dout, OC, Wm(w), OC, dinp, C,
           accumulate ? 1.f : 0.f, mm, out);
    weight_grad_on(on).gemm(rec(lg, cat, Phase::weight_grad), true, false, C, OC, Tn, inp, C, dout,
                            OC, G(w), OC, grad_beta(w), mm);
  }
  // Where a weight gradient's product goes: `on` when given (the shared expert's lane); else the
  // side stream while this backward's weight gradients overlap, forked first, so that it waits
  // for everything the default stream has issued (its inputs included); else the default stream.
  Blas& weight_grad_on(Blas* on) {
    if (on) return *on;
    if (!wgrad_side) return blas;
    side->fork();
    return *side_blas;
  }
  // dinp f32 [+]= ...
  void matmul_backward(float* dinp, bool accumulate, int64_t w, const void* dout, const void* inp,
                       int64_t Tn, int64_t C, int64_t OC, FlopLedger& lg, FlopCategory cat,
                       Blas* on = nullptr) {
    matmul_backward_as(dinp, DType::f32, accumulate, w, dout, inp, Tn, C, OC, lg, cat, on);
  }
  // dinp in mm (overwritten), for an input gradient that only feeds products
  void matmul_backward_mm(void* dinp, int64_t w, const void* dout, const void* inp, int64_t Tn,
                          int64_t C, int64_t OC, FlopLedger& lg, FlopCategory cat) {
    matmul_backward_as(dinp, mm, false, w, dout, inp, Tn, C, OC, lg, cat);
  }

  Lane side_lane() { return Lane{side_blas.get(), side->handle()}; }

  void swiglu_ffn_forward(float* out, const void* ln, void* h13, void* act, int64_t w13, int64_t w2,
                          int64_t Tn, int64_t F, FlopLedger& lg, FlopCategory cat, Lane on = {}) {
    matmul_forward_mm(h13, ln, w13, Tn, Dm, 2 * F, lg, cat, on.blas);
    k::swiglu_forward(act, mm, h13, Tn, F, on.stream);
    matmul_forward(out, act, w2, Tn, F, Dm, true, lg, cat, on.blas);
  }

  // Host pointer tables for the 6 expert products of one MoE layer, then one upload.
  struct ExpertTables {
    std::vector<int64_t> rows, experts;  // non-empty experts only
  };

  void** host_table(int64_t moe_index, int product, int operand) {
    return static_cast<void**>(expert_ptrs_host->ptr) +
           ((moe_index * kExpertProducts + product) * kOperands + operand) * E;
  }
  void* const* dev_table(int64_t moe_index, int product, int operand) {
    return static_cast<void* const*>(expert_ptrs_dev.data()) +
           ((moe_index * kExpertProducts + product) * kOperands + operand) * E;
  }

  void build_expert_tables(int64_t moe_index, int64_t l, ExpertTables& et) {
    Acts& x = acts[size_t(l)];
    const LayerParams& q = lp[size_t(l)];
    et.rows.clear();
    et.experts.clear();
    int64_t o = 0;
    std::vector<int64_t> offs;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r = x.counts_host[size_t(e)];
      if (r > 0) {
        et.rows.push_back(r);
        et.experts.push_back(e);
        offs.push_back(o);
      }
      o += r;
    }
    for (size_t j = 0; j < et.experts.size(); ++j) {
      const int64_t e = et.experts[j], off = offs[j];
      // In bf16 a weight gradient's product goes to scratch first, one whole matrix per expert
      // j (s_off); the row-varying products write their mm results directly (no scratch).
      auto set = [&](int product, const void* A, const void* Bp, const void* C,
                     int64_t s_off = -1) {
        host_table(moe_index, product, 0)[j] = const_cast<void*>(A);
        host_table(moe_index, product, 1)[j] = const_cast<void*>(Bp);
        host_table(moe_index, product, 2)[j] = const_cast<void*>(C);
        host_table(moe_index, product, 3)[j] =
            mm == DType::bf16 && s_off >= 0 ? at_mut(expert_scratch, s_off, 2) : nullptr;
      };
      const size_t ms = mm_size;
      const int64_t jj = int64_t(j);
      set(0, at(x.xg, off * Dm, ms), Wm(q.expert_w13[size_t(e)]), at(x.h13, off * 2 * De, ms));
      set(1, at(x.act, off * De, ms), Wm(q.expert_w2[size_t(e)]), at(x.ye, off * Dm, ms));
      set(2, at(dye, off * Dm, ms), Wm(q.expert_w2[size_t(e)]), at(dact, off * De, ms));
      set(3, at(x.act, off * De, ms), at(dye, off * Dm, ms), G(q.expert_w2[size_t(e)]),
          jj * De * Dm);
      set(4, at(dh13, off * 2 * De, ms), Wm(q.expert_w13[size_t(e)]), at(dxg, off * Dm, ms));
      set(5, at(x.xg, off * Dm, ms), at(dh13, off * 2 * De, ms), G(q.expert_w13[size_t(e)]),
          jj * Dm * 2 * De);
    }
    const size_t bytes_layer = size_t(kExpertProducts * kOperands * E) * sizeof(void*);
    check_cuda(
        cudaMemcpyAsync(const_cast<void**>(dev_table(moe_index, 0, 0)), host_table(moe_index, 0, 0),
                        bytes_layer, cudaMemcpyHostToDevice, nullptr),
        "cudaMemcpyAsync expert tables");
  }

  void expert_product(int64_t moe_index, int product, const ExpertTables& et, bool transA,
                      bool transB, int64_t N_or_M_fixed1, int64_t fixed2, int which_varies,
                      int64_t lda, int64_t ldb, int64_t ldc, float beta, FlopLedger& lg, Phase ph) {
    // which_varies: 0 → M = rows (N = fixed1, K = fixed2); 2 → K = rows (M = fixed1, N = fixed2)
    const size_t n = et.rows.size();
    std::vector<int64_t> M(n), N(n), Kk(n);
    for (size_t j = 0; j < n; ++j) {
      if (which_varies == 0) {
        M[j] = et.rows[j];
        N[j] = N_or_M_fixed1;
        Kk[j] = fixed2;
      } else {
        M[j] = N_or_M_fixed1;
        N[j] = fixed2;
        Kk[j] = et.rows[j];
      }
    }
    // The row-varying products (0, 1, 2, 4: h13, ye, dact, dxg) have their results in mm,
    // written directly (h13 and dact feed only the SwiGLU kernels, ye only the combine kernels,
    // dxg only the scatter-add). The weight gradients are fp32; in bf16 the grouped call writes
    // them to bf16 scratch, then one launch adds them to the fp32 gradients (beta 1).
    const bool mm_result = which_varies == 0;
    const bool loop = expert_path == ExpertPath::loop;
    const bool scratch = mm == DType::bf16 && !loop && !mm_result;
    const int result = scratch ? 3 : 2;
    const DType out = mm_result || scratch ? mm : DType::f32;
    blas.gemm_grouped(rec(lg, FlopCategory::expert, ph), transA, transB, M.data(), N.data(),
                      Kk.data(), host_table(moe_index, product, 0),
                      dev_table(moe_index, product, 0), lda, host_table(moe_index, product, 1),
                      dev_table(moe_index, product, 1), ldb, host_table(moe_index, product, result),
                      dev_table(moe_index, product, result), ldc, scratch ? 0.f : beta, mm, out,
                      int64_t(n), loop);
    if (!scratch || n == 0) return;
    if (beta != 1.f) throw std::logic_error("expert_product: weight gradients accumulate");
    k::grouped_accumulate_bf16(reinterpret_cast<float* const*>(dev_table(moe_index, product, 2)),
                               static_cast<const uint16_t*>(host_table(moe_index, product, 3)[0]),
                               N_or_M_fixed1 * fixed2, int64_t(n));
  }

  std::vector<ExpertTables> expert_tables;

  // ---- routed experts through the tiled kernels (ExpertPath::tiled) --------------------------
  // expert_wtab per MoE layer: [W13_e | W2_e] bf16 weights, then [dW13_e | dW2_e] fp32 gradients.
  static constexpr int kW13 = 0, kW2 = 1;
  void build_expert_weight_tables() {
    if (mm != DType::bf16 || E == 0) return;
    std::vector<const void*> t;
    for (int64_t l = a.dense_layers; l < L; ++l) {
      const LayerParams& q = lp[size_t(l)];
      for (const auto* offs : {&q.expert_w13, &q.expert_w2})
        for (int64_t off : *offs) {
          // The kernels load 16-byte chunks of W_e when its shapes allow (multiples of 8).
          if (Dm % 8 == 0 && De % 8 == 0 && off % 8 != 0)
            throw std::logic_error("an expert weight does not start 16-byte aligned");
          t.push_back(Wm(off));
        }
      for (const auto* offs : {&q.expert_w13, &q.expert_w2})
        for (int64_t off : *offs) t.push_back(G(off));
    }
    expert_wtab.upload(t.data(), t.size() * sizeof(void*));
  }
  const uint16_t* const* weight_table(int64_t l, int which) const {
    return static_cast<const uint16_t* const*>(expert_wtab.data()) +
           ((l - a.dense_layers) * 4 + which) * E;
  }
  float* const* grad_table(int64_t l, int which) const {
    return static_cast<float* const*>(const_cast<void*>(expert_wtab.data())) +
           ((l - a.dense_layers) * 4 + 2 + which) * E;
  }
  static bool tiled(ExpertPath p) {
    return p == ExpertPath::tiled || p == ExpertPath::tiled128 || p == ExpertPath::wgmma;
  }
  bool tiled_path() const { return tiled(expert_path); }
  bool wgmma() const { return expert_path == ExpertPath::wgmma; }
  int64_t tile_rows() const { return expert_path == ExpertPath::tiled ? 64 : 128; }
  int64_t tile_depth() const { return wgmma() ? expert_gemm::kWgmmaDepth : expert_gemm::kDepth; }
  // C (R, N) = A (R, K) · op(W_e) over layer l's tile map; the products' own shapes go to the
  // ledger now, their tiles' padding once the counts are read (book_tiled_padding).
  // gathered: A's rows are the tokens' (A is ln2, row i the token of routed row i: the layer's
  // sorted assignments over top-K), read where they lie rather than copied by gather_rows.
  void tiled_rows(int64_t l, void* C, bool c_bf16, const void* A, int which, bool trans_w,
                  int64_t R, int64_t N, int64_t Kd, FlopLedger& lg, Phase ph,
                  bool gathered = false) {
    Acts& x = acts[size_t(l)];
    const auto* a16 = static_cast<const uint16_t*>(A);
    const int32_t* gather = gathered ? x.sorted.as<int32_t>() : nullptr;
    const int64_t tiles = expert_gemm::max_row_tiles(R, E, tile_rows());
    if (wgmma())
      expert_gemm::rows_wgmma(C, c_bf16, a16, weight_table(l, which), trans_w,
                              x.tile_map.as<int32_t>(), x.n_tiles.as<int32_t>(), tiles, N, Kd,
                              gather, K);
    else
      expert_gemm::rows(C, c_bf16, a16, weight_table(l, which), trans_w, x.tile_map.as<int32_t>(),
                        x.n_tiles.as<int32_t>(), tiles, N, Kd, tile_rows(), gather, K);
    lg.add_gemm(FlopCategory::expert, ph, R, N, Kd);
    tiled_pending.push_back({l, false, N, Kd, ph});
  }
  // dW_e (M, N) += A_e^T · B_e over the rows of each expert of layer l.
  void tiled_weight_grads(int64_t l, int which, const void* A, const void* Bm, int64_t R, int64_t M,
                          int64_t N, FlopLedger& lg, bool gathered = false) {
    const LayerParams& q = lp[size_t(l)];
    const bool overwrite = overwrites_all(which == kW13 ? q.expert_w13 : q.expert_w2);
    Acts& x = acts[size_t(l)];
    const auto *a16 = static_cast<const uint16_t*>(A), *b16 = static_cast<const uint16_t*>(Bm);
    const int32_t* gather = gathered ? x.sorted.as<int32_t>() : nullptr;
    if (wgmma())
      expert_gemm::weight_grads_wgmma(grad_table(l, which), a16, b16, x.offsets.as<int32_t>(), E, M,
                                      N, !overwrite, gather, K);
    else
      expert_gemm::weight_grads(grad_table(l, which), a16, b16, x.offsets.as<int32_t>(), E, M, N,
                                tile_rows(), !overwrite, gather, K);
    lg.add_gemm(FlopCategory::expert, Phase::weight_grad, M, N, R);
    tiled_pending.push_back({l, true, M, N, Phase::weight_grad});
  }
  // ---- the router's products through the tiled kernels (RouterPath::tiled) -------------------
  // The pass's tokens are the one "expert" of the row products (64-row tiles; the E logit columns,
  // or the E-deep input gradient, one tile wide or deep), and chunks of router_chunk tokens the
  // "experts" of the weight gradient: one block a (tile, chunk), each chunk's (E, Dm) product into
  // a partial that sum_partials adds in chunk order. Padding (tile rows past the tokens, columns
  // past E, depth past a multiple of 32) is booked as such.
  static constexpr int64_t kRouterTileRows = 64;
  // 256 tokens a chunk (32 chunks at 8 × 1024 tokens: 256 blocks of the weight gradient for
  // E 66, Dm 512), more past 64 chunks (the partials' traffic grows with the chunks): at most
  // kRouterMaxChunks chunks for any pass.
  static constexpr int64_t kRouterMaxChunks = 64;
  static int64_t router_chunk(int64_t Tn) {
    return std::max<int64_t>(256, ((Tn + kRouterMaxChunks - 1) / kRouterMaxChunks + 31) / 32 * 32);
  }
  struct RouterPlan {  // for a pass of a given token count
    DeviceBuffer offsets, tile_map, n_tiles, chunk_offsets, chunk_grads;
    int64_t max_tiles = 0, chunks = 0;
    std::vector<int32_t> chunk_rows;  // tokens of each chunk (the padding's ledger)
  };
  std::map<int64_t, RouterPlan> router_plans;  // by pass tokens; made at a length's first pass
  DeviceBuffer router_wtab;                    // each MoE layer's bf16 router (E, Dm)
  DeviceBuffer router_partials;                // (chunks of a whole pass, E, Dm) fp32
  bool router_tiled() const { return router_path == RouterPath::tiled && E > 0; }
  const uint16_t* const* router_table(int64_t l) const {
    return static_cast<const uint16_t* const*>(router_wtab.data()) + (l - a.dense_layers);
  }
  void build_router_tables() {
    std::vector<const void*> t;
    for (int64_t l = a.dense_layers; l < L; ++l) {
      if (Dm % 8 == 0 && lp[size_t(l)].router % 8 != 0)  // 16-byte copies of its rows
        throw std::logic_error("a router weight does not start 16-byte aligned");
      t.push_back(Wm(lp[size_t(l)].router));
    }
    router_wtab = alloc(t.size() * sizeof(void*));
    router_wtab.upload(t.data(), t.size() * sizeof(void*));
    // Chunks of any pass (Tn ≤ T): ceil(Tn/256) ≤ ceil(T/256) up to 64·256 tokens, 64 past.
    router_partials = alloc_f(std::min(kRouterMaxChunks, (T + 255) / 256) * E * Dm);
  }
  // Uploads once per pass length (a synchronous copy; the first step's, and a shorter last pass).
  const RouterPlan& router_plan(int64_t Tn) {
    if (const auto it = router_plans.find(Tn); it != router_plans.end()) return it->second;
    RouterPlan p;
    const int32_t offs[2] = {0, int32_t(Tn)};
    p.offsets = alloc(sizeof(offs));
    p.offsets.upload(offs, sizeof(offs));
    p.max_tiles = expert_gemm::max_row_tiles(Tn, 1, kRouterTileRows);
    p.tile_map = alloc(size_t(3 * p.max_tiles) * 4);
    p.n_tiles = alloc(4);
    expert_gemm::build_row_tiles(p.tile_map.as<int32_t>(), p.n_tiles.as<int32_t>(),
                                 p.offsets.as<int32_t>(), 1, kRouterTileRows);
    const int64_t chunk = router_chunk(Tn);
    p.chunks = (Tn + chunk - 1) / chunk;
    if (p.chunks * E * Dm * 4 > int64_t(router_partials.bytes()))
      throw std::logic_error("the router's weight-gradient chunks outgrow their partials");
    std::vector<int32_t> co;
    std::vector<float*> grads_at;
    for (int64_t c = 0; c < p.chunks; ++c) {
      co.push_back(int32_t(c * chunk));
      p.chunk_rows.push_back(int32_t(std::min(chunk, Tn - c * chunk)));
      grads_at.push_back(router_partials.as<float>() + c * E * Dm);
    }
    co.push_back(int32_t(Tn));
    p.chunk_offsets = alloc(co.size() * 4);
    p.chunk_offsets.upload(co.data(), co.size() * 4);
    p.chunk_grads = alloc(grads_at.size() * sizeof(float*));
    p.chunk_grads.upload(grads_at.data(), grads_at.size() * sizeof(float*));
    return router_plans.emplace(Tn, std::move(p)).first->second;
  }
  // router logits (Tn, E) fp32 = ln2 · router^T.
  void router_forward(int64_t l, const void* ln2, int64_t Tn, FlopLedger& lg) {
    const LayerParams& q = lp[size_t(l)];
    if (!router_tiled()) {  // router stored (E, Dm)
      blas.gemm(rec(lg, FlopCategory::router, Phase::forward), false, true, Tn, E, Dm, ln2, Dm,
                Wm(q.router), Dm, router_logits.as<float>(), E, 0.f, mm);
      return;
    }
    const RouterPlan& p = router_plan(Tn);
    expert_gemm::rows(router_logits.data(), false, static_cast<const uint16_t*>(ln2),
                      router_table(l), true, p.tile_map.as<int32_t>(), p.n_tiles.as<int32_t>(),
                      p.max_tiles, E, Dm, kRouterTileRows);
    const int32_t rows = int32_t(Tn);
    book_router(lg, Phase::forward, Tn * E * Dm,
                expert_gemm::executed_row_product_flops(&rows, 1, E, Dm, kRouterTileRows));
  }
  // dln (Tp, Dm) += dlog · router; drouter (E, Dm) (+)= dlog^T · ln2 (dlog (Tp, E) in mm).
  void router_backward_products(int64_t l, const void* ln2, int64_t Tp, FlopLedger& lg) {
    const LayerParams& q = lp[size_t(l)];
    if (!router_tiled()) {
      blas.gemm(rec(lg, FlopCategory::router, Phase::input_grad), false, false, Tp, Dm, E,
                dlog.data(), E, Wm(q.router), Dm, dln.as<float>(), Dm, 1.f, mm);
      blas.gemm(rec(lg, FlopCategory::router, Phase::weight_grad), true, false, E, Dm, Tp,
                dlog.data(), E, ln2, Dm, G(q.router), Dm, grad_beta(q.router), mm);
      return;
    }
    const RouterPlan& p = router_plan(Tp);
    const auto* d16 = static_cast<const uint16_t*>(dlog.data());
    expert_gemm::rows(dln.data(), false, d16, router_table(l), false, p.tile_map.as<int32_t>(),
                      p.n_tiles.as<int32_t>(), p.max_tiles, Dm, E, kRouterTileRows, nullptr, 1,
                      true);
    const int32_t rows = int32_t(Tp);
    book_router(lg, Phase::input_grad, Tp * Dm * E,
                expert_gemm::executed_row_product_flops(&rows, 1, Dm, E, kRouterTileRows));
    expert_gemm::weight_grads(static_cast<float* const*>(p.chunk_grads.data()), d16,
                              static_cast<const uint16_t*>(ln2), p.chunk_offsets.as<int32_t>(),
                              p.chunks, E, Dm, kRouterTileRows, false);
    k::sum_partials(G(q.router), router_partials.as<float>(), E * Dm, p.chunks,
                    grad_beta(q.router) != 0.f);
    book_router(lg, Phase::weight_grad, E * Dm * Tp,
                expert_gemm::executed_weight_grad_flops(p.chunk_rows.data(), p.chunks, E, Dm,
                                                        kRouterTileRows));
  }
  // A router product of `macs` multiply-adds under router, what its tiles executed beyond them
  // under padding.
  static void book_router(FlopLedger& lg, Phase ph, int64_t macs, int64_t executed) {
    lg.flops[int(FlopCategory::router)][int(ph)] += 2 * macs;
    lg.flops[int(FlopCategory::padding)][int(ph)] += executed - 2 * macs;
  }

  // What the host reads after a pass, in one download: the cross-entropy sum (returned), and for
  // each MoE layer its auxiliary losses (aux_host: 2 floats a MoE layer) and routed counts
  // (counts_host), gathered on the device first. A round trip each left the device idle at the
  // end of the MoE step's backward (run F's kernel times, the gap before sumsq_partial: 0.44 ms
  // against the dense step's 0.22, 17 downloads against 1).
  double collect_pass() {
    const int64_t moe = E > 0 ? L - a.dense_layers : 0, slot = 8 + 4 * E;
    const size_t bytes = size_t(8 + moe * slot);
    char* dev = static_cast<char*>(pass_out.data());
    const auto gather = [](void* dst, const void* src, size_t n) {
      check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, nullptr),
                 "cudaMemcpyAsync (a pass's results)");
    };
    gather(dev, loss_sum.data(), 8);
    for (int64_t i = 0; i < moe; ++i) {
      const Acts& x = acts[size_t(a.dense_layers + i)];
      gather(dev + 8 + i * slot, x.aux.data(), 8);
      gather(dev + 8 + i * slot + 8, x.counts.data(), size_t(E) * 4);
    }
    pass_out_host.resize(bytes);
    pass_out.download(pass_out_host.data(), bytes);
    const char* host = pass_out_host.data();
    double ce = 0;
    std::memcpy(&ce, host, 8);
    aux_host.resize(size_t(2 * moe));
    for (int64_t i = 0; i < moe; ++i) {
      std::memcpy(aux_host.data() + 2 * i, host + 8 + i * slot, 8);
      std::memcpy(acts[size_t(a.dense_layers + i)].counts_host.data(), host + 8 + i * slot + 8,
                  size_t(E) * 4);
    }
    return ce;
  }
  DeviceBuffer pass_out;  // collect_pass's gathering place, and its host copy
  std::vector<char> pass_out_host;

  // After a wait: what the tiles of the products launched since executed beyond the products'
  // shapes, booked as padding (each layer's routed counts read once).
  // The counts are the pass's, read by collect_pass.
  void book_tiled_padding(FlopLedger& lg) {
    for (const TiledProduct& p : tiled_pending) {
      Acts& x = acts[size_t(p.layer)];
      const int32_t* c = x.counts_host.data();
      const int64_t rows = std::accumulate(x.counts_host.begin(), x.counts_host.end(), int64_t(0));
      const int64_t executed = p.weight_grad ? expert_gemm::executed_weight_grad_flops(
                                                   c, E, p.d1, p.d2, tile_rows(), tile_depth())
                                             : expert_gemm::executed_row_product_flops(
                                                   c, E, p.d1, p.d2, tile_rows(), tile_depth());
      lg.flops[int(FlopCategory::padding)][int(p.phase)] += executed - 2 * rows * p.d1 * p.d2;
    }
    tiled_pending.clear();
  }

  // ---- routed experts as strided-batched products over the padded layout (ExpertPath::batched)
  // Each expert's rows are padded with zero rows to the pass's largest count rounded up to 64
  // (so cuBLAS sees few shapes), and each product is one cublasGemmStridedBatchedEx over the E
  // experts: bf16 in, fp32 out where the grouped call has no such form. Zero rows add nothing to
  // the weight gradients; what they execute is booked as padding. Rows move between the compact
  // (sorted) and the padded layout by copy_rows.
  static constexpr int64_t kPadRows = 64;
  void check_expert_stride() {
    const LayerParams& q = lp[size_t(a.dense_layers)];
    expert_stride = E > 1 ? q.expert_w13[1] - q.expert_w13[0] : 0;
    for (int64_t l = a.dense_layers; l < L; ++l)
      for (int64_t e = 1; e < E; ++e) {
        const LayerParams& r = lp[size_t(l)];
        if (r.expert_w13[size_t(e)] - r.expert_w13[size_t(e - 1)] != expert_stride ||
            r.expert_w2[size_t(e)] - r.expert_w2[size_t(e - 1)] != expert_stride)
          throw std::logic_error("expert weights are not evenly strided; the batched path needs it");
      }
  }
  void ensure_padded(int64_t rows) {
    if (unpad_map.bytes() == 0) unpad_map = alloc(size_t(T * K) * 4);
    if (rows <= pad_rows) return;
    const int64_t n = rows + rows / 8;  // room for the routing to drift before growing again
    // A row: its map entry, pad_x (Dm), pad_h13 (2De), pad_act and pad_dact (De), pad_y (Dm),
    // all in mm
    const size_t old = size_t(pad_rows) * (4 + mm_size * size_t(Dm + 2 * De + De + De + Dm));
    bytes -= std::min(bytes, old);
    for (DeviceBuffer* b : {&pad_map, &pad_x, &pad_h13, &pad_act, &pad_dact, &pad_y})
      *b = DeviceBuffer();  // freed before the larger ones are taken
    pad_map = alloc(size_t(n) * 4);
    pad_x = alloc_mm(n * Dm);
    pad_h13 = alloc_mm(n * 2 * De);
    pad_act = alloc_mm(n * De);
    pad_dact = alloc_mm(n * De);
    pad_y = alloc_mm(n * Dm);  // ye's and dxg's padded rows
    pad_rows = n;
  }
  int64_t padded_cap(const std::vector<int32_t>& counts) const {
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    return (most + kPadRows - 1) / kPadRows * kPadRows;
  }
  // The useful product (R rows) under expert, the padded rows' work under padding.
  void book_batched(FlopLedger& lg, Phase ph, int64_t R, int64_t padded, int64_t d1, int64_t d2) {
    if (ph == Phase::weight_grad)
      lg.add_gemm(FlopCategory::expert, ph, d1, d2, R);
    else
      lg.add_gemm(FlopCategory::expert, ph, R, d1, d2);
    lg.flops[int(FlopCategory::padding)][int(ph)] += 2 * (padded - R) * d1 * d2;
  }
  void batched_forward(int64_t l, int64_t R, FlopLedger& lg) {
    Acts& x = acts[size_t(l)];
    const LayerParams& q = lp[size_t(l)];
    x.cap = padded_cap(x.counts_host);
    const int64_t cap = x.cap, Pr = E * cap;
    ensure_padded(Pr);
    k::expert_pad_maps(pad_map.as<int32_t>(), unpad_map.as<int32_t>(), x.counts.as<int32_t>(),
                       x.offsets.as<int32_t>(), E, cap);
    // h13 (rows, 2De) = xg · W13_e (Dm, 2De)
    k::copy_rows(pad_x.data(), x.xg.data(), mm, pad_map.as<int32_t>(), Pr, Dm);
    blas.gemm_strided_batched(false, false, cap, 2 * De, Dm, pad_x.data(), Dm, cap * Dm,
                              Wm(q.expert_w13[0]), 2 * De, expert_stride, pad_h13.data(), 2 * De,
                              cap * 2 * De, 0.f, mm, mm, E);
    book_batched(lg, Phase::forward, R, Pr, 2 * De, Dm);
    k::copy_rows(x.h13.data(), pad_h13.data(), mm, unpad_map.as<int32_t>(), R, 2 * De);
    k::swiglu_forward(x.act.data(), mm, x.h13.data(), R, De);
    // ye (rows, Dm) in mm = act · W2_e (De, Dm)
    k::copy_rows(pad_act.data(), x.act.data(), mm, pad_map.as<int32_t>(), Pr, De);
    blas.gemm_strided_batched(false, false, cap, Dm, De, pad_act.data(), De, cap * De,
                              Wm(q.expert_w2[0]), Dm, expert_stride, pad_y.data(), Dm, cap * Dm,
                              0.f, mm, mm, E);
    book_batched(lg, Phase::forward, R, Pr, Dm, De);
    k::copy_rows(x.ye.data(), pad_y.data(), mm, unpad_map.as<int32_t>(), R, Dm);
  }
  void batched_backward(int64_t l, int64_t R, FlopLedger& lg) {
    Acts& x = acts[size_t(l)];
    const LayerParams& q = lp[size_t(l)];
    const int64_t cap = x.cap, Pr = E * cap;
    k::expert_pad_maps(pad_map.as<int32_t>(), unpad_map.as<int32_t>(), x.counts.as<int32_t>(),
                       x.offsets.as<int32_t>(), E, cap);
    const int32_t* pad = pad_map.as<int32_t>();
    // dact (rows, De) = dye · W2_e^T (W2_e stored (De, Dm));  dW2_e (De, Dm) += act^T · dye
    k::copy_rows(pad_x.data(), dye.data(), mm, pad, Pr, Dm);
    blas.gemm_strided_batched(false, true, cap, De, Dm, pad_x.data(), Dm, cap * Dm,
                              Wm(q.expert_w2[0]), Dm, expert_stride, pad_dact.data(), De,
                              cap * De, 0.f, mm, mm, E);
    book_batched(lg, Phase::input_grad, R, Pr, De, Dm);
    k::copy_rows(pad_act.data(), x.act.data(), mm, pad, Pr, De);
    blas.gemm_strided_batched(true, false, De, Dm, cap, pad_act.data(), De, cap * De,
                              pad_x.data(), Dm, cap * Dm, G(q.expert_w2[0]), Dm, expert_stride,
                              1.f, mm, DType::f32, E);
    book_batched(lg, Phase::weight_grad, R, Pr, De, Dm);
    k::copy_rows(dact.data(), pad_dact.data(), mm, unpad_map.as<int32_t>(), R, De);
    k::swiglu_backward(dh13.data(), mm, dact.data(), x.h13.data(), R, De);
    // dxg (rows, Dm) in mm = dh13 · W13_e^T (W13_e stored (Dm, 2De));  dW13_e += xg^T · dh13
    k::copy_rows(pad_h13.data(), dh13.data(), mm, pad, Pr, 2 * De);
    blas.gemm_strided_batched(false, true, cap, Dm, 2 * De, pad_h13.data(), 2 * De, cap * 2 * De,
                              Wm(q.expert_w13[0]), 2 * De, expert_stride, pad_y.data(), Dm,
                              cap * Dm, 0.f, mm, mm, E);
    book_batched(lg, Phase::input_grad, R, Pr, Dm, 2 * De);
    k::copy_rows(dxg.data(), pad_y.data(), mm, unpad_map.as<int32_t>(), R, Dm);
    k::copy_rows(pad_x.data(), x.xg.data(), mm, pad, Pr, Dm);
    blas.gemm_strided_batched(true, false, Dm, 2 * De, cap, pad_x.data(), Dm, cap * Dm,
                              pad_h13.data(), 2 * De, cap * 2 * De, G(q.expert_w13[0]), 2 * De,
                              expert_stride, 1.f, mm, DType::f32, E);
    book_batched(lg, Phase::weight_grad, R, Pr, Dm, 2 * De);
  }

  void moe_forward(int64_t l, int64_t nb, float* out, bool train, FlopLedger& lg) {
    const int64_t Tn = nb * S, moe_index = l - a.dense_layers;
    const LayerParams& q = lp[size_t(l)];
    Acts& x = acts[size_t(l)];
    // The shared expert reads ln2 and adds to out (both written before this), beside everything
    // up to the combine, which adds to out after it; it touches nothing else the routed part does.
    const bool overlap = Dse > 0 && overlapping();
    if (overlap) {
      side->fork();
      swiglu_ffn_forward(out, x.ln2.data(), x.sh13.data(), x.sact.data(), q.shared_w13, q.shared_w2,
                         Tn, Dse, lg, FlopCategory::shared_expert, side_lane());
    }
    router_forward(l, x.ln2.data(), Tn, lg);  // router logits (Tn, E)
    k::router_topk(x.probs.as<float>(), x.lse.as<float>(), x.idx.as<int32_t>(), x.gate.as<float>(),
                   router_logits.as<float>(), Tn, E, K, opt.renormalize_gates);
    const int64_t cap = pass_capacity(Tn);
    k::sort_by_expert(x.counts.as<int32_t>(), x.offsets.as<int32_t>(), x.sorted.as<int32_t>(),
                      x.slot_of.as<int32_t>(), x.idx.as<int32_t>(), sort_scratch.as<int32_t>(), Tn,
                      K, E, cap > 0 ? x.assigned.as<int32_t>() : nullptr, cap);
    const bool tiled = tiled_path();
    // On the cuBLAS paths the routed counts size the products and the ledger, and with a
    // capacity the kept rows size every path's: one wait per layer.
    const bool wait = !tiled || cap > 0;
    if (wait) x.counts.download(x.counts_host.data(), size_t(E) * 4);
    int64_t R = Tn * K;
    if (cap > 0) {
      R = std::accumulate(x.counts_host.begin(), x.counts_host.end(), int64_t(0));
      if (train) dropped += Tn * K - R;
    }
    x.rows = R;
    prof.mark(wait ? "fwd router + sort (+ host wait)" : "fwd router + sort");
    // The tiled products read the routed rows from ln2 through the sorted assignments; the
    // cuBLAS paths need them gathered into xg first.
    if (!tiled) k::gather_rows(x.xg.data(), x.ln2.data(), mm, x.sorted.as<int32_t>(), R, K, Dm);
    if (expert_path == ExpertPath::batched) {
      batched_forward(l, R, lg);
    } else if (tiled) {
      expert_gemm::build_row_tiles(x.tile_map.as<int32_t>(), x.n_tiles.as<int32_t>(),
                                   x.offsets.as<int32_t>(), E, tile_rows());
      tiled_rows(l, x.h13.data(), true, x.ln2.data(), kW13, false, R, 2 * De, Dm, lg,
                 Phase::forward, true);
      k::swiglu_forward(x.act.data(), mm, x.h13.data(), R, De);
      tiled_rows(l, x.ye.data(), true, x.act.data(), kW2, false, R, Dm, De, lg, Phase::forward);
    } else {
      ExpertTables& et = expert_tables[size_t(moe_index)];
      build_expert_tables(moe_index, l, et);
      // h13 (rows, 2De) = xg (rows, Dm) · W13_e (Dm, 2De)
      expert_product(moe_index, 0, et, false, false, 2 * De, Dm, 0, Dm, 2 * De, 2 * De, 0.f, lg,
                     Phase::forward);
      k::swiglu_forward(x.act.data(), mm, x.h13.data(), R, De);
      // ye (rows, Dm) in mm = act (rows, De) · W2_e (De, Dm)
      expert_product(moe_index, 1, et, false, false, Dm, De, 0, De, Dm, Dm, 0.f, lg,
                     Phase::forward);
    }
    prof.mark("fwd routed experts");
    if (Dse > 0 && !overlap)
      swiglu_ffn_forward(out, x.ln2.data(), x.sh13.data(), x.sact.data(), q.shared_w13, q.shared_w2,
                         Tn, Dse, lg, FlopCategory::shared_expert);
    if (overlap) side->join();
    k::moe_combine_forward(out, x.ye.data(), mm, x.gate.as<float>(), x.slot_of.as<int32_t>(), Tn, K,
                           Dm);
    if (!train) return;
    routed[size_t(moe_index)] += R;
    k::router_aux_forward(x.aux.as<float>(), x.p_mean.as<float>(), x.probs.as<float>(),
                          x.lse.as<float>(), assigned_counts(x), Tn, E, K, float(opt.load_balance),
                          float(opt.z_loss), col_scratch.as<float>());
  }

  bool erc_on() const { return opt.erc_loss > 0 && a.moe_layers() > 0; }
  void allocate_erc() {
    check_expert_stride();  // the gate projections are gathered at one stride
    const int64_t n_moe = a.moe_layers();
    erc_u_host.resize(size_t(n_moe * E * Dm));
    erc_u = alloc(erc_u_host.size() * 8);
    erc_delta = alloc_f(E * Dm);
    erc_rt = alloc_f(E * Dm);
    erc_drt = alloc_f(E * Dm);
    erc_wg = alloc_f(Dm * E * De);
    erc_dwg = alloc_f(Dm * E * De);
    erc_act = alloc_f(E * E * De);
    erc_m = alloc_f(E * E);
    erc_dm = alloc_f(E * E);
    erc_losses = alloc(size_t(n_moe) * 8);
  }
  // The ERC loss of every MoE layer (the CPU's erc_forward_backward), once a step before the
  // passes, as on the CPU: its gradients go into the zeroed gradients first (with the loss on,
  // the router and expert W13 gradients are zeroed when the step starts). Each layer's expert
  // gate projections are gathered side by side into wg (Dm, E·De), so each of the CPU's E
  // products per phase is one product here (the same FLOPs, booked under aux-loss); fp32 products
  // whatever the model's matrix type. The losses stay on the device until erc_losses is read.
  // Under data parallelism every rank draws the noise (so the generators stay equal) and rank 0
  // alone computes the loss, its gradients weighted by the world size W (the ranks' gradients are
  // then averaged): the job executes and books its products once, as one process would.
  void erc_step(FlopLedger& lg, bool compute, float grad_weight) {
    for (double& u : erc_u_host) u = rng.uniform();  // layer, row, column: the CPU's order
    if (!compute) return;
    erc_u.upload(erc_u_host.data(), erc_u_host.size() * 8);
    float *rt = erc_rt.as<float>(), *drt = erc_drt.as<float>(), *wg = erc_wg.as<float>(),
          *dwg = erc_dwg.as<float>(), *act = erc_act.as<float>(), *m = erc_m.as<float>(),
          *dm = erc_dm.as<float>();
    const int64_t N = E * De;
    for (int64_t l = a.dense_layers; l < L; ++l) {
      const int64_t mi = l - a.dense_layers;
      const LayerParams& q = lp[size_t(l)];
      k::erc_noise(erc_delta.as<float>(), rt, P(q.router), erc_u.as<double>() + mi * E * Dm, E, Dm);
      k::erc_gather_gate(wg, P(q.expert_w13[0]), expert_stride, E, Dm, De);
      // act (E, E·De) = rt (E, Dm) · wg (Dm, E·De); m[i,j] = ‖block j of act's row i‖
      blas.gemm(rec(lg, FlopCategory::aux_loss, Phase::forward), false, false, E, N, Dm, rt, Dm, wg,
                N, act, N, 0.f, DType::f32);
      k::erc_norms(m, act, E, De);
      k::erc_hinge(erc_losses.as<double>() + mi, dm, m, E, opt.erc_alpha, opt.erc_loss,
                   grad_weight);
      k::erc_scale(act, m, dm, E, De);  // act now holds d loss / d act
      // drt (E, Dm) = dact · wg^T;  dwg (Dm, E·De) = rt^T · dact
      blas.gemm(rec(lg, FlopCategory::aux_loss, Phase::input_grad), false, true, E, Dm, N, act, N,
                wg, N, drt, Dm, 0.f, DType::f32);
      blas.gemm(rec(lg, FlopCategory::aux_loss, Phase::weight_grad), true, false, Dm, N, E, rt, Dm,
                act, N, dwg, N, 0.f, DType::f32);
      for (const int64_t off : q.expert_w13) adds_to(off);
      adds_to(q.router);
      k::erc_scatter_gate_grad(G(q.expert_w13[0]), dwg, expert_stride, E, Dm, De);
      k::erc_router_grad(G(q.router), drt, erc_delta.as<float>(), E * Dm);
    }
  }
  double erc_losses_sum() const {  // in layer order, as the CPU sums them
    std::vector<double> v(size_t(a.moe_layers()));
    erc_losses.download(v.data(), v.size() * 8);
    double s = 0;
    for (double x : v) s += x;
    return s;
  }

  // The capacity of each expert in a pass of Tn tokens (the CPU's); 0 without a capacity factor
  // (dropless).
  int64_t pass_capacity(int64_t Tn) const {
    return opt.capacity_factor > 0 ? cpu::expert_capacity(opt.capacity_factor, Tn, K, E) : 0;
  }
  // Every expert's assignments before any drop (the load balance's f_i).
  const int32_t* assigned_counts(const Acts& x) const {
    return opt.capacity_factor > 0 ? x.assigned.as<int32_t>() : x.counts.as<int32_t>();
  }

  void upload_tokens(const int32_t* inputs, const int32_t* tgts, int64_t Tn) {
    tokens.upload(inputs, size_t(Tn) * 4);
    targets.upload(tgts, size_t(Tn) * 4);
  }

  void forward(int64_t nb, bool train, FlopLedger& lg, float grad_scale) {
    const int64_t Tn = nb * S;
    Bp = nb;
    Tp = Tn;
    float* r0 = acts[0].resid_in.as<float>();
    await_use(0);
    k::embedding_forward(r0, P(embedding), tokens.as<int32_t>(), Tn, Dm);
    prof.mark("fwd embedding");
    for (int64_t l = 0; l < L; ++l) {
      const LayerParams& q = lp[size_t(l)];
      Acts& x = acts[size_t(l)];
      await_use(1 + l);
      float* out = l + 1 < L ? acts[size_t(l + 1)].resid_in.as<float>() : resid_out.as<float>();
      // The residual stream goes on in mid (the out projection adds to it), copied by the norm.
      k::rmsnorm_forward(x.ln1.data(), mm, x.rstd1.as<float>(), x.resid_in.as<float>(), P(q.norm1),
                         Tn, Dm, 1e-5f, x.mid.as<float>());
      if (rope) {  // the rotation in fp32, then one rounding to mm
        matmul_forward(qkv_f32.as<float>(), x.ln1.data(), q.qkv, Tn, Dm, W, false, lg,
                       FlopCategory::projection);
        k::qkv_prepare(x.qkv.data(), mm, qkv_f32.as<float>(), rope_table.as<float>(), nb, S, H,
                       Hkv, Dh);
      } else {  // nothing to rotate: the product writes mm (rounded once, as the cast would)
        matmul_forward_mm(x.qkv.data(), x.ln1.data(), q.qkv, Tn, Dm, W, lg,
                          FlopCategory::projection);
      }
      prof.mark("fwd norm1 + qkv");
      attention_forward(x, nb, lg);
      prof.mark("fwd attention core");
      matmul_forward(x.mid.as<float>(), x.atty.data(), q.attn_out, Tn, H * Dh, Dm, true, lg,
                     FlopCategory::projection);
      // ... and on in out (the FFN adds to it), copied by the norm again.
      k::rmsnorm_forward(x.ln2.data(), mm, x.rstd2.as<float>(), x.mid.as<float>(), P(q.norm2), Tn,
                         Dm, 1e-5f, out);
      prof.mark("fwd out proj + norm2");
      if (l < a.dense_layers)
        swiglu_ffn_forward(out, x.ln2.data(), x.h13.data(), x.act.data(), q.w13, q.w2, Tn, Dffn, lg,
                           FlopCategory::dense_ffn);
      else
        moe_forward(l, nb, out, train, lg);
      prof.mark(l < a.dense_layers ? "fwd dense ffn" : "fwd moe rest");
    }
    lg.elementwise += elementwise_per_pass(nb);
    await_use(L + 1);
    k::rmsnorm_forward(lnf.data(), mm, rstdf.as<float>(), resid_out.as<float>(), P(final_norm), Tn,
                       Dm, 1e-5f);
    prof.mark("fwd final norm");
    // LM head and cross-entropy, chunk by chunk of rows. In training each chunk's logit gradient
    // goes through the LM head's backward at once (dln rows, the head's weight gradient), so no
    // chunk's logits outlive it; backward() starts at the final norm. The products are those of
    // one whole-pass head, split by rows: the ledger is the same.
    for (int64_t r0 = 0; r0 < Tn; r0 += logit_rows) {
      const int64_t n = std::min(logit_rows, Tn - r0);
      const void* ln = at(lnf, r0 * Dm, mm_size);
      // Logits in mm: bf16 in bf16 mode, as the cross-entropy reads them (in fp32 arithmetic).
      if (lm_head >= 0)
        matmul_forward_mm(logits.data(), ln, lm_head, n, Dm, V, lg, FlopCategory::lm_head);
      else
        blas.gemm(rec(lg, FlopCategory::lm_head, Phase::forward), false, true, n, V, Dm, ln, Dm,
                  Wm(embedding), Dm, logits.data(), V, 0.f, mm, mm);
      prof.mark("fwd lm head");
      k::cross_entropy(losses.as<float>() + r0, train ? dlogits.data() : nullptr, mm,
                       logits.data(), targets.as<int32_t>() + r0, n, V, grad_scale);
      prof.mark("cross-entropy");
      if (!train) continue;
      float* dx = dln.as<float>() + r0 * Dm;
      if (lm_head >= 0) {
        matmul_backward(dx, false, lm_head, dlogits.data(), ln, n, Dm, V, lg,
                        FlopCategory::lm_head);
      } else {  // tied: head = embedding (V, Dm) used transposed
        blas.gemm(rec(lg, FlopCategory::lm_head, Phase::input_grad), false, false, n, Dm, V,
                  dlogits.data(), V, Wm(embedding), Dm, dx, Dm, 0.f, mm);
        blas.gemm(rec(lg, FlopCategory::lm_head, Phase::weight_grad), true, false, V, Dm, n,
                  dlogits.data(), V, ln, Dm, G(embedding), Dm, grad_beta(embedding), mm);
      }
      prof.mark("bwd lm head");
    }
    k::sum_double(loss_sum.as<double>(), losses.as<float>(), Tn);
  }

  // The CPU reference's element-wise count (layers.hpp), with the pass's kept rows per MoE layer
  // (set by its forward).
  int64_t elementwise_per_pass(int64_t nb) const {
    std::vector<int64_t> routed_rows;
    for (int64_t l = a.dense_layers; l < L; ++l) routed_rows.push_back(acts[size_t(l)].rows);
    return cpu::elementwise_per_pass(a, nb, rope, routed_rows);
  }

  // ---- backward -----------------------------------------------------------------------------
  // The register-resident attention backward writes dqkv in mm itself when there is no RoPE to
  // undo (qkv_prepare_backward would only cast it).
  bool dqkv_direct() const { return backward_mma && !rope; }

  void attention_backward(Acts& x, FlopLedger& lg) {
    // The pointer tables hold B·H entries per product (g·B·Hkv + b·Hkv + kv head for the
    // backward's); a shorter pass uses the first Bp sequences of each group.
    const int64_t group = H / Hkv, BHkv = Bp * Hkv, BH = Bp * H, stride = B * Hkv;
    if (flash) {
      const float* sl = rope ? nullptr : slopes.as<float>();
      if (backward_mma)  // without RoPE straight into the bf16 dqkv (dqkv_direct)
        attention::backward_mma(dqkv_direct() ? dqkv_mm.data() : dqkv.data(), dqkv_direct(),
                                delta.as<float>(), ds_tiles.as<uint16_t>(), datty_mm.as<uint16_t>(),
                                x.atty.as<uint16_t>(), x.attn_lse.as<float>(), x.qkv.as<uint16_t>(),
                                sl, Bp, S, H, Hkv, Dh, dkdv_kernel);
      else
        attention::backward(dqkv.as<float>(), delta.as<float>(), datty_mm.as<uint16_t>(),
                            x.atty.as<uint16_t>(), x.attn_lse.as<float>(), x.qkv.as<uint16_t>(),
                            sl, Bp, S, H, Hkv, Dh);
      record_fused_attention(lg, Phase::input_grad, BH);
      return;
    }
    const float scale = 1.f / std::sqrt(float(Dh));
    // dP = dO·V^T (all heads), dS = softmax backward, dQ = dS·K. A whole pass is one call over
    // every table entry; a shorter one takes its sequences' entries group by group.
    const int64_t calls = Bp == B ? 1 : group, per_call = Bp == B ? BH : BHkv;
    for (int64_t c = 0; c < calls; ++c)
      blas.gemm_batched(false, true, S, S, Dh, table(x, bdO, c * stride), H * Dh,
                        table(x, bV, c * stride), W,
                        const_cast<void* const*>(table(x, bdP, c * stride)), S, 0.f, mm,
                        DType::f32, per_call);
    k::attention_softmax_backward(dS.data(), mm, dP.as<float>(), x.P.data(), BH, S, scale);
    for (int64_t c = 0; c < calls; ++c)
      blas.gemm_batched(false, false, S, Dh, S, table(x, bdS, c * stride), S,
                        table(x, bK, c * stride), W,
                        const_cast<void* const*>(table(x, bdQ, c * stride)), W, 0.f, mm,
                        DType::f32, per_call);
    // dV = Σ_g P^T·dO, dK = Σ_g dS^T·Q: one batched call per query head of a group
    for (int64_t g = 0; g < group; ++g) {
      const float beta = g == 0 ? 0.f : 1.f;
      blas.gemm_batched(true, false, S, Dh, S, table(x, bP, g * stride), S,
                        table(x, bdO, g * stride), H * Dh,
                        const_cast<void* const*>(table(x, bdV, g * stride)), W, beta, mm,
                        DType::f32, BHkv);
      blas.gemm_batched(true, false, S, Dh, S, table(x, bdS, g * stride), S,
                        table(x, bQ, g * stride), W,
                        const_cast<void* const*>(table(x, bdK, g * stride)), W, beta, mm,
                        DType::f32, BHkv);
    }
    record_attention(lg, Phase::input_grad, 4 * BH);
  }

  // dln (T,Dm) = the FFN's input gradient (overwritten); its weight gradients added. Scratch:
  // the default stream's dact and dh13, or the side stream's own. A lane with a handle keeps the
  // weight gradients on it (weight_grad_on).
  void swiglu_ffn_backward(const void* ln, const void* h13, const void* act, int64_t w13,
                           int64_t w2, int64_t F, FlopLedger& lg, FlopCategory cat, Lane on = {}) {
    Blas& b = on.blas ? *on.blas : blas;
    void* da = on.stream ? side_dact.data() : dact.data();
    void* dh = on.stream ? side_dh13.data() : dh13.data();
    const bool fenced = wgrad_side && !on.blas;  // its weight gradients on the side stream
    // dresid_mm holds d(out) as product input; da (T,F) in mm feeds only the SwiGLU backward.
    b.gemm(rec(lg, cat, Phase::input_grad), false, true, Tp, F, Dm, dresid_mm.data(), Dm, Wm(w2),
           Dm, da, F, 0.f, mm, mm);
    weight_grad_on(on.blas).gemm(rec(lg, cat, Phase::weight_grad), true, false, F, Dm, Tp, act, F,
                                 dresid_mm.data(), Dm, G(w2), Dm, grad_beta(w2), mm);
    if (fenced) side->mark(kReadsDresid);
    if (fenced) side->wait(kReadsDh13);  // the later layer's W13 gradient still reads dh13
    k::swiglu_backward(dh, mm, da, h13, Tp, F, on.stream);
    matmul_backward(dln.as<float>(), false, w13, dh, ln, Tp, Dm, 2 * F, lg, cat, on.blas);
    if (fenced) side->mark(kReadsDh13);
  }

  void moe_backward(int64_t l, FlopLedger& lg) {
    const int64_t moe_index = l - a.dense_layers, R = acts[size_t(l)].rows;
    const LayerParams& q = lp[size_t(l)];
    Acts& x = acts[size_t(l)];
    // On the side stream the shared expert reads dresid_mm, ln2 and its activations and writes
    // dln and its own weight gradients, beside the combine and routed backward (which write
    // neither); the scatter-add into dln waits for it.
    const bool overlap = Dse > 0 && overlapping();
    if (overlap) side->fork();
    // On the default stream its weight gradients stay there too: the routed backward overwrites
    // the dh13 they read before this layer's wait for the side stream.
    if (Dse > 0)
      swiglu_ffn_backward(x.ln2.data(), x.sh13.data(), x.sact.data(), q.shared_w13, q.shared_w2,
                          Dse, lg, FlopCategory::shared_expert,
                          overlap ? side_lane() : Lane{&blas, nullptr});
    else
      check_cuda(cudaMemsetAsync(dln.data(), 0, size_t(Tp * Dm) * 4, nullptr), "memset dln");
    // Dropped assignments' gates get 0 (capacity factor).
    k::moe_combine_backward(dye.data(), mm, dgate.as<float>(), dresid.as<float>(), x.ye.data(),
                            x.gate.as<float>(), x.slot_of.as<int32_t>(), Tp, K, Dm);
    prof.mark("bwd shared expert + combine");
    if (!tiled_path())  // the cuBLAS paths add into the zeroed expert gradients
      for (const auto* offs : {&q.expert_w2, &q.expert_w13})
        for (const int64_t off : *offs) adds_to(off);
    if (expert_path == ExpertPath::batched) {
      batched_backward(l, R, lg);
    } else if (tiled_path()) {
      // dact (rows, De) = dye · W2_e^T (W2_e stored (De, Dm));  dW2_e (De, Dm) += act^T · dye
      tiled_rows(l, dact.data(), true, dye.data(), kW2, true, R, De, Dm, lg, Phase::input_grad);
      tiled_weight_grads(l, kW2, x.act.data(), dye.data(), R, De, Dm, lg);
      k::swiglu_backward(dh13.data(), mm, dact.data(), x.h13.data(), R, De);
      // dxg (rows, Dm) in mm = dh13 · W13_e^T (W13_e stored (Dm, 2De));  dW13_e += xg^T · dh13,
      // xg's rows read from ln2 (gathered)
      tiled_rows(l, dxg.data(), true, dh13.data(), kW13, true, R, Dm, 2 * De, lg,
                 Phase::input_grad);
      tiled_weight_grads(l, kW13, x.ln2.data(), dh13.data(), R, Dm, 2 * De, lg, true);
    } else {
      const ExpertTables& et = expert_tables[size_t(moe_index)];
      // dact (rows, De) = dye (rows, Dm) · W2_e^T;  dW2_e (De, Dm) += act^T · dye
      expert_product(moe_index, 2, et, false, true, De, Dm, 0, Dm, Dm, De, 0.f, lg,
                     Phase::input_grad);
      expert_product(moe_index, 3, et, true, false, De, Dm, 2, De, Dm, Dm, 1.f, lg,
                     Phase::weight_grad);
      k::swiglu_backward(dh13.data(), mm, dact.data(), x.h13.data(), R, De);
      // dxg (rows, Dm) in mm = dh13 (rows, 2De) · W13_e^T;  dW13_e (Dm, 2De) += xg^T · dh13
      expert_product(moe_index, 4, et, false, true, Dm, 2 * De, 0, 2 * De, 2 * De, Dm, 0.f, lg,
                     Phase::input_grad);
      expert_product(moe_index, 5, et, true, false, Dm, 2 * De, 2, Dm, 2 * De, 2 * De, 1.f, lg,
                     Phase::weight_grad);
    }
    prof.mark("bwd routed experts");
    if (overlap) side->join();
    k::moe_scatter_add(dln.as<float>(), dxg.data(), mm, x.slot_of.as<int32_t>(), Tp, K, Dm);
    k::router_backward(dlog.data(), mm, x.probs.as<float>(), x.lse.as<float>(), x.idx.as<int32_t>(),
                       x.gate.as<float>(), dgate.as<float>(), assigned_counts(x), Tp, E, K,
                       opt.renormalize_gates, float(aux_grad_w * opt.load_balance),
                       float(aux_grad_w * opt.z_loss));
    router_backward_products(l, x.ln2.data(), Tp, lg);
  }

  void upload_embedding_segments(const int32_t* inputs, int64_t Tn) {
    // Positions grouped by token id, ascending inside each group: the CPU's summation order.
    std::vector<int32_t> pos(static_cast<size_t>(Tn));
    std::iota(pos.begin(), pos.end(), 0);
    std::stable_sort(pos.begin(), pos.end(),
                     [&](int32_t x, int32_t y) { return inputs[x] < inputs[y]; });
    std::vector<int32_t> ids, seg;
    for (int64_t i = 0; i < Tn; ++i)
      if (i == 0 || inputs[pos[size_t(i)]] != inputs[pos[size_t(i - 1)]]) {
        ids.push_back(inputs[pos[size_t(i)]]);
        seg.push_back(int32_t(i));
      }
    seg.push_back(int32_t(Tn));
    emb_ids.upload(ids.data(), ids.size() * 4);
    emb_seg.upload(seg.data(), seg.size() * 4);
    emb_pos.upload(pos.data(), pos.size() * 4);
    emb_unique = int64_t(ids.size());
  }
  int64_t emb_unique = 0;

  void backward(FlopLedger& lg) {
    lg.elementwise += elementwise_per_pass(Bp);  // the backward kernels mirror them
    // With the weight gradients beside: the FFN's read dresid_mm and dh13, attention-out's
    // dresid_mm_attn (the norm2 backward writes there instead, so that the FFN's is still
    // dresid_mm's), qkv's dqkv_mm. Each buffer has a fence slot (kReads*): marked after the
    // product that reads it is issued to the side stream, waited for right before the default
    // stream next writes the buffer (this layer's norm1 backward for dresid_mm; the next layer's
    // SwiGLU or routed backward, norm2 backward and attention backward for the others). So a
    // layer's qkv and attention-out gradients run beside the next layer's FFN backward; all are
    // joined before the embedding backward.
    wgrad_side = overlapping_wgrad();
    void* dresid_attn = wgrad_side ? dresid_mm_attn.data() : dresid_mm.data();
    // dln holds d(objective)/d(lnf) from the forward's chunked LM head backward.
    check_cuda(cudaMemsetAsync(dresid.data(), 0, size_t(Tp * Dm) * 4, nullptr), "memset dresid");
    // Each rmsnorm backward also writes the residual gradient in mm (dresid_mm), which the next
    // products read.
    k::rmsnorm_backward(dresid.as<float>(), G(final_norm), dln.as<float>(), resid_out.as<float>(),
                        P(final_norm), rstdf.as<float>(), Tp, Dm, col_scratch.as<float>(),
                        dresid_mm.data(), mm, !overwrites(final_norm));
    bucket_written(L + 1);  // the final norm and LM head
    prof.mark("bwd final norm");
    for (int64_t l = L - 1; l >= 0; --l) {
      const LayerParams& q = lp[size_t(l)];
      Acts& x = acts[size_t(l)];
      if (l < a.dense_layers) {
        swiglu_ffn_backward(x.ln2.data(), x.h13.data(), x.act.data(), q.w13, q.w2, Dffn, lg,
                            FlopCategory::dense_ffn);
      } else {
        if (wgrad_side) side->wait(kReadsDh13);  // the routed backward writes dh13 too
        moe_backward(l, lg);
      }
      prof.mark(l < a.dense_layers ? "bwd dense ffn" : "bwd moe rest");
      if (wgrad_side) side->wait(kReadsDresidAttn);  // the later layer's attention-out gradient
      k::rmsnorm_backward(dresid.as<float>(), G(q.norm2), dln.as<float>(), x.mid.as<float>(),
                          P(q.norm2), x.rstd2.as<float>(), Tp, Dm, col_scratch.as<float>(),
                          dresid_attn, mm, !overwrites(q.norm2));
      matmul_backward_mm(datty_mm.data(), q.attn_out, dresid_attn, x.atty.data(), Tp, H * Dh, Dm,
                         lg, FlopCategory::projection);
      if (wgrad_side) side->mark(kReadsDresidAttn);
      prof.mark("bwd norm2 + out proj");
      if (wgrad_side) side->wait(kReadsDqkv);  // the later layer's qkv gradient reads dqkv_mm
      attention_backward(x, lg);
      prof.mark("bwd attention core");
      if (!dqkv_direct())
        k::qkv_prepare_backward(dqkv_mm.data(), mm, dqkv.as<float>(),
                                rope ? rope_table.as<float>() : nullptr, Bp, S, H, Hkv, Dh);
      matmul_backward(dln.as<float>(), false, q.qkv, dqkv_mm.data(), x.ln1.data(), Tp, Dm, W, lg,
                      FlopCategory::projection);
      if (wgrad_side) {
        side->mark(kReadsDqkv);
        side->wait(kReadsDresid);  // this layer's W2 gradient reads the dresid_mm norm1 writes
      }
      k::rmsnorm_backward(dresid.as<float>(), G(q.norm1), dln.as<float>(), x.resid_in.as<float>(),
                          P(q.norm1), x.rstd1.as<float>(), Tp, Dm, col_scratch.as<float>(),
                          l > 0 ? dresid_mm.data() : nullptr, mm,  // layer 0: the embedding
                          !overwrites(q.norm1));
      bucket_written(1 + l);
      prof.mark("bwd qkv + norm1");  // per layer: else the next layer's ffn phase takes it
    }
    if (wgrad_side) side->join();  // every weight gradient, before anything reads them
    wgrad_side = false;
    adds_to(embedding);
    k::embedding_backward(G(embedding), dresid.as<float>(), emb_ids.as<int32_t>(),
                          emb_seg.as<int32_t>(), emb_pos.as<int32_t>(), emb_unique, Dm);
    bucket_written(0);
    prof.mark("bwd embedding");
  }

  void check_tokens(const int32_t* inputs, const int32_t* tgts, int64_t n) const {
    for (int64_t t = 0; t < n; ++t) {
      if (inputs[t] < 0 || inputs[t] >= V)
        throw InputError(
            fmt::format("input token {} at position {} is outside [0, {})", inputs[t], t, V));
      if (tgts[t] >= V)
        throw InputError(
            fmt::format("target token {} at position {} is outside [0, {})", tgts[t], t, V));
    }
  }

  // One step's gradients over step_B sequences, in passes of at most B; every weight gradient
  // adds into `grads`, so the passes accumulate.
  double compute_gradients(const int32_t* inputs, const int32_t* tgts, StepResult* r) {
    const int64_t n_tokens = step_B * S;
    check_tokens(inputs, tgts, n_tokens);
    int64_t bearing = 0;
    for (int64_t t = 0; t < n_tokens; ++t) bearing += tgts[t] >= 0;
    prof.used = 0;  // marks of an evaluation pass since the last step are dropped
    prof.mark("start");
    tiled_pending.clear();
    issue_embedding_update(inputs, n_tokens);  // the last update's embedding, these rows first
    start_gradients();
    FlopLedger lg;
    std::fill(routed.begin(), routed.end(), 0);
    dropped = 0;
    const int world = comm ? comm->info().world_size : 1;
    const bool erc_here = erc_on() && (!comm || comm->info().rank == 0);
    if (erc_on()) {
      settle();  // the ERC loss reads the routers and expert weights
      prof.mark("zero grads");
      erc_step(lg, erc_here, float(world));
      prof.mark("erc loss");
    }
    // Cross-entropy gradient scale: 1/(the job's loss-bearing targets), times W under data
    // parallelism, where the gradients are then averaged over the W ranks; so the gradient is
    // that of the mean over every target of the job however the ranks and passes split it.
    // Auxiliary losses: each pass's weighs by its share of the job's sequences (W·n_p/n_job
    // before the average over ranks); one rank in one pass gets weight 1.
    job_seqs = step_B;
    int64_t job_bearing = bearing;
    if (world > 1) {
      int64_t c[2] = {bearing, step_B};
      comm->all_reduce_sum_host(c, 2);
      job_bearing = c[0];
      job_seqs = c[1];
    }
    const float ce_scale = job_bearing <= 0 ? 0.f
                           : world == 1     ? 1.f / float(job_bearing)
                                            : float(double(world) / double(job_bearing));
    double ce_sum = 0, lb = 0, z = 0;
    reduced_beside = reducing_beside();
    summed_beside = summing_beside();
    if (use_end.empty()) plan_update_stages();  // the buckets
    if (reduced_beside && !red) red = std::make_unique<StagedStream>(1);
    if (summed_beside && !reduced_beside && !nrm) nrm = std::make_unique<StagedStream>(1);
    for (int64_t s0 = 0; s0 < step_B; s0 += B) {
      const int64_t nb = std::min(B, step_B - s0);
      reduce_in_backward = reduced_beside && s0 + B >= step_B;
      sum_in_backward = summed_beside && s0 + B >= step_B;
      aux_grad_w = double(world) * double(nb) / double(job_seqs);
      // The embedding segments first: their host sort runs while the device zeroes the
      // gradients (an upload waits for that).
      upload_embedding_segments(inputs + s0 * S, nb * S);
      upload_tokens(inputs + s0 * S, tgts + s0 * S, nb * S);
      prof.mark("zero grads + upload");
      forward(nb, true, lg, ce_scale);
      backward(lg);
      ce_sum += collect_pass();
      book_tiled_padding(lg);
      const double w = double(nb) / double(step_B);  // this rank's mean over its passes
      for (int64_t i = 0; i < L - a.dense_layers && E > 0; ++i) {
        lb += w * double(aux_host[size_t(2 * i)]);
        z += w * double(aux_host[size_t(2 * i + 1)]);
      }
    }
    aux_grad_w = 1;
    reduce_in_backward = sum_in_backward = false;
    await_reduce();
    check_gradients_written();
    last_ce_sum = ce_sum;
    const double ce = bearing > 0 ? ce_sum / double(bearing) : 0.0;
    const double erc = erc_here ? erc_losses_sum() : 0.0;
    if (r) {
      r->loss = ce;
      r->aux_load_balance = lb;
      r->aux_z = z;
      r->aux_erc = erc;
      r->flops = lg;
      r->routed_per_moe_layer = routed;
      r->dropped_assignments = dropped;
      r->loss_bearing_targets = bearing;
    }
    return ce + lb + z + erc;
  }

  void reduce_over_ranks(StepResult& r) {
    // Gradients: the mean over ranks (scaled for it in compute_gradients). The loss is the job's
    // mean over all loss-bearing targets; the auxiliary losses the ranks' weighted by their
    // shares of the job's sequences. Ledgers and counters are the job's sums.
    if (sharded)  // this rank's chunk of the mean gradient; the rest is not needed
      comm->reduce_scatter_mean(grads.as<float>(), chunk);
    else if (!reduced_beside)  // else averaged bucket by bucket in the backward
      comm->all_reduce_mean(grads.as<float>(), n_params);
    const double share = double(step_B) / double(job_seqs);
    std::vector<double> d = {last_ce_sum, r.aux_load_balance * share, r.aux_z * share, r.aux_erc};
    comm->all_reduce_sum_host(d.data(), int64_t(d.size()));
    r.aux_load_balance = d[1];
    r.aux_z = d[2];
    r.aux_erc = d[3];  // rank 0's (erc_step)
    std::vector<int64_t*> counters{&r.loss_bearing_targets, &r.dropped_assignments};
    for (int64_t& v : r.routed_per_moe_layer) counters.push_back(&v);
    comm->all_reduce_sum_host(r.flops, counters);
    r.loss = r.loss_bearing_targets > 0 ? d[0] / double(r.loss_bearing_targets) : 0.0;
  }
  int64_t job_seqs = 0;  // the step's sequences over all ranks (set by compute_gradients)

  StepResult train_step(const int32_t* inputs, const int32_t* tgts, int64_t step,
                        const OptimConfig& cfg) {
    StepResult r;
    compute_gradients(inputs, tgts, &r);
    if (comm) reduce_over_ranks(r);  // world size 1 too: the same NCCL path
    finish_norm(float(cfg.grad_clip));
    r.lr = scheduled_lr(cfg, step);
    ++adam_steps;
    const double bc1 = 1.0 - std::pow(cfg.beta1, double(adam_steps));
    const double bc2 = 1.0 - std::pow(cfg.beta2, double(adam_steps));
    if (sharded) {  // update this rank's chunk, then every rank takes every chunk
      if (shard_len > 0)  // a tiny model over many ranks leaves the last ones nothing
        k::adamw(P(shard_begin), nullptr, adam_m.as<float>(), adam_v.as<float>(),
                 grads.as<float>() + shard_begin, decay.as<uint8_t>() + shard_begin,
                 norm.as<float>(), shard_len, float(r.lr), float(cfg.beta1), float(cfg.beta2),
                 float(cfg.eps), float(cfg.weight_decay), float(1.0 / bc1), float(1.0 / bc2));
      comm->all_gather(params.as<float>(), chunk);
      refresh_mm_weights();
    } else {
      run_update(norm.as<float>(), float(r.lr), cfg, bc1, bc2);
    }
    prof.mark("all-reduce + grad norm + adamw");
    float nh[2];
    norm.download(nh, 8);
    prof.collect();
    r.grad_norm = double(nh[0]);
    // The AdamW update, as the CPU counts it: each data-parallel rank updates every parameter,
    // or, sharded, its chunk of them.
    r.flops.elementwise += n_params * (comm && !sharded ? comm->info().world_size : 1);
    ledger += r.flops;
    return r;
  }

  double forward_loss(const int32_t* inputs, const int32_t* tgts, int64_t n_seqs,
                      double* per_position) {
    check_tokens(inputs, tgts, n_seqs * S);
    double total = 0;
    int64_t bearing = 0;
    std::vector<float> pl;
    tiled_pending.clear();
    for (int64_t s0 = 0; s0 < n_seqs; s0 += B) {
      const int64_t nb = std::min(B, n_seqs - s0);
      upload_tokens(inputs + s0 * S, tgts + s0 * S, nb * S);
      forward(nb, false, eval_ledger, 0.f);
      const double chunk = collect_pass();
      book_tiled_padding(eval_ledger);
      total += chunk;
      if (per_position) {
        pl.resize(size_t(nb * S));
        losses.download(pl.data(), pl.size() * 4);
        for (int64_t i = 0; i < nb * S; ++i) per_position[s0 * S + i] = double(pl[size_t(i)]);
      }
    }
    for (int64_t t = 0; t < n_seqs * S; ++t) bearing += tgts[t] >= 0;
    return bearing > 0 ? total / double(bearing) : 0.0;
  }
};

Model::Model(const Arch& arch, const ModelOptions& options, uint64_t seed, int64_t batch_seqs,
             DType matmul, Communicator* comm, AttentionPath attention, bool shard_optimizer,
             int64_t logit_rows, ExpertPath experts, int sizing_world)
    : impl_(std::make_unique<Impl>(arch, options, seed, batch_seqs, matmul, comm, attention,
                                   shard_optimizer, logit_rows, experts, sizing_world)) {
  impl_->build_attention_tables();
  impl_->expert_tables.resize(size_t(std::max<int64_t>(arch.moe_layers(), 0)));
  impl_->build_expert_weight_tables();
  if (experts != ExpertPath::grouped) set_expert_path(experts);
  synchronize();
}
Model::~Model() = default;

StepResult Model::train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                             const OptimConfig& cfg) {
  impl_->require_trainable();
  return impl_->train_step(inputs, targets, step, cfg);
}
double Model::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                           double* per_position_loss) {
  return impl_->forward_loss(inputs, targets, n_seqs, per_position_loss);
}
double Model::compute_gradients(const int32_t* inputs, const int32_t* targets, StepResult* result) {
  impl_->require_trainable();
  return impl_->compute_gradients(inputs, targets, result);
}
const std::vector<TensorInfo>& Model::tensors() const {
  return impl_->tensors;
}
std::vector<float> Model::parameters() const {
  impl_->settle();
  std::vector<float> p(size_t(impl_->n_params));
  impl_->params.download(p.data(), p.size() * 4);
  return p;
}
void Model::set_parameters(std::span<const float> values) {
  if (int64_t(values.size()) != impl_->n_params)
    throw InputError(
        fmt::format("set_parameters: {} values for {} parameters", values.size(), impl_->n_params));
  impl_->settle();
  impl_->params.upload(values.data(), values.size() * 4);
  impl_->refresh_mm_weights();
}
std::vector<float> Model::gradients() const {
  impl_->settle();
  std::vector<float> g(size_t(impl_->n_params));
  impl_->grads.download(g.data(), g.size() * 4);
  return g;
}

namespace {
// Version 2 adds the generator's state after the AdamW step count; version 1 (no ERC loss on the
// cuda device then, so nothing was drawn after the initial weights) still loads. Version 3
// counts the ledgers in 128 bits (FlopCount); versions 1 and 2 hold 64-bit counts.
constexpr char kMagic[8] = {'M', 'O', 'E', 'P', 'C', 'U', 'D', '3'};
constexpr char kMagicV2[8] = {'M', 'O', 'E', 'P', 'C', 'U', 'D', '2'};
constexpr char kMagicV1[8] = {'M', 'O', 'E', 'P', 'C', 'U', 'D', '1'};
template <class T>
void put(std::vector<char>& out, const T* p, size_t n) {
  const size_t old = out.size();
  out.resize(old + n * sizeof(T));
  std::memcpy(out.data() + old, p, n * sizeof(T));
}
template <class T>
void get(const std::vector<char>& in, size_t& pos, T* p, size_t n) {
  if (pos + n * sizeof(T) > in.size())
    throw InputError(fmt::format("cuda model state is truncated ({} bytes)", in.size()));
  std::memcpy(p, in.data() + pos, n * sizeof(T));
  pos += n * sizeof(T);
}
}  // namespace

void Model::save_state(std::vector<char>& out) const {
  impl_->require_trainable();
  impl_->settle();
  const Impl& m = *impl_;
  out.clear();
  put(out, kMagic, 8);
  put(out, &m.n_params, 1);
  std::vector<float> buf(size_t(m.n_params));
  for (const DeviceBuffer* b : {&m.params, &m.adam_m, &m.adam_v}) {
    if (m.sharded && b != &m.params) {
      buf = m.gather_moments(*b);
    } else {
      b->download(buf.data(), buf.size() * 4);
    }
    put(out, buf.data(), buf.size());
  }
  put(out, &m.adam_steps, 1);
  put(out, m.rng.state().data(), 4);
  for (const FlopLedger* l : {&m.ledger, &m.eval_ledger}) {
    for (const auto& row : l->flops) put(out, row.data(), row.size());
    put(out, &l->elementwise, 1);
  }
}

void Model::load_state(const std::vector<char>& in) {
  impl_->require_trainable();
  Impl& m = *impl_;
  m.settle();
  size_t pos = 0;
  char magic[8];
  get(in, pos, magic, 8);
  const bool v1 = std::memcmp(magic, kMagicV1, 8) == 0;
  const bool v2 = std::memcmp(magic, kMagicV2, 8) == 0;
  if (!v1 && !v2 && std::memcmp(magic, kMagic, 8) != 0)
    throw InputError("model state does not start with the CUDA model's magic");
  int64_t n = 0;
  get(in, pos, &n, 1);
  if (n != m.n_params)
    throw InputError(
        fmt::format("model state holds {} parameters; this model has {}", n, m.n_params));
  std::vector<float> buf(static_cast<size_t>(n));
  for (DeviceBuffer* b : {&m.params, &m.adam_m, &m.adam_v}) {
    get(in, pos, buf.data(), buf.size());
    if (m.sharded && b != &m.params) {  // this rank's chunk of the moments
      b->fill_zero();
      if (m.shard_len > 0)
        b->upload(buf.data() + m.shard_begin, size_t(m.shard_len) * 4);
    } else {
      b->upload(buf.data(), buf.size() * 4);
    }
  }
  get(in, pos, &m.adam_steps, 1);
  if (!v1) get(in, pos, m.rng.state().data(), 4);
  auto count = [&](FlopCount& c) {
    if (!v1 && !v2) return get(in, pos, &c, 1);
    int64_t v = 0;
    get(in, pos, &v, 1);
    c = v;
  };
  for (FlopLedger* l : {&m.ledger, &m.eval_ledger}) {
    for (auto& row : l->flops)
      for (FlopCount& c : row) count(c);
    count(l->elementwise);
  }
  if (pos != in.size())
    throw InputError(fmt::format("model state has {} trailing bytes", in.size() - pos));
  m.refresh_mm_weights();
}

std::array<uint64_t, 4> Model::rng_state() const {
  return impl_->rng.state();
}
void Model::set_rng_state(const std::array<uint64_t, 4>& state) {
  impl_->rng.state() = state;
}

const FlopLedger& Model::ledger() const {
  return impl_->ledger;
}
const FlopLedger& Model::eval_ledger() const {
  return impl_->eval_ledger;
}
int64_t Model::trainable_params() const {
  return impl_->n_params;
}
int64_t Model::adam_steps() const {
  return impl_->adam_steps;
}
const Arch& Model::arch() const {
  return impl_->a;
}
int64_t Model::batch_seqs() const {
  return impl_->step_B;
}
int64_t Model::pass_seqs() const {
  return impl_->B;
}
int64_t Model::logit_rows() const {
  return impl_->logit_rows;
}
DType Model::matmul_type() const {
  return impl_->mm;
}
void Model::set_profiling(bool on, bool per_kernel) {
  Profiler* p = &impl_->prof;
  if (on && per_kernel) {
    per_kernel_profiler = p;
    launch_hook() = mark_launch;
  } else if (per_kernel_profiler == p) {
    per_kernel_profiler = nullptr;
    launch_hook() = nullptr;
  }
  impl_->prof.on = on;
  impl_->prof.times = PhaseTimes{};
  impl_->prof.used = 0;
}
void Model::set_shared_overlap(bool on) {
  impl_->overlap_shared = on;
}
void Model::set_update_overlap(bool on) {
  impl_->settle();
  impl_->overlap_update = on;
}
bool Model::update_overlap() const {
  return impl_->updating_beside();
}
void Model::set_reduce_overlap(bool on) {
  impl_->overlap_reduce = on;
}
bool Model::reduce_overlap() const {
  return impl_->reducing_beside();
}
void Model::set_norm_overlap(bool on) {
  impl_->overlap_norm = on;
}
bool Model::norm_overlap() const {
  return impl_->summing_beside();
}
void Model::set_weight_grad_overlap(bool on) {
  Impl& m = *impl_;
  m.overlap_wgrad = on;
  if (on && !m.dresid_mm_attn.data()) {
    m.ensure_side();
    m.dresid_mm_attn = m.alloc_mm(m.T * m.Dm);
  }
}
bool Model::weight_grad_overlap() const {
  return impl_->overlapping_wgrad();
}
void Model::set_gemm_table(std::shared_ptr<const GemmTable> table, bool lenient) {
  Impl& m = *impl_;
  m.blas.set_table(table, lenient);  // refuses a table from another device first
  if (m.side_blas) m.side_blas->set_table(table, lenient);
  m.gemm_table = std::move(table);
  m.gemm_lenient = lenient;
}
void Model::record_gemm_shapes(bool on) {
  Impl& m = *impl_;
  m.record_shapes = on;
  m.blas.record_shapes(on);
  if (m.side_blas) m.side_blas->record_shapes(on);
}
std::vector<std::pair<GemmShape, int64_t>> Model::gemm_shapes() const {
  std::vector<std::pair<GemmShape, int64_t>> out = impl_->blas.shapes_seen();
  if (impl_->side_blas) {
    const auto more = impl_->side_blas->shapes_seen();
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}
Blas::Counts Model::gemm_counts() const {
  Blas::Counts c = impl_->blas.counts();
  if (impl_->side_blas) {
    c.products += impl_->side_blas->counts().products;
    c.from_table += impl_->side_blas->counts().from_table;
    c.table_skipped += impl_->side_blas->counts().table_skipped;
  }
  return c;
}
bool Model::shared_overlap() const {
  return impl_->overlapping();
}
std::vector<std::pair<std::string, double>> Model::profile_ms_per_step() const {
  return impl_->prof.times.per_step();
}
void Model::set_expert_path(ExpertPath path) {
  if (Impl::tiled(path) && impl_->mm != DType::bf16)
    throw InputError(fmt::format(
        "expert path '{}' multiplies bf16 inputs; this model multiplies in fp32 (valid: "
        "grouped, loop, batched)",
        path == ExpertPath::tiled      ? "tiled"
        : path == ExpertPath::tiled128 ? "tiled128"
                                       : "wgmma"));
  if (path == ExpertPath::wgmma) {
    const DeviceInfo d = current_device();
    if (!expert_gemm::wgmma_supported(d.compute_major, d.compute_minor))
      throw InputError(fmt::format(
          "expert path 'wgmma' runs on compute capability 9.0 (H100/H200) only; this device "
          "({}) is {}.{} (valid here: tiled, tiled128, grouped, loop, batched)",
          d.name, d.compute_major, d.compute_minor));
    if (impl_->E > 0 && (impl_->Dm % 8 != 0 || impl_->De % 8 != 0))
      throw InputError(fmt::format(
          "expert path 'wgmma' needs d_model ({}) and the expert width ({}) in multiples of 8 "
          "(valid for these shapes: tiled, tiled128, grouped, loop, batched)",
          impl_->Dm, impl_->De));
  }
  if (path == ExpertPath::batched && impl_->E > 0) {
    Impl& m = *impl_;
    m.check_expert_stride();
    // Room for a routing 25 % above uniform; a pass that needs more grows the buffers.
    const int64_t even = (m.T * m.K + m.E - 1) / m.E;
    m.ensure_padded(m.E * ((even + even / 4 + m.kPadRows - 1) / m.kPadRows * m.kPadRows));
  }
  Impl& m = *impl_;
  m.expert_path = path;
  // The routed rows gathered into xg: only the cuBLAS paths read them so; the tiled products
  // read them from ln2 through the sorted assignments.
  for (Impl::Acts& x : m.acts) {
    if (!x.idx.data()) continue;  // not a MoE layer
    if (m.tiled_path())
      x.xg = DeviceBuffer();
    else if (!x.xg.data())
      x.xg = m.alloc_mm(m.T * m.K * m.Dm);
  }
}
void Model::set_router_path(RouterPath path) {
  Impl& m = *impl_;
  if (path == RouterPath::tiled && m.mm != DType::bf16)
    throw InputError(
        "router path 'tiled' multiplies bf16 inputs; this model multiplies in fp32 (valid: "
        "cublas)");
  m.router_path = path;
  if (m.router_tiled() && !m.router_wtab.data()) {
    m.build_router_tables();
    m.router_plan(m.T);  // a whole pass's, before any step
  }
}
RouterPath Model::router_path() const {
  return impl_->router_path;
}
bool Model::fused_attention() const {
  return impl_->flash;
}
ExpertPath Model::expert_path() const {
  return impl_->expert_path;
}
std::vector<int32_t> Model::routed_counts(int64_t layer) const {
  const Impl& m = *impl_;
  if (layer < m.a.dense_layers || layer >= m.L || m.E == 0)
    throw std::out_of_range(fmt::format("routed_counts: layer {} is not a MoE layer", layer));
  std::vector<int32_t> c(size_t(m.E));
  m.acts[size_t(layer)].counts.download(c.data(), c.size() * 4);
  return c;
}
size_t Model::device_bytes() const {
  return impl_->bytes;
}

namespace {
constexpr std::pair<const char*, AttentionPath> kAttention[] = {
    {"cublas", AttentionPath::cublas},
    {"fused", AttentionPath::fused},
    {"fused_mma", AttentionPath::fused_mma},
    {"fused_mma_wide", AttentionPath::fused_mma_wide},
    {"fused_mma_lean", AttentionPath::fused_mma_lean},
    {"fused_wgmma", AttentionPath::fused_wgmma}};
constexpr std::pair<const char*, ExpertPath> kExperts[] = {
    {"grouped", ExpertPath::grouped}, {"loop", ExpertPath::loop},
    {"tiled", ExpertPath::tiled},     {"tiled128", ExpertPath::tiled128},
    {"wgmma", ExpertPath::wgmma},     {"batched", ExpertPath::batched}};
constexpr std::pair<const char*, LaunchMode> kLaunch[] = {{"plain", LaunchMode::plain},
                                                          {"pdl", LaunchMode::programmatic}};
constexpr std::pair<const char*, RouterPath> kRouter[] = {{"cublas", RouterPath::cublas},
                                                          {"tiled", RouterPath::tiled}};

template <class E, size_t N>
E lookup(const std::pair<const char*, E> (&names)[N], const std::string& key,
         const std::string& value) {
  std::string valid = "auto";  // handled by the caller
  for (const auto& [name, e] : names) {
    if (value == name) return e;
    valid += std::string("|") + name;
  }
  throw InputError(
      fmt::format("--kernels: {}={} is not known (valid: {}={})", key, value, key, valid));
}
template <class E, size_t N>
const char* name_of(const std::pair<const char*, E> (&names)[N], E e) {
  for (const auto& [name, v] : names)
    if (v == e) return name;
  return "?";
}
}  // namespace

const char* attention_name(AttentionPath p) {
  return name_of(kAttention, p);
}

// A positive row count, or `auto` (0).
static int64_t parse_logit_rows(const std::string& value) {
  if (value == "auto") return 0;
  int64_t rows = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), rows);
  if (ec != std::errc() || end != value.data() + value.size() || rows <= 0)
    throw InputError(fmt::format(
        "--kernels: logits={} is not a row count (valid: logits=auto or a positive whole number "
        "of token rows, e.g. logits=2048)",
        value));
  return rows;
}

// auto (""), none, builtin, builtin:NAME of a table built in, or a file name.
static std::string parse_gemm_choice(const std::string& value) {
  if (value == "auto") return "";
  if (!value.starts_with("builtin:")) return value;
  const std::string name = value.substr(8);
  std::string names;
  for (const BuiltinGemmTable& b : builtin_gemm_tables()) {
    if (b.name == name) return value;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  throw InputError(fmt::format(
      "--kernels: gemm={} names no built-in GEMM table (built in: {}; valid: gemm=auto, none, "
      "builtin, builtin:NAME or a table file)",
      value, names.empty() ? "none" : names));
}

KernelChoice parse_kernel_choice(const std::string& spec) {
  KernelChoice k;
  constexpr const char* kNames = "attention, experts, logits, gemm, launch, router";
  std::vector<std::string> seen;
  size_t pos = 0;
  while (pos < spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      throw InputError(
          fmt::format("--kernels: '{}' is not name=value (valid names: {})", item, kNames));
    const bool known = key == "attention" || key == "experts" || key == "logits" || key == "gemm" ||
                       key == "launch" || key == "router";
    if (!known || std::find(seen.begin(), seen.end(), key) != seen.end())
      throw InputError(fmt::format("--kernels: '{}' {} (valid names, each at most once: {})", key,
                                   known ? "is given twice" : "is not a kernel name", kNames));
    seen.push_back(key);
    if (key == "attention")
      k.attention = value == "auto" ? std::nullopt : std::optional(lookup(kAttention, key, value));
    else if (key == "experts")
      k.experts = value == "auto" ? std::nullopt : std::optional(lookup(kExperts, key, value));
    else if (key == "logits")
      k.logit_rows = parse_logit_rows(value);
    else if (key == "launch")
      k.launch = value == "auto" ? std::nullopt : std::optional(lookup(kLaunch, key, value));
    else if (key == "router")
      k.router = value == "auto" ? std::nullopt : std::optional(lookup(kRouter, key, value));
    else
      k.gemm_table = parse_gemm_choice(value);
    pos = end + 1;
  }
  return k;
}

std::string to_string(const KernelChoice& k) {
  return fmt::format("attention={},experts={}{}{}{}{}",
                     k.attention ? name_of(kAttention, *k.attention) : "auto",
                     k.experts ? name_of(kExperts, *k.experts) : "auto",
                     k.logit_rows > 0 ? fmt::format(",logits={}", k.logit_rows) : "",
                     k.gemm_table.empty() ? "" : ",gemm=" + k.gemm_table,
                     k.launch == LaunchMode::programmatic ? ",launch=pdl" : "",
                     k.router == RouterPath::tiled ? ",router=tiled" : "");
}

AutoTarget auto_target(const Arch& arch, const DeviceInfo& device) {
  return {.head_dim = arch.head_dim,
          .d_model = arch.d_model,
          .d_expert = arch.is_dense() ? 0 : arch.d_expert,
          .compute_major = device.compute_major,
          .compute_minor = device.compute_minor,
          .shared_optin = device.shared_optin};
}

// The kernels each path runs, as Model chooses them (forward_mma, backward_mma, dkdv_kernel).
std::size_t attention_shared_bytes(AttentionPath path, int64_t Dh) {
  if (path == AttentionPath::cublas || !attention::supported(Dh)) return 0;
  const bool mma_backward = path != AttentionPath::fused && attention::backward_mma_supported(Dh);
  const std::size_t backward = mma_backward ? attention::backward_mma_shared_bytes(Dh)
                                            : attention::backward_shared_bytes(Dh);
  const std::size_t forward =
      path == AttentionPath::fused ? attention::forward_shared_bytes(Dh)
      : path == AttentionPath::fused_wgmma
          ? attention::wgmma_shared_bytes(Dh)
          : attention::forward_mma_shared_bytes(Dh, path == AttentionPath::fused_mma_wide);
  return std::max(forward, backward);
}

KernelChoice resolve_kernels(const KernelChoice& asked, const AutoTarget& t, DType matmul,
                             const AutoOptions& options) {
  KernelChoice k = asked;
  const bool bf16 = matmul == DType::bf16, moe = t.d_expert > 0;
  const bool hopper = expert_gemm::wgmma_supported(t.compute_major, t.compute_minor);
  // A fused path fits where the device allows its kernels' shared memory (or is not known).
  const auto fits = [&](AttentionPath p) {
    return t.shared_optin == 0 || attention_shared_bytes(p, t.head_dim) <= t.shared_optin;
  };
  if (!k.attention)
    k.attention =
        !bf16 ? AttentionPath::cublas
        : options.wgmma_attention && hopper && attention::backward_wgmma_supported(t.head_dim) &&
                fits(AttentionPath::fused_wgmma)
            ? AttentionPath::fused_wgmma
        : attention::backward_mma_supported(t.head_dim) && fits(AttentionPath::fused_mma_lean)
            ? AttentionPath::fused_mma_lean
        : attention::supported(t.head_dim) && fits(AttentionPath::fused_mma)
            ? AttentionPath::fused_mma
            : AttentionPath::cublas;
  if (!k.experts)
    k.experts =
        !bf16 ? ExpertPath::grouped
        : options.wgmma_experts && hopper && moe && t.d_model % 8 == 0 && t.d_expert % 8 == 0
            ? ExpertPath::wgmma
            : ExpertPath::tiled128;
  if (!k.launch)
    k.launch = options.pdl && t.compute_major >= 9 ? LaunchMode::programmatic : LaunchMode::plain;
  if (!k.router)
    k.router = options.tiled_router && bf16 && moe ? RouterPath::tiled : RouterPath::cublas;
  return k;
}

}  // namespace moeplan::backend::cuda
