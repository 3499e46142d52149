#include "moeplan/audit/runs.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/claims.hpp"
#include "moeplan/planner/point.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/ledger_json.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "moeplan/sweeps/runs_folder.hpp"

namespace moeplan::audit {

namespace {

using json = nlohmann::json;

// Reads one record's keys; `prefix` is the place of the object read ("measured.tokens."), so that
// a message names the full key. Counts are whole and not negative: a fraction, a negative or a
// number past int64 is refused, never rounded.
struct Reader {
  const std::string& source;
  std::string prefix;
  Reader in(const std::string& key) const { return Reader{source, prefix + key + "."}; }
  [[noreturn]] void fail(const std::string& key, const char* want) const {
    throw InputError(fmt::format("{}: '{}{}' is missing or not {}", source, prefix, key, want));
  }
  const json& obj(const json& j, const std::string& key) const {
    if (!j.contains(key) || !j.at(key).is_object()) fail(key, "an object");
    return j.at(key);
  }
  int64_t integer(const json& j, const std::string& key) const {
    const auto c = j.contains(key) ? count_from_json(j.at(key)) : std::nullopt;
    if (!c) fail(key, "a whole number >= 0 below 2^63");
    return *c;
  }
  // A FLOP count: an integer, or a string of digits past 64 bits (sweeps/ledger_json.hpp).
  FlopCount count(const json& j, const std::string& key) const {
    const auto c =
        j.is_object() && j.contains(key) ? flop_count_from_json(j.at(key)) : std::nullopt;
    if (!c) fail(key, fmt::format("a FLOP count ({})", kFlopCountForms).c_str());
    return *c;
  }
  int64_t integer_or(const json& j, const std::string& key, int64_t dflt) const {
    return j.contains(key) ? integer(j, key) : dflt;
  }
  double real(const json& j, const std::string& key) const {
    if (!j.contains(key) || !j.at(key).is_number() || !std::isfinite(j.at(key).get<double>()))
      fail(key, "a finite number");
    return j.at(key).get<double>();
  }
  double real_or(const json& j, const std::string& key, double dflt) const {
    return j.contains(key) ? real(j, key) : dflt;
  }
  std::string text(const json& j, const std::string& key) const {
    if (!j.contains(key) || !j.at(key).is_string()) fail(key, "a string");
    return j.at(key).get<std::string>();
  }
};

Plan parse_plan(const Reader& rd, const json& p) {
  Plan plan;
  plan.id = rd.text(p, "id");
  plan.role = p.contains("role") ? rd.text(p, "role") : "moe";
  if (plan.role != "moe" && plan.role != "dense")
    throw InputError(fmt::format("{}: plan role '{}' (valid: dense, moe)", rd.source, plan.role));
  const json& a = rd.obj(p, "arch");
  const Reader ra = rd.in("arch");
  Arch& arch = plan.arch;
  arch.d_model = ra.integer(a, "d_model");
  arch.layers = ra.integer(a, "layers");
  arch.dense_layers = ra.integer_or(a, "dense_layers", arch.layers);
  arch.heads = ra.integer(a, "heads");
  arch.kv_heads = ra.integer_or(a, "kv_heads", arch.heads);
  arch.head_dim = ra.integer(a, "head_dim");
  arch.d_ffn = ra.integer_or(a, "d_ffn", 0);
  arch.experts = ra.integer_or(a, "experts", 0);
  arch.top_k = ra.integer_or(a, "top_k", 0);
  arch.d_expert = ra.integer_or(a, "d_expert", 0);
  arch.d_shared = ra.integer_or(a, "d_shared", 0);
  arch.seq_len = ra.integer_or(a, "seq_len", rd.integer_or(p, "seq_len", 0));
  arch.vocab = ra.integer(a, "vocab");
  if (a.contains("tied_embeddings") && a.at("tied_embeddings").is_boolean())
    arch.tied_embeddings = a.at("tied_embeddings").get<bool>();
  if (a.contains("count_router") && a.at("count_router").is_boolean())
    arch.count_router = a.at("count_router").get<bool>();
  if (a.contains("count_norms") && a.at("count_norms").is_boolean())
    arch.count_norms = a.at("count_norms").get<bool>();
  // A shape `run` could not have trained (heads 0, top_k above experts) is damage, not a plan
  // to recompute FLOPs from (it gave inf findings).
  try {
    validate(arch);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: '{}arch' is not a shape a run trains: {}", rd.source,
                                 rd.prefix, e.what()));
  }
  plan.counts = count_params(arch);
  const std::string conv = p.contains("convention") ? rd.text(p, "convention") : "paper";
  const size_t slash = conv.find('/');
  const auto c = parse_convention(conv.substr(0, slash));
  if (!c)
    throw InputError(
        fmt::format("{}: plan convention '{}' is not one of paper, exact/causal, "
                    "exact/full, megatron",
                    rd.source, conv));
  plan.convention = *c;
  std::string mask = slash == std::string::npos ? "" : conv.substr(slash + 1);
  if (p.contains("mask") && p.at("mask").is_string()) mask = p.at("mask").get<std::string>();
  if (!mask.empty()) {
    const auto m = parse_attention_mask(mask);
    if (!m)
      throw InputError(fmt::format("{}: plan mask '{}' (valid: causal, full)", rd.source, mask));
    plan.mask = *m;
  }
  plan.flops_per_token = rd.real(p, "flops_per_token");
  Budget& b = plan.budget;
  b.flops_per_token = plan.flops_per_token;
  b.compute = rd.real(p, "compute");
  b.compute_target = rd.real_or(p, "compute_target", b.compute);
  b.tokens_consumed = rd.integer(p, "tokens_consumed");
  b.tokens_unique = rd.integer(p, "tokens_unique");
  b.epochs = rd.real_or(
      p, "epochs", b.tokens_unique > 0 ? double(b.tokens_consumed) / double(b.tokens_unique) : 0);
  b.steps = rd.integer(p, "steps");
  b.batch_seqs = rd.integer(p, "batch_seqs");
  b.seq_len = rd.integer_or(p, "seq_len", arch.seq_len);
  if (p.contains("reuse")) {
    const std::string reuse = rd.text(p, "reuse");
    if (reuse != "strict" && reuse != "loose")
      throw InputError(fmt::format("{}: plan reuse '{}' (valid: strict, loose)", rd.source, reuse));
    b.reuse = reuse == "loose" ? Reuse::loose : Reuse::strict;
  }
  // The plan's own N (its counting reading): what it printed, which must be what its arch gives
  // under that reading (an arch edited to twice the experts under the old N held every claim:
  // the measured N was compared with the printed one only).
  for (const auto& [key, from_arch] : {std::pair{"total_params", plan.counts.total_params},
                                       {"active_params", plan.counts.active_params}})
    if (p.contains(key) && rd.integer(p, key) != from_arch)
      throw InputError(fmt::format(
          "{}: 'plan.{}' = {} disagrees with its arch, which gives {} (router {}, norms {}); "
          "the record is damaged or was edited",
          rd.source, key, rd.integer(p, key), from_arch, arch.count_router ? "in" : "out",
          arch.count_norms ? "in" : "out"));
  // Its M too, as the manifest reader holds a point to it (D = steps·batch·S and C = M·D are
  // plan_defect's, for report and audit alike): a plan edited to match a forged ledger (M 0.8 %
  // up) otherwise held every claim without --plan.
  const double m_arch = planned_flops_per_token(arch, plan.convention, plan.mask);
  if (std::fabs(plan.flops_per_token - m_arch) > 1e-9 * m_arch)
    throw InputError(fmt::format(
        "{}: 'plan.flops_per_token' = {} disagrees with its arch, which gives {} under {}; the "
        "record is damaged or was edited",
        rd.source, plan.flops_per_token, m_arch, convention_label(plan.convention, plan.mask)));
  return plan;
}

// FLOP and token counts: whole numbers while they are readable, else 7 significant digits.
std::string count_str(double v) {
  return std::fabs(v) < 1e12 ? fmt::format("{:.0f}", v) : fmt::format("{:.7g}", v);
}

std::string pct(double rel) {
  return fmt::format("{:+.4f}%", 100.0 * rel);
}
double rel(double found, double expected) {
  return expected != 0 ? (found - expected) / expected : 0;
}

class RunAuditor {
 public:
  RunAuditor(const RunsAuditOptions& o, AuditReport& r) : opt_(o), report_(r) {}

  void add(Severity s, const std::string& point, const std::string& q, std::optional<double> e,
           std::optional<double> f, double tol, std::string msg) {
    // Against an expected 0 a non-zero value has no relative difference (it read +0.00 %).
    std::optional<double> rd;
    if (e && f && (*e != 0 || *f == 0)) rd = rel(*f, *e);
    report_.findings.push_back(Finding{s, point, 0, q, e, f, rd, tol, std::move(msg)});
  }
  // The exact counts behind the last finding's expected and found values.
  void exact(FlopCount expected, FlopCount found) {
    report_.findings.back().expected_exact = to_string(expected);
    report_.findings.back().found_exact = to_string(found);
  }

  // Measured N and N_a against the plan; a difference must be a counting reading.
  // Returns N under the plan's reading when the difference is explained.
  double check_params(const RunRecord& r, const Plan& p) {
    const std::string& id = r.point_id;
    const ParamCounts base = count_params(p.arch);
    struct Reading {
      bool router, norms;
    };
    static constexpr Reading kReadings[] = {
        {false, false}, {true, false}, {false, true}, {true, true}};
    auto explain = [&](int64_t measured, bool active) -> std::optional<Reading> {
      for (const Reading& rdg : kReadings) {
        Arch a = p.arch;
        a.count_router = rdg.router;
        a.count_norms = rdg.norms;
        const ParamCounts c = count_params(a);
        if ((active ? c.active_params : c.total_params) == measured) return rdg;
      }
      return std::nullopt;
    };
    double n_plan_reading = double(r.total_params);
    for (bool active : {false, true}) {
      const int64_t planned = active ? p.counts.active_params : p.counts.total_params;
      const int64_t measured = active ? r.active_params : r.total_params;
      const char* q = active ? "active_params" : "total_params";
      const char* sym = active ? "N_a" : "N";
      if (planned == measured) continue;
      const auto rdg = explain(measured, active);
      if (!rdg) {
        add(Severity::error, id, q, double(planned), double(measured), 0,
            fmt::format("measured {} = {} but the plan has {} ({}), and no counting reading "
                        "(router, norms in or out) of the planned shape gives it",
                        sym, measured, planned, pct(rel(double(measured), double(planned)))));
        continue;
      }
      std::string parts;
      if (rdg->router != p.arch.count_router)
        parts += fmt::format("router weights {} ({} = D_m·E per MoE layer)",
                             rdg->router ? "in" : "out", base.router);
      if (rdg->norms != p.arch.count_norms)
        parts += fmt::format("{}RMSNorm scales {} ({} = 2·D_m per layer + D_m)",
                             parts.empty() ? "" : " and ", rdg->norms ? "in" : "out", base.norms);
      add(Severity::info, id, q, double(planned), double(measured), 0,
          fmt::format("measured {} = {} vs planned {}: explained by the reading — the record "
                      "counts the {}; the plan does not",
                      sym, measured, planned, parts));
      if (!active) n_plan_reading = double(planned);
    }
    return n_plan_reading;
  }

  // A measured ledger against an analytic one, category by category: every difference is
  // named with its reason, and those no routing, auxiliary loss, recompute or padding explains
  // are errors. `q` prefixes each finding's quantity ("flops", "validation-flops"); `what` says
  // what the analytic ledger counts ("45 steps").
  // A [train] setting of the record as a number, or nullopt where the record does not say.
  static std::optional<double> setting(const RunRecord& r, const std::string& key) {
    const auto it = r.train.find(key);
    if (it == r.train.end()) return std::nullopt;
    try {
      return std::stod(it->second);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  void compare_exact(const RunRecord& r, const std::string& q, const FlopLedger& measured,
                     const FlopLedger& analytic, AttentionMask mask, const std::string& what) {
    const std::string& id = r.point_id;
    const std::string label = convention_label(Convention::exact, mask);
    const bool validation = q != "flops";
    const std::string whose = validation ? "validation " : "";
    // What the record itself rules out: the cpu engine executes no padding and no recompute, an
    // evaluation has no backward pass to recompute in, a run without the ERC loss has no
    // auxiliary products, and a dropless run (capacity_factor 0) drops no assignment.
    const bool cpu = r.device == "cpu";
    const auto erc = setting(r, "erc_loss"), capacity = setting(r, "capacity_factor");
    for (int c = 0; c < kFlopCategories; ++c) {
      const FlopCategory cat = FlopCategory(c);
      const FlopCount m = measured.category(cat), e = analytic.category(cat);
      if (m == e) {
        // The same total split otherwise between the passes (a record with no backward pass,
        // its FLOPs moved into forward) is not the step the analytic ledger describes.
        std::string split_m, split_e;
        bool same_split = true;
        for (int ph = 0; ph < kPhases; ++ph) {
          const FlopCount pm = measured.at(cat, Phase(ph)), pe = analytic.at(cat, Phase(ph));
          same_split = same_split && pm == pe;
          split_m += (ph ? " / " : "") + to_string(pm);
          split_e += (ph ? " / " : "") + to_string(pe);
        }
        if (!same_split)
          add(Severity::error, id, fmt::format("{}:{}", q, name(cat)), double(e), double(m), 0,
              fmt::format("{}{} {} FLOPs by pass (forward / input-grad / weight-grad): measured "
                          "{} vs analytic {} for {}: the same total, split as no training step "
                          "splits it",
                          whose, label, name(cat), split_m, split_e, what));
        continue;
      }
      std::string why;
      Severity sev = Severity::info;
      switch (cat) {
        case FlopCategory::expert:
          if (m < e && capacity && *capacity == 0) {
            why =
                "fewer routed assignments than K per token, in a dropless run (capacity_factor "
                "0): a routing or ledger bug, or an edit";
            sev = Severity::error;
          } else {
            why = m < e ? "fewer routed assignments than dropless K per token: capacity drops"
                        : "more routed assignments than K per token: a routing bug";
            sev = m < e ? Severity::warning : Severity::error;
          }
          break;
        case FlopCategory::aux_loss:
          if (validation || (erc && *erc == 0)) {
            why = validation ? "auxiliary loss products in an evaluation, which computes no loss "
                               "but the cross-entropy"
                             : "auxiliary loss products in a run without the ERC loss (erc_loss 0)";
            sev = Severity::error;
          } else {
            why = "auxiliary loss (ERC) products, not in the dropless model";
          }
          break;
        case FlopCategory::recompute:
          if (validation || cpu) {
            why = validation ? "products executed again in an evaluation, which has no backward "
                               "pass to recompute in"
                             : "products executed again on the cpu device, which recomputes "
                               "nothing";
            sev = Severity::error;
          } else {
            why =
                "products executed again (activation recompute, or the fused attention's "
                "backward recomputing scores)";
          }
          break;
        case FlopCategory::padding:
          if (cpu) {
            why = "padding on the cpu device, which executes the useful products only";
            sev = Severity::error;
          } else {
            why =
                "executed beyond the model's useful work (padding tokens, the masked part "
                "of attention squares a device computes, or the unfilled rows of expert "
                "tiles)";
          }
          break;
        default:
          why = "not explained by routing, auxiliary losses, recompute or padding";
          sev = Severity::error;
      }
      add(sev, id, fmt::format("{}:{}", q, name(cat)), double(e), double(m), 0,
          fmt::format("{}{} {} FLOPs: measured {} vs analytic {} for {} ({}): {}", whose, label,
                      name(cat), to_string(m), to_string(e), what,
                      e != 0 ? pct(rel(double(m), double(e))) : std::string("none expected"), why));
      exact(e, m);
    }
  }

  // The validation ledger (not part of C): forward products only, each evaluation one forward
  // pass over the held-out windows. A damaged or inflated one means the BPC was not measured on
  // what the record says.
  void check_validation_flops(const RunRecord& r, const Plan& p) {
    if (!r.has_validation_ledger) return;  // an older record
    const std::string& id = r.point_id;
    if (r.validation_ledger.total() != r.validation_total) {
      add(Severity::error, id, "validation-flops", double(r.validation_ledger.total()),
          double(r.validation_total), 0,
          fmt::format("the record's flops.validation.total {} is not the sum of its categories {}",
                      to_string(r.validation_total), to_string(r.validation_ledger.total())));
      exact(r.validation_ledger.total(), r.validation_total);
    }
    for (Phase ph : {Phase::input_grad, Phase::weight_grad})
      if (const FlopCount b = r.validation_ledger.phase(ph); b != 0) {
        add(Severity::error, id, "validation-flops", 0, double(b), 0,
            fmt::format("the validation ledger has {} {} FLOPs: an evaluation runs no backward "
                        "pass",
                        to_string(b), name(ph)));
        exact(0, b);
      }
    const int64_t seq = p.arch.seq_len;
    // Held-out tokens are whole windows: another count is not one `run` writes.
    if (r.evaluations >= 0 && r.validation_tokens > 0 && seq > 0 &&
        r.validation_tokens % seq != 0) {
      add(Severity::error, id, "validation-flops", {}, double(r.validation_tokens), 0,
          fmt::format("the record's data.validation_tokens {} is not a whole number of windows of "
                      "S = {}: `run` scores whole windows, so its validation ledger cannot be "
                      "checked",
                      r.validation_tokens, seq));
      return;
    }
    if (r.evaluations < 0 || r.validation_tokens <= 0 || seq <= 0) {
      add(Severity::info, id, "validation-flops", {}, double(r.validation_ledger.total()), 0,
          "the validation ledger is not compared with an analytic one: the record does not say "
          "how many evaluations of how many held-out windows it ran");
      return;
    }
    FlopLedger forward =
        exact_step_ledger(p.arch, r.validation_tokens / seq, {r.executed_mask, false, {}});
    for (auto& by_phase : forward.flops)
      by_phase[size_t(Phase::input_grad)] = by_phase[size_t(Phase::weight_grad)] = 0;
    compare_exact(
        r, "validation-flops", r.validation_ledger, forward * r.evaluations, r.executed_mask,
        fmt::format("{} evaluations of {} held-out tokens", r.evaluations, r.validation_tokens));
  }

  // Measured ledger against the analytic `exact` ledger for the steps actually run, and against
  // the plan's convention through lens(); every category that differs is named with its reason.
  double check_flops(const RunRecord& r, const Plan& p) {
    const std::string& id = r.point_id;
    const double tol = opt_.tolerance;
    const Arch& a = p.arch;
    const int64_t step_tokens = p.budget.batch_seqs * a.seq_len;
    if (r.ledger.total() != r.ledger_total) {
      add(Severity::error, id, "flops", double(r.ledger.total()), double(r.ledger_total), 0,
          fmt::format("the record's flops.total {} is not the sum of its categories {}",
                      to_string(r.ledger_total), to_string(r.ledger.total())));
      exact(r.ledger.total(), r.ledger_total);
    }
    // exact: the analytic ledger of the steps the tokens say were run (dropless routing).
    if (step_tokens > 0 && r.tokens_consumed % step_tokens == 0) {
      const int64_t steps = r.tokens_consumed / step_tokens;
      compare_exact(r, "flops", r.ledger,
                    exact_step_ledger(a, p.budget.batch_seqs, {r.executed_mask, false, {}}) * steps,
                    r.executed_mask, fmt::format("{} steps", steps));
    } else {
      add(Severity::warning, id, "tokens_consumed", {}, double(r.tokens_consumed), 0,
          fmt::format("{} tokens consumed is not a whole number of steps of {} tokens: the exact "
                      "ledger is not compared",
                      r.tokens_consumed, step_tokens));
    }
    // The plan's convention: the measured ledger through lens() against the planned C.
    Arch lens_arch = a;
    lens_arch.count_router = p.arch.count_router;
    const ConventionLens ln = lens(lens_arch, p.convention, r.executed_mask, p.mask);
    const double measured_conv = ln.apply(r.ledger);
    // "paper (router in)" where the plan's N_a counts the router: the lens's 6·N_a does too.
    const std::string label = flops_label(p.arch, p.convention, p.mask);
    // Planned C is M times the plan's D: a run that consumed other tokens spent another C, and
    // the line says so, with the measured C per consumed token against M beside it.
    const int64_t planned_d = p.budget.tokens_consumed;
    const double planned_c = p.flops_per_token * double(planned_d);
    const double d = rel(measured_conv, planned_c);
    std::string per_token;
    if (r.tokens_consumed != planned_d && r.tokens_consumed > 0)
      per_token = fmt::format(
          "; the run consumed {} tokens, not the planned {}: per consumed token {:.6g} vs M = "
          "{:.6g} ({})",
          r.tokens_consumed, planned_d, measured_conv / double(r.tokens_consumed),
          p.flops_per_token,
          pct(rel(measured_conv / double(r.tokens_consumed), p.flops_per_token)));
    add(std::fabs(d) <= tol ? Severity::info : Severity::error, id, "compute", planned_c,
        measured_conv, tol,
        fmt::format(
            "C ({}): measured ledger through the {} lens = {} vs plan M·D (D = {} consumed) "
            "= {}: {}{}",
            label, label, count_str(measured_conv), planned_d, count_str(planned_c), pct(d),
            per_token));
    // The C [paper] the record states (and the report shows), whatever the plan's convention: a
    // figure its own ledger does not give is an error (the report's C column and its equal-C
    // verdict read it; a warning let the report call a point unequal, or equal, that the audit
    // passed on its ledger).
    const double paper_c = lens(lens_arch, Convention::paper, r.executed_mask).apply(r.ledger);
    if (std::fabs(rel(r.compute_paper, paper_c)) > 1e-9)
      add(Severity::error, id, "compute", paper_c, r.compute_paper, 0,
          fmt::format("the record's measured.compute.paper {} differs from the paper lens applied "
                      "to its ledger {}",
                      count_str(r.compute_paper), count_str(paper_c)));
    // The record keys its figures by the bare convention ("paper", "exact/causal").
    if (const auto it = r.conventions.find(convention_label(p.convention, p.mask));
        it != r.conventions.end() && std::fabs(rel(it->second, measured_conv)) > 1e-9)
      add(Severity::error, id, "compute", measured_conv, it->second, 0,
          fmt::format("the record's own {} figure {} differs from lens() applied to its ledger {}",
                      label, count_str(it->second), count_str(measured_conv)));
    // Residual between the raw measured ledger (exact) and the plan's convention, by category.
    const FlopsPerToken planned = flops_per_token(lens_arch, p.convention, p.mask);
    for (int c = 0; c < kFlopCategories; ++c) {
      const FlopCategory cat = FlopCategory(c);
      const double conv = planned.by_category[size_t(c)] * double(r.tokens_consumed);
      const double meas = double(r.ledger.category(cat));
      if (std::fabs(meas - conv) <= 1e-9 * std::max(std::fabs(meas), 1.0)) continue;
      const auto term = std::find_if(ln.terms.begin(), ln.terms.end(),
                                     [&](const LensTerm& t) { return t.category == cat; });
      std::string why;
      if (term == ln.terms.end())
        why = fmt::format("{} FLOPs are not part of {}", name(cat), label);
      else if (std::fabs(term->weight - 1.0) > 1e-12)
        why = fmt::format("{} (lens weight {:.6f})", term->explanation, term->weight);
      else
        why =
            "counted alike by both: the difference is in the ledger itself (see the exact "
            "comparison)";
      add(Severity::info, id, fmt::format("flops:{}", name(cat)), conv, meas, 0,
          fmt::format("{}: {} counts {}, measured (exact/{}) {}: {}", name(cat), label,
                      count_str(conv), name(r.executed_mask), to_string(r.ledger.category(cat)),
                      why));
      report_.findings.back().found_exact = to_string(r.ledger.category(cat));
    }
    return measured_conv;
  }

  void check_tokens(const RunRecord& r, const Plan& p) {
    const std::string& id = r.point_id;
    const Budget& b = p.budget;
    auto exact_int = [&](const char* q, int64_t planned, int64_t measured, const char* what) {
      if (planned != measured)
        add(Severity::error, id, q, double(planned), double(measured), 0,
            fmt::format("{}: measured {} vs planned {} ({})", what, measured, planned,
                        pct(rel(double(measured), double(planned)))));
    };
    exact_int("tokens_consumed", b.tokens_consumed, r.tokens_consumed, "tokens consumed");
    exact_int("tokens_unique", b.tokens_unique, r.tokens_unique, "unique tokens");
    exact_int("steps", b.steps, r.steps, "optimizer steps");
    const int64_t step_tokens = b.batch_seqs * p.arch.seq_len;
    if (step_tokens > 0 && r.tokens_consumed % step_tokens == 0 &&
        r.steps != r.tokens_consumed / step_tokens)
      add(Severity::error, id, "steps", double(r.tokens_consumed / step_tokens), double(r.steps), 0,
          fmt::format("the record's steps {} is not its consumed tokens / tokens per step ({} / "
                      "{} = {})",
                      r.steps, r.tokens_consumed, step_tokens, r.tokens_consumed / step_tokens));
    if (std::fabs(rel(r.epochs, b.epochs)) > 1e-9)
      add(Severity::error, id, "epochs", b.epochs, r.epochs, 0,
          fmt::format("epochs (consumed / unique): measured {:.6g} vs planned {:.6g}", r.epochs,
                      b.epochs));
    if (r.tokens_unique > 0 &&
        std::fabs(rel(r.epochs, double(r.tokens_consumed) / double(r.tokens_unique))) > 1e-9)
      add(Severity::error, id, "epochs", double(r.tokens_consumed) / double(r.tokens_unique),
          r.epochs, 0, "the record's epochs is not its consumed / unique tokens");
    if (r.tokens_dropped > 0)
      add(Severity::warning, id, "tokens_dropped", 0, double(r.tokens_dropped), 0,
          fmt::format("the loader dropped {} tokens (a tail that does not fill a batch)",
                      r.tokens_dropped));
  }

 private:
  const RunsAuditOptions& opt_;
  AuditReport& report_;
};

struct PointValues {
  std::string id;
  bool dense;
  double n, c, d_unique;
  Reuse reuse;
  double epochs = 0;
};

ClaimVerdict equal_claim(const std::string& name, const std::string& q,
                         const std::vector<PointValues>& pts, double PointValues::*field,
                         double tol, std::vector<Finding>& findings) {
  ClaimVerdict cv;
  cv.name = name;
  QuantityVerdict qv;
  qv.quantity = q;
  qv.tolerance = tol;
  const auto base =
      std::find_if(pts.begin(), pts.end(), [](const PointValues& p) { return p.dense; });
  qv.kind = base != pts.end() ? "equal_to_baseline" : "equal";
  size_t lo = 0, hi = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    cv.rows.push_back(pts[i].id);
    if (pts[i].*field < pts[lo].*field) lo = i;
    if (pts[i].*field > pts[hi].*field) hi = i;
  }
  qv.min = pts[lo].*field, qv.max = pts[hi].*field;
  qv.min_row = pts[lo].id, qv.max_row = pts[hi].id;
  qv.rel_range = qv.min != 0 ? (qv.max - qv.min) / std::fabs(qv.min) : 0;
  if (base != pts.end()) {
    const double ref = (*base).*field;
    for (const PointValues& p : pts) {
      const double d = rel(p.*field, ref);
      // What is tested, printed as it is tested: the farthest point from the baseline.
      if (&p != &*base && (!qv.deviation || std::fabs(d) > std::fabs(*qv.deviation)))
        qv.deviation = d, qv.deviation_row = p.id;
      if (std::fabs(d) <= tol) continue;
      qv.breaking.push_back(p.id);
      findings.push_back(
          Finding{Severity::error, p.id, 0, q, ref, p.*field, d, tol,
                  fmt::format("claim '{}': {} = {} is {} from the dense baseline "
                              "{}'s {}",
                              name, q, count_str(p.*field), pct(d), base->id, count_str(ref))});
    }
  } else {
    std::vector<double> xs;
    for (const PointValues& p : pts) xs.push_back(p.*field);
    for (size_t i : outliers_to_remove(xs, tol)) {
      qv.breaking.push_back(pts[i].id);
      findings.push_back(Finding{Severity::error,
                                 pts[i].id,
                                 0,
                                 q,
                                 {},
                                 xs[i],
                                 {},
                                 tol,
                                 fmt::format("claim '{}': {} = {} breaks the group's {:.2f}% range",
                                             name, q, count_str(xs[i]), 100 * qv.rel_range)});
    }
    qv.note = "no dense baseline record: spread over the points only";
  }
  qv.holds = qv.breaking.empty();
  cv.holds = qv.holds;
  cv.quantities.push_back(qv);
  return cv;
}

}  // namespace

namespace {
std::map<std::string, std::string> settings_map(const json& train) {
  std::map<std::string, std::string> out;
  if (!train.is_object()) return out;
  const json kept = moeplan::result_settings(train);  // items() of a temporary would dangle
  for (const auto& [key, value] : kept.items()) out[key] = value.dump();
  return out;
}
}  // namespace

std::map<std::string, std::string> settings_from_text(std::string_view train_json_text) {
  return settings_map(json::parse(train_json_text));
}

RunRecord parse_run_record(std::string_view text, std::string source) {
  RunRecord r;
  r.source = std::move(source);
  const Reader rd{r.source, ""};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw InputError(fmt::format("{}: not valid JSON ({})", r.source, json_error_text(e)));
  }
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object", r.source));
  if (rd.integer(j, "schema") != 1)
    throw InputError(fmt::format("{}: schema {} (this moeplan reads schema 1)", r.source,
                                 rd.integer(j, "schema")));
  r.point_id = rd.text(j, "point_id");
  if (j.contains("sweep_tolerances")) {
    const json& t = rd.obj(j, "sweep_tolerances");
    const Reader rt = rd.in("sweep_tolerances");
    for (const char* k : {"n", "compute"}) {
      const double v = rt.real(t, k);
      if (!(v > 0 && v < 1))
        throw InputError(
            fmt::format("{}: 'sweep_tolerances.{}' is {} (valid: a relative "
                        "tolerance in (0, 1))",
                        r.source, k, v));
      (k[0] == 'n' ? r.n_tolerance : r.compute_tolerance) = v;
    }
  }
  if (j.contains("sweep_equal_resources")) {
    if (!j.at("sweep_equal_resources").is_boolean())
      rd.fail("sweep_equal_resources", "true or false");
    r.equal_resources = j.at("sweep_equal_resources").get<bool>();
  }
  if (!is_point_id(r.point_id))
    throw InputError(fmt::format("{}: 'point_id' is {} (a point id is {})", r.source,
                                 j["point_id"].dump(), kPointIdRule));
  r.status = rd.text(j, "status");
  if (r.status != "running" && r.status != "complete")
    throw InputError(fmt::format("{}: 'status' is \"{}\" (valid: \"running\", \"complete\")",
                                 r.source, r.status));
  r.plan = parse_plan(rd.in("plan"), rd.obj(j, "plan"));
  r.plan_json = j.at("plan");
  if (j.contains("data")) {
    const json& d = rd.obj(j, "data");
    const Reader rdd = rd.in("data");
    // As printed in findings: a line break in a path would forge a line of the report.
    r.data_source = printable(rdd.text(d, "source"));
    r.data_description = printable(rdd.text(d, "description"));
    r.validation_tokens = rdd.integer(d, "validation_tokens");
    if (d.contains("training_fingerprint"))
      r.training_fingerprint = rdd.text(d, "training_fingerprint");
    if (d.contains("validation_fingerprint"))
      r.validation_fingerprint = rdd.text(d, "validation_fingerprint");
  }
  if (j.contains("train")) r.train = settings_map(rd.obj(j, "train"));
  if (j.contains("device") && j.at("device").is_string())
    r.device = printable(j.at("device").get<std::string>());
  // The curves (arrays of objects with numbers) and the facts of how it ran, as `moeplan report`
  // reads them, in a running record too.
  if (const auto d = curve_defect(j)) rd.fail(d->key, d->want.c_str());
  if (const auto d = run_facts_defect(j)) rd.fail(d->key, d->want.c_str());
  if (const auto d = plan_defect(j)) rd.fail(d->key, d->want.c_str());
  if (r.status != "complete") return r;  // a running record carries only partial fields
  const json& m = rd.obj(j, "measured");
  const Reader rm = rd.in("measured");
  // What every record `run` writes and `moeplan report` reads, checked here too, so that the two
  // (and `run`'s skip, which reads records this way) accept the same records.
  r.steps = rm.integer(m, "steps");
  rm.obj(m, "matches_plan");
  const json& c = rm.obj(m, "compute");
  r.compute_paper = rm.in("compute").real(c, "paper");
  if (!c.contains("within_rounding") || !c.at("within_rounding").is_boolean())
    rm.in("compute").fail("within_rounding", "true or false");
  for (const char* k : {"final_val_bpc", "train_seconds", "wall_seconds"}) rd.real(j, k);
  r.has_measured = true;
  r.total_params = rm.integer(m, "total_params");
  r.active_params = rm.integer(m, "active_params");
  const json& f = rm.obj(m, "flops");
  const Reader rf = rm.in("flops");
  const std::string mask = rf.text(f, "executed_mask");
  const auto mk = parse_attention_mask(mask);
  if (!mk)
    throw InputError(fmt::format("{}: executed_mask '{}' (valid: causal, full)", r.source, mask));
  r.executed_mask = *mk;
  r.ledger_total = rf.count(f, "total");
  // Every category and phase, each a count: one missing is not read as zero.
  r.ledger = flop_ledger_from_json(f, r.source, "measured.flops.");
  if (f.contains("conventions") && f.at("conventions").is_object())
    for (const auto& [k, v] : f.at("conventions").items())
      if (v.is_number()) r.conventions[k] = v.get<double>();
  if (f.contains("validation")) {
    const json& v = rf.obj(f, "validation");
    r.has_validation_ledger = true;
    r.validation_total = rf.in("validation").count(v, "total");
    r.validation_ledger = flop_ledger_from_json(v, r.source, "measured.flops.validation.");
    // Its evaluations are val_curve's entries: a record with the ledger must say them.
    if (!j.contains("val_curve") || !j.at("val_curve").is_array())
      rd.fail("val_curve", "an array (the evaluations the validation ledger counts)");
  }
  if (j.contains("val_curve")) r.evaluations = int64_t(j.at("val_curve").size());
  const json& t = rm.obj(m, "tokens");
  const Reader rt = rm.in("tokens");
  r.tokens_consumed = rt.integer(t, "consumed");
  r.tokens_unique = rt.integer(t, "unique");
  r.epochs = rt.real(t, "epochs");
  r.tokens_dropped = rt.integer_or(t, "dropped", 0);
  return r;
}

namespace {

// What a record read, in words: the source, the built-in generator's seed, the held-out tokens.
std::string data_read(const RunRecord& r) {
  std::string s = r.data_source;
  if (r.data_source == "builtin") {
    const auto it = r.train.find("data_seed");
    s += fmt::format(", data_seed {}", it == r.train.end() ? "unrecorded" : it->second);
  }
  return s + fmt::format(", {} validation tokens", r.validation_tokens);
}

// Equal D̂ is the same unique tokens only from the same source, and the BPCs compare only on the
// same held-out set: every point must have read what the dense baseline (or the first) read.
// The [train] settings that change training but not the data (seed, losses, positions, ...) are
// compared too: a difference is a warning, the points were not trained alike.
void same_data_claim(const std::vector<PointValues>& pts, const std::vector<const RunRecord*>& rs,
                     AuditReport& report) {
  const auto base_at = std::find_if(pts.begin(), pts.end(), [](auto& p) { return p.dense; });
  const size_t b = base_at == pts.end() ? 0 : size_t(base_at - pts.begin());
  const RunRecord& base = *rs[b];
  const std::string who = base_at == pts.end() ? "the first point" : "the dense baseline";
  // Records that do not say which data they read: a sweep of older records is only told so;
  // one such record among records that say it (a `data` removed by hand) fails the claim.
  const auto unsaid = std::count_if(rs.begin(), rs.end(),
                                    [](const RunRecord* r) { return r->data_source.empty(); });
  const bool mixed = unsaid > 0 && size_t(unsaid) < rs.size();
  ClaimVerdict cv;
  const std::string want = data_read(base);
  cv.name = base.data_source.empty()
                ? std::string("the same data for every point (source, held-out set)")
                : fmt::format("the same data for every point (source, held-out set) as {}: {}",
                              base.point_id, want);
  for (const RunRecord* r : rs)
    if (r->data_source.empty())
      report.findings.push_back(Finding{
          mixed ? Severity::error : Severity::info,
          r->point_id,
          0,
          "data",
          {},
          {},
          {},
          0,
          mixed ? fmt::format("{} does not say which data it read while the sweep's other records "
                              "do: the same-data claim cannot hold",
                              r->source)
                : fmt::format("{} does not say which data it read (an older record): the same-data "
                              "claim is not checked",
                              r->source)});
  if (unsaid > 0) {
    if (mixed) {
      for (const RunRecord* r : rs) cv.rows.push_back(r->point_id);
      cv.holds = false;
      report.claims.push_back(cv);
    }
  } else {
    // The same source by name can still be other tokens (a file edited between runs): the
    // fingerprints of the held-out set, and of the training region when D̂ is the same, must agree.
    auto other_tokens = [&](const RunRecord& r) {
      std::string s;
      if (!r.validation_fingerprint.empty() && !base.validation_fingerprint.empty() &&
          r.validation_fingerprint != base.validation_fingerprint)
        s = fmt::format("held-out set {} against {}", r.validation_fingerprint,
                        base.validation_fingerprint);
      if (r.tokens_unique == base.tokens_unique && !r.training_fingerprint.empty() &&
          !base.training_fingerprint.empty() && r.training_fingerprint != base.training_fingerprint)
        s += fmt::format("{}training region {} against {}", s.empty() ? "" : ", ",
                         r.training_fingerprint, base.training_fingerprint);
      return s;
    };
    for (const RunRecord* r : rs) {
      cv.rows.push_back(r->point_id);
      const std::string got = data_read(*r);
      std::string msg;
      if (got != want)
        msg = fmt::format("read {}; {} {} read {}", got, who, base.point_id, want);
      else if (const std::string diff = other_tokens(*r); !diff.empty())
        msg = fmt::format(
            "read {} as {} {} did, but other tokens (fingerprints: {}): the source "
            "changed between the runs",
            got, who, base.point_id, diff);
      if (msg.empty()) continue;
      cv.holds = false;
      report.findings.push_back(
          Finding{Severity::error, r->point_id, 0, "data", {}, {}, {}, 0, std::move(msg)});
    }
    report.claims.push_back(cv);
  }
  // The [train] settings, whether or not the records say their data.
  std::set<std::string> keys;
  for (const RunRecord* r : rs)
    for (const auto& kv : r->train) keys.insert(kv.first);
  for (const std::string& key : keys) {
    if (key == "source" || (key == "data_seed" && unsaid == 0) || key == "eval_every" ||
        key == "eval_tokens")
      continue;  // the data claim above, or when and how much validation: not the training
    auto value = [&](const RunRecord& r) {
      const auto it = r.train.find(key);
      return it == r.train.end() ? std::string("unrecorded") : it->second;
    };
    std::string differ, first;  // the finding is filed under the first point that differs
    for (const RunRecord* r : rs)
      if (value(*r) != value(base)) {
        if (first.empty()) first = r->point_id;
        differ += fmt::format("{}{} {}", differ.empty() ? "" : ", ", r->point_id, value(*r));
      }
    if (!differ.empty())
      report.findings.push_back(
          Finding{Severity::warning,
                  first,
                  0,
                  "train",
                  {},
                  {},
                  {},
                  0,
                  fmt::format("[train] {} differs across the sweep: {} against {} for {} {}; the "
                              "points were not trained alike",
                              key, differ, value(base), who, base.point_id)});
  }
}

}  // namespace

AuditReport audit_runs(const std::vector<RunRecord>& records, const std::vector<Plan>& planned,
                       const RunsAuditOptions& opt) {
  AuditReport report;
  RunAuditor au(opt, report);
  std::vector<PointValues> pts;
  std::vector<const RunRecord*> done;                        // the complete records, as pts
  std::vector<std::pair<std::string, const Plan*>> audited;  // every record's plan, as audited
  for (const RunRecord& r : records) {
    const Plan* plan = &r.plan;
    if (!planned.empty()) {
      const auto it = std::find_if(planned.begin(), planned.end(),
                                   [&](const Plan& p) { return p.id == r.point_id; });
      if (it == planned.end()) {
        au.add(Severity::warning, r.point_id, "plan", {}, {}, 0,
               fmt::format("{}: point '{}' is not in the manifest; audited against the plan it "
                           "carries",
                           r.source, r.point_id));
      } else {
        plan = &*it;
        // Every value of the plan, as `moeplan run` compares them before it skips or resumes a
        // point (a learning rate or warm-up edited since is another point, too).
        if (const std::string d = plan_differ(r.plan_json, plan_to_json(*it)); !d.empty())
          au.add(Severity::warning, r.point_id, "plan", {}, {}, 0,
                 fmt::format("the record was made from a different plan than the manifest's "
                             "point: {}; audited against the manifest",
                             d));
      }
    }
    if (!opt.manifest_train.empty() && !r.train.empty()) {
      std::string d;
      for (const auto& [key, want] : opt.manifest_train) {
        const auto it = r.train.find(key);
        const std::string got = it == r.train.end() ? "unset" : it->second;
        if (got != want)
          d += fmt::format("{}{} = {} (the manifest: {})", d.empty() ? "" : ", ", key, got, want);
      }
      if (!d.empty())
        au.add(Severity::warning, r.point_id, "train", {}, {}, 0,
               fmt::format("trained with other [train] settings than the manifest's: {}", d));
    }
    audited.emplace_back(r.point_id, plan);
    if (r.status != "complete") {
      au.add(Severity::error, r.point_id, "status", {}, {}, 0,
             fmt::format("record is '{}', not complete: not audited, and the sweep's claims "
                         "cannot hold without it",
                         r.status));
      continue;
    }
    ClaimVerdict point;
    point.name = fmt::format("run {}: measured ledgers match the plan", r.point_id);
    point.rows.push_back(r.point_id);
    const size_t first = report.findings.size();
    const double n = au.check_params(r, *plan);
    const double c = au.check_flops(r, *plan);
    au.check_tokens(r, *plan);
    au.check_validation_flops(r, *plan);
    for (size_t i = first; i < report.findings.size(); ++i)
      if (report.findings[i].severity == Severity::error) point.holds = false;
    report.claims.push_back(point);
    done.push_back(&r);
    pts.push_back({r.point_id, plan->role == "dense", n, c, double(r.tokens_unique),
                   plan->budget.reuse, r.epochs});
  }
  // One sweep: its points planned in one FLOP convention under one counting reading and one
  // reuse rule (what `moeplan grid` makes and `show` checks). Records put together from two
  // sweeps would compare C in two conventions, or D̂ of a strict point with a loose one's.
  auto reading = [](const Plan& p) {
    return fmt::format("{} with {} reuse", flops_label(p.arch, p.convention, p.mask),
                       p.budget.reuse == Reuse::strict ? "strict" : "loose");
  };
  for (const auto& [id, plan] : audited)
    if (reading(*plan) != reading(*audited.front().second))
      throw InputError(fmt::format(
          "point '{}' was planned in {}, point '{}' in {}: the records are not one sweep (its "
          "points share the FLOP convention, the counting readings and the reuse rule); audit "
          "each sweep's folder on its own",
          id, reading(*plan), audited.front().first, reading(*audited.front().second)));
  // A sweep's claims are about all its points: one still running, or planned and not started,
  // leaves them unproven (it may be the point that breaks equal N), so the audit does not pass.
  ClaimVerdict complete;
  complete.name = "every point of the sweep has a complete record";
  for (const RunRecord& r : records) {
    complete.rows.push_back(r.point_id);
    if (r.status != "complete") complete.holds = false;
  }
  for (const Plan& p : planned)
    if (std::none_of(records.begin(), records.end(),
                     [&](const RunRecord& r) { return r.point_id == p.id; })) {
      au.add(Severity::error, p.id, "record", {}, {}, 0,
             "planned point has no record yet: the sweep's claims cannot hold without it");
      complete.rows.push_back(p.id);
      complete.holds = false;
    }
  if (!planned.empty() || !complete.holds) report.claims.push_back(complete);
  // An equal-resource sweep is measured against its dense baseline: without one the claims
  // below are spreads over the MoE points, which says nothing about MoE against dense.
  if (pts.size() >= 2 && std::none_of(pts.begin(), pts.end(), [](auto& p) { return p.dense; }))
    au.add(Severity::warning, pts.front().id, "baseline", {}, {}, 0,
           "no complete dense baseline record among the runs: the equal N, C and D̂ claims are "
           "spreads over the MoE points only, not a comparison with dense");
  if (pts.size() >= 2) {
    const double ntol = opt.n_tolerance.value_or(opt.tolerance);
    const double ctol = opt.compute_tolerance.value_or(opt.tolerance);
    // The convention the points' C is in: the plan each was audited against (the manifest's with
    // --plan), not the record's own; a record planned in another was labelled in its own while
    // its value was the manifest's.
    const Plan& first_plan = *audited.front().second;
    const std::string conv = flops_label(first_plan.arch, first_plan.convention, first_plan.mask);
    report.claims.push_back(equal_claim("equal total parameters N across the sweep", "total_params",
                                        pts, &PointValues::n, ntol, report.findings));
    report.claims.push_back(
        equal_claim(fmt::format("equal training compute C ({}) across the sweep", conv), "compute",
                    pts, &PointValues::c, ctol, report.findings));
    const bool strict = std::all_of(pts.begin(), pts.end(),
                                    [](const PointValues& p) { return p.reuse == Reuse::strict; });
    if (strict)
      report.claims.push_back(equal_claim("equal unique data D̂ (strict reuse) across the sweep",
                                          "tokens_unique", pts, &PointValues::d_unique, 0,
                                          report.findings));
    else  // loose reuse: one number of epochs for every point (up to D̂'s whole windows)
      report.claims.push_back(equal_claim("equal epochs (loose reuse) across the sweep", "epochs",
                                          pts, &PointValues::epochs, opt.tolerance,
                                          report.findings));
    same_data_claim(pts, done, report);
  }
  // One sweep's records carry its tolerances alike: a folder whose records disagree holds points
  // of two sweeps, and which one's tolerance judged equal N and C would be an accident.
  ClaimVerdict tolerances;
  tolerances.name = "every record carries the same sweep tolerances";
  const RunRecord* first_tol = nullptr;  // the dense baseline's, else the first that has them
  for (const RunRecord& r : records) {
    if (!r.n_tolerance || !r.compute_tolerance) continue;
    tolerances.rows.push_back(r.point_id);
    if (!first_tol || (r.plan.role == "dense" && first_tol->plan.role != "dense")) first_tol = &r;
  }
  for (const RunRecord& r : records) {
    if (!first_tol || !r.n_tolerance || !r.compute_tolerance || &r == first_tol) continue;
    if (*r.n_tolerance == *first_tol->n_tolerance &&
        *r.compute_tolerance == *first_tol->compute_tolerance)
      continue;
    tolerances.holds = false;
    au.add(Severity::error, r.point_id, "sweep_tolerances", *first_tol->n_tolerance, *r.n_tolerance,
           0,
           fmt::format("carries sweep tolerances N {:g} %, C {:g} %, {} carries N {:g} %, C {:g} "
                       "%: records of two sweeps (`--plan sweep.toml` holds every record to "
                       "the manifest's)",
                       100 * *r.n_tolerance, 100 * *r.compute_tolerance, first_tol->point_id,
                       100 * *first_tol->n_tolerance, 100 * *first_tol->compute_tolerance));
  }
  if (!tolerances.holds) report.claims.push_back(tolerances);
  for (const RunRecord& r : records)
    if (r.equal_resources && !*r.equal_resources)
      au.add(Severity::warning, r.point_id, "equal_resources", {}, {}, 0,
             "trained from a manifest that says equal_resources = false (an ablation or a "
             "test): these runs are not an equal-resource comparison");
  report.sort_findings();
  return report;
}

}  // namespace moeplan::audit
