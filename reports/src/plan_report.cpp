#include "moeplan/reports/plan_report.hpp"

#include <array>

#include <fmt/format.h>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/reports/text_table.hpp"
#include "moeplan/sweeps/manifest_io.hpp"

namespace moeplan {

namespace {

struct Lens {
  Convention convention;
  AttentionMask mask;
};
constexpr std::array<Lens, 4> kLenses{{{Convention::paper, AttentionMask::full},
                                       {Convention::exact, AttentionMask::causal},
                                       {Convention::exact, AttentionMask::full},
                                       {Convention::megatron, AttentionMask::causal}}};

std::string count(int64_t v) {
  // 2150612992 -> "2,150,612,992": exact counts are what a reader checks by hand.
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  if (v < 0) out.insert(out.begin(), '-');
  return out;
}

std::string share(int64_t part, int64_t total) {
  return total > 0 ? fmt::format("{:.2f}%", 100.0 * double(part) / double(total)) : "";
}

}  // namespace

std::string render_plan_breakdown(const Plan& p) {
  const ParamCounts& c = p.counts;
  const Arch& a = p.arch;
  std::string out = fmt::format("{}  [{}]\n", p.id.empty() ? "plan" : p.id, p.role);
  out += fmt::format("architecture: {}  (seq_len {}, vocab {}{})\n", describe(a), a.seq_len,
                     a.vocab, a.tied_embeddings ? ", tied embeddings" : "");
  // Every note, not only an unreachable point's ('!'): a reachable one can still say its D̂ is
  // not the baseline's, or which other rates solved to it.
  if (!p.note.empty()) out += fmt::format("{} {}\n", p.reachable ? "note:" : "!", p.note);

  TextTable params;
  params.add_column("parameters", TextTable::Align::left);
  params.add_column("count");
  params.add_column("in N?", TextTable::Align::left);
  params.add_column("share of N");
  auto prow = [&](const char* what, int64_t v, const std::string& in_n) {
    params.add_row({what, count(v), in_n, in_n == "no" ? "" : share(v, c.total_params)});
  };
  prow("attention (Q, K, V, O)", c.attention, "yes");
  prow("dense FFN", c.dense_ffn, "yes");
  prow("routed experts, total", c.expert_total, "yes");
  prow("routed experts, active (K per layer)", c.expert_active, "N_a only");
  prow("shared expert", c.shared_expert, "yes");
  prow("router", c.router, a.count_router ? "yes (count_router)" : "no");
  prow("RMSNorm scales", c.norms, a.count_norms ? "yes (count_norms)" : "no");
  prow("token embedding", c.embedding, "no");
  prow("LM head", c.lm_head, a.tied_embeddings ? "no (tied)" : "no");
  params.add_row({"N  total_params", count(c.total_params), "", "100.00%"});
  params.add_row(
      {"N_a  active_params", count(c.active_params), "", share(c.active_params, c.total_params)});
  params.add_row({"r_a  activation_rate", fmt::format("{:.4f}", c.activation_rate()), "",
                  p.role == "moe" && p.activation_rate_target > 0
                      ? fmt::format("target {:.4f}", p.activation_rate_target)
                      : ""});
  params.add_row({"all trainable (incl. vocab, router, norms)", count(c.trainable()), "", ""});
  out += "\n";
  out += params.render();

  TextTable flops;
  flops.add_column("FLOPs per token (fwd+bwd)", TextTable::Align::left);
  std::array<FlopsPerToken, kLenses.size()> f;
  for (size_t i = 0; i < kLenses.size(); ++i) {
    f[i] = flops_per_token(a, kLenses[i].convention, kLenses[i].mask);
    flops.add_column(flops_label(a, f[i].convention, f[i].mask));
  }
  for (int cat = 0; cat < kFlopCategories; ++cat) {
    bool any = false;
    for (const auto& x : f) any |= x.by_category[size_t(cat)] != 0;
    if (!any) continue;
    std::vector<std::string> row{std::string(name(FlopCategory(cat)))};
    for (const auto& x : f) row.push_back(human(x.by_category[size_t(cat)]));
    flops.add_row(row);
  }
  std::vector<std::string> total{"M (training)"}, fwd{"forward only"};
  for (const auto& x : f) {
    total.push_back(human(x.total));
    fwd.push_back(human(x.forward));
  }
  flops.add_row(total);
  flops.add_row(fwd);
  out += "\n";
  out += flops.render();

  const Budget& b = p.budget;
  const std::string label = flops_label(p.arch, p.convention, p.mask);
  TextTable budget;
  budget.add_column(fmt::format("budget [{}]", label), TextTable::Align::left);
  budget.add_column("value");
  budget.add_row({fmt::format("M flops_per_token [{}]", label), human(p.flops_per_token)});
  budget.add_row(
      {fmt::format("C compute target [{}]", label), fmt::format("{:.4g}", b.compute_target)});
  budget.add_row({fmt::format("C compute, whole steps [{}]", label),
                  fmt::format("{:.4g} ({:+.4f}%)", b.compute, 100 * b.compute_rel_diff)});
  budget.add_row({"D tokens_consumed", human(double(b.tokens_consumed))});
  budget.add_row({"D̂ tokens_unique", human(double(b.tokens_unique))});
  budget.add_row({"epochs (D/D̂)", fmt::format("{} ({} reuse)", ratio(b.epochs, 3),
                                              b.reuse == Reuse::strict ? "strict" : "loose")});
  budget.add_row({"TPP tokens_per_param (consumed)", ratio(b.tokens_per_param, 2)});
  budget.add_row({"D' effective_data (Muennighoff)", human(b.effective_data)});
  budget.add_row({"steps", std::to_string(b.steps)});
  budget.add_row({"batch", fmt::format("{} seqs = {} tokens", b.batch_seqs, p.hyper.batch_tokens)});
  budget.add_row(
      {fmt::format("η lr_peak ({})", p.hyper.rule), fmt::format("{:.4g}", p.hyper.lr_peak)});
  budget.add_row({"warmup_steps", std::to_string(p.hyper.warmup_steps)});
  out += "\n";
  out += budget.render();
  return out;
}

nlohmann::json plan_breakdown_json(const Plan& p) {
  nlohmann::json j = plan_to_json(p);
  const ParamCounts& c = p.counts;
  j["params"] = {{"attention", c.attention},
                 {"dense_ffn", c.dense_ffn},
                 {"expert_total", c.expert_total},
                 {"expert_active", c.expert_active},
                 {"shared_expert", c.shared_expert},
                 {"router", c.router},
                 {"norms", c.norms},
                 {"embedding", c.embedding},
                 {"lm_head", c.lm_head},
                 {"trainable", c.trainable()}};
  nlohmann::json by = nlohmann::json::object();
  for (const Lens& l : kLenses) {
    const FlopsPerToken f = flops_per_token(p.arch, l.convention, l.mask);
    nlohmann::json cats = nlohmann::json::object();
    for (int cat = 0; cat < kFlopCategories; ++cat)
      cats[std::string(name(FlopCategory(cat)))] = f.by_category[size_t(cat)];
    by[f.label()] = {{"total", f.total}, {"forward", f.forward}, {"by_category", cats}};
  }
  j["flops_per_token_by_convention"] = by;
  return j;
}

}  // namespace moeplan
