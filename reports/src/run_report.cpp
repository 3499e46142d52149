#include "moeplan/reports/run_report.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeplan/accounting/budget.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/reports/format.hpp"
#include "moeplan/reports/plot.hpp"
#include "moeplan/reports/stats.hpp"
#include "moeplan/reports/text_table.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/ledger_json.hpp"
#include "moeplan/sweeps/manifest.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "moeplan/sweeps/runs_folder.hpp"

namespace moeplan {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_record(const fs::path& f) {
  std::error_code ec;
  if (fs::is_directory(f, ec))
    throw InputError(fmt::format("record '{}' is a folder, not a file", f.string()));
  std::ifstream in(f, std::ios::binary);
  if (!in)
    throw InputError(
        fmt::format("record '{}' cannot be read ({})", f.string(), std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& x) {
    throw InputError(fmt::format("record '{}' is not valid JSON: {} ({})", f.string(),
                                 json_error_text(x), damaged_record_remedy(f)));
  }
}

bool is_dense(const json& r) {
  return r["plan"].value("role", "") == "dense";
}
bool is_complete(const json& r) {
  return r.value("status", "") == "complete";
}
// The folder's complete dense baseline, the one every "vs dense" figure is against (nullptr
// where there is none; load_run_records refuses a folder with two).
const json* complete_dense(const std::vector<json>& records) {
  const json* dense = nullptr;
  for (const json& r : records)
    if (is_dense(r) && is_complete(r)) dense = &r;
  return dense;
}
// The parts (facts, arith) of a complete record's final evaluation; nullptr where it has none (a
// point still training, a source without parts).
const json* final_parts(const json& r) {
  if (!is_complete(r) || !r.contains("val_curve") || r["val_curve"].empty() ||
      !r["val_curve"].back().contains("parts"))
    return nullptr;
  return &r["val_curve"].back()["parts"];
}
// The audit's findings on a record, put there by annotate() under a key no record file has:
// {"errors": [...], "warnings": [...]}.
constexpr const char* kAuditKey = "$audit";
// Why `moeplan audit` will not judge the record's folder as one sweep ("" when it does).
std::string folder_refusal(const json& r) {
  return r.contains(kAuditKey) ? r[kAuditKey].value("folder_refused", "") : "";
}
bool has_audit_error(const json& r) {
  return r.contains(kAuditKey) && !r[kAuditKey]["errors"].empty();
}
std::string first_audit_error(const json& r) {
  if (!has_audit_error(r)) return "";
  const json& e = r[kAuditKey]["errors"];
  return e.front().get<std::string>() +
         (e.size() > 1 ? fmt::format(" (and {} more)", e.size() - 1) : "");
}
// Whether the audit finds the record's FLOP ledger wrong (its total, or a category against the
// analytic ledger): the summary C the table shows is then no evidence of equal compute.
bool ledger_flagged(const json& r) {
  if (!r.contains(kAuditKey) || !r[kAuditKey].contains("error_quantities")) return false;
  for (const json& q : r[kAuditKey]["error_quantities"]) {
    const std::string s = q.get<std::string>();
    // "flops": the ledger's total against its categories; "flops:<category>": a category
    // against the analytic ledger of the steps run. Not "compute": the sweep's equal-C claim
    // books its errors there too, for points whose own ledger and plan agree.
    if (s == "flops" || s.rfind("flops:", 0) == 0) return true;
  }
  return false;
}
std::vector<json> annotate(const std::vector<json>& records, const FolderAudit* audit) {
  std::vector<json> out = records;
  if (!audit) return out;
  for (json& r : out) {
    const std::string id = r.value("point_id", "");
    json a = {{"errors", json::array()}, {"warnings", json::array()}};
    if (const auto it = audit->errors.find(id); it != audit->errors.end()) a["errors"] = it->second;
    if (const auto it = audit->error_quantities.find(id); it != audit->error_quantities.end())
      a["error_quantities"] = it->second;
    if (const auto it = audit->warnings.find(id); it != audit->warnings.end())
      a["warnings"] = it->second;
    // A folder the audit will not judge as one sweep: no record has an error of its own, but no
    // point is set against the baseline (the table never declares a win the audit refuses).
    if (!audit->refused.empty()) a["folder_refused"] = audit->refused;
    r[kAuditKey] = a;
  }
  return out;
}

// Trained from a manifest that says equal_resources = false (an ablation, a test); records
// written before 2026-12-03 do not say, and are taken as planned equal.
bool not_equal_resource_sweep(const json& r) {
  return r.value("sweep_equal_resources", true) == false;
}
// The points that say so, for the banner.
std::string ablation_points(const std::vector<json>& records) {
  std::string s;
  for (const json& r : records)
    if (not_equal_resource_sweep(r))
      s += fmt::format("{}{}", s.empty() ? "" : ", ", r.value("point_id", "?"));
  return s;
}

// What a record's validation BPC was measured on and what it trained from: the source, the
// built-in generator's seed, the held-out tokens a pass scores ("" in records that do not say).
std::string data_label(const json& r, bool with_data_seed = true) {
  if (!r.contains("data") || !r["data"].is_object()) return "";
  const json& d = r["data"];
  // A path's line break or escape sequence would break the line it is printed in.
  std::string s = printable(d.value("source", "?"));
  if (with_data_seed && s == "builtin" && r.contains("train") && r["train"].contains("data_seed"))
    s += fmt::format(", data_seed {}", r["train"]["data_seed"].dump());
  return s + fmt::format(", {} validation tokens", d.value("validation_tokens", int64_t{0}));
}

// A point's BPC is compared with the dense baseline's only when both read the same data (a
// record that does not say is taken at its word).
bool same_data(const json& r, const json& dense) {
  // data_seed only where both records carry their [train] settings (older records do not).
  const bool seeds = r.contains("train") && dense.contains("train");
  const std::string a = data_label(r, seeds), b = data_label(dense, seeds);
  if (a.empty() || b.empty()) return true;
  // The same source by name but other tokens by content (a file edited between runs): the
  // held-out set, and the training region where both read the same D̂ (a point of more unique
  // tokens reads a longer region, with its own fingerprint), as `audit` compares them.
  const auto same = [&](const char* key) {
    const std::string fa = r["data"].value(key, ""), fb = dense["data"].value(key, "");
    return fa.empty() || fb.empty() || fa == fb;
  };
  const auto unique = [](const json& x) {
    return x.contains("measured") ? x["measured"]["tokens"].value("unique", int64_t{-1}) : -1;
  };
  return a == b && same("validation_fingerprint") &&
         (unique(r) != unique(dense) || same("training_fingerprint"));
}

// Why a complete record is not an equal-resource peer of the dense baseline ("" when it is), from
// what both measured: N and C (in the convention the sweep was planned in) within 1 % of the
// baseline's (audit's default tolerance),
// and under strict reuse exactly the baseline's D̂ unique. A point that breaks the contract gets
// no "vs dense" figure, bar or chart point: its BPC difference would not be a fair comparison.
// The FLOP convention a record's plan equalised C in ("paper", "exact/causal", "megatron"), and
// its measured C through that convention's lens, from the ledger (nullopt where the record does
// not carry it: older records; paper is always there).
std::string plan_convention(const json& r) {
  const std::string c = r["plan"].value("convention", "paper");
  return c == "exact" ? "exact/" + r["plan"].value("mask", "causal") : c;
}
std::optional<double> measured_compute(const json& r, const std::string& label) {
  const json& m = r["measured"];
  if (label == "paper") return m["compute"].value("paper", 0.0);
  const json& f = m["flops"];
  if (f.contains("conventions") && f["conventions"].contains(label))
    return f["conventions"][label].get<double>();
  return std::nullopt;
}

// The paper lens of a record's ledger counts what its N_a counts: with the router's or the
// norms' weights in N_a (--count-router, --count-norms), its C is "paper (router in)", as grid
// and run label it.
std::string paper_label(const json& r) {
  Arch a;
  if (r["plan"].contains("arch")) {
    const json& arch = r["plan"]["arch"];
    a.count_router = arch.value("count_router", false);
    a.count_norms = arch.value("count_norms", false);
  }
  return flops_label(a, Convention::paper, AttentionMask::full);
}

// One label for a column or an axis over every record; where records differ, each is named.
std::string common_label(const std::vector<json>& records,
                         const std::function<std::string(const json&)>& label_of) {
  std::vector<std::string> seen;
  for (const json& r : records)
    if (std::find(seen.begin(), seen.end(), label_of(r)) == seen.end()) seen.push_back(label_of(r));
  if (seen.empty()) return "paper";
  std::string s = seen[0];
  for (size_t i = 1; i < seen.size(); ++i) s += " or " + seen[i];
  return s;
}

// The sweep's n_tolerance and compute_tolerance as its dense baseline's record carries them
// (`run` writes the manifest's), else 1 % each, `audit`'s default.
std::pair<double, double> sweep_tolerances(const json& dense) {
  const json t = dense.value("sweep_tolerances", json::object());
  return {t.value("n", 0.01), t.value("compute", 0.01)};
}

// v within a relative tolerance of base (a positive base), as the audit's tolerances are read.
bool within(double v, double base, double tol) {
  return base > 0 && std::fabs(v / base - 1) <= tol + 1e-9;
}

std::string unequal_resources(const json& r, const json& dense) {
  if (!is_complete(r) || !is_complete(dense)) return "";
  const json &m = r["measured"], &d = dense["measured"];
  const auto [n_tol, c_tol] = sweep_tolerances(dense);
  std::string why;
  double tol = n_tol;
  auto rel = [&](const char* what, double v, double base) {
    if (within(v, base, tol)) return;
    why += fmt::format("{}{} {} is {:+.2f}% from the baseline's {}", why.empty() ? "" : ", ", what,
                       human(v), base > 0 ? 100 * (v / base - 1) : 100.0, human(base));
  };
  rel("N", double(m.value("total_params", int64_t{0})),
      double(d.value("total_params", int64_t{0})));
  // C in the convention the sweep was planned in: an exact-planned sweep is equal in exact C and
  // may be 3 % apart in paper C (the attention term differs), which the audit does not call
  // unequal either.
  std::string conv = plan_convention(dense);
  auto c = measured_compute(r, conv), dc = measured_compute(dense, conv);
  if (!c || !dc) conv = "paper", c = measured_compute(r, conv), dc = measured_compute(dense, conv);
  tol = c_tol;
  rel(fmt::format("C [{}]", conv == "paper" ? paper_label(dense) : conv).c_str(), *c, *dc);
  if (dense["plan"].value("reuse", "strict") == "strict") {
    const int64_t u = m["tokens"].value("unique", int64_t{0}),
                  du = d["tokens"].value("unique", int64_t{0});
    if (u != du)
      why += fmt::format("{}D̂ {} unique is not the baseline's {} (strict reuse)",
                         why.empty() ? "" : ", ", human(double(u)), human(double(du)));
  }
  return why;
}

// A point's BPC is set against the baseline's only when both read the same data and had equal
// resources.
bool comparable(const json& r, const json& dense) {
  return same_data(r, dense) && unequal_resources(r, dense).empty() && !has_audit_error(r) &&
         !has_audit_error(dense) && folder_refusal(dense).empty();
}

// C [paper] within the plan's rounding of its target (the record's `within_rounding`, recomputed),
// and a FLOP ledger behind it that the folder's audit finds no error in.
bool compute_ok(const json& r) {
  const json &p = r["plan"], &c = r["measured"]["compute"];
  const bool paper = p.value("convention", "") == "paper";
  const double plan_c = paper ? p.value("compute", 0.0) : c.value("plan_paper", 0.0);
  // Records without a target (hand-made, older) are held to the planned C itself.
  const double target = paper && p.contains("compute_target") ? p.value("compute_target", 0.0)
                                                              : c.value("target_paper", plan_c);
  return is_complete(r) && !ledger_flagged(r) &&
         within_rounding(c.value("paper", 0.0), target, plan_c);
}

// Whether a record did what its plan said, from the numbers (not the record's own flags): the
// planned steps, D consumed, D̂ unique and epochs exactly, and C [paper] within the plan's
// rounding of its target.
bool matches_plan(const json& r) {
  const json &p = r["plan"], &m = r["measured"], &tok = m["tokens"];
  const int64_t consumed = tok.value("consumed", int64_t{0}),
                unique = tok.value("unique", int64_t{0});
  const int64_t planned = p.value("tokens_consumed", int64_t{-1}),
                planned_unique = p.value("tokens_unique", int64_t{-1});
  // The epochs the record states, against its plan's (the table prints both).
  const double epochs = tok.value("epochs", 0.0), planned_epochs = p.value("epochs", -1.0);
  const bool epochs_ok = std::fabs(epochs - planned_epochs) <= 1e-9 * std::fabs(planned_epochs);
  return m.value("steps", int64_t{-1}) == p.value("steps", int64_t{-2}) && consumed == planned &&
         unique == planned_unique && epochs_ok && compute_ok(r);
}

std::string html_escape(const std::string& s) {
  return escape_html(s);
}

// A paragraph of several lines (the verdict): one <p> a line in HTML, one Markdown paragraph a
// line with '<', '>' and '&' escaped (point ids and data sources are the user's text).
std::string html_paragraphs(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    if (end > start) out += "<p>" + html_escape(text.substr(start, end - start)) + "</p>\n";
    start = end + 1;
  }
  return out;
}
std::string md_paragraphs(const std::string& text) {
  return escape_markdown(text, "\n\n");
}
// Preformatted text (the bars) as an indented code block: every line four spaces in. Unlike a
// ``` fence, nothing in the text (a point id's backticks) can end it early.
std::string md_code_block(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out += "    " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

// The HTML report's page head, titled `heading`, and its first heading: both reports share its
// style. Prose no wider than a reader follows, numbers in columns of even digits, a wide table
// scrolled within its own box rather than the page, its point column staying in view.
std::string html_head(const std::string& heading) {
  return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(heading) +
         "</title><style>"
         "body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222}"
         "h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.8em}"
         "p{max-width:62em;line-height:1.45}.wide{overflow-x:auto}"
         "table{border-collapse:collapse;font-variant-numeric:tabular-nums}"
         "td,th{padding:3px 9px;text-align:right;border-bottom:1px solid #e4e4e4}"
         "td{white-space:nowrap}th{background:#e9eef3;vertical-align:bottom}"
         ".l{text-align:left}td:first-child,th:first-child{text-align:left;position:sticky;left:0}"
         "td:first-child{background:#fff}tr:nth-child(even) td{background:#f6f6f6}"
         "</style></head><body>\n<h1>" +
         html_escape(heading) + "</h1>\n";
}

// A title of several sentences as an HTML heading (its first sentence) and a paragraph (the
// rest), as the Markdown report splits it.
std::string html_section(const std::string& title, const char* tag) {
  const size_t end = title.find(". ");
  if (end == std::string::npos) return fmt::format("<{0}>{1}</{0}>\n", tag, html_escape(title));
  return fmt::format("<{0}>{1}</{0}>\n<p>{2}</p>\n", tag, html_escape(title.substr(0, end)),
                     html_escape(title.substr(end + 2)));
}

// A table of the report as HTML, in a box of its own that scrolls across where it is wider than
// the page.
std::string html_table(const TextTable& t) {
  return "<div class=\"wide\">" + t.render_html() + "</div>\n";
}

// The C columns carry the paper lens's label: "paper (router in)" where N_a counts the router.
std::vector<std::string> headers(const std::string& paper) {
  return {"point",
          "r_a",
          "r_a target",
          "N plan",
          "N meas",
          "C plan [" + paper + "]",
          "C meas [" + paper + "]",
          "C ok",
          "D plan (consumed)",
          "D meas (consumed)",
          "D̂ plan (unique)",
          "D̂ meas (unique)",
          "epochs plan",
          "epochs meas",
          "val BPC",
          "vs dense",
          "facts BPC",
          "arith BPC",
          "wall s",
          "status"};
}

// The r_a asked for, '!' where the plan could not reach it (grid's mark); "-" for the dense
// baseline and for records without a target.
std::string target_cell(const json& plan) {
  if (plan.value("role", "") == "dense" || !plan.contains("activation_rate_target")) return "-";
  return fmt::format("{:.3f}{}", plan.value("activation_rate_target", 0.0),
                     plan.value("reachable", true) ? "" : " !");
}

// A line naming the points the shape rules could not bring to their target r_a (grid's '!'):
// their ids name the target, so a report read without the grid output would misstate what was
// compared. Empty when there are none.
std::string missed_targets(const std::vector<const json*>& plans) {
  std::string missed;
  for (const json* p : plans) {
    if (p->value("role", "") == "dense" || p->value("reachable", true)) continue;
    const std::string note = printable(p->value("note", ""));
    missed += fmt::format("{}{} trains r_a {:.3f} (target {:.3f}{})", missed.empty() ? "" : ", ",
                          p->value("id", "?"), p->value("activation_rate", 0.0),
                          p->value("activation_rate_target", 0.0),
                          note.empty() ? "" : "; its plan's note: " + note);
  }
  return missed.empty() ? ""
                        : "\n! off its target r_a (not reachable under the shape rules): " + missed;
}

// Why a complete MoE point's BPC is not set against the complete dense baseline's, in the
// table's words ("" where it is: comparable()).
std::string not_compared(const json& r, const json& dense) {
  return !same_data(r, dense)                           ? "other data"
         : !unequal_resources(r, dense).empty()         ? "not equal"
         : has_audit_error(r) || has_audit_error(dense) ? "audit error"
         : !folder_refusal(dense).empty()               ? "not one sweep"
                                                        : "";
}

std::vector<std::string> row_of(const json& r, const json* dense) {
  const json& p = r["plan"];
  const json& m = r["measured"];
  const json& tok = m["tokens"];
  const bool complete = is_complete(r);
  const double bpc = r.value("final_val_bpc", 0.0);
  std::string facts = "-", arith = "-";
  // The parts of the final evaluation, as val BPC: a running point has none yet.
  if (const json* final = final_parts(r)) {
    const json& parts = *final;
    if (parts.contains("facts")) facts = fmt::format("{:.3f}", parts["facts"].get<double>());
    if (parts.contains("arith")) arith = fmt::format("{:.3f}", parts["arith"].get<double>());
  }
  std::string vs = "-";
  if (!is_dense(r) && dense && complete) {
    vs = not_compared(r, *dense);
    if (vs.empty()) vs = fmt::format("{:+.3f}", bpc - dense->value("final_val_bpc", 0.0));
  }
  return {r.value("point_id", "?"), fmt::format("{:.3f}", p.value("activation_rate", 0.0)),
          target_cell(p), human(p.value("total_params", 0.0)),
          human(double(m.value("total_params", int64_t{0}))),
          // The plan's C through the paper lens (the column's convention), not plan.compute,
          // which is in the plan's own convention.
          human(m["compute"].value("plan_paper", p.value("compute", 0.0))),
          human(m["compute"].value("paper", 0.0)),
          !complete       ? "-"
          : compute_ok(r) ? "yes"
                          : "no",  // a running point's C is partial
          human(p.value("tokens_consumed", 0.0)), human(double(tok.value("consumed", int64_t{0}))),
          human(p.value("tokens_unique", 0.0)), human(double(tok.value("unique", int64_t{0}))),
          ratio(p.value("epochs", 0.0), 3), ratio(tok.value("epochs", 0.0), 3),
          complete ? fmt::format("{:.4f}", bpc) : "-", vs, facts, arith,
          fmt::format("{:.1f}", r.value("wall_seconds", 0.0)),
          complete ? "complete"
                   : fmt::format("{} (step {})", r.value("status", "?"), m.value("steps", 0))};
}

// Time and FLOP rate: equal C is not equal time. Executed counts every product the device ran
// (the ledger's exact/causal total: masked attention and recomputed products included); useful
// leaves out `padding` and `recompute`. The time ratio is against the dense baseline on the same
// hardware and devices, under the same kernel and thread request, passes and optimizer sharding
// only (timing_label), and not for a record resumed on other hardware or in another layout
// (same_timing).
const std::vector<std::string> kTimeHeaders = {"point",
                                               "device",
                                               "train s",
                                               "tokens/s (consumed)",
                                               "TFLOP/s executed [exact/causal]",
                                               "TFLOP/s useful [exact/causal]",
                                               "FLOPs vs dense [exact/causal useful]",
                                               "train time vs dense"};

// A FLOP count of a record as a double (an integer, or digits past 64 bits); check_record has
// refused a record whose total is neither.
double count_of(const json& v) {
  const auto c = flop_count_from_json(v);
  return c ? double(*c) : 0.0;
}

double category_sum(const json& flops, const char* category) {
  double s = 0;
  if (flops.contains("by_category") && flops["by_category"].contains(category))
    for (const auto& [phase, v] : flops["by_category"][category].items()) s += count_of(v);
  return s;
}

// The FLOPs a record's products did for the model: the ledger's exact/causal total less
// `padding` and `recompute` (what the time table calls useful).
double useful_flops(const json& r) {
  const json& flops = r["measured"]["flops"];
  const double total = flops.contains("total") ? count_of(flops["total"]) : 0.0;
  return total - category_sum(flops, "padding") - category_sum(flops, "recompute");
}

// A point's useful FLOPs over the dense baseline's, for complete points compared with it (same
// data, equal resources): the work behind its time, where the time ratio is the work's ratio
// over the rate's. Equal C in a convention is not equal work: the paper convention counts
// neither the LM head nor the router, whose FLOPs grow with the tokens a point consumes, and
// counts attention unmasked.
std::optional<double> work_vs_dense(const json& r, const json* dense) {
  if (!dense || !is_complete(r) || !is_complete(*dense) || !comparable(r, *dense))
    return std::nullopt;
  const double base = useful_flops(*dense), own = useful_flops(r);
  if (!(base > 0) || !(own > 0)) return std::nullopt;
  return own / base;
}

// The device and its hardware (each session's, in order, where a resume moved it; records before
// the `hardware` field: none), how many of them (data-parallel ranks, when more than one), the
// kernels that ran on it (records before the `kernels` field: the device), and what else changes
// the time: passes smaller than a rank's share of the batch (`--micro-batch`) and a sharded
// optimizer. `k` stands where the record's kernels go: device_label gives those that ran,
// timing_label those asked for.
std::string label_with(const json& r, const std::string& k) {
  const int w = r.value("world_size", 1);
  std::string hardware;
  for (const json& h : r.value("hardware", json::array()))
    hardware += (hardware.empty() ? "" : " then ") + printable(h.get<std::string>());
  std::string label = printable(r.value("device", "?")) +
                      (hardware.empty() ? "" : " (" + hardware + ")") +
                      (w > 1 ? fmt::format(" x{}", w) : "") + (k.empty() ? "" : " " + k);
  const int64_t pass = r.value("pass_seqs", int64_t(0));
  const int64_t batch = r.contains("plan") ? r["plan"].value("batch_seqs", int64_t(0)) : 0;
  if (pass > 0 && batch > 0 && pass < (batch + w - 1) / w)
    label += fmt::format(" passes of {}", pass);
  if (r.value("optimizer_sharded", false)) label += " sharded optimizer";
  // Resumed under --elastic with other ranks, passes, sharding or threads: where each later
  // layout began.
  const json layouts = r.value("layouts", json::array());
  for (size_t i = 1; i < layouts.size(); ++i)
    label += fmt::format(", another layout from step {}", layouts[i].value("from_step", 0));
  return label;
}

std::string device_label(const json& r) {
  return label_with(r, printable(r.value("kernels", "")));
}

// What times are compared by: the label with the kernels and threads the run asked for in place
// of those it resolved to. `auto` chooses per point (an MoE point's experts kernel, a head width's
// attention kernel, a small model's one CPU thread), so a dense baseline and an MoE point run by
// one command resolve differently and are still each at moeplan's own choice.
bool has_request(const json& r) {
  return r.contains("kernels_requested") && r.contains("threads_requested");
}
std::string timing_label(const json& r) {
  const std::string asked = r["kernels_requested"].get<std::string>();
  const int64_t threads = r["threads_requested"].get<int64_t>();
  return label_with(r, "--kernels " + (asked.empty() ? std::string("auto") : printable(asked)) +
                           (threads > 0 ? fmt::format(" --threads {}", threads) : ""));
}

// Two records' training times are compared only when each ran on one kind of hardware (not
// resumed elsewhere) in one layout (not resumed under --elastic), and their timing labels are the
// same; where either record is from before the request was kept, their device labels (the
// kernels that ran).
bool same_timing(const json& a, const json& b) {
  auto one_kind = [](const json& r) {
    return r.value("hardware", json::array()).size() <= 1 &&
           r.value("layouts", json::array()).size() <= 1;
  };
  if (!one_kind(a) || !one_kind(b)) return false;
  return has_request(a) && has_request(b) ? timing_label(a) == timing_label(b)
                                          : device_label(a) == device_label(b);
}

// The useful FLOP rate of one device over the peak the record names (the CUDA engine's bf16
// tensor peak, where known, or one given to `moeplan run --peak-tflops`, marked "(given)"; a
// record has one only for a run on one kind of hardware).
std::optional<double> mfu_of(const json& r, double useful_per_second) {
  const double peak = r.value("peak_flops_per_second_per_device", 0.0);
  const int w = r.value("world_size", 1);
  if (!(peak > 0) || !(useful_per_second > 0)) return std::nullopt;
  return useful_per_second / double(w) / peak;
}
std::string mfu_cell(const json& r, double useful_per_second) {
  const std::optional<double> mfu = mfu_of(r, useful_per_second);
  if (!mfu) return "-";
  return fmt::format("{:.1f}%{}", 100 * *mfu,
                     r.value("peak_source", "") == "given" ? " (given)" : "");
}

// The most device memory the point's buffers held at once, of its device's (records of a GPU run
// since device_memory was kept; "-" otherwise).
std::string memory_cell(const json& r) {
  if (!r.contains("device_memory") || !r["device_memory"].is_object()) return "-";
  const json& m = r["device_memory"];
  return bytes_text(m.value("peak_bytes", 0.0)) + " of " + bytes_text(m.value("device_bytes", 0.0));
}

// A point still training is set against the baseline on what can be judged before its ledgers
// are whole: the audit judges nothing of it but its status, so its plan must be the baseline's
// equal (N and C within the sweep's tolerances, and under strict reuse the same D̂ unique) and it
// must read the same data; the baseline and the folder must be free of the audit's errors.
bool comparable_so_far(const json& r, const json& dense) {
  if (is_complete(r)) return comparable(r, dense);
  if (!same_data(r, dense) || has_audit_error(dense) || !folder_refusal(dense).empty())
    return false;
  if (has_audit_error(r)) {  // its status alone
    if (!r[kAuditKey].contains("error_quantities")) return false;
    for (const json& q : r[kAuditKey]["error_quantities"])
      if (q != "status") return false;
  }
  const auto [n_tol, c_tol] = sweep_tolerances(dense);
  const json &p = r["plan"], &d = dense["plan"];
  return within(p.value("total_params", 0.0), d.value("total_params", 0.0), n_tol) &&
         within(p.value("compute", 0.0), d.value("compute", 0.0), c_tol) &&
         (d.value("reuse", "strict") != "strict" ||
          p.value("tokens_unique", 0.0) == d.value("tokens_unique", 0.0));
}

// When an MoE point's validation BPC first came to the dense baseline's final BPC or below: the
// training seconds at that evaluation (val_curve_train_seconds; evaluations not counted), none
// where it has not. It may have got there between two evaluations, so the time is at most that.
// A point still training (a sweep stopped at a time limit, or one read while it runs) counts too:
// its curve so far is the start of the curve it will have (the schedule is the plan's), so a time
// it reached the BPC in is final, and one it has not is "not yet" rather than "not reached". Only
// for points compared with the baseline (same data, equal resources) and timed as the time table
// times them (same_timing); `compared` false otherwise, and for records without the times
// (written before they were kept, or resumed from a checkpoint without them).
struct Reached {
  bool compared = false;
  bool complete = false;
  std::optional<double> seconds;
  std::optional<double> bpc;             // the validation BPC at that evaluation
  std::optional<double> last_evaluated;  // training seconds at the last evaluation, if any
};
Reached reached_dense(const json& r, const json* dense) {
  if (!dense || is_dense(r) || !r.contains("val_curve_train_seconds") || !r.contains("val_curve") ||
      !comparable_so_far(r, *dense) || !same_timing(*dense, r) ||
      !(dense->value("train_seconds", 0.0) > 0))
    return {};
  // check_record has read the times as one number a val_curve entry.
  const json &v = r.at("val_curve"), &t = r.at("val_curve_train_seconds");
  const double target = dense->value("final_val_bpc", 0.0);
  Reached got{true, is_complete(r), std::nullopt, std::nullopt, std::nullopt};
  for (size_t i = 0; i < v.size() && i < t.size(); ++i) {
    got.last_evaluated = t[i].get<double>();
    const double bpc = v[i].value("val_bpc", INFINITY);
    if (bpc <= target) {
      got.seconds = got.last_evaluated;
      got.bpc = bpc;
      break;
    }
  }
  return got;
}

std::string reached_cell(const json& r, const json* dense) {
  const Reached got = reached_dense(r, dense);
  if (!got.compared) return "-";
  if (got.seconds)
    return fmt::format("{:.1f} s ({:.2f}x)", *got.seconds,
                       *got.seconds / dense->value("train_seconds", 0.0));
  if (got.complete) return "not reached";
  return got.last_evaluated ? fmt::format("not yet at {:.1f} s", *got.last_evaluated)
                            : "not yet (no evaluation)";
}

// Under the time table: how many compared MoE points reached the dense baseline's final BPC, and
// in what fraction of its training time ("" where none is compared).
std::string reached_summary(const std::vector<json>& records, const json* dense) {
  int compared = 0, reached = 0, faster = 0, training = 0;
  double lo = INFINITY, hi = 0;
  for (const json& r : records) {
    const Reached got = reached_dense(r, dense);
    if (!got.compared) continue;
    ++compared;
    if (!got.seconds) {
      training += !got.complete;
      continue;
    }
    const double ratio = *got.seconds / dense->value("train_seconds", 0.0);
    ++reached;
    faster += ratio < 1;
    lo = std::min(lo, ratio);
    hi = std::max(hi, ratio);
  }
  if (compared == 0) return "";
  std::string s = fmt::format(
      "Time to the dense baseline's final validation BPC ({:.4f}, after {:.1f} s of training): "
      "{} of {} MoE point(s) reached it",
      dense->value("final_val_bpc", 0.0), dense->value("train_seconds", 0.0), reached, compared);
  if (reached > 0)
    s += fmt::format(", in {} the dense baseline's training time; {} of them in less",
                     lo == hi ? fmt::format("{:.2f}x", lo) : fmt::format("{:.2f}x-{:.2f}x", lo, hi),
                     faster);
  if (training > 0)
    s += fmt::format("; {} point(s) still training had not reached it by their last evaluation",
                     training);
  return s +
         ". Each time is the training seconds (evaluations not counted) at the point's first "
         "evaluation at or below that BPC, so at most the time it took; the point trains on "
         "to its own C";
}

// Under the time table: time = work / rate. For the MoE points with both a FLOP ratio and a
// time ratio to the dense baseline, the range of each and of the rate ratio between them (the
// useful rate's: the FLOP ratio over the time ratio); "" where none has both.
std::string work_summary(const std::vector<json>& records, const json* dense) {
  int n = 0;
  double work_lo = INFINITY, work_hi = 0, rate_lo = INFINITY, rate_hi = 0;
  for (const json& r : records) {
    if (is_dense(r)) continue;
    const std::optional<double> work = work_vs_dense(r, dense);
    const double secs = r.value("train_seconds", 0.0),
                 base = dense ? dense->value("train_seconds", 0.0) : 0.0;
    if (!work || !same_timing(*dense, r) || !(secs > 0) || !(base > 0)) continue;
    const double rate = *work / (secs / base);
    ++n;
    work_lo = std::min(work_lo, *work);
    work_hi = std::max(work_hi, *work);
    rate_lo = std::min(rate_lo, rate);
    rate_hi = std::max(rate_hi, rate);
  }
  if (n == 0) return "";
  const auto range = [](double lo, double hi) {
    return fmt::format("{:.2f}x", lo) + (fmt::format("{:.2f}", lo) == fmt::format("{:.2f}", hi)
                                             ? std::string()
                                             : fmt::format("-{:.2f}x", hi));
  };
  std::string s = fmt::format(
      "Time = work / rate: against the dense baseline, {} MoE point(s) timed with it did {} its "
      "useful FLOPs [exact/causal] at {} its useful FLOP rate (each point's train time vs dense "
      "is the first over the second)",
      n, range(work_lo, work_hi), range(rate_lo, rate_hi));
  if (dense->contains("plan") && (*dense)["plan"].value("convention", "") == "paper")
    s += ". Equal C [paper] is not equal work: the paper convention counts neither the LM head "
         "nor the router, whose FLOPs grow with the tokens a point consumes, and counts "
         "attention unmasked";
  return s;
}

// A complete point's training time over the dense baseline's, where timed as the baseline was
// (same_timing).
std::optional<double> time_vs_dense(const json& r, const json* dense) {
  const double secs = r.value("train_seconds", 0.0);
  if (!dense || !same_timing(*dense, r) || !is_complete(r) || !(secs > 0) ||
      !(dense->value("train_seconds", 0.0) > 0))
    return std::nullopt;
  return secs / dense->value("train_seconds", 0.0);
}

std::vector<std::string> time_row_of(const json& r, const json* dense, bool with_mfu,
                                     bool with_memory, bool with_reached) {
  const json& flops = r["measured"]["flops"];
  const double secs = r.value("train_seconds", 0.0);
  const double total = flops.contains("total") ? count_of(flops["total"]) : 0.0;
  const double useful = useful_flops(r);
  const std::optional<double> work = work_vs_dense(r, dense);
  auto rate = [&](double f) { return secs > 0 ? fmt::format("{:.3g}", f / secs / 1e12) : "-"; };
  const std::optional<double> time = time_vs_dense(r, dense);
  const std::string vs = time ? fmt::format("{:.2f}x", *time) : "-";
  std::vector<std::string> row = {
      r.value("point_id", "?"),
      device_label(r),
      fmt::format("{:.1f}", secs),
      secs > 0 ? human(double(r["measured"]["tokens"].value("consumed", int64_t{0})) / secs) : "-",
      rate(total),
      rate(useful),
      work ? fmt::format("{:.2f}x", *work) : "-",
      vs};
  if (with_mfu) row.push_back(mfu_cell(r, secs > 0 ? useful / secs : 0.0));
  if (with_memory) row.push_back(memory_cell(r));
  if (with_reached) row.push_back(reached_cell(r, dense));
  return row;
}

// The csv and json formats: each point's figures as the two tables show them, for a script
// (pandas, a spreadsheet), as numbers: FLOPs, tokens, seconds and bytes unrounded, MFU and the
// ratios to the dense baseline as fractions, null (an empty CSV cell) where a table prints "-".
// The verdicts are the tables': val_bpc_vs_dense only where the table sets the point against the
// baseline, vs_dense saying why not where it does not.
using ordered_json = nlohmann::ordered_json;

// The validation parts (facts, arith) of any complete record's final evaluation, in the order
// first seen: each a column of every row.
std::vector<std::string> final_part_names(const std::vector<json>& records) {
  std::vector<std::string> names;
  for (const json& r : records)
    if (const json* parts = final_parts(r))
      for (const auto& [k, v] : parts->items())
        if (std::find(names.begin(), names.end(), k) == names.end()) names.push_back(k);
  return names;
}

ordered_json export_point(const json& r, const json* dense, const std::vector<std::string>& parts) {
  const json& p = r["plan"];
  const json& m = r["measured"];
  const json& tok = m["tokens"];
  const bool complete = is_complete(r), d = is_dense(r);
  const double secs = r.value("train_seconds", 0.0);
  const auto or_null = [](const std::optional<double>& v) {
    return v ? ordered_json(*v) : ordered_json(nullptr);
  };
  ordered_json o;
  o["point"] = r.value("point_id", "?");
  o["role"] = p.value("role", "?");
  o["status"] = r.value("status", "?");
  o["steps_plan"] = p.value("steps", int64_t{0});
  o["steps_measured"] = m.value("steps", int64_t{0});
  o["activation_rate"] = p.value("activation_rate", 0.0);
  o["activation_rate_target"] = d || !p.contains("activation_rate_target")
                                    ? ordered_json(nullptr)
                                    : ordered_json(p.value("activation_rate_target", 0.0));
  o["target_reachable"] = p.value("reachable", true);
  o["total_params_plan"] = p.value("total_params", 0.0);
  o["total_params_measured"] = m.value("total_params", int64_t{0});
  o["compute_convention"] = paper_label(r);
  o["compute_plan_flops"] = m["compute"].value("plan_paper", p.value("compute", 0.0));
  o["compute_measured_flops"] = m["compute"].value("paper", 0.0);
  o["compute_ok"] = complete ? ordered_json(compute_ok(r)) : ordered_json(nullptr);
  const std::string own = plan_convention(r);
  o["plan_convention"] = own == "paper" ? paper_label(r) : own;
  o["compute_plan_flops_plan_convention"] = p.value("compute", 0.0);
  o["compute_measured_flops_plan_convention"] = or_null(measured_compute(r, own));
  o["tokens_consumed_plan"] = p.value("tokens_consumed", 0.0);
  o["tokens_consumed_measured"] = tok.value("consumed", int64_t{0});
  o["tokens_unique_plan"] = p.value("tokens_unique", 0.0);
  o["tokens_unique_measured"] = tok.value("unique", int64_t{0});
  o["epochs_plan"] = p.value("epochs", 0.0);
  o["epochs_measured"] = tok.value("epochs", 0.0);
  const double bpc = r.value("final_val_bpc", 0.0);
  o["val_bpc"] = complete ? ordered_json(bpc) : ordered_json(nullptr);
  const std::string why = d           ? "baseline"
                          : !complete ? "not complete"
                          : !dense    ? "no complete dense baseline"
                                      : not_compared(r, *dense);
  o["vs_dense"] = why.empty() ? "compared" : why;
  const double base = dense ? dense->value("final_val_bpc", 0.0) : 0.0;
  o["val_bpc_vs_dense"] = why.empty() ? ordered_json(bpc - base) : ordered_json(nullptr);
  o["beats_dense"] = why.empty() ? ordered_json(bpc < base) : ordered_json(nullptr);
  const json* parts_of = final_parts(r);
  for (const std::string& part : parts)
    o["val_bpc_" + part] = parts_of && parts_of->contains(part)
                               ? ordered_json((*parts_of)[part].get<double>())
                               : ordered_json(nullptr);
  const json train = r.value("train", json::object());
  for (const char* seed : {"seed", "data_seed"})
    o[seed] = train.is_object() && train.contains(seed) ? ordered_json(train[seed])
                                                        : ordered_json(nullptr);
  o["wall_seconds"] = r.value("wall_seconds", 0.0);
  o["train_seconds"] = secs;
  o["device"] = device_label(r);
  o["world_size"] = r.value("world_size", 1);
  const json& flops = m["flops"];
  const double total = flops.contains("total") ? count_of(flops["total"]) : 0.0;
  const double useful = useful_flops(r);
  const auto per_second = [&](double v) {
    return secs > 0 ? ordered_json(v / secs) : ordered_json(nullptr);
  };
  o["tokens_per_second_consumed"] = per_second(double(tok.value("consumed", int64_t{0})));
  o["flops_executed_exact_causal"] = total;
  o["flops_useful_exact_causal"] = useful;
  o["flops_per_second_executed_exact_causal"] = per_second(total);
  o["flops_per_second_useful_exact_causal"] = per_second(useful);
  o["useful_flops_vs_dense"] = or_null(work_vs_dense(r, dense));
  o["train_time_vs_dense"] = or_null(time_vs_dense(r, dense));
  o["mfu_useful"] = or_null(mfu_of(r, secs > 0 ? useful / secs : 0.0));
  o["peak_flops_per_second_per_device"] =
      r.value("peak_flops_per_second_per_device", 0.0) > 0
          ? ordered_json(r.value("peak_flops_per_second_per_device", 0.0))
          : ordered_json(nullptr);
  o["peak_given"] = r.value("peak_source", "") == "given";
  const bool memory = r.contains("device_memory") && r["device_memory"].is_object();
  o["device_memory_peak_bytes"] =
      memory ? ordered_json(r["device_memory"].value("peak_bytes", 0.0)) : ordered_json(nullptr);
  o["device_memory_bytes"] =
      memory ? ordered_json(r["device_memory"].value("device_bytes", 0.0)) : ordered_json(nullptr);
  const Reached got = reached_dense(r, dense);
  o["dense_bpc_reached"] = !got.compared  ? ordered_json(nullptr)
                           : got.seconds  ? ordered_json("yes")
                           : got.complete ? ordered_json("no")
                                          : ordered_json("not yet");
  o["dense_bpc_reached_train_seconds"] = or_null(got.seconds);
  o["dense_bpc_reached_vs_dense_time"] =
      got.seconds ? ordered_json(*got.seconds / dense->value("train_seconds", 0.0))
                  : ordered_json(nullptr);
  const size_t errors = has_audit_error(r) ? r[kAuditKey]["errors"].size() : 0;
  o["audit_errors"] = errors;
  o["audit_first_error"] = errors ? ordered_json(first_audit_error(r)) : ordered_json(nullptr);
  return o;
}

// The rows of one folder's points, as export_point makes them, with a column for each of `parts`.
std::vector<ordered_json> export_points(const std::vector<json>& records,
                                        const std::vector<std::string>& parts) {
  const json* dense = complete_dense(records);
  std::vector<ordered_json> rows;
  for (const json& r : records) rows.push_back(export_point(r, dense, parts));
  return rows;
}

// What the figures are counted in: every FLOP figure's convention, every token figure's kind.
ordered_json export_conventions() {
  return {
      {"compute",
       "C = M·D: M per consumed token in the row's compute_convention (the "
       "paper's, M = 6·N_a + 12·L·D_m·S) and in its plan_convention (the one the "
       "sweep was planned equal in)"},
      {"flops",
       "the ledger's exact/causal count: executed is every product the device ran, "
       "useful leaves out padding and recompute"},
      {"tokens", "consumed counts repeats; unique does not; epochs = consumed / unique"},
      {"mfu_useful", "the useful FLOP rate of one device over peak_flops_per_second_per_device"},
      {"vs_dense",
       "val_bpc_vs_dense, beats_dense and useful_flops_vs_dense only where "
       "vs_dense is 'compared' (same data, equal N, C and D̂, no audit error); "
       "train_time_vs_dense only where the point was timed as the baseline was (the "
       "same hardware and devices, --kernels and --threads request, passes and "
       "optimizer sharding); dense_bpc_reached where it was timed so and is compared, "
       "or, still training, is so far"}};
}

ordered_json export_audit(const FolderAudit* audit) {
  if (!audit) return nullptr;
  return {
      {"claims", audit->claims},
      {"holding", audit->holding},
      {"failing", audit->failing},
      {"refused", audit->refused.empty() ? ordered_json(nullptr) : ordered_json(audit->refused)}};
}

// Rows as CSV: one header line of the first row's keys (every row has the same), numbers as
// JSON writes them (shortest round trip), true/false, and an empty cell for null.
std::string export_csv(const std::vector<ordered_json>& rows) {
  if (rows.empty()) return "";
  std::string out;
  for (const auto& [k, v] : rows.front().items()) out += (out.empty() ? "" : ",") + csv_field(k);
  out += "\n";
  for (const ordered_json& row : rows) {
    std::string line;
    bool first = true;
    for (const auto& [k, v] : row.items()) {
      if (!first) line += ",";
      first = false;
      line += v.is_null()     ? std::string()
              : v.is_string() ? csv_field(v.get<std::string>())
                              : v.dump();
    }
    out += line + "\n";
  }
  return out;
}

// The json format's document: what `moeplan report` it is, then `fields`.
std::string export_json(const ordered_json& fields) {
  ordered_json doc = {{"schema", 1}};
  doc.update(fields);
  // A name or a message not in UTF-8 (a folder's name as given) cannot stop the export.
  return doc.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

// Replicates in csv and json: every folder's rows, each with its folder's name first (the long
// form a script groups by point), set against its own folder's dense baseline.
struct FoldersExport {
  const char* count_key;      // the JSON key of the folder count
  const char* summary_words;  // what the summary's keys mean, for `conventions`
  bool with_lr = false;       // each row's peak η (a learning-rate sweep's folders differ in it)
};
constexpr FoldersExport kReplicateExport{
    "replicates",
    "one entry per point, the replicate table's row: over the folders where the point is "
    "complete (val_bpc_*), and over those where it is compared with its folder's dense baseline "
    "(vs_dense_pairs; val_bpc_vs_dense_*, its ci95 = mean ± t·sd/√n, Student t with n − 1 "
    "degrees of freedom; its p = the paired t test's two-sided p-value of a mean of 0; "
    "beats_dense); vs_dense_holm_5pct = told apart from 0 by Holm's step-down over every point "
    "with a p (family-wise error 5 %), null under two such points; sd is the sample standard "
    "deviation; null where the table prints -"};
constexpr FoldersExport kLrSweepExport{
    "lr_sweep_folders",
    "one entry per point, the learning-rate sweep's row: best_lr_peak and best_val_bpc, the "
    "lowest final BPC (the mean over each η's seeds, best_val_bpc_sd their sd, best_seeds their "
    "count) over the folders' η, its rule and folders; bracketed = η's both below and above it "
    "were tried; next_best_lr_peak and best_vs_next_ci95, the paired difference's 95 % interval "
    "(best minus next best, by seed); best_val_bpc_vs_dense_best = the point's BPC at its best η "
    "minus the dense baseline's at its own, paired by seed over vs_dense_pairs seeds, its ci95 = "
    "mean ± t·sd/√n (Student t with n − 1 degrees of freedom) and p its paired t test's "
    "two-sided p-value of a mean of 0; null where the table prints -; each row of the folders "
    "also has its plan's lr_peak",
    true};

std::string export_replicates(const std::vector<std::vector<json>>& folders,
                              const std::vector<std::string>& names,
                              const std::vector<FolderAudit>& audits, ReportFormat format,
                              const ordered_json& summary, const FoldersExport& kind) {
  // The parts' columns of every folder in every row: a folder whose points are all still
  // training has no final parts, and its rows must still line up with the others' in CSV.
  std::vector<json> all;
  for (const std::vector<json>& folder : folders)
    all.insert(all.end(), folder.begin(), folder.end());
  const std::vector<std::string> parts = final_part_names(all);
  std::vector<ordered_json> rows;
  ordered_json each = ordered_json::array();
  for (size_t f = 0; f < folders.size(); ++f) {
    std::vector<ordered_json> points = export_points(folders[f], parts);
    if (kind.with_lr)
      for (size_t i = 0; i < points.size(); ++i)
        points[i]["lr_peak"] = folders[f][i]["plan"].value("lr_peak", 0.0);
    const json* dense = complete_dense(folders[f]);
    each.push_back({{"folder", names[f]},
                    {"dense_baseline",
                     dense ? ordered_json(dense->value("point_id", "?")) : ordered_json(nullptr)},
                    {"audit", export_audit(audits.empty() ? nullptr : &audits[f])},
                    {"points", points}});
    for (const ordered_json& p : points) {
      ordered_json row = {{"folder", names[f]}};
      row.update(p);
      rows.push_back(std::move(row));
    }
  }
  if (format == ReportFormat::csv) return export_csv(rows);
  ordered_json conventions = export_conventions();
  conventions["summary"] = kind.summary_words;
  return export_json({{kind.count_key, folders.size()},
                      {"conventions", conventions},
                      {"summary", summary},
                      {"folders", each}});
}

// What the folder's audit says, in one line and its warnings (each once, at most 8 shown).
std::string audit_line(const FolderAudit& a) {
  if (!a.refused.empty()) return "\n`moeplan audit` of this folder refuses it: " + a.refused;
  size_t errors = 0;
  for (const auto& [id, m] : a.errors) errors += m.size();
  std::vector<std::string> warned;
  for (const auto& [id, msgs] : a.warnings)
    for (const std::string& m : msgs)
      if (std::find(warned.begin(), warned.end(), m) == warned.end()) warned.push_back(m);
  std::string s = fmt::format(
      "\n`moeplan audit` of this folder (no --plan): {} of {} claims hold{}; {} error(s), {} "
      "warning(s)",
      a.holding, a.claims,
      a.failing.empty() ? "" : fmt::format(" (failing: {})", fmt::join(a.failing, "; ")), errors,
      warned.size());
  for (size_t i = 0; i < warned.size() && i < 8; ++i) s += "\n  warning: " + warned[i];
  if (warned.size() > 8) s += fmt::format("\n  ... and {} more warning(s)", warned.size() - 8);
  return s;
}

// Each folder's audit line, named by its folder; one line for all where every folder's reads the
// same (a sweep of 15 folders, each "9 of 9 claims hold", need not say it 15 times).
std::string folders_audit_lines(const std::vector<std::string>& names,
                                const std::vector<FolderAudit>& audits) {
  std::vector<std::string> lines;
  for (const FolderAudit& a : audits) lines.push_back(audit_line(a).substr(1));
  if (lines.size() >= 2 && std::all_of(lines.begin(), lines.end(),
                                       [&](const std::string& l) { return l == lines[0]; })) {
    std::string line = lines[0];
    const std::string own = "`moeplan audit` of this folder";
    if (line.starts_with(own)) line = "`moeplan audit`" + line.substr(own.size());
    return fmt::format("\nin each of the {} folders: {}", lines.size(), line);
  }
  std::string s;
  for (size_t f = 0; f < lines.size(); ++f) s += fmt::format("\nin '{}': {}", names[f], lines[f]);
  return s;
}

// One paragraph: how many MoE points beat dense, and how many records match their plan.
std::string verdict_of(const std::vector<json>& records, const json* dense,
                       const FolderAudit* audit) {
  int moe_total = 0, moe_better = 0, complete_count = 0, matching = 0;
  std::string best, other_data, unequal, off_plan, audited, incomplete;
  const bool dense_flagged = dense && (has_audit_error(*dense) || !folder_refusal(*dense).empty());
  double best_bpc = 1e300;
  const double dense_bpc = dense ? dense->value("final_val_bpc", 0.0) : 0.0;
  for (const json& r : records) {
    if (!is_complete(r)) {
      incomplete += fmt::format("{}{} ({}, step {} of {})", incomplete.empty() ? "" : ", ",
                                r.value("point_id", "?"), r.value("status", "?"),
                                r["measured"].value("steps", int64_t{0}),
                                r["plan"].value("steps", int64_t{0}));
      continue;
    }
    ++complete_count;
    if (matches_plan(r))
      ++matching;
    else
      off_plan += fmt::format("{}{}", off_plan.empty() ? "" : ", ", r.value("point_id", "?"));
    const double bpc = r.value("final_val_bpc", 0.0);
    if (dense && !same_data(r, *dense)) {
      other_data += fmt::format(
          "{}{} ({}{})", other_data.empty() ? "" : ", ", r.value("point_id", "?"), data_label(r),
          data_label(r) == data_label(*dense) ? "; other tokens: the source changed between runs"
                                              : "");
      continue;
    }
    if (dense && !is_dense(r)) {
      if (const std::string why = unequal_resources(r, *dense); !why.empty()) {
        unequal += fmt::format("\n  {}: {}", r.value("point_id", "?"), why);
        continue;
      }
    }
    if (dense && has_audit_error(r) && !is_dense(r)) {
      audited += fmt::format("\n  {}: {}", r.value("point_id", "?"), first_audit_error(r));
      continue;
    }
    if (dense_flagged) continue;
    if (!is_dense(r) && dense) {
      ++moe_total;
      if (bpc < dense_bpc) ++moe_better;
    }
    if (bpc < best_bpc) {
      best_bpc = bpc;
      best = r.value("point_id", "");
    }
  }
  const std::string ablation = ablation_points(records);
  std::string v =
      dense_flagged ? !folder_refusal(*dense).empty()
                          ? std::string(
                                "no comparison: `moeplan audit` will not judge these records "
                                "as one sweep (its reason is below), so no point is set against "
                                "the dense baseline")
                          : fmt::format(
                                "no comparison: `moeplan audit` finds an error in the dense "
                                "baseline's record ({}), so no point is set against it",
                                first_audit_error(*dense))
      : dense && moe_total == 0
          ? fmt::format("dense baseline val BPC {:.4f}; no MoE point is compared with it",
                        dense_bpc)
      : dense ? fmt::format(
                    "dense baseline val BPC {:.4f}; MoE points with lower validation "
                    "BPC: {} of {}; best point: {} ({:.4f} BPC)",
                    dense_bpc, moe_better, moe_total, best, best_bpc)
              : std::string("no complete dense baseline record: no comparison");
  if (dense && !dense_flagged && moe_total > 0)
    v += "\none run per point: each margin holds its seed's noise too; for a 95 % confidence "
         "interval, train the sweep again with other seeds (`--train seed=S`) and give the "
         "folders together to `moeplan report`";
  if (!ablation.empty())
    v = fmt::format(
            "NOT an equal-resource sweep: {} trained from a manifest that says equal_resources = "
            "false (an ablation or a test; grid plans none such), so the comparison below is "
            "not an equal-resource claim whatever the tolerances say\n",
            ablation) +
        v;
  if (!incomplete.empty())
    v += "\nnot compared, not complete (a run stopped or still training; the same `moeplan run` "
         "resumes it): " +
         incomplete;
  if (!other_data.empty())
    v += fmt::format(
        "\nnot compared with the dense baseline, which read {}: trained or validated on other "
        "data: {}",
        data_label(*dense), other_data);
  if (!audited.empty())
    v += "\nNOT compared with the dense baseline, `moeplan audit` finds an error in the record "
         "(its first; `moeplan audit` lists every one):" +
         audited;
  if (!unequal.empty())
    v += fmt::format(
             "\nNOT compared with the dense baseline, not equal-resource (N within {:.3g} % and C "
             "[{}] within {:.3g} % of the baseline's, the sweep's tolerances; D̂ unique equal under "
             "strict reuse; `moeplan audit` says more):",
             100 * sweep_tolerances(*dense).first, plan_convention(*dense),
             100 * sweep_tolerances(*dense).second) +
         unequal;
  v += fmt::format(
      "\nmeasured vs plan: {} of {} complete point(s) consumed exactly the planned D, read exactly "
      "the planned D̂ unique, ran the planned epochs and steps, with C [{}] within the plan's "
      "rounding{}",
      matching, complete_count, common_label(records, paper_label),
      off_plan.empty() ? ""
                       : fmt::format(" (off the plan: {}; `moeplan audit` says where)", off_plan));
  std::vector<const json*> plans;
  for (const json& r : records) plans.push_back(&r["plan"]);
  v += missed_targets(plans);
  // A capacity factor drops routed assignments: those points' experts computed less than K per
  // token, which an equal-resource claim should state.
  std::string drops;
  for (const json& r : records) {
    const int64_t dropped = r["measured"]["tokens"].value("dropped_assignments", int64_t{0});
    if (dropped <= 0 || !r["plan"].contains("arch")) continue;
    const json& a = r["plan"]["arch"];
    const double assignments =
        double(r["measured"]["tokens"].value("consumed", int64_t{0})) *
        double(a.value("top_k", int64_t{0})) *
        double(a.value("layers", int64_t{0}) - a.value("dense_layers", int64_t{0}));
    if (assignments <= 0) continue;
    drops += fmt::format("{}{} {:.1f} % ({} of {})", drops.empty() ? "" : ", ",
                         r.value("point_id", "?"), 100.0 * double(dropped) / assignments,
                         human(double(dropped)), human(assignments));
  }
  if (!drops.empty())
    v +=
        "\ncapacity drops (routed assignments over an expert's capacity, computed by no expert): " +
        drops;
  if (audit) v += audit_line(*audit);
  return v;
}

// The report's charts: the sweep's outcome (final BPC against r_a, the dense baseline as a
// line), training time and, on a GPU, device memory against r_a, validation BPC against training
// compute (every point ends at the same C), and training loss against consumed tokens (the MoE
// points read more, repeating D̂).
// What BPC is per: "byte" where every record's tokens are bytes (the built-in corpus and text
// files; a record that does not say is a byte source), "token" where none are (llm.c shards of a
// tokenizer's ids: about 4x the per-byte figure at GPT-2's ~4 bytes a token), else both.
std::string bpc_per(const std::vector<json>& records) {
  bool bytes = false, tokens = false;
  for (const json& r : records)
    (!r.contains("data") || r["data"].value("byte_tokens", true) ? bytes : tokens) = true;
  return tokens && !bytes ? "token" : tokens ? "byte or token" : "byte";
}

// The title's words for it.
std::string bpc_words(const std::vector<json>& records) {
  const std::string per = bpc_per(records);
  return fmt::format("validation bits per {}{}", per,
                     per == "token"           ? ", the source's tokens not being bytes"
                     : per == "byte or token" ? ", each record's own source's unit"
                                              : "");
}

// A chart of one figure of the MoE points against r_a, the dense baseline's as a line (its
// legend gives the baseline's figure with `digits` decimals and `unit`): only records compared with
// the baseline as the time table compares them (same_timing: one kind of hardware, the same passes,
// sharding and kernel request), named by what they share, and that have the figure (none without
// the baseline's).
void add_against_ra(std::vector<plot::Chart>& charts, const std::vector<json>& records,
                    const json& dense, const std::string& what, const std::string& y_label,
                    const std::string& id,
                    const std::function<std::optional<double>(const json&)>& figure, int digits,
                    const char* unit) {
  const std::optional<double> d = figure(dense);
  if (!d) return;
  plot::Series s{"MoE points", {}, true, false};
  for (const json& r : records)
    if (!is_dense(r) && is_complete(r) && same_timing(r, dense))
      if (const std::optional<double> y = figure(r))
        s.points.emplace_back(r["plan"].value("activation_rate", 0.0), *y);
  if (s.points.empty()) return;
  plot::Chart c{fmt::format("{} against the activation rate ({})", what,
                            has_request(dense) ? timing_label(dense) : device_label(dense)),
                "activation rate r_a = N_a / N",
                y_label,
                {},
                0,
                id};
  c.series.push_back(
      plot::reference_line(s, fmt::format("dense baseline ({:.{}f} {})", *d, digits, unit), *d));
  c.series.insert(c.series.end() - 1, std::move(s));
  charts.push_back(std::move(c));
}

// Validation BPC against training seconds (each evaluation's val_curve_train_seconds) for the
// dense baseline and the MoE points the time table compares with it (reached_dense), the
// baseline's final BPC as a grey dotted line (the baseline's own curve is the dashed one): where
// a curve crosses it is the time to the dense baseline's BPC, and a ring marks the evaluation the
// table's "reached" figure is. Equal C is not equal time, and this is the comparison at equal
// time.
void add_bpc_against_time(std::vector<plot::Chart>& charts, const std::vector<json>& records,
                          const json& dense, const std::string& bpc_axis) {
  auto curve = [](const json& r) {
    plot::Series s{r.value("point_id", "?"), {}, false, is_dense(r)};
    const json &v = r.at("val_curve"), &t = r.at("val_curve_train_seconds");
    for (size_t i = 0; i < v.size() && i < t.size(); ++i)
      s.points.emplace_back(t[i].get<double>(), v[i].value("val_bpc", 0.0));
    s.points = plot::bucket_means(s.points, 300);
    return s;
  };
  plot::Chart c{"Validation BPC against training time (" +
                    (has_request(dense) ? timing_label(dense) : device_label(dense)) + ")",
                "training seconds (measured; evaluations not counted)",
                bpc_axis,
                {},
                0,
                "bpc-time"};
  const bool dense_timed = dense.contains("val_curve_train_seconds") && dense.contains("val_curve");
  if (dense_timed) c.series.push_back(curve(dense));
  bool rings = false;
  for (const json& r : records)
    if (const Reached got = reached_dense(r, &dense); got.compared) {
      c.series.push_back(curve(r));
      if (got.seconds) c.series.back().rings.emplace_back(*got.seconds, *got.bpc);
      rings = rings || got.seconds;
    }
  if (c.series.size() == (dense_timed ? 1u : 0u)) return;
  plot::Series all{"", {}, false, false};
  for (const plot::Series& s : c.series)
    all.points.insert(all.points.end(), s.points.begin(), s.points.end());
  plot::Series level = plot::reference_line(
      all,
      fmt::format("dense baseline's final BPC ({:.4f}){}", dense.value("final_val_bpc", 0.0),
                  rings ? "; \u25CB first reached" : ""),
      dense.value("final_val_bpc", 0.0));
  level.level = dense_timed;  // apart from the baseline's own dashed curve
  c.series.push_back(std::move(level));
  charts.push_back(std::move(c));
}

std::vector<plot::Chart> charts_of(const std::vector<json>& records, const json* dense) {
  std::vector<plot::Chart> charts;
  const std::string bpc_axis = "validation bits per " + bpc_per(records);
  plot::Series moe{"MoE points", {}, true, false};
  for (const json& r : records)
    if (!is_dense(r) && is_complete(r) && (!dense || comparable(r, *dense)))
      moe.points.emplace_back(r["plan"].value("activation_rate", 0.0),
                              r.value("final_val_bpc", 0.0));
  if (!moe.points.empty()) {
    const bool strict =
        (dense ? *dense : records.front())["plan"].value("reuse", "strict") == "strict";
    plot::Chart c{strict ? "Final validation BPC against the activation rate (equal N, C and D̂)"
                         : "Final validation BPC against the activation rate (equal N and C; "
                           "loose reuse: D̂ per point)",
                  "activation rate r_a = N_a / N",
                  bpc_axis + " (lower is better)",
                  {},
                  0,
                  "bpc-ra"};
    c.series.push_back(moe);
    if (dense) {
      const double b = dense->value("final_val_bpc", 0.0);
      c.series.push_back(plot::reference_line(moe, fmt::format("dense baseline ({:.4f})", b), b));
    }
    charts.push_back(std::move(c));
  }
  // Training time against r_a, beside the BPC chart: equal C is not equal time. And, on a GPU,
  // device memory against r_a: at equal N the weights and AdamW state are the same, the
  // activations are not.
  if (dense && !moe.points.empty()) {
    add_against_ra(
        charts, records, *dense, "Training time", "training seconds", "time-ra",
        [](const json& r) { return std::optional(r.value("train_seconds", 0.0)); }, 1, "s");
    add_against_ra(
        charts, records, *dense, "Device memory held",
        "most device memory moeplan's buffers held (GiB)", "memory-ra",
        [](const json& r) -> std::optional<double> {
          if (!r.contains("device_memory")) return std::nullopt;
          return r["device_memory"].value("peak_bytes", 0.0) / double(1u << 30);
        },
        2, "GiB");
    add_bpc_against_time(charts, records, *dense, bpc_axis);
  }
  plot::Chart val{
      "Validation BPC during training, against training compute", "", bpc_axis, {}, 0, "val-c"};
  plot::Chart loss{"Training loss against consumed tokens (y axis fitted from 15 % of each run on)",
                   "tokens consumed (repeats counted)",
                   "training loss (nats per token)",
                   {},
                   0.15,
                   "loss-d"};
  for (const json& r : records) {
    const json& p = r["plan"];
    // A point the comparison leaves out (other data, unequal resources, an audit error) keeps
    // its curves, named as left out: they are its training, not an equal-resource comparison.
    std::string id = r.value("point_id", "?");
    if (dense && !is_dense(r) && is_complete(r)) {
      if (!same_data(r, *dense))
        id += " (other data)";
      else if (!unequal_resources(r, *dense).empty())
        id += " (not equal-resource)";
      else if (has_audit_error(r) || has_audit_error(*dense))
        id += " (audit error)";
      else if (!folder_refusal(*dense).empty())
        id += " (not one sweep)";
    } else if (!is_complete(r)) {  // the audit errs on every running record: this says why
      id += " (not complete)";
    } else if (has_audit_error(r)) {
      id += " (audit error)";
    }
    const double steps = p.value("steps", 0.0);
    const double per_step = steps > 0 ? p.value("tokens_consumed", 0.0) / steps : 0.0;
    const double m = p.value("flops_per_token", 0.0);
    plot::Series v{id, {}, false, is_dense(r)};
    for (const json& e : r.value("val_curve", json::array()))
      v.points.emplace_back(e.value("step", 0.0) * per_step * m, e.value("val_bpc", 0.0));
    // Thinned as the loss curve is: a record of 200k evaluations made one 2.4 MB polyline.
    v.points = plot::bucket_means(v.points, 300);
    if (!v.points.empty()) val.series.push_back(std::move(v));
    std::vector<plot::XY> l;
    for (const json& e : r.value("loss_curve", json::array()))
      l.emplace_back(e.value("tokens_consumed", 0.0), e.value("train_loss", 0.0));
    if (!l.empty()) loss.series.push_back({id, plot::bucket_means(l, 150), false, is_dense(r)});
  }
  val.x_label =
      fmt::format("training compute C [{}] (FLOPs)", common_label(records, [](const json& r) {
                    const std::string c = plan_convention(r);
                    return c == "paper" ? paper_label(r) : c;
                  }));
  if (!val.series.empty()) charts.push_back(std::move(val));
  if (!loss.series.empty()) charts.push_back(std::move(loss));
  return charts;
}

// Each complete MoE point's final BPC minus the dense baseline's, as bars.
std::string bars_of(const std::vector<json>& records, const json* dense) {
  if (!dense) return "";
  std::vector<std::pair<std::string, double>> bars;
  for (const json& r : records)
    if (!is_dense(r) && is_complete(r) && comparable(r, *dense))
      bars.emplace_back(r.value("point_id", "?"),
                        r.value("final_val_bpc", 0.0) - dense->value("final_val_bpc", 0.0));
  if (bars.empty()) return "";
  return "val BPC minus the dense baseline's (# below dense: better; + above: worse)\n" +
         plot::text_bars(bars, "{:+.4f}");
}

}  // namespace

namespace {

// What the report reads of a record, with its type: a damaged or hand-edited record is refused
// naming the file and the key, rather than read as zeros.
void check_record(const json& r, const fs::path& f) {
  auto fail = [&](const std::string& key, const char* want) {
    throw InputError(fmt::format("record '{}': '{}' is {}; the record is damaged ({})", f.string(),
                                 key, want, damaged_record_remedy(f)));
  };
  auto at = [&](const json& j, const std::string& path, const char* key) -> const json& {
    if (!j.is_object() || !j.contains(key)) fail(path + key, "missing");
    return j.at(key);
  };
  auto number = [&](const json& j, const std::string& path, const char* key) {
    if (!at(j, path, key).is_number()) fail(path + key, "not a number");
  };
  // A count: whole and not negative (a fraction or a negative is damage, not a count).
  auto count = [&](const json& j, const std::string& path, const char* key) {
    if (!count_from_json(at(j, path, key))) fail(path + key, "not a whole number >= 0 below 2^63");
  };
  auto object = [&](const json& j, const std::string& path, const char* key) -> const json& {
    const json& v = at(j, path, key);
    if (!v.is_object()) fail(path + key, "not an object");
    return v;
  };
  // Keys a record may leave out (older records, CPU runs) but, when given, are read as this type.
  auto optional = [&](const json& j, const std::string& path, const char* key, auto check) {
    if (j.is_object() && j.contains(key)) check(j, path, key);
  };
  auto text = [&](const json& j, const std::string& path, const char* key) {
    if (!at(j, path, key).is_string()) fail(path + key, "not a string");
  };
  auto one_of = [&](const json& j, const std::string& path, const char* key, const char* a,
                    const char* b) {
    const json& v = at(j, path, key);
    if (v != a && v != b)
      fail(path + key, fmt::format("{} (valid: \"{}\", \"{}\")", v.dump(), a, b).c_str());
  };
  if (!r.is_object()) fail("(the whole record)", "not a JSON object");
  if (r.is_object() && r.contains("sweep_equal_resources") &&
      !r["sweep_equal_resources"].is_boolean())
    fail("sweep_equal_resources", "not true or false");
  // What the time table's device label and MFU read.
  if (r.is_object() && r.contains("world_size") &&
      !(r["world_size"].is_number_integer() && r["world_size"].get<int64_t>() >= 1 &&
        r["world_size"].get<int64_t>() <= 1 << 20))
    fail("world_size", "not a whole number of ranks from 1 to 1048576");
  if (r.is_object() && r.contains("hardware")) {
    const json& h = r["hardware"];
    if (!h.is_array() ||
        !std::all_of(h.begin(), h.end(), [](const json& v) { return v.is_string(); }))
      fail("hardware", "not a list of strings");
  }
  if (r.is_object() && r.contains("kernels_requested") && !r["kernels_requested"].is_string())
    fail("kernels_requested", "not a string");
  if (r.is_object() && r.contains("threads_requested") &&
      !(r["threads_requested"].is_number_integer() && r["threads_requested"].get<int64_t>() >= 0))
    fail("threads_requested", "not a whole number >= 0");
  if (r.is_object() && r.contains("layouts")) {
    const json& l = r["layouts"];
    const auto whole = [](const json& e, const char* k, int64_t lo) {
      return e.is_object() && e.contains(k) && e[k].is_number_integer() &&
             e[k].get<int64_t>() >= lo;
    };
    if (!l.is_array() || !std::all_of(l.begin(), l.end(), [&](const json& e) {
          return whole(e, "from_step", 0) && whole(e, "world_size", 0) &&
                 whole(e, "micro_batch", 0) && whole(e, "threads", 0) &&
                 e.contains("optimizer_sharded") && e["optimizer_sharded"].is_boolean() &&
                 e.contains("kernels") && e["kernels"].is_string();
        }))
      fail("layouts",
           "not a list of {from_step, world_size, micro_batch, threads} (whole numbers >= 0), "
           "optimizer_sharded (true or false) and kernels (a string)");
  }
  if (r.is_object() && r.contains("peak_flops_per_second_per_device")) {
    const json& p = r["peak_flops_per_second_per_device"];
    if (!p.is_number() || !(p.get<double>() > 0) || !std::isfinite(p.get<double>()))
      fail("peak_flops_per_second_per_device", "not a FLOP rate > 0");
  }
  if (r.is_object() && r.contains("device_memory")) {
    const json& m = r["device_memory"];
    const auto bytes = [&](const char* k) {
      return m.is_object() && m.contains(k) && m[k].is_number_integer() && m[k].get<int64_t>() > 0;
    };
    if (!bytes("peak_bytes") || !bytes("device_bytes") ||
        m["peak_bytes"].get<int64_t>() > m["device_bytes"].get<int64_t>())
      fail("device_memory",
           "not {peak_bytes, device_bytes}, whole numbers > 0, the peak within the device");
  }
  if (r.is_object() && r.contains("peak_source")) {
    const json& p = r["peak_source"];
    if (!p.is_string() || (p != "built-in" && p != "given"))
      fail("peak_source", "not \"built-in\" (the maker's) or \"given\" (--peak-tflops)");
  }
  if (r.is_object() && r.contains("sweep_tolerances")) {
    const json& t = r["sweep_tolerances"];
    for (const char* k : {"n", "compute"})
      if (!t.is_object() || !t.contains(k) || !t[k].is_number() || !(t[k].get<double>() > 0) ||
          !(t[k].get<double>() < 1))
        fail(std::string("sweep_tolerances.") + k, "not a relative tolerance in (0, 1)");
  }
  if (!at(r, "", "point_id").is_string()) fail("point_id", "not a string");
  if (!is_point_id(r["point_id"].get<std::string>()))
    fail("point_id",
         fmt::format("{} (a point id is {})", r["point_id"].dump(), kPointIdRule).c_str());
  one_of(r, "", "status", "running", "complete");
  const json& plan = object(r, "", "plan");
  if (plan.contains("role")) one_of(plan, "plan.", "role", "dense", "moe");
  if (plan.contains("reuse")) one_of(plan, "plan.", "reuse", "strict", "loose");
  optional(plan, "plan.", "convention", text);
  for (const char* k : {"activation_rate", "compute", "epochs", "flops_per_token"})
    number(plan, "plan.", k);
  for (const char* k : {"total_params", "tokens_consumed", "tokens_unique", "steps"})
    count(plan, "plan.", k);
  optional(plan, "plan.", "batch_seqs", count);
  if (plan.contains("arch")) {
    const json& a = object(plan, "plan.", "arch");
    for (const char* k : {"top_k", "layers", "dense_layers"}) optional(a, "plan.arch.", k, count);
    for (const char* k : {"count_router", "count_norms"})
      if (a.contains(k) && !a.at(k).is_boolean())
        fail(std::string("plan.arch.") + k, "not true or false");
  }
  if (r.contains("data")) {
    const json& d = object(r, "", "data");
    for (const char* k : {"source", "validation_fingerprint", "training_fingerprint"})
      optional(d, "data.", k, text);
    optional(d, "data.", "validation_tokens", count);
  }
  if (r.contains("train")) {
    const json& tr = object(r, "", "train");
    for (const char* k : {"seed", "data_seed"}) optional(tr, "train.", k, count);
  }
  const json& m = object(r, "", "measured");
  count(m, "measured.", "total_params");
  count(m, "measured.", "steps");
  const json& c = object(m, "measured.", "compute");
  number(c, "measured.compute.", "paper");
  optional(c, "measured.compute.", "plan_paper", number);
  const json& t = object(m, "measured.", "tokens");
  for (const char* k : {"consumed", "unique"}) count(t, "measured.tokens.", k);
  number(t, "measured.tokens.", "epochs");
  optional(t, "measured.tokens.", "dropped_assignments", count);
  const json& flops = object(m, "measured.", "flops");
  if (flops.contains("conventions")) {
    const json& conv = object(flops, "measured.flops.", "conventions");
    for (const auto& [label, v] : conv.items())
      if (!v.is_number()) fail("measured.flops.conventions." + label, "not a number");
  }
  if (!flop_count_from_json(at(flops, "measured.flops.", "total")))
    fail("measured.flops.total", "not a FLOP count");
  // The categories the time table reads (padding, recompute): each count given must be one.
  if (flops.contains("by_category")) {
    const json& by = object(flops, "measured.flops.", "by_category");
    FlopCount sum;
    for (const auto& [cat, phases] : by.items()) {
      const std::string path = "measured.flops.by_category." + cat;
      if (!phases.is_object()) fail(path, "not an object");
      for (const auto& [phase, v] : phases.items()) {
        const auto c = flop_count_from_json(v);
        if (!c) fail(path + "." + phase, "not a FLOP count");
        sum += *c;
      }
    }
    // The categories are parts of the total: more padding than total FLOPs printed a negative
    // useful rate.
    if (sum > *flop_count_from_json(flops.at("total")))
      fail("measured.flops.total",
           fmt::format("below the sum of its categories, {}", to_string(sum)).c_str());
  }
  // The curves the charts and the per-part columns read: arrays of objects with numbers.
  if (const auto d = run_facts_defect(r))
    fail(d->key, d->missing ? "missing" : fmt::format("not {}", d->want).c_str());
  if (const auto d = curve_defect(r))
    fail(d->key, d->missing ? "missing" : fmt::format("not {}", d->want).c_str());
  if (const auto d = plan_defect(r)) fail(d->key, fmt::format("not {}", d->want).c_str());
  if (!is_complete(r)) return;
  object(m, "measured.", "matches_plan");
  for (const char* k : {"final_val_bpc", "train_seconds", "wall_seconds"}) number(r, "", k);
  if (!at(c, "measured.compute.", "within_rounding").is_boolean())
    fail("measured.compute.within_rounding", "not true or false");
}

}  // namespace

std::vector<json> load_run_records(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(fmt::format(
        "'{}' is not a folder: `moeplan report` reads the runs folder of `moeplan run sweep.toml "
        "--out DIR` (runs/<point>/record.json)",
        dir.string()));
  if (!fs::is_directory(dir, ec))
    throw InputError(
        fmt::format("runs folder '{}' does not exist (run `moeplan run sweep.toml --out {}` first)",
                    dir.string(), dir.string()));
  std::vector<json> out;
  for (const fs::path& f : point_record_files(dir)) {
    out.push_back(read_record(f));
    check_record(out.back(), f);
    check_point_folder(out.back().at("point_id").get<std::string>(), f);
  }
  if (out.empty())
    throw InputError(fmt::format(
        "no runs/<point>/record.json under '{}'{}", dir.string(),
        fs::exists(dir / "record.json", ec)
            ? fmt::format(" (it is one point's folder; give the runs folder that holds it, '{}')",
                          dir.parent_path().string())
            : ""));
  // One sweep, one dense baseline: with two, which one every "vs dense" figure used followed
  // the directory's listing order.
  std::vector<std::string> dense_ids;
  for (const json& r : out)
    if (is_dense(r)) dense_ids.push_back(r.at("point_id").get<std::string>());
  std::sort(dense_ids.begin(), dense_ids.end());
  if (dense_ids.size() > 1)
    throw InputError(fmt::format(
        "'{}' holds {} dense baselines ({}): a runs folder is one sweep with one; report each "
        "sweep's folder on its own, or move the extra one away",
        dir.string(), dense_ids.size(), fmt::join(dense_ids, ", ")));
  // Dense first, then by r_a, then by id: the same order whatever the directory lists first.
  std::sort(out.begin(), out.end(), [](const json& a, const json& b) {
    if (is_dense(a) != is_dense(b)) return is_dense(a);
    const double ra = a["plan"].value("activation_rate", 0.0),
                 rb = b["plan"].value("activation_rate", 0.0);
    if (ra != rb) return ra < rb;
    return a.at("point_id").get<std::string>() < b.at("point_id").get<std::string>();
  });
  return out;
}

namespace {

// Each format's name for --format and the extension of -o that says it.
struct ReportFormatName {
  ReportFormat format;
  const char *name, *extension;
};
constexpr ReportFormatName kReportFormats[] = {{ReportFormat::text, "table", ".txt"},
                                               {ReportFormat::markdown, "md", ".md"},
                                               {ReportFormat::html, "html", ".html"},
                                               {ReportFormat::csv, "csv", ".csv"},
                                               {ReportFormat::json, "json", ".json"}};

}  // namespace

ReportFormat run_report_format(const std::optional<std::string>& format_flag,
                               const fs::path& output) {
  const ReportFormatName* flag = nullptr;
  for (const ReportFormatName& f : kReportFormats)
    if (format_flag == f.name) flag = &f;
  if (format_flag && !flag)
    throw InputError(fmt::format(
        "--format '{}' is not a report format (valid: table, md, html, csv, json)", *format_flag));
  const std::string ext = extension_lower(output);
  if (output.empty() || (ext.empty() && flag))  // -o /dev/stdout --format csv
    return flag ? flag->format : ReportFormat::text;
  const ReportFormatName* by_ext = nullptr;
  for (const ReportFormatName& f : kReportFormats)
    if (ext == f.extension) by_ext = &f;
  if (!by_ext) {
    // ".md" alone is a hidden file's name with no extension.
    const std::string name = output.filename().string();
    throw InputError(fmt::format(
        "-o '{}': the report is written as .md, .html, .txt, .csv or .json{}", output.string(),
        ext.empty() && name.size() > 1 && name[0] == '.'
            ? fmt::format(" ('{}' is a name without an extension: give e.g. report{})", name, name)
            : ""));
  }
  if (flag && flag != by_ext)
    throw InputError(fmt::format(
        "--format {} contradicts -o '{}', which is written as {}; leave out --format or name the "
        "file for the format",
        *format_flag, output.string(), by_ext->name));
  return by_ext->format;
}

std::vector<ChartFile> run_report_charts(const std::vector<json>& given, const FolderAudit* audit) {
  const std::vector<json> records = annotate(given, audit);
  const json* dense = complete_dense(records);
  std::vector<ChartFile> out;
  for (const plot::Chart& c : charts_of(records, dense)) out.push_back({c.id, plot::render_svg(c)});
  return out;
}

std::string render_run_report(const std::vector<json>& given, const std::string& source,
                              ReportFormat format, const FolderAudit* audit) {
  const std::vector<json> records = annotate(given, audit);
  const json* dense = complete_dense(records);
  TextTable t;
  const std::string paper = common_label(records, paper_label);
  std::vector<std::string> kHeaders = headers(paper);
  std::vector<std::vector<std::string>> rows;
  for (const json& r : records) rows.push_back(row_of(r, dense));
  // The per-part columns are the built-in corpus's (facts, arith): a text or shard source has
  // no parts, and two columns of "-" would read as missing results.
  const bool parts = std::any_of(records.begin(), records.end(), [](const json& r) {
    const json d = r.value("data", json::object());
    return d.is_object() && d.contains("parts") && d["parts"].is_array() && !d["parts"].empty();
  });
  if (!parts)
    for (const char* drop : {"facts BPC", "arith BPC"}) {
      const auto at = std::find(kHeaders.begin(), kHeaders.end(), drop);
      const auto i = at - kHeaders.begin();
      kHeaders.erase(at);
      for (auto& row : rows) row.erase(row.begin() + i);
    }
  // A sweep planned equal in another convention (grid --convention exact) is equal in that C,
  // not in paper C (the attention term differs, by some percent): its C columns follow the paper
  // ones, so that the C the sweep held equal is in the table, not only in the audit.
  auto own_label = [&](const json& r) {
    const std::string c = plan_convention(r);
    return c == "paper" ? paper_label(r) : c;
  };
  const bool other_convention = std::any_of(
      records.begin(), records.end(), [](const json& r) { return plan_convention(r) != "paper"; });
  std::string own;
  if (other_convention) {
    own = common_label(records, own_label);
    const auto at = std::find(kHeaders.begin(), kHeaders.end(), "C meas [" + paper + "]");
    const auto i = at - kHeaders.begin() + 1;
    kHeaders.insert(kHeaders.begin() + i, {"C plan [" + own + "]", "C meas [" + own + "]"});
    // Records of two sweeps (conventions) in one folder: each cell names its own, so that two
    // equal-looking figures in two conventions do not read as equal C.
    const bool mixed = own.find(" or ") != std::string::npos;
    for (size_t k = 0; k < rows.size(); ++k) {
      const json& r = records[k];
      const auto c = measured_compute(r, plan_convention(r));
      const std::string tag = mixed ? " [" + own_label(r) + "]" : "";
      rows[k].insert(rows[k].begin() + i,
                     {human(r["plan"].value("compute", 0.0)) + tag, c ? human(*c) + tag : "-"});
    }
  }
  for (const auto& h : kHeaders)
    t.add_column(h,
                 h == "point" || h == "status" ? TextTable::Align::left : TextTable::Align::right);
  for (const auto& row : rows) t.add_row(row);
  // The MFU column only where some record names its devices' peak (none does on a CPU unless
  // given one).
  const bool with_mfu = std::any_of(records.begin(), records.end(), [](const json& r) {
    return r.value("peak_flops_per_second_per_device", 0.0) > 0;
  });
  const bool any_given = std::any_of(records.begin(), records.end(), [](const json& r) {
    return r.value("peak_source", "") == "given" && r.contains("peak_flops_per_second_per_device");
  });
  // The memory column only where some record is of a device with memory of its own (a GPU).
  const bool with_memory = std::any_of(records.begin(), records.end(), [](const json& r) {
    return r.contains("device_memory") && r["device_memory"].is_object();
  });
  // The time to the dense baseline's BPC only where some MoE point is compared with it so.
  const bool with_reached = std::any_of(records.begin(), records.end(), [&](const json& r) {
    return reached_dense(r, dense).compared;
  });
  std::vector<std::string> time_headers = kTimeHeaders;
  if (with_mfu) time_headers.push_back("MFU [exact/causal useful, of the device peak]");
  if (with_memory) time_headers.push_back("device memory, most held");
  if (with_reached) time_headers.push_back("dense's final BPC reached [train s, vs dense]");
  TextTable tt;
  for (const auto& h : time_headers)
    tt.add_column(h,
                  h == "point" || h == "device" ? TextTable::Align::left : TextTable::Align::right);
  std::vector<std::vector<std::string>> time_rows;
  for (const json& r : records) {
    time_rows.push_back(time_row_of(r, dense, with_mfu, with_memory, with_reached));
    tt.add_row(time_rows.back());
  }
  const std::string time_title =
      "Time and achieved FLOP rate (equal C is not equal time). Executed: every product the "
      "device ran, the ledger's exact/causal total; useful: without padding (e.g. the masked "
      "half of attention a GPU computes) and recompute. Train time vs dense: only against a "
      "dense run on the same hardware and devices, under the same --kernels and --threads "
      "request (auto chooses for each point), passes and optimizer sharding; a point resumed on "
      "other hardware or in another layout has none" +
      std::string(with_mfu ? ". MFU: the useful rate of one device over its maker's dense peak "
                             "for the products' precision (bf16 on a GPU), where known"
                           : "") +
      std::string(any_given ? "; (given): over the peak given to moeplan run --peak-tflops" : "") +
      std::string(with_memory ? ". Device memory: the most moeplan's buffers held at once on one "
                                "device (rank 0's), of its size, in the session that wrote the "
                                "record; the CUDA context's and cuBLAS's and NCCL's own memory "
                                "are not in it"
                              : "");
  const std::string verdict = verdict_of(records, dense, audit);
  // Markdown's heading is the first sentence; the rest is a paragraph under it.
  const std::string heading =
      fmt::format("moeplan report: {} run(s) in {}", records.size(), printable(source));
  const std::string title =
      heading +
      fmt::format(
          ". BPC = {}, on held-out data; C = M·D in the {} "
          "convention (M = 6·N_a + 12·L·D_m·S per consumed token){}; D consumed counts repeats, D̂ "
          "unique does not",
          bpc_words(records), paper,
          !other_convention ? ""
          : own.find(" or ") == std::string::npos
              ? fmt::format(", and in the {} convention the sweep was planned equal in", own)
              : fmt::format(", and in the convention each record's sweep was planned equal in ({}: "
                            "records of more than one sweep, each cell says its own)",
                            own));
  const std::string bars = bars_of(records, dense);
  const std::string reached = [&] {
    const std::string work = work_summary(records, dense), time = reached_summary(records, dense);
    return work.empty() || time.empty() ? work + time : work + ".\n" + time;
  }();
  switch (format) {
    case ReportFormat::text:
      return title + "\n\n" + t.render() + "\n" + verdict + "\n\n" +
             (bars.empty() ? "" : bars + "\n") + time_title + "\n\n" + tt.render() +
             (reached.empty() ? "" : "\n" + reached + "\n");
    case ReportFormat::markdown:
      return "# " + escape_markdown(heading) + "\n\n" +
             escape_markdown(title.substr(heading.size() + 2)) + "\n\n" + t.render_markdown() +
             "\n" + md_paragraphs(verdict) + "\n\n" +
             (bars.empty() ? "" : md_code_block(bars) + "\n") + "## " +
             escape_markdown(time_title.substr(0, time_title.find(". "))) + "\n\n" +
             escape_markdown(time_title.substr(time_title.find(". ") + 2)) + "\n\n" +
             tt.render_markdown() + (reached.empty() ? "" : "\n" + md_paragraphs(reached) + "\n");
    case ReportFormat::csv:
      return export_csv(export_points(records, final_part_names(records)));
    case ReportFormat::json:
      return export_json({{"source", printable(source)},
                          {"conventions", export_conventions()},
                          {"dense_baseline", dense ? ordered_json(dense->value("point_id", "?"))
                                                   : ordered_json(nullptr)},
                          {"audit", export_audit(audit)},
                          {"points", export_points(records, final_part_names(records))}});
    case ReportFormat::html:
      break;
  }
  std::string figures;
  for (const plot::Chart& c : charts_of(records, dense))
    figures += "<figure>\n" + plot::render_svg(c) + "</figure>\n";
  return html_head(heading) + "<p>" + html_escape(title.substr(heading.size() + 2)) + "</p>\n" +
         html_table(t) + html_paragraphs(verdict) +
         (figures.empty() ? "" : "<h2>Charts</h2>\n" + figures) + html_section(time_title, "h2") +
         html_table(tt) + html_paragraphs(reached) + "</body></html>\n";
}

namespace {

std::string sd_text(const Stats& s) {
  return s.has_sd ? fmt::format("{:.4f}", s.sd) : "-";
}

// A p-value to four decimals; under 0.0001 in scientific notation (not "0.0000"), and 0 as 0 (an
// sd of 0 over replicates that differ from dense by the same margin).
std::string p_text(double p) {
  return p == 0 ? "0" : p < 1e-4 ? fmt::format("{:.1e}", p) : fmt::format("{:.4f}", p);
}

// The first key where two plans differ ("" when equal).
std::string first_difference(const json& a, const json& b) {
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b[k] != v) return k;
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) return k;
  return "";
}

}  // namespace

// A record's [train] settings that decide its final BPC, less those replicates vary (the seeds)
// and eval_every (when it evaluates, not what it trains or scores at the end).
json replicate_settings(const json& r) {
  json t = result_settings(r.value("train", json::object()));
  if (!t.is_object()) return json::object();
  for (const char* k : {"seed", "data_seed", "eval_every"}) t.erase(k);
  return t;
}

namespace {

// The level of the margins' confidence intervals over replicates: the tables, the verdict, the
// chart and the JSON key `val_bpc_vs_dense_ci95` say "95 %". Holm's family-wise error is 1 − it,
// which the JSON key `vs_dense_holm_5pct` and the export's conventions call "5 %".
constexpr double kConfidence = 0.95;
// The most seeds the verdict would name for a margin across 0; past it, "over" this.
constexpr int kMostSeeds = 1000;

// Several folders as a report reads them: their names as given on the command line, shown as
// text (a name's escape sequence or line break would act in a terminal), and their records
// annotated with their folder's audit.
std::pair<std::vector<std::string>, std::vector<std::vector<json>>> printable_and_annotated(
    const std::vector<std::string>& given_names, const std::vector<std::vector<json>>& given,
    const std::vector<FolderAudit>& audits) {
  std::vector<std::string> names;
  for (const std::string& n : given_names) names.push_back(printable(n));
  std::vector<std::vector<json>> folders;
  for (size_t f = 0; f < given.size(); ++f)
    folders.push_back(annotate(given[f], audits.empty() ? nullptr : &audits[f]));
  return {names, folders};
}

// A report over several folders in text, markdown or HTML: the title's first sentence (`heading`)
// as the heading, the table, the verdict, then the text bars or, in HTML, the charts.
std::string render_over_folders(ReportFormat format, const std::string& heading,
                                const std::string& title, const TextTable& t,
                                const std::string& verdict, const std::string& bar_text,
                                const std::vector<const plot::Chart*>& figures) {
  switch (format) {
    case ReportFormat::text:
      return title + "\n\n" + t.render() + "\n" + verdict + "\n\n" + bar_text;
    case ReportFormat::markdown:
      return "# " + escape_markdown(heading) + "\n\n" +
             escape_markdown(title.substr(heading.size() + 2)) + "\n\n" + t.render_markdown() +
             "\n" + md_paragraphs(verdict) + "\n\n" +
             (bar_text.empty() ? "" : md_code_block(bar_text));
    default:
      break;
  }
  std::string html = html_head(heading) + "<p>" + html_escape(title.substr(heading.size() + 2)) +
                     "</p>\n" + html_table(t) + html_paragraphs(verdict);
  for (const plot::Chart* c : figures)
    if (!c->series.empty()) html += "<figure>\n" + plot::render_svg(*c) + "</figure>\n";
  return html + "</body></html>\n";
}

// The replicate report in `format`, or, where `charts` is given, its charts there and "".
std::string replicates(const std::vector<std::vector<json>>& given,
                       const std::vector<std::string>& given_names, ReportFormat format,
                       const std::vector<FolderAudit>& audits, std::vector<plot::Chart>* charts) {
  const auto [names, folders] = printable_and_annotated(given_names, given, audits);
  std::map<std::string, std::pair<json, size_t>> settings_of;  // first [train], less the seeds
  // Points in the order of the first folder that has them (dense first, then by r_a).
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<size_t, const json*>>> by_point;
  std::map<std::string, const json*> plan_of;
  std::map<std::string, size_t> plan_folder;
  std::map<std::string, std::pair<std::string, size_t>> source_of;  // without data_seed
  std::map<std::string, std::pair<const json*, size_t>> first_read;  // for the fingerprints
  for (size_t f = 0; f < folders.size(); ++f)
    for (const json& r : folders[f]) {
      const std::string id = r.value("point_id", "?");
      if (!by_point.count(id)) order.push_back(id);
      // Replicates vary the seeds (data_seed too: another draw of the built-in corpus), not the
      // source or the held-out set: a mean over two sources describes neither.
      if (const std::string src = data_label(r, false); !src.empty()) {
        const auto [it, fresh] = source_of.try_emplace(id, src, f);
        if (!fresh && it->second.first != src)
          throw InputError(fmt::format(
              "point '{}' read other data in '{}' ({}) than in '{}' ({}); replicates train the "
              "same plan on the same source and held-out set, with other seeds",
              id, names[f], src, names[it->second.second], it->second.first));
        // One source by name can be two corpora: two folders' own `text:corpus.txt`, or a file
        // edited between them. Where the name and data_seed agree, so must the tokens.
        const auto [first, none] = first_read.try_emplace(id, &r, f);
        if (!none && data_label(*first->second.first, true) == data_label(r, true))
          for (const char* key : {"training_fingerprint", "validation_fingerprint"}) {
            const std::string a = (*first->second.first)["data"].value(key, ""),
                              b = r["data"].value(key, "");
            if (!a.empty() && !b.empty() && a != b)
              throw InputError(fmt::format(
                  "point '{}' read other tokens in '{}' than in '{}' from {} (data.{} {} against "
                  "{}): the files differ between the folders; replicates train on the same data, "
                  "with other seeds",
                  id, names[f], names[first->second.second], src, key, b, a));
          }
      }
      // Replicates differ in their seeds only: another positions or load_balance is another
      // experiment, and its mean with this one describes neither.
      if (r.contains("train")) {
        const json s = replicate_settings(r);
        const auto [it, fresh] = settings_of.try_emplace(id, s, f);
        if (!fresh && it->second.first != s) {
          json both = s;  // every key of either side
          both.update(it->second.first);
          for (const auto& [k, unused] : both.items()) {
            const json& first = it->second.first;
            const std::string here = s.contains(k) ? s[k].dump() : "(not set)",
                              there = first.contains(k) ? first[k].dump() : "(not set)";
            if (here != there)
              throw InputError(fmt::format(
                  "point '{}' trained with train.{} = {} in '{}' but {} in '{}'; replicates "
                  "differ only in their seeds (seed, data_seed)",
                  id, k, here, names[f], there, names[it->second.second]));
          }
        }
      }
      if (plan_of.count(id)) {
        const std::string key = first_difference(*plan_of[id], r["plan"]);
        if (!key.empty())
          throw InputError(fmt::format(
              "point '{}' has another plan in '{}' than in '{}' (plan.{} differs); replicates "
              "must train the same plan: plan them with the same `moeplan grid` flags and "
              "another --train seed",
              id, names[f], names[plan_folder[id]], key));
      } else {
        plan_of[id] = &r["plan"];
        plan_folder[id] = f;
      }
      by_point[id].emplace_back(f, &r);
    }
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    const json &pa = *plan_of[a], &pb = *plan_of[b];
    const bool da = pa.value("role", "") == "dense", db = pb.value("role", "") == "dense";
    if (da != db) return da;
    return pa.value("activation_rate", 0.0) < pb.value("activation_rate", 0.0);
  });
  // Each folder's complete dense baseline, for the paired differences.
  std::vector<const json*> dense(folders.size(), nullptr);
  for (size_t f = 0; f < folders.size(); ++f) dense[f] = complete_dense(folders[f]);
  // Folders whose runs share their seeds are not independent replicates: say so.
  std::string same_seeds;
  std::vector<std::string> seeds(folders.size(), "not recorded");
  std::vector<std::vector<std::string>> seeds_seen(folders.size());
  for (size_t f = 0; f < folders.size(); ++f)
    for (const json& r : folders[f])
      if (r.contains("train")) {
        const std::string s = fmt::format("{}/{}", r["train"].value("seed", uint64_t(0)),
                                          r["train"].value("data_seed", uint64_t(0)));
        // A folder whose records ran with different seeds is not one replicate: say each.
        auto& seen = seeds_seen[f];
        if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
        seen.push_back(s);
        seeds[f] = fmt::format("{}", fmt::join(seen, " and "));
      }
  for (size_t a = 0; a < folders.size(); ++a)
    for (size_t b = a + 1; b < folders.size(); ++b)
      if (seeds[a] != "not recorded" && seeds[a] == seeds[b])
        same_seeds += fmt::format("{}'{}' and '{}' (seed/data_seed {})",
                                  same_seeds.empty() ? "" : ", ", names[a], names[b], seeds[a]);

  TextTable t;
  std::vector<std::string> headers = {
      "point",           "r_a",        "r_a target", "replicates",    "val BPC mean",
      "sd (n-1)",        "min",        "max",        "vs dense mean", "vs dense sd",
      "vs dense 95% CI", "vs dense p", "beats dense"};
  std::vector<std::vector<std::string>> rows;
  bool any_timed = false;
  plot::Series reps_mean{"MoE mean", {}, true, false};
  reps_mean.mean = true;
  std::vector<plot::Series> per_folder(folders.size());
  for (size_t f = 0; f < folders.size(); ++f) per_folder[f] = {names[f], {}, true, false};
  std::vector<double> dense_bpcs;
  std::vector<std::optional<double>> folder_dense(folders.size());  // each counted baseline's
  std::vector<std::pair<std::string, double>> bars;
  plot::Series margins{"MoE: mean margin, 95 % interval", {}, true, false};
  ordered_json summary = ordered_json::array();  // the rows, unrounded, for --format json
  int moe_points = 0, moe_always = 0, moe_partial = 0;
  // The margins' confidence intervals: how many lie wholly below 0 (MoE better beyond the seeds'
  // noise), wholly above, or across it; and each pair count's t, which sets their width.
  int ci_points = 0, ci_below = 0, ci_above = 0, ci_missing = 0;
  std::string seeds_needed;  // per point across 0: the seeds that would clear it, as a plan
  std::map<int, double> t_of_pairs;
  // Each point with an interval: its p-value and mean, for Holm's step-down over all of them.
  struct Tested {
    std::string id;
    double p, mean, r_a;
    size_t summary_row;
  };
  std::vector<Tested> tested;
  std::string left_out;
  for (const std::string& id : order) {
    const json& plan = *plan_of[id];
    const bool is_d = plan.value("role", "") == "dense";
    std::vector<double> bpc, diff, reached_ratio;
    int beats = 0, paired = 0, timed = 0;
    for (const auto& [f, r] : by_point[id]) {
      if (!is_complete(*r)) continue;
      // A record its folder's dense baseline cannot be compared with (other data, unequal
      // resources) is not a replicate of this point: left out of every column, and named.
      if (has_audit_error(*r)) {  // with or without a dense baseline in its folder
        left_out += fmt::format("\n  {} in '{}': `moeplan audit` finds an error: {}", id, names[f],
                                first_audit_error(*r));
        continue;
      }
      if (!is_d && dense[f] && !comparable(*r, *dense[f])) {
        const std::string why =
            !same_data(*r, *dense[f])                   ? "other data than its dense baseline"
            : !unequal_resources(*r, *dense[f]).empty() ? unequal_resources(*r, *dense[f])
            : has_audit_error(*r) ? "`moeplan audit` finds an error: " + first_audit_error(*r)
            : has_audit_error(*dense[f])
                ? "`moeplan audit` finds an error in its dense baseline: " +
                      first_audit_error(*dense[f])
                : "`moeplan audit` will not judge its folder as one sweep: " +
                      folder_refusal(*dense[f]);
        left_out += fmt::format("\n  {} in '{}': {}", id, names[f], why);
        continue;
      }
      const double b = r->value("final_val_bpc", 0.0);
      bpc.push_back(b);
      if (is_d) {
        dense_bpcs.push_back(b);
        folder_dense[f] = b;
      }
      if (!is_d && dense[f] && comparable(*r, *dense[f])) {
        const double d = b - dense[f]->value("final_val_bpc", 0.0);
        diff.push_back(d);
        ++paired;
        beats += d < 0;
        // Time to its folder's dense baseline's final BPC, where timed against it.
        if (const Reached got = reached_dense(*r, dense[f]); got.compared) {
          ++timed;
          if (got.seconds)
            reached_ratio.push_back(*got.seconds / dense[f]->value("train_seconds", 0.0));
        }
      }
      // Every replicate the BPC columns (and the MoE mean) count, paired with a dense baseline
      // or not: the chart says "every replicate", and its mean is of these.
      if (!is_d) per_folder[f].points.emplace_back(plan.value("activation_rate", 0.0), b);
    }
    const Stats sb = stats_of(bpc), sdf = stats_of(diff);
    if (!is_d && sb.n > 0)
      reps_mean.points.emplace_back(plan.value("activation_rate", 0.0), sb.mean);
    if (!is_d && paired > 0) {
      ++moe_points;
      // "Every replicate" only where every folder gave a pair (a folder without its dense
      // baseline or with the point unfinished gives none).
      if (size_t(paired) == folders.size())
        moe_always += beats == paired;
      else
        ++moe_partial;
      bars.emplace_back(id, sdf.mean);
      margins.points.emplace_back(plan.value("activation_rate", 0.0), sdf.mean);
    }
    const std::optional<Interval> ci = is_d ? std::nullopt : mean_interval(sdf, kConfidence);
    const std::optional<double> p = ci ? mean_zero_p(sdf) : std::nullopt;  // the same t
    if (ci) {
      tested.push_back({id, *p, sdf.mean, plan.value("activation_rate", 0.0), summary.size()});
      margins.whiskers.push_back({plan.value("activation_rate", 0.0), ci->lo, ci->hi});
      ++ci_points;
      ci_below += ci->hi < 0;
      ci_above += ci->lo > 0;
      if (ci->hi >= 0 && ci->lo <= 0) {
        const std::optional<int> n = values_to_exclude_zero(sdf, kConfidence, kMostSeeds);
        seeds_needed += fmt::format("{}{} {}", seeds_needed.empty() ? "" : ", ", id,
                                    n ? fmt::format("{}", *n) : fmt::format("over {}", kMostSeeds));
      }
      t_of_pairs[sdf.n] = student_t_critical(kConfidence, sdf.n - 1);
    } else if (!is_d && paired > 0) {
      ++ci_missing;
    }
    rows.push_back(
        {id, fmt::format("{:.3f}", plan.value("activation_rate", 0.0)), target_cell(plan),
         fmt::format("{} of {}", sb.n, folders.size()), sb.n ? fmt::format("{:.4f}", sb.mean) : "-",
         sd_text(sb), sb.n ? fmt::format("{:.4f}", sb.lo) : "-",
         sb.n ? fmt::format("{:.4f}", sb.hi) : "-",
         is_d || !sdf.n ? "-" : fmt::format("{:+.4f}", sdf.mean), is_d ? "-" : sd_text(sdf),
         ci ? fmt::format("[{:+.4f}, {:+.4f}]", ci->lo, ci->hi) : "-", p ? p_text(*p) : "-",
         is_d || !paired ? "-" : fmt::format("{} of {}", beats, paired)});
    const Stats sr = stats_of(reached_ratio);
    if (format == ReportFormat::json) {  // the table's row for a script; other formats need none
      auto value_if = [](bool has, double v) { return has ? ordered_json(v) : ordered_json(); };
      auto count_if = [](bool has, int v) { return has ? ordered_json(v) : ordered_json(); };
      summary.push_back({{"point", id},
                         {"role", is_d ? "dense" : "moe"},
                         {"activation_rate", plan.value("activation_rate", 0.0)},
                         {"replicates_complete", sb.n},
                         {"val_bpc_mean", value_if(sb.n > 0, sb.mean)},
                         {"val_bpc_sd", value_if(sb.has_sd, sb.sd)},
                         {"val_bpc_min", value_if(sb.n > 0, sb.lo)},
                         {"val_bpc_max", value_if(sb.n > 0, sb.hi)},
                         {"vs_dense_pairs", count_if(!is_d, paired)},
                         {"val_bpc_vs_dense_mean", value_if(sdf.n > 0, sdf.mean)},  // dense: none
                         {"val_bpc_vs_dense_sd", value_if(sdf.has_sd, sdf.sd)},
                         {"val_bpc_vs_dense_ci95",
                          ci ? ordered_json::array({ci->lo, ci->hi}) : ordered_json(nullptr)},
                         {"val_bpc_vs_dense_p", value_if(p.has_value(), p.value_or(0))},
                         {"vs_dense_holm_5pct", ordered_json()},  // set below, over every point
                         {"beats_dense", count_if(!is_d && paired > 0, beats)},
                         {"dense_bpc_timed", count_if(!is_d && timed > 0, timed)},
                         {"dense_bpc_reached", count_if(!is_d && timed > 0, sr.n)},
                         {"dense_bpc_reached_time_vs_dense_mean", value_if(sr.n > 0, sr.mean)}});
    }
    rows.back().push_back(is_d || !timed ? "-" : fmt::format("{} of {}", sr.n, timed));
    rows.back().push_back(sr.n ? fmt::format("{:.2f}x", sr.mean) : "-");
    any_timed = any_timed || timed > 0;
  }
  // The time to the dense baseline's BPC only where some pair was timed so.
  if (!any_timed)
    for (auto& row : rows) row.resize(row.size() - 2);
  else
    headers.insert(headers.end(), {"dense's BPC reached (timed)", "in time vs dense, mean"});
  for (const auto& h : headers)
    t.add_column(h, h == "point" ? TextTable::Align::left : TextTable::Align::right);
  for (const auto& row : rows) t.add_row(row);
  std::string folders_text;
  for (size_t f = 0; f < names.size(); ++f)
    folders_text += fmt::format("{}{} (seed/data_seed {})", f ? ", " : "", names[f], seeds[f]);
  std::vector<json> all;
  for (const auto& f : folders) all.insert(all.end(), f.begin(), f.end());
  const std::string heading =
      fmt::format("moeplan report: {} points over {} runs folders of one sweep: {}", order.size(),
                  folders.size(), folders_text);
  const std::string title =
      heading +
      fmt::format(
          ". val BPC = final {}; vs "
          "dense = a point's BPC minus the dense baseline's of the same folder (its seeds), over "
          "the "
          "replicates whose folder has one (the BPC columns count every replicate); sd is the "
          "sample standard deviation over the replicates; vs dense 95% CI = the margin's 95 % "
          "confidence interval, mean ± t·sd/√n over its n paired replicates (Student t, n − 1 "
          "degrees of freedom); vs dense p = the two-sided p-value of the paired t test of a mean "
          "margin of 0 (the same t and n − 1)",
          bpc_words(all)) +
      (any_timed ? "; dense's BPC reached: in how many of the replicates timed against their "
                   "folder's dense baseline (as one folder's report times them) the point's "
                   "validation BPC came to that baseline's final BPC, and the mean, over those, of "
                   "its training time to it over the baseline's training time"
                 : "");
  // Which points of which folder: the same ids recur in every replicate.
  std::string ablation;
  for (size_t f = 0; f < folders.size(); ++f)
    if (const std::string ids = ablation_points(folders[f]); !ids.empty())
      ablation += fmt::format("{}{} in {}", ablation.empty() ? "" : "; ", ids, names[f]);
  std::string verdict =
      (ablation.empty() ? ""
                        : fmt::format("NOT an equal-resource sweep: {} trained from a manifest "
                                      "that says equal_resources = false (an ablation or a test)\n",
                                      ablation)) +
      (moe_points == 0
           ? std::string("no MoE point is paired with its folder's dense baseline")
           : fmt::format(
                 "MoE points below their folder's dense baseline in every replicate: {} of {}{}",
                 moe_always, moe_points,
                 moe_partial ? fmt::format(" ({} paired in fewer than the {} folders: not "
                                           "counted as every replicate)",
                                           moe_partial, folders.size())
                             : ""));
  if (ci_points > 0) {
    std::string widths;
    for (const auto& [n, t] : t_of_pairs)
      widths += fmt::format("{}{} pairs: t = {:.2f}, the mean ± {:.2f} × sd",
                            widths.empty() ? "" : "; ", n, t, t / std::sqrt(double(n)));
    verdict += fmt::format(
        "\nthe margin's 95 % confidence interval ({}) lies wholly below 0 for {} of {} MoE "
        "points, wholly above 0 for {}, across 0 for {}{}{}",
        widths, ci_below, ci_points, ci_above, ci_points - ci_below - ci_above,
        ci_points - ci_below - ci_above > 0
            ? fmt::format(" (not told apart from 0 by these seeds; seeds needed, were the mean "
                          "and sd to hold: {})",
                          seeds_needed)
            : "",
        ci_missing ? fmt::format(" ({} paired in one replicate only: no interval)", ci_missing)
                   : "");
  }
  // The intervals hold each for its point alone: "r_a 0.2 beats dense" picked from m points is
  // weaker than its interval says. Holm's step-down judges the m points together.
  if (tested.size() >= 2) {
    const double alpha = 1 - kConfidence;
    std::vector<double> ps;
    for (const Tested& x : tested) ps.push_back(x.p);
    const std::vector<bool> apart = holm_rejects(ps, alpha);
    margins.name += "; hollow: Holm does not rule out 0";
    std::string which;
    const Tested* stop = nullptr;  // the smallest p not rejected: where the steps stopped
    size_t rejected = 0;
    for (size_t i = 0; i < tested.size(); ++i) {
      if (format == ReportFormat::json)
        summary[tested[i].summary_row]["vs_dense_holm_5pct"] = apart[i];
      if (apart[i]) {
        ++rejected;
        which += fmt::format("{}{} ({} 0)", which.empty() ? ": " : ", ", tested[i].id,
                             tested[i].mean < 0 ? "below" : "above");
      } else {
        if (!stop || tested[i].p < stop->p) stop = &tested[i];
        margins.rings.emplace_back(tested[i].r_a, tested[i].mean);  // hollow on the chart
      }
    }
    verdict += fmt::format(
        "\nthe {} MoE points with an interval, taken together (Holm's step-down on their p, "
        "family-wise error {:g} %; each interval above holds for its point alone): told apart "
        "from 0 for {} of {}{}{}",
        tested.size(), 100 * alpha, rejected, tested.size(), which,
        stop ? fmt::format("; the steps stop at {}, p = {} > {:g}/{} = {:.4f}", stop->id,
                           p_text(stop->p), alpha, tested.size() - rejected,
                           alpha / double(tested.size() - rejected))
             : "");
  }
  if (ci_points == 0 && ci_missing > 0) {
    verdict +=
        "\nno MoE point is paired with its dense baseline in two replicates or more: no "
        "confidence interval of a margin";
  }
  {
    std::vector<const json*> plans;
    for (const std::string& id : order) plans.push_back(plan_of[id]);
    verdict += missed_targets(plans);
  }
  if (!left_out.empty())
    verdict +=
        "\nleft out, not compared with their folder's dense baseline (as `moeplan report "
        "FOLDER` says of one folder):" +
        left_out;
  if (!same_seeds.empty())
    verdict += "\nnot independent: " + same_seeds +
               " ran with the same seeds: one initialisation and one data order, so their "
               "differences measure the device, kernels or thread count, not training noise (on "
               "the same ones they repeat each other bit for bit)";
  verdict += folders_audit_lines(names, audits);
  const std::string bar_text =
      bars.empty() ? ""
                   : "mean val BPC minus the dense baseline's (# below dense: better; + above: "
                     "worse)\n" +
                         plot::text_bars(bars, "{:+.4f}");
  plot::Chart c{"Final validation BPC against the activation rate, every replicate",
                "activation rate r_a = N_a / N",
                "validation bits per " + bpc_per(all) + " (lower is better)",
                {},
                0,
                "replicates"};
  for (const plot::Series& s : per_folder)
    if (!s.points.empty()) c.series.push_back(s);
  if (!reps_mean.points.empty()) {
    c.series.push_back(reps_mean);
    // Each replicate's own dense baseline, in its colour: the margins the table pairs are to it,
    // and the spread of these lines is the baseline's seed noise. Then the mean of them.
    for (size_t f = 0; f < folders.size(); ++f)
      if (folder_dense[f] && !per_folder[f].points.empty()) {
        plot::Series own = plot::reference_line(
            reps_mean, fmt::format("{}: dense ({:.4f})", names[f], *folder_dense[f]),
            *folder_dense[f]);
        own.beside = names[f];
        c.series.push_back(std::move(own));
      }
    const Stats sd = stats_of(dense_bpcs);
    if (sd.n)
      c.series.push_back(
          plot::reference_line(reps_mean, fmt::format("dense mean ({:.4f})", sd.mean), sd.mean));
  }
  // The margins with their intervals: the verdict's "wholly below 0" is a whisker under the line.
  plot::Chart m{"Margin over the dense baseline against r_a, with 95 % confidence intervals",
                "activation rate r_a = N_a / N",
                "val BPC minus its seed's dense (below 0: MoE better)",
                {},
                0,
                "margins"};
  if (!margins.points.empty()) {
    m.series.push_back(margins);
    m.series.push_back(plot::reference_line(margins, "dense baseline (margin 0)", 0.0));
  }
  if (charts) {
    if (!c.series.empty()) charts->push_back(std::move(c));
    if (!m.series.empty()) charts->push_back(std::move(m));
    return "";
  }
  if (format == ReportFormat::csv || format == ReportFormat::json)
    return export_replicates(folders, names, audits, format, summary, kReplicateExport);
  return render_over_folders(format, heading, title, t, verdict, bar_text, {&c, &m});
}

// The keys of a plan that a learning-rate sweep changes (grid --lr-scale): the peak η, the cosine
// floor (kept at most η) and the rule's name.
bool is_lr_key(const std::string& k) {
  return k == "lr_peak" || k == "lr_min" || k == "rule";
}

// The first key where two plans differ outside the learning-rate keys ("" when none).
std::string first_difference_but_lr(const json& a, const json& b) {
  for (const auto& [k, v] : a.items())
    if (!is_lr_key(k) && (!b.contains(k) || b[k] != v)) return k;
  for (const auto& [k, v] : b.items())
    if (!is_lr_key(k) && !a.contains(k)) return k;
  return "";
}

// Folders whose plans differ only in η, and in η somewhere: a learning-rate sweep (grid
// --lr-scale), not replicates. Plans the same throughout are replicates (false); plans that differ
// in η and in another key are refused here, naming that key (the replicate report would name η).
bool is_lr_sweep(const std::vector<std::vector<json>>& folders,
                 const std::vector<std::string>& names) {
  std::map<std::string, std::pair<const json*, size_t>> first;
  bool eta_differs = false;
  std::string other;  // the first difference outside η, as the refusal says it
  for (size_t f = 0; f < folders.size(); ++f)
    for (const json& r : folders[f]) {
      if (!r.contains("plan")) return false;
      const std::string id = r.value("point_id", "?");
      const auto [it, fresh] = first.try_emplace(id, &r["plan"], f);
      if (fresh) continue;
      const json &a = *it->second.first, &b = r["plan"];
      if (const std::string key = first_difference_but_lr(a, b); !key.empty() && other.empty())
        other = fmt::format("point '{}' has another plan in '{}' than in '{}' (plan.{} differs)",
                            id, printable(names[f]), printable(names[it->second.second]), key);
      eta_differs = eta_differs || a.value("lr_peak", 0.0) != b.value("lr_peak", 0.0);
    }
  if (eta_differs && !other.empty())
    throw InputError(other +
                     "; a learning-rate sweep's folders differ in η only: plan them with the same "
                     "`moeplan grid` flags and another --lr-scale");
  return eta_differs;
}

// The factor on the step law's η that a plan's rule names: "step-law" 1, "step-law ×F" F.
std::optional<double> lr_factor(const json& plan) {
  const std::string rule = plan.value("rule", "");
  if (rule == "step-law") return 1.0;
  const std::string prefix = "step-law ×";
  if (!rule.starts_with(prefix)) return std::nullopt;
  try {
    size_t used = 0;
    const double f = std::stod(rule.substr(prefix.size()), &used);
    if (used == rule.size() - prefix.size() && f > 0) return f;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A learning-rate sweep over folders: one or more folders per η (each another seed; every η trained
// for the same seeds), the same plans and settings otherwise. Per point: its final BPC at every η
// (the mean over seeds), the best of those tried and whether it is bracketed, whether the seeds
// tell the best from the next best, and each point at its own best η against the dense baseline at
// its own, paired by seed. In `format`, or, where `charts` is given, its chart there and "".
std::string lr_sweep(const std::vector<std::vector<json>>& given,
                     const std::vector<std::string>& given_names, ReportFormat format,
                     const std::vector<FolderAudit>& audits, std::vector<plot::Chart>* charts) {
  const auto [names, folders] = printable_and_annotated(given_names, given, audits);
  // Each folder's η rule and factor on the step law's η, and its seeds (one of each per folder).
  std::vector<std::optional<double>> factor(folders.size());
  std::vector<std::string> rule_of(folders.size()), seed_of(folders.size());
  for (size_t f = 0; f < folders.size(); ++f)
    for (const json& r : folders[f]) {
      const std::string rule = r["plan"].value("rule", "");
      const json train = r.value("train", json::object());
      const std::string seed =
          train.is_object() && train.contains("seed")
              ? fmt::format("{}/{}", train["seed"].dump(), train.value("data_seed", json()).dump())
              : "not recorded";
      if (rule_of[f].empty()) {
        rule_of[f] = rule;
        factor[f] = lr_factor(r["plan"]);
        seed_of[f] = seed;
        continue;
      }
      if (rule != rule_of[f])
        throw InputError(fmt::format(
            "'{}' holds points planned under two η rules ({} and {}); a learning-rate sweep "
            "takes one folder per `moeplan grid --lr-scale` and seed",
            names[f], printable(rule_of[f]), printable(rule)));
      if (seed != seed_of[f])
        throw InputError(fmt::format(
            "'{}' holds points trained with two seeds (seed/data_seed {} and {}); a "
            "learning-rate sweep takes one folder per `moeplan grid --lr-scale` and seed",
            names[f], seed_of[f], seed));
    }
  // The η's: one group of folders per rule, by factor where every folder has one.
  std::vector<std::string> rules;
  for (size_t f = 0; f < folders.size(); ++f)
    if (!rule_of[f].empty() && std::find(rules.begin(), rules.end(), rule_of[f]) == rules.end())
      rules.push_back(rule_of[f]);
  const bool all_factors =
      std::all_of(factor.begin(), factor.end(), [](const auto& x) { return x.has_value(); });
  std::map<std::string, double> factor_of_rule;
  for (size_t f = 0; f < folders.size(); ++f)
    if (factor[f]) factor_of_rule[rule_of[f]] = *factor[f];
  if (all_factors)
    std::stable_sort(rules.begin(), rules.end(), [&](const std::string& a, const std::string& b) {
      return factor_of_rule[a] < factor_of_rule[b];
    });
  const size_t groups = rules.size();
  std::vector<std::vector<size_t>> members(groups);
  std::vector<size_t> group_of(folders.size(), groups);  // groups: a folder with no records
  for (size_t f = 0; f < folders.size(); ++f)
    for (size_t g = 0; g < groups; ++g)
      if (rule_of[f] == rules[g]) {
        members[g].push_back(f);
        group_of[f] = g;
      }
  auto eta_name = [&](size_t g) {  // an η in short: "×0.5", or its rule where not a factor
    const auto it = factor_of_rule.find(rules[g]);
    return it != factor_of_rule.end() ? fmt::format("×{:g}", it->second) : printable(rules[g]);
  };
  auto label = [&](size_t g) {  // an η's column: "η ×0.5, 3 seeds", or its one folder's name
    const std::string eta =
        factor_of_rule.count(rules[g]) ? "η " + eta_name(g) : printable(rules[g]);
    if (members[g].size() == 1) return fmt::format("{} ({})", names[members[g][0]], eta);
    return fmt::format("{}, {} seeds", eta, members[g].size());
  };
  auto seed_list = [&](size_t g) {
    std::vector<std::string> s;
    for (size_t f : members[g]) s.push_back(seed_of[f]);
    std::sort(s.begin(), s.end());
    return s;
  };
  // Every η trained for the same seeds, each once: the seeds pair the η's and the points.
  for (size_t g = 0; g < groups; ++g) {
    const std::vector<std::string> s = seed_list(g);
    if (const auto twice = std::adjacent_find(s.begin(), s.end()); twice != s.end()) {
      std::vector<std::string> both;
      for (size_t f : members[g])
        if (seed_of[f] == *twice) both.push_back(fmt::format("'{}'", names[f]));
      throw InputError(fmt::format(
          "{} trained the same seeds (seed/data_seed {}) at one η ({}): a repeat, not another "
          "seed; give one of them",
          fmt::join(both, " and "), *twice, printable(rules[g])));
    }
    if (g > 0 && s != seed_list(0))
      throw InputError(fmt::format(
          "the folders at {} trained seed/data_seed {}, those at {} {}; a learning-rate sweep "
          "trains every seed at every η (give each η's folders for the same seeds)",
          printable(rules[g]), fmt::join(s, ", "), printable(rules[0]),
          fmt::join(seed_list(0), ", ")));
  }
  // The same point in every folder: the same settings and data (only η and the seeds differ),
  // one η per rule, and not one η under two rules.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const json*>> at;  // per point, its record in each folder
  std::map<std::string, const json*> plan_of;
  for (size_t f = 0; f < folders.size(); ++f)
    for (const json& r : folders[f]) {
      const std::string id = r.value("point_id", "?");
      auto& per = at[id];
      if (per.empty()) {
        per.assign(folders.size(), nullptr);
        order.push_back(id);
        plan_of[id] = &r["plan"];
      }
      per[f] = &r;
    }
  for (const std::string& id : order) {
    const json* first = nullptr;
    size_t first_f = 0;
    for (size_t f = 0; f < folders.size(); ++f) {
      const json* r = at[id][f];
      if (!r) continue;
      if (!first) {
        first = r;
        first_f = f;
        continue;
      }
      // The settings a result depends on, as replicates read them (not the seeds, the device or
      // the checkpoint interval).
      const json a = replicate_settings(*first), b = replicate_settings(*r);
      json both = a;
      both.update(b);
      for (const auto& [k, unused] : both.items())
        if (a.value(k, json()) != b.value(k, json()))
          throw InputError(fmt::format(
              "point '{}' trained with train.{} = {} in '{}' but {} in '{}'; a learning-rate "
              "sweep compares runs that differ in η and seed only",
              id, k, b.value(k, json()).dump(), names[f], a.value(k, json()).dump(),
              names[first_f]));
      if (data_label(*first, false) != data_label(*r, false))
        throw InputError(fmt::format(
            "point '{}' read other data in '{}' ({}) than in '{}' ({}); a learning-rate sweep "
            "trains on the same data at other η",
            id, names[f], data_label(*r, false), names[first_f], data_label(*first, false)));
      const double eta = (*r)["plan"].value("lr_peak", 0.0);
      for (size_t e = 0; e < f; ++e) {
        const json* other = at[id][e];
        if (!other) continue;
        const double other_eta = (*other)["plan"].value("lr_peak", 0.0);
        if (group_of[e] == group_of[f] && other_eta != eta)
          throw InputError(fmt::format(
              "point '{}' trained at η {:.4g} in '{}' but {:.4g} in '{}', both planned {}; "
              "plan each seed's folder with the same `moeplan grid` flags",
              id, eta, names[f], other_eta, names[e], printable(rule_of[f])));
        if (group_of[e] != group_of[f] && other_eta == eta)
          throw InputError(fmt::format(
              "point '{}' trained at the same η ({:.4g}) in '{}' and '{}'; a learning-rate sweep "
              "takes one η per --lr-scale (other seeds at one η are a replicate report's)",
              id, eta, names[e], names[f]));
      }
    }
  }
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    const json &pa = *plan_of[a], &pb = *plan_of[b];
    const bool da = pa.value("role", "") == "dense", db = pb.value("role", "") == "dense";
    if (da != db) return da;
    return pa.value("activation_rate", 0.0) < pb.value("activation_rate", 0.0);
  });
  const bool seeded =
      std::any_of(members.begin(), members.end(), [](const auto& m) { return m.size() >= 2; });
  // Per point and η: its final BPC for each seed where complete and free of audit errors.
  using BySeed = std::map<std::string, double>;
  struct Point {
    std::vector<BySeed> bpc;           // per η
    std::vector<double> eta;           // per η, where trained
    std::optional<size_t> best, next;  // the η's of the lowest and second-lowest means
    int tried = 0;
    bool lowest = false, highest = false;  // the best at an end of the η tried
    bool bracketed() const { return tried >= 2 && !lowest && !highest; }
    std::string end() const {  // why not bracketed
      return tried < 2 ? "one η tried" : lowest ? "lowest η tried" : "highest η tried";
    }
    double mean(size_t g) const { return stats_of(values(g)).mean; }
    std::vector<double> values(size_t g) const {
      std::vector<double> v;
      for (const auto& [s, x] : bpc[g]) v.push_back(x);
      return v;
    }
  };
  // The paired differences a − b over the seeds both have.
  auto paired = [](const BySeed& a, const BySeed& b) {
    std::vector<double> d;
    for (const auto& [s, x] : a)
      if (const auto it = b.find(s); it != b.end()) d.push_back(x - it->second);
    return d;
  };
  std::map<std::string, Point> points;
  std::string left_out;
  std::vector<std::string> headers = {"point", "r_a"};
  for (size_t g = 0; g < groups; ++g) headers.push_back(label(g));
  headers.insert(headers.end(), {"best η", "of", "bracketed", "best vs dense's best"});
  if (seeded) headers.insert(headers.end(), {"95% CI", "p"});
  std::vector<std::vector<std::string>> rows;
  std::vector<plot::Series> curves;
  for (const std::string& id : order) {
    const json& plan = *plan_of[id];
    std::vector<std::string> row = {id, fmt::format("{:.3f}", plan.value("activation_rate", 0.0))};
    Point& p = points[id];
    p.bpc.resize(groups);
    p.eta.assign(groups, 0.0);
    std::vector<bool> trained(groups, false);
    plot::Series curve{id, {}, true, plan.value("role", "") == "dense"};
    for (size_t g = 0; g < groups; ++g) {
      std::string missing;  // a seed not counted: why
      for (size_t f : members[g]) {
        const json* r = at[id][f];
        if (!r || !is_complete(*r)) {
          missing = r ? "running" : "-";
          continue;
        }
        if (has_audit_error(*r)) {
          left_out += fmt::format("\n  {} in '{}': `moeplan audit` finds an error: {}", id,
                                  names[f], first_audit_error(*r));
          missing = "audit error";
          continue;
        }
        p.bpc[g][seed_of[f]] = r->value("final_val_bpc", 0.0);
        p.eta[g] = (*r)["plan"].value("lr_peak", 0.0);
        trained[g] = true;
      }
      if (!trained[g]) {
        row.push_back(missing);
        continue;
      }
      const Stats s = stats_of(p.values(g));
      std::string cell = fmt::format("{:.4f}", s.mean);
      if (s.has_sd) cell += fmt::format("±{:.4f}", s.sd);
      if (size_t(s.n) < members[g].size())
        cell += fmt::format(" ({} of {})", s.n, members[g].size());
      row.push_back(cell);
      if (factor_of_rule.count(rules[g]))  // factors 2x apart lie evenly on log2
        curve.points.emplace_back(std::log2(factor_of_rule[rules[g]]), s.mean);
      if (!p.best || s.mean < p.mean(*p.best)) {
        p.next = p.best;
        p.best = g;
      } else if (!p.next || s.mean < p.mean(*p.next)) {
        p.next = g;
      }
      ++p.tried;
    }
    if (p.best && p.tried >= 2) {
      double lo = 0, hi = 0;
      bool any = false;
      for (size_t g = 0; g < groups; ++g)
        if (trained[g]) {
          lo = any ? std::min(lo, p.eta[g]) : p.eta[g];
          hi = any ? std::max(hi, p.eta[g]) : p.eta[g];
          any = true;
        }
      p.lowest = p.eta[*p.best] == lo;
      p.highest = p.eta[*p.best] == hi;
    }
    std::sort(curve.points.begin(), curve.points.end());
    if (!curve.points.empty()) curves.push_back(curve);
    auto of = [&](size_t g) {  // the best's column in short: its factor, or its one folder
      return factor_of_rule.count(rules[g]) || members[g].size() > 1 ? eta_name(g)
                                                                     : names[members[g][0]];
    };
    row.push_back(p.best ? fmt::format("{:.4g}", p.eta[*p.best]) : "-");
    row.push_back(p.best ? of(*p.best) : "-");
    row.push_back(!p.best ? "-" : p.bracketed() ? "yes" : "no: " + p.end());
    rows.push_back(std::move(row));  // the margin's cells once dense's best is known
  }
  // Dense's best, then each MoE point's best against it, paired by seed.
  std::string dense_id;
  for (const std::string& id : order)
    if (plan_of[id]->value("role", "") == "dense") dense_id = id;
  const Point* dense = dense_id.empty() || !points[dense_id].best ? nullptr : &points[dense_id];
  int moe = 0, below = 0, ci_points = 0, ci_below = 0;
  std::string unbracketed, across, told, not_told;
  int told_count = 0, next_count = 0;
  ordered_json summary = ordered_json::array();
  TextTable table;
  for (const auto& h : headers)
    table.add_column(h, h == "point" ? TextTable::Align::left : TextTable::Align::right);
  auto interval_text = [](const Interval& i) {
    return fmt::format("[{:+.4f}, {:+.4f}]", i.lo, i.hi);
  };
  auto value_if = [](bool has, double v) { return has ? ordered_json(v) : ordered_json(); };
  {
    size_t i = 0;
    for (const std::string& id : order) {
      std::vector<std::string> row = rows[i++];
      const Point& p = points[id];
      const bool is_d = id == dense_id;
      Stats margin;
      if (!is_d && dense && p.best)
        margin = stats_of(paired(p.bpc[*p.best], dense->bpc[*dense->best]));
      const std::optional<Interval> ci = mean_interval(margin, kConfidence);
      const std::optional<double> pv = ci ? mean_zero_p(margin) : std::nullopt;
      if (margin.n > 0) {
        ++moe;
        below += margin.mean < 0;
      }
      if (ci) {
        ++ci_points;
        ci_below += ci->hi < 0;
        if (ci->hi >= 0)
          across += fmt::format("{}{} {}", across.empty() ? "" : ", ", id, interval_text(*ci));
      }
      row.push_back(margin.n > 0 ? fmt::format("{:+.4f}", margin.mean) : "-");
      if (seeded) {
        row.push_back(ci ? interval_text(*ci) : "-");
        row.push_back(pv ? p_text(*pv) : "-");
      }
      table.add_row(row);
      if (p.best && !p.bracketed())
        unbracketed += fmt::format("{}{} ({})", unbracketed.empty() ? "" : ", ", id, p.end());
      // Do the seeds tell the best η from the next best? The paired difference's interval.
      std::optional<Interval> vs_next;
      if (p.best && p.next) {
        vs_next = mean_interval(stats_of(paired(p.bpc[*p.best], p.bpc[*p.next])), kConfidence);
        if (vs_next) {
          ++next_count;
          const std::string words = fmt::format("{} ({} vs {}: {})", id, eta_name(*p.best),
                                                eta_name(*p.next), interval_text(*vs_next));
          std::string& list = vs_next->hi < 0 ? told : not_told;
          list += (list.empty() ? "" : ", ") + words;
          told_count += vs_next->hi < 0;
        }
      }
      if (format == ReportFormat::json) {
        std::vector<std::string> best_folders;
        if (p.best)
          for (size_t f : members[*p.best]) best_folders.push_back(names[f]);
        const Stats sb = p.best ? stats_of(p.values(*p.best)) : Stats{};
        summary.push_back(
            {{"point", id},
             {"role", is_d ? "dense" : "moe"},
             {"best_lr_peak", value_if(p.best.has_value(), p.best ? p.eta[*p.best] : 0)},
             {"best_val_bpc", value_if(p.best.has_value(), sb.mean)},
             {"best_val_bpc_sd", value_if(sb.has_sd, sb.sd)},
             {"best_seeds", sb.n},
             {"best_rule", p.best ? ordered_json(rules[*p.best]) : ordered_json()},
             {"best_folder", p.best ? ordered_json(fmt::format("{}", fmt::join(best_folders, ", ")))
                                    : ordered_json()},
             {"bracketed", p.best && p.bracketed()},
             {"next_best_lr_peak", value_if(p.next.has_value(), p.next ? p.eta[*p.next] : 0)},
             {"best_vs_next_ci95",
              vs_next ? ordered_json::array({vs_next->lo, vs_next->hi}) : ordered_json()},
             {"vs_dense_pairs", margin.n},
             {"best_val_bpc_vs_dense_best", value_if(margin.n > 0, margin.mean)},
             {"best_val_bpc_vs_dense_best_ci95",
              ci ? ordered_json::array({ci->lo, ci->hi}) : ordered_json()},
             {"best_val_bpc_vs_dense_best_p", value_if(pv.has_value(), pv.value_or(0))}});
      }
    }
  }
  std::string folders_text;
  for (size_t g = 0; g < groups; ++g) {
    if (members[g].size() == 1) {
      folders_text += fmt::format("{}{}", g ? ", " : "", label(g));
      continue;
    }
    std::vector<std::string> each;
    for (size_t f : members[g])
      each.push_back(fmt::format("{} (seed/data_seed {})", names[f], seed_of[f]));
    folders_text += fmt::format("{}{}: {}", g ? "; " : "", label(g), fmt::join(each, ", "));
  }
  std::vector<json> all;
  for (const auto& f : folders) all.insert(all.end(), f.begin(), f.end());
  const size_t seeds = groups ? members[0].size() : 0;
  std::vector<std::string> etas;
  for (size_t g = 0; g < groups; ++g) etas.push_back(eta_name(g));
  const std::string heading =
      seeded ? fmt::format(
                   "moeplan report: a learning-rate sweep over {} seeds, {} points at {} η "
                   "({}), {} runs folders",
                   seeds, order.size(), groups, fmt::join(etas, ", "), folders.size())
             : fmt::format(
                   "moeplan report: a learning-rate sweep, {} points over {} runs "
                   "folders: {}",
                   order.size(), folders.size(), folders_text);
  const std::string title =
      heading +
      (seeded
           ? fmt::format(
                 ". The folders: {}. Each η's folders trained the same plans with one seed each, "
                 "every η the same seeds (`moeplan grid --lr-scale`: η ×F of each point's "
                 "step-law η); cells: the "
                 "mean final {} over the seeds ± their sd; best η = the η of the lowest mean; "
                 "bracketed = tried both below and above it; best vs dense's best = the point's "
                 "BPC at its best η minus the dense baseline's at its own, paired by seed, its "
                 "95% CI = mean ± t·sd/√n (Student t, n − 1 degrees of freedom) and p its paired "
                 "t test's",
                 folders_text, bpc_words(all))
           : fmt::format(
                 ". Each folder trained the same plans with the same seeds at another peak η "
                 "(`moeplan grid --lr-scale`: η ×F of each point's step-law η); cells: final {}; "
                 "best η = the η of the lowest of them; bracketed = tried both below and above "
                 "it; best vs dense's best = the point's BPC at its best η minus the dense "
                 "baseline's at its own",
                 bpc_words(all)));
  std::string verdict;
  if (dense)
    verdict += fmt::format("dense baseline: best at η {:.4g} ({}){}", dense->eta[*dense->best],
                           label(*dense->best),
                           dense->tried < 2 ? ", the one η tried: no best to speak of"
                           : dense->lowest  ? ", the lowest tried: its best may lie lower"
                           : dense->highest ? ", the highest tried: its best may lie higher"
                                            : ", bracketed");
  else
    verdict += "no complete dense baseline: no point is set against it";
  if (moe > 0)
    verdict += fmt::format(
        "\neach at its own best η of those tried, MoE points below the dense baseline: {} of {}",
        below, moe);
  if (ci_points > 0)
    verdict += fmt::format(
        "\nthe margin's 95 % confidence interval wholly below 0 (MoE better beyond the seeds' "
        "noise): {} of {}{}",
        ci_below, ci_points, across.empty() ? "" : "; not: " + across);
  if (!unbracketed.empty())
    verdict +=
        "\nbest η at an end of those tried (another --lr-scale beyond it would tell whether "
        "it is the best): " +
        unbracketed;
  if (next_count > 0) {
    verdict += fmt::format(
        "\nbest η told apart from the next best by the seeds (the paired difference's 95 % "
        "interval wholly below 0): {} of {}{}",
        told_count, next_count, told.empty() ? "" : ": " + told);
    if (!not_told.empty())
      verdict += "; within the seeds' noise, so either η may be the best: " + not_told;
  }
  verdict += seeded
                 ? "\neach best η is picked on the seeds that then measure its margin (dense's as "
                   "well): fresh seeds at the chosen η's measure the margins free of that choice"
                 : "\none run per η and point: BPC differences between η's smaller than the seeds' "
                   "noise (a replicate report measures it) do not pick a best";
  if (!left_out.empty()) verdict += "\nleft out:" + left_out;
  verdict += folders_audit_lines(names, audits);
  plot::Chart c{
      seeded ? fmt::format("Final validation BPC (mean over {} seeds) against the peak learning "
                           "rate, per point",
                           seeds)
             : "Final validation BPC against the peak learning rate, per point",
      "log2 of peak η / the step law's η (--lr-scale: -1 = ×0.5, 0 = ×1, 1 = ×2)",
      "validation bits per " + bpc_per(all) + " (lower is better)",
      {},
      0,
      "lr-sweep"};
  if (all_factors) c.series = curves;
  if (charts) {
    if (!c.series.empty()) charts->push_back(std::move(c));
    return "";
  }
  if (format == ReportFormat::csv || format == ReportFormat::json)
    return export_replicates(folders, names, audits, format, summary, kLrSweepExport);
  return render_over_folders(format, heading, title, table, verdict, "", {&c});
}

}  // namespace

std::string render_replicate_report(const std::vector<std::vector<json>>& folders,
                                    const std::vector<std::string>& names, ReportFormat format,
                                    const std::vector<FolderAudit>& audits) {
  if (is_lr_sweep(folders, names)) return lr_sweep(folders, names, format, audits, nullptr);
  return replicates(folders, names, format, audits, nullptr);
}

std::vector<ChartFile> replicate_report_charts(const std::vector<std::vector<json>>& folders,
                                               const std::vector<std::string>& names,
                                               const std::vector<FolderAudit>& audits) {
  std::vector<plot::Chart> charts;
  if (is_lr_sweep(folders, names))
    lr_sweep(folders, names, ReportFormat::html, audits, &charts);
  else
    replicates(folders, names, ReportFormat::html, audits, &charts);
  std::vector<ChartFile> out;
  for (const plot::Chart& c : charts) out.push_back({c.id, plot::render_svg(c)});
  return out;
}

}  // namespace moeplan
