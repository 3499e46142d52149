#include "moeplan/accounting/flops.hpp"

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"

namespace moeplan {

std::string_view name(Convention c) {
  switch (c) {
    case Convention::paper:
      return "paper";
    case Convention::exact:
      return "exact";
    case Convention::megatron:
      return "megatron";
  }
  return "?";
}
std::optional<Convention> parse_convention(std::string_view s) {
  if (s == "paper") return Convention::paper;
  if (s == "exact") return Convention::exact;
  if (s == "megatron") return Convention::megatron;
  return std::nullopt;
}
std::string_view name(AttentionMask m) {
  return m == AttentionMask::causal ? "causal" : "full";
}
std::optional<AttentionMask> parse_attention_mask(std::string_view s) {
  if (s == "causal") return AttentionMask::causal;
  if (s == "full") return AttentionMask::full;
  return std::nullopt;
}
std::string convention_label(Convention c, AttentionMask mask) {
  if (c == Convention::exact) return fmt::format("exact/{}", name(mask));
  return std::string(name(c));
}

std::string flops_label(const Arch& arch, Convention c, AttentionMask mask) {
  std::string label = convention_label(c, mask);
  if (c != Convention::paper || !(arch.count_router || arch.count_norms)) return label;
  // paper's 6·N_a takes whatever N_a holds: a reading that puts weights in N_a puts FLOPs in M.
  const char* router = arch.count_router ? "router in" : "";
  const char* sep = arch.count_router && arch.count_norms ? ", " : "";
  const char* norms = arch.count_norms ? "norms in" : "";
  return fmt::format("{} ({}{}{})", label, router, sep, norms);
}

namespace {

// Forward, input-grad and weight-grad of one weight product (m tokens, n outputs, k inputs).
void add_weight_product(FlopLedger& l, FlopCategory c, int64_t m, int64_t n, int64_t k) {
  l.add_gemm(c, Phase::forward, m, n, k);
  l.add_gemm(c, Phase::input_grad, m, k, n);   // dX = dY·W^T
  l.add_gemm(c, Phase::weight_grad, k, n, m);  // dW = X^T·dY
}

// Attention core of one sequence and one head, as executed: Q·K^T and P·V forward; backward
// dP = dO·V^T, dV = P^T·dO, dQ = dS·K, dK = dS^T·Q (four products, all input gradients).
// Causal: query i meets i+1 keys, so each product costs 2·D_h·S(S+1)/2 in all. Counted in
// FlopCount: at S 1e7 and 150 heads of 128 the core alone passes what 64 bits hold.
FlopCount attention_core_product(int64_t S, int64_t Dh, AttentionMask mask) {
  return mask == AttentionMask::causal ? FlopCount(Dh) * S * (S + 1) : FlopCount(2) * S * S * Dh;
}

// m·n for a token count, refused in one line rather than wrapped.
int64_t checked_product(int64_t m, int64_t n, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(m, n, &out))
    throw InputError(
        fmt::format("{} = {}·{} is past 2^63 tokens; a smaller batch or seq_len fits", what, m, n));
  return out;
}

}  // namespace

FlopLedger exact_step_ledger(const Arch& a, int64_t batch_seqs, const ExactStepOptions& opt) {
  FlopLedger l;
  const int64_t T = checked_product(batch_seqs, a.seq_len, "tokens a step"), Dm = a.d_model;
  const FlopCount core =
      FlopCount(batch_seqs) * a.heads * attention_core_product(a.seq_len, a.head_dim, opt.mask);
  if (opt.routed_per_moe_layer && int64_t(opt.routed_per_moe_layer->size()) != a.moe_layers())
    throw InputError(fmt::format("exact_step_ledger: {} routed counts given for {} MoE layers",
                                 opt.routed_per_moe_layer->size(), a.moe_layers()));
  // Every layer's attention is alike, and so is every dense layer's FFN and every MoE layer's but
  // for its routed count: one of each, times its count (a loop over 1e10 layers took minutes).
  FlopLedger attention;
  add_weight_product(attention, FlopCategory::projection, T, a.q_width(), Dm);   // Q
  add_weight_product(attention, FlopCategory::projection, T, a.kv_width(), Dm);  // K
  add_weight_product(attention, FlopCategory::projection, T, a.kv_width(), Dm);  // V
  add_weight_product(attention, FlopCategory::projection, T, Dm, a.q_width());   // O
  attention.flops[int(FlopCategory::attention_core)][int(Phase::forward)] += FlopCount(2) * core;
  attention.flops[int(FlopCategory::attention_core)][int(Phase::input_grad)] += FlopCount(4) * core;
  l += attention * a.layers;
  FlopLedger dense_ffn;
  add_weight_product(dense_ffn, FlopCategory::dense_ffn, T, a.d_ffn, Dm);  // W1
  add_weight_product(dense_ffn, FlopCategory::dense_ffn, T, a.d_ffn, Dm);  // W3
  add_weight_product(dense_ffn, FlopCategory::dense_ffn, T, Dm, a.d_ffn);  // W2
  l += dense_ffn * a.dense_layers;
  // An MoE layer without its routed experts: router, shared expert, ERC's proxy products.
  FlopLedger moe;
  add_weight_product(moe, FlopCategory::router, T, a.experts, Dm);
  if (a.d_shared > 0) {
    add_weight_product(moe, FlopCategory::shared_expert, T, a.d_shared, Dm);
    add_weight_product(moe, FlopCategory::shared_expert, T, a.d_shared, Dm);
    add_weight_product(moe, FlopCategory::shared_expert, T, Dm, a.d_shared);
  }
  if (opt.erc_loss) {
    // Proxy tokens R̃ (E×D_m) through each expert's gate projection W_g^j (D_m×D_e).
    FlopLedger proxy;
    add_weight_product(proxy, FlopCategory::aux_loss, a.experts, a.d_expert, Dm);
    moe += proxy * a.experts;
  }
  l += moe * a.moe_layers();
  // The routed experts: the same count in every MoE layer unless the step's counts are given.
  const auto add_experts = [&](FlopLedger& into, int64_t routed) {
    add_weight_product(into, FlopCategory::expert, routed, a.d_expert, Dm);
    add_weight_product(into, FlopCategory::expert, routed, a.d_expert, Dm);
    add_weight_product(into, FlopCategory::expert, routed, Dm, a.d_expert);
  };
  if (opt.routed_per_moe_layer) {
    for (const int64_t routed : *opt.routed_per_moe_layer) add_experts(l, routed);
  } else if (a.moe_layers() > 0) {
    FlopLedger experts;
    add_experts(experts, checked_product(T, a.top_k, "routed tokens a step"));
    l += experts * a.moe_layers();
  }
  add_weight_product(l, FlopCategory::lm_head, T, a.vocab, Dm);
  return l;
}

FlopsPerToken flops_per_token(const Arch& a, Convention c, AttentionMask mask) {
  FlopsPerToken f;
  f.convention = c;
  f.mask = c == Convention::exact
               ? mask
               : (c == Convention::paper ? AttentionMask::full : AttentionMask::causal);
  auto& cat = f.by_category;
  const double L = double(a.layers), Dm = double(a.d_model), S = double(a.seq_len);
  if (c == Convention::exact) {
    const FlopLedger l = exact_step_ledger(a, 1, ExactStepOptions{mask, false, std::nullopt});
    for (int i = 0; i < kFlopCategories; ++i) cat[i] = double(l.category(FlopCategory(i))) / S;
    f.forward = double(l.phase(Phase::forward)) / S;
  } else if (c == Convention::paper) {
    const ParamCounts p = count_params(a);
    // 6·N_a split by component; norms (if counted in N_a) ride with the projections.
    cat[int(FlopCategory::projection)] = 6.0 * double(p.attention + (a.count_norms ? p.norms : 0));
    cat[int(FlopCategory::dense_ffn)] = 6.0 * double(p.dense_ffn);
    cat[int(FlopCategory::expert)] = 6.0 * double(p.expert_active);
    cat[int(FlopCategory::shared_expert)] = 6.0 * double(p.shared_expert);
    cat[int(FlopCategory::router)] = a.count_router ? 6.0 * double(p.router) : 0.0;
    cat[int(FlopCategory::attention_core)] = 12.0 * L * Dm * S;
    f.forward = 2.0 * double(p.active_params) + 4.0 * L * Dm * S;
  } else {  // megatron
    const double Ld = double(a.dense_layers), Le = double(a.moe_layers());
    cat[int(FlopCategory::projection)] =
        L * 6.0 * (2.0 * Dm * double(a.q_width()) + 2.0 * Dm * double(a.kv_width()));
    cat[int(FlopCategory::attention_core)] = L * 6.0 * S * double(a.q_width());
    cat[int(FlopCategory::dense_ffn)] = Ld * 18.0 * Dm * double(a.d_ffn);
    cat[int(FlopCategory::expert)] = Le * 18.0 * Dm * double(a.top_k * a.d_expert);
    cat[int(FlopCategory::shared_expert)] = Le * 18.0 * Dm * double(a.d_shared);
    cat[int(FlopCategory::lm_head)] = 6.0 * Dm * double(a.vocab);
  }
  for (double v : cat) f.total += v;
  if (c == Convention::megatron) f.forward = f.total / 3.0;
  return f;
}

double ConventionLens::apply(const FlopLedger& ledger) const {
  double s = 0;
  for (const LensTerm& t : terms) s += t.weight * double(ledger.category(t.category));
  return s;
}

ConventionLens lens(const Arch& a, Convention c, AttentionMask executed, AttentionMask counted) {
  ConventionLens out{c, {}};
  const double S = double(a.seq_len);
  const double causal_to_full = executed == AttentionMask::causal ? 2.0 * S / (S + 1.0) : 1.0;
  auto add = [&](FlopCategory cat, double w, std::string why) {
    out.terms.push_back({cat, w, std::move(why)});
  };
  switch (c) {
    case Convention::exact:
      for (int i = 0; i < kFlopCategories; ++i) {
        // C counts the model's useful work in every convention: what a device executes beyond
        // it (padding, recomputed products) is in the ledger's total, not in C. Counted, a CUDA
        // run's C [exact] exceeded the CPU's for the same point (+5 % with cuBLAS attention's
        // full squares, several times with tiled experts' unfilled rows).
        if (beyond_useful(FlopCategory(i))) continue;
        // exact/full counts every key of every query; a causal run executed (S+1)/(2S) of that.
        if (FlopCategory(i) == FlopCategory::attention_core && counted == AttentionMask::full &&
            executed == AttentionMask::causal)
          add(FlopCategory(i), causal_to_full,
              fmt::format("exact/full counts S keys a query: executed causal is (S+1)/(2S) = "
                          "{:.4f}x of it",
                          (S + 1.0) / (2.0 * S)));
        else
          add(FlopCategory(i), 1.0, "counted as executed");
      }
      break;
    case Convention::paper: {
      // The norm scales inside N_a (count_norms) are 6·norms per token that no product executes:
      // carried by the attention projections' term, which is exactly 6·attention per token.
      const ParamCounts p = count_params(a);
      if (a.count_norms && p.attention > 0)
        add(FlopCategory::projection, double(p.attention + p.norms) / double(p.attention),
            fmt::format("6·N_a term, with the norm scales inside N_a (count_norms): 6·(attention "
                        "{} + norms {}) per token",
                        p.attention, p.norms));
      else
        add(FlopCategory::projection, 1.0, "6·N_a term");
      add(FlopCategory::dense_ffn, 1.0, "6·N_a term");
      add(FlopCategory::expert, 1.0, "6·N_a term (K experts per token)");
      add(FlopCategory::shared_expert, 1.0, "6·N_a term");
      if (a.count_router) add(FlopCategory::router, 1.0, "router inside N_a (count_router)");
      const double width = double(a.d_model) / double(a.q_width());
      add(FlopCategory::attention_core, causal_to_full * width,
          executed == AttentionMask::causal
              ? fmt::format(
                    "paper counts the full S: executed causal is (S+1)/(2S) = {:.4f}x of it",
                    (S + 1.0) / (2.0 * S))
              : std::string("paper counts the full S, as executed"));
      break;
    }
    case Convention::megatron: {
      add(FlopCategory::projection, 1.0, "attention projections");
      add(FlopCategory::dense_ffn, 1.0, "SwiGLU as 3 GEMMs");
      add(FlopCategory::expert, 1.0, "routed experts as K·D_e");
      add(FlopCategory::shared_expert, 1.0, "shared expert in full");
      add(FlopCategory::lm_head, 1.0, "logits included");
      add(FlopCategory::attention_core, executed == AttentionMask::causal ? S / (S + 1.0) : 0.5,
          "megatron halves the S·S term exactly (S/2 keys per query)");
      break;
    }
  }
  return out;
}

}  // namespace moeplan
