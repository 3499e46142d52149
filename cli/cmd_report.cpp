// `moeplan report runs/`: the comparison of a sweep's run records, each MoE point against the
// dense baseline, with the measured N, C, D and D̂ beside the planned ones.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/backend/atomic_file.hpp"
#include "moeplan/reports/text_table.hpp"

namespace moeplan::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ReportFlags {
  std::string runs_dir = "runs";
  std::string output;
};

std::vector<json> load_records(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(
        fmt::format("runs folder '{}' does not exist (run `moeplan run sweep.toml "
                    "--out {}` first)",
                    dir.string(), dir.string()));
  std::vector<json> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const fs::path f = e.path() / "record.json";
    if (!fs::exists(f, ec)) continue;
    try {
      out.push_back(json::parse(backend::read_file(f)));
    } catch (const json::exception& x) {
      throw InputError(fmt::format("record '{}' is unreadable: {}", f.string(), x.what()));
    }
  }
  if (out.empty())
    throw InputError(fmt::format("no runs/<point>/record.json under '{}'", dir.string()));
  // Dense baseline first, then MoE points by activation rate.
  std::sort(out.begin(), out.end(), [](const json& a, const json& b) {
    const bool da = a["plan"].value("role", "") == "dense",
               db = b["plan"].value("role", "") == "dense";
    if (da != db) return da;
    return a["plan"].value("activation_rate", 0.0) < b["plan"].value("activation_rate", 0.0);
  });
  return out;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

int report(const ReportFlags& f) {
  const std::vector<json> recs = load_records(f.runs_dir);
  const json* dense = nullptr;
  for (const json& r : recs)
    if (r["plan"].value("role", "") == "dense" && r.value("status", "") == "complete") dense = &r;
  const double dense_bpc = dense ? (*dense).value("final_val_bpc", 0.0) : 0.0;

  TextTable t;
  std::vector<std::string> headers = {"point",
                                      "r_a",
                                      "N plan",
                                      "N meas",
                                      "C plan [paper]",
                                      "C meas [paper]",
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
  for (const auto& h : headers)
    t.add_column(h,
                 h == "point" || h == "status" ? TextTable::Align::left : TextTable::Align::right);
  std::vector<std::vector<std::string>> rows;
  int moe_total = 0, moe_better = 0, complete_count = 0, matching = 0;
  std::string best;
  double best_bpc = 1e300;
  for (const json& r : recs) {
    const json& p = r["plan"];
    const json& m = r["measured"];
    const json& tok = m["tokens"];
    const bool complete = r.value("status", "") == "complete";
    if (complete) {
      ++complete_count;
      bool all = m["compute"].value("within_rounding", false);
      for (const auto& [k, v] : m["matches_plan"].items()) all = all && v == true;
      if (all) ++matching;
    }
    const double bpc = r.value("final_val_bpc", 0.0);
    std::string facts = "-", arith = "-";
    if (!r["val_curve"].empty()) {
      const json& parts = r["val_curve"].back()["parts"];
      if (parts.contains("facts")) facts = fmt::format("{:.3f}", parts["facts"].get<double>());
      if (parts.contains("arith")) arith = fmt::format("{:.3f}", parts["arith"].get<double>());
    }
    std::string vs = "-";
    if (p.value("role", "") != "dense" && dense && complete) {
      vs = fmt::format("{:+.3f}", bpc - dense_bpc);
      ++moe_total;
      if (bpc < dense_bpc) ++moe_better;
    }
    if (complete && bpc < best_bpc) {
      best_bpc = bpc;
      best = r.value("point_id", "");
    }
    std::vector<std::string> row = {
        r.value("point_id", "?"),
        fmt::format("{:.3f}", p.value("activation_rate", 0.0)),
        human(p.value("total_params", 0.0)),
        human(double(m.value("total_params", int64_t{0}))),
        human(p.value("compute", 0.0)),
        human(m["compute"].value("paper", 0.0)),
        m["compute"].value("within_rounding", false) ? "yes" : "no",
        human(p.value("tokens_consumed", 0.0)),
        human(double(tok.value("consumed", int64_t{0}))),
        human(p.value("tokens_unique", 0.0)),
        human(double(tok.value("unique", int64_t{0}))),
        fmt::format("{:.3f}", p.value("epochs", 0.0)),
        fmt::format("{:.3f}", tok.value("epochs", 0.0)),
        complete ? fmt::format("{:.4f}", bpc) : "-",
        vs,
        facts,
        arith,
        fmt::format("{:.0f}", r.value("wall_seconds", 0.0)),
        complete ? "complete"
                 : fmt::format("{} (step {})", r.value("status", "?"), m.value("steps", 0))};
    t.add_row(row);
    rows.push_back(row);
  }
  std::string verdict =
      dense ? fmt::format(
                  "dense baseline val BPC {:.4f}; MoE points with lower validation BPC: {} of "
                  "{}; best point: {} ({:.4f} BPC)",
                  dense_bpc, moe_better, moe_total, best, best_bpc)
            : std::string("no complete dense baseline record: no comparison");
  verdict += fmt::format(
      "\nmeasured vs plan: {} of {} complete point(s) consumed exactly the planned D, read exactly "
      "the planned D̂ unique, ran the planned epochs and steps, with C [paper] within the plan's "
      "rounding",
      matching, complete_count);
  const std::string title = fmt::format(
      "moeplan report: {} run(s) in {}. BPC = validation bits per byte (held-out data); C in the "
      "paper convention (6·N_a + 12·L·D_m·S per consumed token); D consumed counts repeats, D̂ "
      "unique does not",
      recs.size(), f.runs_dir);
  const fs::path out(f.output);
  const std::string ext = out.extension().string();
  std::string text;
  if (f.output.empty() || ext == ".txt") {
    text = title + "\n\n" + t.render() + "\n" + verdict + "\n";
  } else if (ext == ".md") {
    text = "# " + title + "\n\n" + t.render_markdown() + "\n" + verdict + "\n";
  } else if (ext == ".html") {
    text =
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>moeplan report</title>"
        "<style>td,th{padding:2px 8px;text-align:right}td:first-child{text-align:left}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style>"
        "</head><body>\n<p>" +
        html_escape(title) + "</p>\n<table>\n<tr>";
    for (const auto& h : headers) text += "<th>" + html_escape(h) + "</th>";
    text += "</tr>\n";
    for (const auto& row : rows) {
      text += "<tr>";
      for (const auto& c : row) text += "<td>" + html_escape(c) + "</td>";
      text += "</tr>\n";
    }
    text += "</table>\n<p>" + html_escape(verdict) + "</p>\n</body></html>\n";
  } else {
    throw InputError(fmt::format("-o '{}': the report is written as .md, .html or .txt", f.output));
  }
  if (f.output.empty()) {
    fmt::print("{}", text);
  } else {
    try {
      backend::write_file_atomic(out, text);
    } catch (const std::runtime_error& e) {
      throw InputError(e.what());
    }
    fmt::print("wrote {}\n", f.output);
  }
  return kExitOk;
}

const bool registered = register_command(
    {"report",
     "Compare a sweep's runs: validation BPC per point against dense, measured vs planned", 50,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<ReportFlags>();
       app.add_option("runs", f->runs_dir, "the runs folder of `moeplan run --out`")
           ->capture_default_str();
       app.add_option("-o,--output", f->output, "write report.md, report.html or report.txt");
       return [f] { return report(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
