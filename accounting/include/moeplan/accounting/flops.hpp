#pragma once
// FLOPs per token under named conventions (ACCOUNTING.md). Every figure carries its label.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/accounting/ledger.hpp"

namespace moeplan {

enum class Convention { paper, exact, megatron };
enum class AttentionMask { causal, full };  // how attention-core is executed / counted

std::string_view name(Convention c);
std::optional<Convention> parse_convention(std::string_view s);
std::string_view name(AttentionMask m);
std::optional<AttentionMask> parse_attention_mask(std::string_view s);

// Label printed beside every FLOP figure, e.g. "paper", "exact/causal", "megatron".
std::string convention_label(Convention c, AttentionMask mask = AttentionMask::causal);
// The label of M and C of `arch`: convention_label plus the counting readings that change M under
// that convention, named as the auditor names them: "paper (router in)", "paper (norms in)",
// "paper (router in, norms in)". `exact` and `megatron` count router and norms the same way
// whatever the readings, so their labels are convention_label's.
std::string flops_label(const Arch& arch, Convention c, AttentionMask mask);

// Training FLOPs per consumed token (forward + backward), broken down by ledger category.
// `paper`: 6·N_a + 12·L·D_m·S (full S); norms/router only as far as the Arch's count_* readings
//          put them into N_a.
// `exact`: the analytic mean over one full sequence of what the backend's ledger records for a
//          dropless step (causal = (S+1)/2 keys per query on average), LM head included.
// `megatron`: upstream Megatron-LM's reading (causal halved as S/2, SwiGLU 3 GEMMs, routed experts
//          as K·D_e, shared expert in full, LM head in, router out).
struct FlopsPerToken {
  Convention convention = Convention::paper;
  AttentionMask mask = AttentionMask::full;
  std::array<double, kFlopCategories> by_category{};  // training (fwd+bwd) FLOPs per token
  double forward = 0;                                 // forward-only FLOPs per token
  double total = 0;                                   // M (training)
  std::string label() const { return convention_label(convention, mask); }
};

FlopsPerToken flops_per_token(const Arch& arch, Convention c,
                              AttentionMask mask = AttentionMask::causal);

// The analytic `exact` ledger of one training step over `batch_seqs` sequences of arch.seq_len.
// `routed_per_moe_layer[l]` = assignments actually computed by the routed experts of MoE layer l
// (dropless: batch_seqs·S·K each; pass nullopt for that). The backend's measured ledger must
// equal this to the FLOP. ERC aux-loss FLOPs are added when erc is true.
struct ExactStepOptions {
  AttentionMask mask = AttentionMask::causal;
  bool erc_loss = false;
  std::optional<std::vector<int64_t>> routed_per_moe_layer;  // size moe_layers()
};
FlopLedger exact_step_ledger(const Arch& arch, int64_t batch_seqs,
                             const ExactStepOptions& opt = {});

// A convention as a lens on a measured ledger: the ledger's categories selected and scaled the
// way the convention counts them. `executed_mask` is how attention-core was executed, so that
// e.g. `paper` (full S) rescales a causal ledger by 2S/(S+1). Returns training FLOPs.
struct LensTerm {
  FlopCategory category;
  double weight;            // multiplier applied to the ledger's category
  std::string explanation;  // why, in one line
};
struct ConventionLens {
  Convention convention;
  std::vector<LensTerm> terms;  // categories not listed count 0
  double apply(const FlopLedger& ledger) const;
};
// `counted`: the mask the convention counts under `exact` (exact/full counts S keys a query, so
// an executed causal attention core is scaled up by 2S/(S+1)); paper counts full and megatron
// S/2 whatever it says.
ConventionLens lens(const Arch& arch, Convention c, AttentionMask executed_mask,
                    AttentionMask counted = AttentionMask::causal);

}  // namespace moeplan
