// The CPU reference model: parameter layout, activation buffers (allocated once), the forward and
// backward passes as sequences of layer calls, AdamW, and the checkpointable state.
#include "moeplan/backend/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "eigen_types.hpp"
#include "erc.hpp"
#include "layers.hpp"
#include "moe.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/backend/phase_times.hpp"
#include "parallel.hpp"
#include "rng.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace moeplan::backend {

using namespace cpu;

namespace cpu {
SerialScope::SerialScope(bool serial) {
  if (!serial) return;
  previous_eigen_ = Eigen::nbThreads();
  Eigen::setNbThreads(1);
#ifdef _OPENMP
  previous_ = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
}
SerialScope::~SerialScope() {
  if (previous_eigen_ > 0) Eigen::setNbThreads(previous_eigen_);
#ifdef _OPENMP
  if (previous_ > 0) omp_set_num_threads(previous_);
#endif
}
}  // namespace cpu

double scheduled_lr(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr_peak * double(step + 1) / double(c.warmup_steps);
  const int64_t decay_steps = c.total_steps - c.warmup_steps;
  if (decay_steps <= 0) return c.lr_peak;
  const double progress = std::min(1.0, double(step - c.warmup_steps) / double(decay_steps));
  return c.lr_min + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr_peak - c.lr_min);
}

namespace {

// Offsets of one layer's tensors in the flat parameter vector (−1 when absent).
struct LayerParams {
  int64_t norm1 = -1, qkv = -1, attn_out = -1, norm2 = -1;
  int64_t w13 = -1, w2 = -1;  // dense FFN
  int64_t router = -1, shared_w13 = -1, shared_w2 = -1;
  std::vector<int64_t> expert_w13, expert_w2;  // routed experts
};

}  // namespace

// Model::set_profiling's clock: the host time between two marks goes to the later mark's name
// (the products are synchronous here, so it is the work's own), added up over the steps since
// it was switched on.
struct PhaseClock {
  bool on = false;
  std::chrono::steady_clock::time_point last;
  PhaseTimes times;
  void start() {
    if (on) last = std::chrono::steady_clock::now();
  }
  void mark(const char* name) {
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    times.add(name, std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  }
};

template <class S>
struct Model<S>::Impl {
  Arch a;
  ModelOptions opt;
  // B: sequences one forward/backward pass holds (the activations' size); step_B: sequences a
  // train_step reads (B·passes, the last pass possibly shorter).
  int64_t step_B = 0;
  int64_t B = 0, seq = 0, Dm = 0, H = 0, Hkv = 0, Dh = 0, Wqkv = 0, V = 0, E = 0, K = 0, De = 0,
          Dse = 0, Dffn = 0, L = 0;
  bool rope = false, serial = false;
  int threads = 1;

  std::vector<TensorInfo> tensors;
  std::vector<LayerParams> lp;
  int64_t embedding = 0, final_norm = 0, lm_head = -1;
  Buffer<S> params, grads, adam_m, adam_v;
  int64_t adam_steps = 0;
  Rng rng;
  FlopLedger ledger, eval_ledger;
  bool erc_frozen = false, erc_drawn = false;

  Buffer<S> slopes;   // (H) ALiBi
  Buffer<S> cos_sin;  // (S, Dh/2, 2) RoPE

  // Activations, per layer, saved for backward. T = B·S tokens.
  struct Acts {
    Buffer<S> ln1, rstd1, qkv, att, atty, mid, ln2, rstd2;  // (T,Dm) (T) (T,Wqkv)
                                                            // (B,H,S,S) (T,H·Dh) (T,Dm)..
    Buffer<S> h13, act;        // dense (T,2Dffn) (T,Dffn); routed (T·K,2De) (T·K,De)
    Buffer<S> probs, lse;      // (T,E) (T)
    std::vector<int32_t> idx;  // (T,K)
    Buffer<S> gate;            // (T,K)
    std::vector<int32_t> slot_row, row_token;        // (T·K) (T·K)
    std::vector<int64_t> assigned, offsets, cursor;  // (E) (E+1) (E)
    Buffer<S> xg, ye;                                // (T·K,Dm) (T·K,Dm)
    Buffer<S> sh13, sact;                            // (T,2Dse) (T,Dse)
    std::vector<double> lb_dp;                       // (E) λ·E·f_i/T
    Buffer<S> erc_delta;                             // (E,Dm)
  };
  std::vector<Buffer<S>> resid;  // L+1 × (T,Dm): input of each layer, then the final one
  std::vector<Acts> acts;
  Buffer<S> lnf, rstdf, logits;  // (T,Dm) (T) (T,V)
  std::vector<double> losses;    // (T)
  // Backward scratch, shared by all layers (sized for the widest).
  Buffer<S> dresid, dln, dqkv, datty, dh13, dact, dye, dxg, dlog, dgate, att_scratch;
  // ERC scratch.
  Buffer<S> erc_rt, erc_drt, erc_act, erc_m, erc_dm;
  std::vector<S*> erc_dw13;
  std::vector<const S*> erc_w13;
  // Per-step outputs.
  std::vector<int64_t> routed;
  std::vector<FlopLedger> expert_ledgers;  // (E)
  int64_t dropped = 0;
  double aux_lb = 0, aux_z = 0;
  double aux_w = 1;  // the current pass's weight in the auxiliary losses (its share of the batch)
  PhaseClock clock;  // set_profiling; marks in training passes only (an evaluation's are not)
  // A phase of a training pass ends (forward() serves evaluations too, which are not timed).
  void mark(bool train, const char* name) {
    if (train) clock.mark(name);
  }

  S* P(int64_t off) { return params.data() + off; }
  S* G(int64_t off) { return grads.data() + off; }

  int64_t add_tensor(const std::string& name, int64_t rows, int64_t cols, bool decay) {
    const int64_t off = tensors.empty() ? 0 : tensors.back().offset + tensors.back().size();
    tensors.push_back({name, off, rows, cols, decay});
    return off;
  }

  // weights_only: the layout and the initial weights alone (Model::initial_weights), without
  // gradients, AdamW moments and activations; layout_only: the layout alone, no weights drawn.
  Impl(const Arch& arch, const ModelOptions& o, uint64_t seed, int64_t batch_seqs,
       bool weights_only = false, bool layout_only = false)
      : a(arch), opt(o), rng(seed) {
    validate(arch);
    if (o.positions != "alibi" && o.positions != "rope")
      throw InputError(fmt::format("positions '{}' is not one of: alibi, rope", o.positions));
    if (batch_seqs < 1)
      throw InputError(fmt::format("batch_seqs {} must be at least 1", batch_seqs));
    if (o.positions == "rope" && arch.head_dim % 2 != 0)
      throw InputError(fmt::format("RoPE needs an even head_dim, got {}", arch.head_dim));
    if (o.capacity_factor < 0)
      throw InputError(fmt::format("capacity_factor {} must be >= 0", o.capacity_factor));
    if (o.micro_batch_seqs < 0)
      throw InputError(fmt::format("micro_batch_seqs {} must be >= 0 (0: the whole batch in one pass)",
                                   o.micro_batch_seqs));
    step_B = batch_seqs;
    B = o.micro_batch_seqs > 0 ? std::min(o.micro_batch_seqs, batch_seqs) : batch_seqs;
    seq = a.seq_len;
    Dm = a.d_model;
    H = a.heads;
    Hkv = a.kv_heads;
    Dh = a.head_dim;
    Wqkv = (H + 2 * Hkv) * Dh;
    V = a.vocab;
    E = a.experts;
    K = a.top_k;
    De = a.d_expert;
    Dse = a.d_shared;
    Dffn = a.d_ffn;
    L = a.layers;
    rope = o.positions == "rope";
    const int64_t T = B * seq;
    serial = T * Dm < kParallelStream;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif

    // Parameter layout.
    embedding = add_tensor("embedding", V, Dm, true);
    lp.resize(L);
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("layer{}.", l);
      LayerParams& q = lp[l];
      q.norm1 = add_tensor(p + "norm1", 1, Dm, false);
      q.qkv = add_tensor(p + "qkv", Dm, Wqkv, true);
      q.attn_out = add_tensor(p + "attn_out", H * Dh, Dm, true);
      q.norm2 = add_tensor(p + "norm2", 1, Dm, false);
      if (l < a.dense_layers) {
        q.w13 = add_tensor(p + "ffn.w13", Dm, 2 * Dffn, true);
        q.w2 = add_tensor(p + "ffn.w2", Dffn, Dm, true);
        continue;
      }
      q.router = add_tensor(p + "router", E, Dm, true);
      for (int64_t e = 0; e < E; ++e) {
        q.expert_w13.push_back(add_tensor(fmt::format("{}expert{}.w13", p, e), Dm, 2 * De, true));
        q.expert_w2.push_back(add_tensor(fmt::format("{}expert{}.w2", p, e), De, Dm, true));
      }
      if (Dse > 0) {
        q.shared_w13 = add_tensor(p + "shared.w13", Dm, 2 * Dse, true);
        q.shared_w2 = add_tensor(p + "shared.w2", Dse, Dm, true);
      }
    }
    final_norm = add_tensor("final_norm", 1, Dm, false);
    if (!a.tied_embeddings) lm_head = add_tensor("lm_head", Dm, V, true);
    if (layout_only) return;
    const int64_t n = tensors.back().offset + tensors.back().size();
    params.assign(n, S(0));

    // Init: N(0, 0.02); residual-output projections scaled by 1/sqrt(2L) (GPT-2); norms 1.
    for (const TensorInfo& t : tensors) {
      const bool is_norm = !t.weight_decay;
      const bool residual_out = t.name.ends_with("attn_out") || t.name.ends_with("w2");
      const double std = residual_out ? 0.02 / std::sqrt(2.0 * double(L)) : 0.02;
      for (int64_t i = 0; i < t.size(); ++i)
        params[t.offset + i] = is_norm ? S(1) : S(std * rng.normal());
    }
    if (weights_only) return;
    grads.assign(n, S(0));
    adam_m.assign(n, S(0));
    adam_v.assign(n, S(0));

    // Position tables.
    if (rope) {
      cos_sin.resize(seq * Dh);
      for (int64_t p = 0; p < seq; ++p)
        for (int64_t i = 0; i < Dh / 2; ++i) {
          const double theta = double(p) * std::pow(10000.0, -2.0 * double(i) / double(Dh));
          cos_sin[(p * Dh / 2 + i) * 2] = S(std::cos(theta));
          cos_sin[(p * Dh / 2 + i) * 2 + 1] = S(std::sin(theta));
        }
    } else {
      std::vector<double> s(H);
      alibi_slopes(s.data(), H);
      slopes.assign(s.begin(), s.end());
    }

    // Activations and scratch, sized once.
    activation_buffers([](auto& buffer, int64_t n) { buffer.resize(std::size_t(n)); });
    for (int64_t l = a.dense_layers; l < L; ++l)
      std::fill(acts[l].erc_delta.begin(), acts[l].erc_delta.end(), S(1));
    routed.assign(a.moe_layers(), 0);
    expert_ledgers.resize(E);
  }

  // Every activation and scratch buffer one pass of B sequences holds, each given to
  // take(buffer, elements): the constructor sizes them so, and Model::memory_need counts them so,
  // from the one list.
  template <class Take>
  void activation_buffers(Take&& take) {
    const int64_t T = B * seq;
    resid.resize(L + 1);
    for (Buffer<S>& r : resid) take(r, T * Dm);
    acts.resize(L);
    int64_t widest_h = 0, widest_rows_dm = 0;
    for (int64_t l = 0; l < L; ++l) {
      Acts& x = acts[l];
      take(x.ln1, T * Dm);
      take(x.rstd1, T);
      take(x.qkv, T * Wqkv);
      take(x.att, B * H * seq * seq);
      take(x.atty, T * H * Dh);
      take(x.mid, T * Dm);
      take(x.ln2, T * Dm);
      take(x.rstd2, T);
      if (l < a.dense_layers) {
        take(x.h13, T * 2 * Dffn);
        take(x.act, T * Dffn);
        widest_h = std::max(widest_h, T * Dffn);
        continue;
      }
      take(x.h13, T * K * 2 * De);
      take(x.act, T * K * De);
      take(x.probs, T * E);
      take(x.lse, T);
      take(x.idx, T * K);
      take(x.gate, T * K);
      take(x.slot_row, T * K);
      take(x.row_token, T * K);
      take(x.assigned, E);
      take(x.offsets, E + 1);
      take(x.cursor, E);
      take(x.xg, T * K * Dm);
      take(x.ye, T * K * Dm);
      take(x.sh13, T * 2 * Dse);
      take(x.sact, T * Dse);
      take(x.lb_dp, E);
      take(x.erc_delta, E * Dm);  // the constructor fills it with 1
      widest_h = std::max({widest_h, T * K * De, T * Dse});
      widest_rows_dm = T * K * Dm;
    }
    take(lnf, T * Dm);
    take(rstdf, T);
    take(logits, T * V);
    take(losses, T);
    take(dresid, T * Dm);
    take(dln, T * Dm);
    take(dqkv, T * Wqkv);
    take(datty, T * H * Dh);
    take(dh13, 2 * widest_h);
    take(dact, widest_h);
    take(dye, widest_rows_dm);
    take(dxg, widest_rows_dm);
    take(dlog, T * E);
    take(dgate, T * K);
    take(att_scratch, int64_t(threads) * seq * seq);
    if (E > 0) {
      take(erc_rt, E * Dm);
      take(erc_drt, E * Dm);
      take(erc_act, E * E * De);
      take(erc_m, E * E);
      take(erc_dm, E * E);
      take(erc_dw13, E);
      take(erc_w13, E);
    }
  }

  void check_tokens(const int32_t* inputs, const int32_t* targets, int64_t T) const {
    for (int64_t t = 0; t < T; ++t) {
      if (inputs[t] < 0 || inputs[t] >= V)
        throw InputError(
            fmt::format("input token {} at position {} is outside [0, {})", inputs[t], t, V));
      if (targets[t] >= V)
        throw InputError(
            fmt::format("target token {} at position {} is outside [0, {})", targets[t], t, V));
    }
  }

  // Runs fn(expert, first_row, rows, ledger) for every expert. With many experts each one is a
  // task (its products single-threaded inside): one barrier instead of one per small product.
  // Each expert records into its own ledger, summed in expert order afterwards.
  template <class Fn>
  void for_each_expert(const int64_t* offsets, FlopLedger& lg, Fn&& fn) {
    for (FlopLedger& el : expert_ledgers) el = FlopLedger{};
    const bool tasks = !serial && E >= 2 * int64_t(threads);
#pragma omp parallel for schedule(dynamic, 1) if (tasks)
    for (int64_t e = 0; e < E; ++e)
      fn(e, offsets[e], offsets[e + 1] - offsets[e], expert_ledgers[e]);
    for (const FlopLedger& el : expert_ledgers) lg += el;
  }

  void moe_forward(int64_t l, int64_t nb, S* out, bool train, FlopLedger& lg) {
    const int64_t T = nb * seq;
    const LayerParams& q = lp[l];
    Acts& x = acts[l];
    matmul_wt_forward(x.probs.data(), x.ln2.data(), P(q.router), T, Dm, E, lg,
                      FlopCategory::router);
    router_forward(x.probs.data(), x.lse.data(), x.idx.data(), x.gate.data(), T, E, K,
                   opt.renormalize_gates);
    const int64_t cap = expert_capacity(opt.capacity_factor, T, K, E);  // per pass
    const int64_t drop =
        dispatch(x.assigned.data(), x.offsets.data(), x.cursor.data(), x.slot_row.data(),
                 x.row_token.data(), x.idx.data(), T, E, K, cap);
    const int64_t R = x.offsets[E];
    gather_rows(x.xg.data(), x.ln2.data(), x.row_token.data(), R, Dm);
    mark(train, "fwd router + sort");
    for_each_expert(x.offsets.data(), lg, [&](int64_t e, int64_t o, int64_t rows, FlopLedger& el) {
      matmul_forward(x.h13.data() + o * 2 * De, x.xg.data() + o * Dm, P(q.expert_w13[e]), rows, Dm,
                     2 * De, false, el, FlopCategory::expert);
      swiglu_forward(x.act.data() + o * De, x.h13.data() + o * 2 * De, rows, De);
      matmul_forward(x.ye.data() + o * Dm, x.act.data() + o * De, P(q.expert_w2[e]), rows, De, Dm,
                     false, el, FlopCategory::expert);
    });
    mark(train, "fwd routed experts");
    if (Dse > 0) {
      matmul_forward(x.sh13.data(), x.ln2.data(), P(q.shared_w13), T, Dm, 2 * Dse, false, lg,
                     FlopCategory::shared_expert);
      swiglu_forward(x.sact.data(), x.sh13.data(), T, Dse);
      matmul_forward(out, x.sact.data(), P(q.shared_w2), T, Dse, Dm, true, lg,
                     FlopCategory::shared_expert);
    }
    combine_forward(out, x.ye.data(), x.gate.data(), x.slot_row.data(), T, K, Dm);
    if (!train) return;
    const int64_t moe_index = l - a.dense_layers;
    routed[moe_index] += R;
    dropped += drop;
    // Load balance λ·E·Σ f_i·P_i (f_i from assignments before any drop) and z-loss, summed
    // in a fixed order.
    double lb = 0;
    for (int64_t e = 0; e < E; ++e) {
      double p_mean = 0;
      for (int64_t t = 0; t < T; ++t) p_mean += double(x.probs[t * E + e]);
      p_mean /= double(T);
      const double f = double(x.assigned[e]) / double(T * K);
      lb += f * p_mean;
      x.lb_dp[e] = aux_w * opt.load_balance * double(E) * f / double(T);
    }
    aux_lb += aux_w * opt.load_balance * double(E) * lb;
    if (opt.z_loss > 0) {
      double z = 0;
      for (int64_t t = 0; t < T; ++t) z += double(x.lse[t]) * double(x.lse[t]);
      aux_z += aux_w * opt.z_loss * z / double(T);
    }
  }

  // Returns the summed cross-entropy over loss-bearing targets; fills losses (T).
  double forward(const int32_t* inputs, const int32_t* targets, int64_t nb, bool train,
                 FlopLedger& lg) {
    const int64_t T = nb * seq;
    embedding_forward(resid[0].data(), inputs, P(embedding), T, Dm);
    mark(train, "fwd embedding");
    for (int64_t l = 0; l < L; ++l) {
      const LayerParams& q = lp[l];
      Acts& x = acts[l];
      rmsnorm_forward(x.ln1.data(), x.rstd1.data(), resid[l].data(), P(q.norm1), T, Dm);
      matmul_forward(x.qkv.data(), x.ln1.data(), P(q.qkv), T, Dm, Wqkv, false, lg,
                     FlopCategory::projection);
      if (rope) rope_forward(x.qkv.data(), cos_sin.data(), nb, seq, H, Hkv, Dh);
      mark(train, "fwd norm1 + qkv");
      attention_forward(x.atty.data(), x.att.data(), x.qkv.data(), rope ? nullptr : slopes.data(),
                        nb, seq, H, Hkv, Dh, lg);
      mark(train, "fwd attention core");
      std::copy_n(resid[l].data(), T * Dm, x.mid.data());
      matmul_forward(x.mid.data(), x.atty.data(), P(q.attn_out), T, H * Dh, Dm, true, lg,
                     FlopCategory::projection);
      rmsnorm_forward(x.ln2.data(), x.rstd2.data(), x.mid.data(), P(q.norm2), T, Dm);
      S* out = resid[l + 1].data();
      std::copy_n(x.mid.data(), T * Dm, out);
      mark(train, "fwd out proj + norm2");
      if (l < a.dense_layers) {
        matmul_forward(x.h13.data(), x.ln2.data(), P(q.w13), T, Dm, 2 * Dffn, false, lg,
                       FlopCategory::dense_ffn);
        swiglu_forward(x.act.data(), x.h13.data(), T, Dffn);
        matmul_forward(out, x.act.data(), P(q.w2), T, Dffn, Dm, true, lg, FlopCategory::dense_ffn);
        mark(train, "fwd dense ffn");
      } else {
        moe_forward(l, nb, out, train, lg);
        mark(train, "fwd moe rest");  // the shared expert, the combine, the auxiliary losses
      }
    }
    lg.elementwise += elementwise_per_pass(nb);
    rmsnorm_forward(lnf.data(), rstdf.data(), resid[L].data(), P(final_norm), T, Dm);
    mark(train, "fwd final norm");
    if (lm_head >= 0)
      matmul_forward(logits.data(), lnf.data(), P(lm_head), T, Dm, V, false, lg,
                     FlopCategory::lm_head);
    else
      matmul_wt_forward(logits.data(), lnf.data(), P(embedding), T, Dm, V, lg,
                        FlopCategory::lm_head);
    mark(train, "fwd lm head");
    const double ce = crossentropy_forward(logits.data(), losses.data(), targets, T, V);
    mark(train, "cross-entropy");
    return ce;
  }

  // Element-wise work of one pass (layers.hpp), with this pass's routed rows per MoE layer.
  int64_t elementwise_per_pass(int64_t nb) const {
    std::vector<int64_t> routed;
    for (int64_t l = a.dense_layers; l < L; ++l) routed.push_back(acts[l].offsets[E]);
    return cpu::elementwise_per_pass(a, nb, rope, routed);
  }

  void moe_backward(int64_t l, int64_t nb, FlopLedger& lg) {
    const int64_t T = nb * seq;
    const LayerParams& q = lp[l];
    Acts& x = acts[l];
    if (Dse > 0) {
      matmul_backward(dact.data(), false, G(q.shared_w2), dresid.data(), x.sact.data(),
                      P(q.shared_w2), T, Dse, Dm, lg, FlopCategory::shared_expert);
      swiglu_backward(dh13.data(), dact.data(), x.sh13.data(), T, Dse);
      matmul_backward(dln.data(), false, G(q.shared_w13), dh13.data(), x.ln2.data(),
                      P(q.shared_w13), T, Dm, 2 * Dse, lg, FlopCategory::shared_expert);
    } else {
      std::fill_n(dln.data(), T * Dm, S(0));
    }
    combine_backward(dye.data(), dgate.data(), dresid.data(), x.ye.data(), x.gate.data(),
                     x.slot_row.data(), T, K, Dm);
    clock.mark("bwd shared expert + combine");
    for_each_expert(x.offsets.data(), lg, [&](int64_t e, int64_t o, int64_t rows, FlopLedger& el) {
      matmul_backward(dact.data() + o * De, false, G(q.expert_w2[e]), dye.data() + o * Dm,
                      x.act.data() + o * De, P(q.expert_w2[e]), rows, De, Dm, el,
                      FlopCategory::expert);
      swiglu_backward(dh13.data() + o * 2 * De, dact.data() + o * De, x.h13.data() + o * 2 * De,
                      rows, De);
      matmul_backward(dxg.data() + o * Dm, false, G(q.expert_w13[e]), dh13.data() + o * 2 * De,
                      x.xg.data() + o * Dm, P(q.expert_w13[e]), rows, Dm, 2 * De, el,
                      FlopCategory::expert);
    });
    clock.mark("bwd routed experts");
    scatter_add_rows(dln.data(), dxg.data(), x.slot_row.data(), T, K, Dm);
    router_backward(dlog.data(), x.probs.data(), x.lse.data(), x.idx.data(), x.gate.data(),
                    dgate.data(), x.lb_dp.data(), 2.0 * aux_w * opt.z_loss / double(T), T, E, K,
                    opt.renormalize_gates);
    matmul_wt_backward(dln.data(), true, G(q.router), dlog.data(), x.ln2.data(), P(q.router), T, Dm,
                       E, lg, FlopCategory::router);
    clock.mark("bwd moe rest");  // the scatter back, the router's backward
  }

  void backward(int64_t nb, const int32_t* inputs, const int32_t* targets, double ce_scale,
                FlopLedger& lg) {
    const int64_t T = nb * seq;
    lg.elementwise += elementwise_per_pass(nb);  // the backward kernels mirror them
    crossentropy_backward(logits.data(), targets, ce_scale, T, V);
    clock.mark("cross-entropy");
    if (lm_head >= 0)
      matmul_backward(dln.data(), false, G(lm_head), logits.data(), lnf.data(), P(lm_head), T, Dm,
                      V, lg, FlopCategory::lm_head);
    else
      matmul_wt_backward(dln.data(), false, G(embedding), logits.data(), lnf.data(), P(embedding),
                         T, Dm, V, lg, FlopCategory::lm_head);
    clock.mark("bwd lm head");
    std::fill(dresid.begin(), dresid.end(), S(0));
    rmsnorm_backward(dresid.data(), G(final_norm), dln.data(), resid[L].data(), P(final_norm),
                     rstdf.data(), T, Dm);
    clock.mark("bwd final norm");
    for (int64_t l = L - 1; l >= 0; --l) {
      const LayerParams& q = lp[l];
      Acts& x = acts[l];
      // dresid holds d/d(layer output); the residual passes it through to mid unchanged.
      if (l < a.dense_layers) {
        matmul_backward(dact.data(), false, G(q.w2), dresid.data(), x.act.data(), P(q.w2), T, Dffn,
                        Dm, lg, FlopCategory::dense_ffn);
        swiglu_backward(dh13.data(), dact.data(), x.h13.data(), T, Dffn);
        matmul_backward(dln.data(), false, G(q.w13), dh13.data(), x.ln2.data(), P(q.w13), T, Dm,
                        2 * Dffn, lg, FlopCategory::dense_ffn);
        clock.mark("bwd dense ffn");
      } else {
        moe_backward(l, nb, lg);
      }
      rmsnorm_backward(dresid.data(), G(q.norm2), dln.data(), x.mid.data(), P(q.norm2),
                       x.rstd2.data(), T, Dm);
      matmul_backward(datty.data(), false, G(q.attn_out), dresid.data(), x.atty.data(),
                      P(q.attn_out), T, H * Dh, Dm, lg, FlopCategory::projection);
      clock.mark("bwd norm2 + out proj");
      attention_backward(dqkv.data(), datty.data(), x.qkv.data(), x.att.data(), att_scratch.data(),
                         threads, nb, seq, H, Hkv, Dh, lg);
      clock.mark("bwd attention core");
      if (rope) rope_backward(dqkv.data(), cos_sin.data(), nb, seq, H, Hkv, Dh);
      matmul_backward(dln.data(), false, G(q.qkv), dqkv.data(), x.ln1.data(), P(q.qkv), T, Dm, Wqkv,
                      lg, FlopCategory::projection);
      rmsnorm_backward(dresid.data(), G(q.norm1), dln.data(), resid[l].data(), P(q.norm1),
                       x.rstd1.data(), T, Dm);
      clock.mark("bwd qkv + norm1");
    }
    embedding_backward(G(embedding), dresid.data(), inputs, T, Dm);
    clock.mark("bwd embedding");
  }

  double erc(FlopLedger& lg) {
    double total = 0;
    for (int64_t l = a.dense_layers; l < L; ++l) {
      const LayerParams& q = lp[l];
      Acts& x = acts[l];
      if (!erc_frozen || !erc_drawn) erc_draw_noise(x.erc_delta.data(), P(q.router), E, Dm, rng);
      for (int64_t e = 0; e < E; ++e) {
        erc_w13[e] = P(q.expert_w13[e]);
        erc_dw13[e] = G(q.expert_w13[e]);
      }
      total += erc_forward_backward(G(q.router), erc_dw13.data(), P(q.router), erc_w13.data(),
                                    x.erc_delta.data(), erc_rt.data(), erc_drt.data(),
                                    erc_act.data(), erc_m.data(), erc_dm.data(), E, Dm, De,
                                    opt.erc_alpha, opt.erc_loss, lg);
    }
    erc_drawn = true;
    return total;
  }

  // One step's gradients over step_B sequences, in passes of at most B sequences; the weight
  // gradients accumulate across passes (every backward product adds into them).
  double compute_gradients(const int32_t* inputs, const int32_t* targets, StepResult* r) {
    const int64_t T = step_B * seq;
    clock.start();
    check_tokens(inputs, targets, T);
    std::fill(grads.begin(), grads.end(), S(0));
    clock.mark("zero grads");
    FlopLedger lg;
    dropped = 0;
    aux_lb = aux_z = 0;
    std::fill(routed.begin(), routed.end(), 0);
    int64_t bearing = 0;
    for (int64_t t = 0; t < T; ++t) bearing += targets[t] >= 0;
    const double aux_erc = (opt.erc_loss > 0 && a.moe_layers() > 0) ? erc(lg) : 0.0;
    if (opt.erc_loss > 0 && a.moe_layers() > 0) clock.mark("erc loss");
    const double ce_scale = bearing > 0 ? 1.0 / double(bearing) : 0.0;
    double ce_sum = 0;
    for (int64_t s0 = 0; s0 < step_B; s0 += B) {
      const int64_t nb = std::min(B, step_B - s0);
      aux_w = double(nb) / double(step_B);
      const int32_t* in = inputs + s0 * seq;
      const int32_t* tg = targets + s0 * seq;
      ce_sum += forward(in, tg, nb, true, lg);
      backward(nb, in, tg, ce_scale, lg);
    }
    aux_w = 1;
    const double ce = bearing > 0 ? ce_sum / double(bearing) : 0.0;
    if (r) {
      r->loss = ce;
      r->aux_load_balance = aux_lb;
      r->aux_z = aux_z;
      r->aux_erc = aux_erc;
      r->flops = lg;
      r->routed_per_moe_layer = routed;
      r->dropped_assignments = dropped;
      r->loss_bearing_targets = bearing;
    }
    return ce + aux_lb + aux_z + aux_erc;
  }

  // Global L2 norm in a fixed chunking, so the sum order never depends on the thread count.
  double grad_norm() const {
    constexpr int64_t kChunks = 64;
    const int64_t n = int64_t(grads.size()), chunk = (n + kChunks - 1) / kChunks;
    double part[kChunks] = {};
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
    for (int64_t c = 0; c < kChunks; ++c) {
      double s = 0;
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i)
        s += double(grads[i]) * double(grads[i]);
      part[c] = s;
    }
    double total = 0;
    for (double p : part) total += p;
    return std::sqrt(total);
  }

  void adamw(const OptimConfig& c, double lr, double grad_scale) {
    ++adam_steps;
    const double bc1 = 1.0 - std::pow(c.beta1, double(adam_steps));
    const double bc2 = 1.0 - std::pow(c.beta2, double(adam_steps));
    const S b1 = S(c.beta1), b2 = S(c.beta2), gs = S(grad_scale), eps = S(c.eps), slr = S(lr);
    const S ibc1 = S(1.0 / bc1), ibc2 = S(1.0 / bc2);
    for (const TensorInfo& t : tensors) {
      const S wd = t.weight_decay ? S(c.weight_decay) : S(0);
      S* p = P(t.offset);
      const S* g = grads.data() + t.offset;
      S* m = adam_m.data() + t.offset;
      S* v = adam_v.data() + t.offset;
      const int64_t n = t.size();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
      for (int64_t i = 0; i < n; ++i) {
        const S gi = g[i] * gs;
        m[i] = b1 * m[i] + (S(1) - b1) * gi;
        v[i] = b2 * v[i] + (S(1) - b2) * gi * gi;
        const S mh = m[i] * ibc1, vh = v[i] * ibc2;
        p[i] -= slr * (mh / (std::sqrt(vh) + eps) + wd * p[i]);
      }
    }
  }
};

template <class S>
Model<S>::Model(const Arch& arch, const ModelOptions& options, uint64_t seed, int64_t batch_seqs)
    : impl_(std::make_unique<Impl>(arch, options, seed, batch_seqs)) {}

template <class S>
typename Model<S>::MemoryNeed Model<S>::memory_need(const Arch& arch, const ModelOptions& options,
                                                    int64_t batch_seqs) {
  Impl impl(arch, options, 0, batch_seqs, true, true);  // the layout alone: nothing allocated
  MemoryNeed need;
  if (!impl.tensors.empty())
    need.state =
        4 * std::size_t(impl.tensors.back().offset + impl.tensors.back().size()) * sizeof(S);
  impl.activation_buffers([&need](auto& buffer, int64_t n) {
    need.activations +=
        std::size_t(n) * sizeof(typename std::decay_t<decltype(buffer)>::value_type);
  });
  return need;
}

template <class S>
typename Model<S>::InitialWeights Model<S>::initial_weights(const Arch& arch,
                                                            const ModelOptions& options,
                                                            uint64_t seed, bool layout_only) {
  auto impl = std::make_shared<Impl>(arch, options, seed, 1, true, layout_only);
  InitialWeights w;
  w.tensors = impl->tensors;
  w.rng_state = impl->rng.state();
  w.params = std::span<const S>(impl->params.data(), impl->params.size());
  w.owner = impl;
  return w;
}
template <class S>
Model<S>::~Model() = default;
template <class S>
Model<S>::Model(Model&&) noexcept = default;
template <class S>
Model<S>& Model<S>::operator=(Model&&) noexcept = default;

template <class S>
double Model<S>::compute_gradients(const int32_t* inputs, const int32_t* targets,
                                   StepResult* result) {
  SerialScope serial(impl_->serial);
  return impl_->compute_gradients(inputs, targets, result);
}

template <class S>
StepResult Model<S>::train_step(const int32_t* inputs, const int32_t* targets, int64_t step,
                                const OptimConfig& cfg) {
  SerialScope serial(impl_->serial);
  StepResult r;
  impl_->compute_gradients(inputs, targets, &r);
  r.grad_norm = impl_->grad_norm();
  const double scale =
      (cfg.grad_clip > 0 && r.grad_norm > cfg.grad_clip) ? cfg.grad_clip / r.grad_norm : 1.0;
  r.lr = scheduled_lr(cfg, step);
  impl_->adamw(cfg, r.lr, scale);
  impl_->clock.mark("grad norm + adamw");
  if (impl_->clock.on) ++impl_->clock.times.steps;
  r.flops.elementwise += int64_t(impl_->params.size());  // the AdamW update
  impl_->ledger += r.flops;
  return r;
}

template <class S>
double Model<S>::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t n_seqs,
                              double* per_position_loss) {
  Impl& m = *impl_;
  SerialScope serial(m.serial);
  const int64_t seq = m.seq;
  m.check_tokens(inputs, targets, n_seqs * seq);
  double total = 0;
  int64_t bearing = 0;
  for (int64_t s0 = 0; s0 < n_seqs; s0 += m.B) {
    const int64_t nb = std::min(m.B, n_seqs - s0);
    total += m.forward(inputs + s0 * seq, targets + s0 * seq, nb, false, m.eval_ledger);
    if (per_position_loss) std::copy_n(m.losses.data(), nb * seq, per_position_loss + s0 * seq);
  }
  for (int64_t t = 0; t < n_seqs * seq; ++t) bearing += targets[t] >= 0;
  return bearing > 0 ? total / double(bearing) : 0.0;
}

template <class S>
void Model<S>::set_profiling(bool on) {
  impl_->clock = PhaseClock{};
  impl_->clock.on = on;
}
template <class S>
std::vector<std::pair<std::string, double>> Model<S>::profile_ms_per_step() const {
  return impl_->clock.times.per_step();
}

template <class S>
const std::vector<TensorInfo>& Model<S>::tensors() const {
  return impl_->tensors;
}
template <class S>
const TensorInfo& Model<S>::tensor(std::string_view name) const {
  for (const TensorInfo& t : impl_->tensors)
    if (t.name == name) return t;
  throw InputError(fmt::format("no tensor named '{}' in this model", name));
}
template <class S>
std::span<S> Model<S>::parameters() {
  return impl_->params;
}
template <class S>
std::span<const S> Model<S>::parameters() const {
  return impl_->params;
}
template <class S>
std::span<const S> Model<S>::gradients() const {
  return impl_->grads;
}
template <class S>
void Model<S>::freeze_erc_noise(bool frozen) {
  impl_->erc_frozen = frozen;
}
template <class S>
std::array<uint64_t, 4> Model<S>::rng_state() const {
  return impl_->rng.state();
}

namespace {
// Version 2 counts the ledgers in 128 bits (FlopCount); version 1 (64-bit counts) still loads.
constexpr char kStateMagic[8] = {'M', 'O', 'E', 'P', 'C', 'P', 'U', '2'};
constexpr char kStateMagicV1[8] = {'M', 'O', 'E', 'P', 'C', 'P', 'U', '1'};

template <class T>
void put(std::vector<char>& out, const T* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n * sizeof(T));
  if (n > 0) std::memcpy(out.data() + at, p, n * sizeof(T));
}
template <class T>
void get(const std::vector<char>& in, size_t& pos, T* p, size_t n) {
  if (pos + n * sizeof(T) > in.size())
    throw InputError(fmt::format("model state is truncated ({} bytes)", in.size()));
  std::memcpy(p, in.data() + pos, n * sizeof(T));
  pos += n * sizeof(T);
}
void put_ledger(std::vector<char>& out, const FlopLedger& l) {
  for (const auto& row : l.flops) put(out, row.data(), row.size());
  put(out, &l.elementwise, 1);
}
void get_ledger(const std::vector<char>& in, size_t& pos, FlopLedger& l, bool narrow) {
  auto one = [&](FlopCount& c) {
    if (!narrow) return get(in, pos, &c, 1);
    int64_t v = 0;
    get(in, pos, &v, 1);
    c = v;
  };
  for (auto& row : l.flops)
    for (FlopCount& c : row) one(c);
  one(l.elementwise);
}
}  // namespace

template <class S>
void Model<S>::save_state(std::vector<char>& out) const {
  const Impl& m = *impl_;
  out.clear();
  put(out, kStateMagic, 8);
  const int64_t header[2] = {int64_t(sizeof(S)), int64_t(m.params.size())};
  put(out, header, 2);
  put(out, m.params.data(), m.params.size());
  put(out, m.adam_m.data(), m.adam_m.size());
  put(out, m.adam_v.data(), m.adam_v.size());
  put(out, &m.adam_steps, 1);
  put(out, m.rng.state().data(), 4);
  put_ledger(out, m.ledger);
  put_ledger(out, m.eval_ledger);
}

template <class S>
void Model<S>::load_state(const std::vector<char>& in) {
  Impl& m = *impl_;
  size_t pos = 0;
  char magic[8];
  get(in, pos, magic, 8);
  const bool v1 = std::memcmp(magic, kStateMagicV1, 8) == 0;
  if (!v1 && std::memcmp(magic, kStateMagic, 8) != 0)
    throw InputError("model state does not start with the CPU model's magic");
  int64_t header[2];
  get(in, pos, header, 2);
  if (header[0] != int64_t(sizeof(S)) || header[1] != int64_t(m.params.size()))
    throw InputError(
        fmt::format("model state holds {} parameters of {} bytes; this model has {} of {} bytes",
                    header[1], header[0], m.params.size(), sizeof(S)));
  get(in, pos, m.params.data(), m.params.size());
  get(in, pos, m.adam_m.data(), m.adam_m.size());
  get(in, pos, m.adam_v.data(), m.adam_v.size());
  get(in, pos, &m.adam_steps, 1);
  get(in, pos, m.rng.state().data(), 4);
  get_ledger(in, pos, m.ledger, v1);
  get_ledger(in, pos, m.eval_ledger, v1);
  if (pos != in.size())
    throw InputError(fmt::format("model state has {} trailing bytes", in.size() - pos));
}

template <class S>
const FlopLedger& Model<S>::ledger() const {
  return impl_->ledger;
}
template <class S>
const FlopLedger& Model<S>::eval_ledger() const {
  return impl_->eval_ledger;
}
template <class S>
int64_t Model<S>::trainable_params() const {
  return int64_t(impl_->params.size());
}
template <class S>
int64_t Model<S>::adam_steps() const {
  return impl_->adam_steps;
}
template <class S>
const Arch& Model<S>::arch() const {
  return impl_->a;
}
template <class S>
const ModelOptions& Model<S>::options() const {
  return impl_->opt;
}
template <class S>
int64_t Model<S>::batch_seqs() const {
  return impl_->step_B;
}
template <class S>
int64_t Model<S>::pass_seqs() const {
  return impl_->B;
}
int cpu_threads_for(const Arch& arch, int64_t pass_seqs, int requested) {
  if (pass_seqs * arch.seq_len * arch.d_model < cpu::kParallelStream) return 1;
  return requested > 0 ? requested : Eigen::nbThreads();
}

template <class S>
int Model<S>::threads() const {
  return cpu_threads_for(impl_->a, impl_->B, 0);  // the engine has set Eigen's count
}

template class Model<float>;
template class Model<double>;

}  // namespace moeplan::backend
