#include "moeplan/audit/render.hpp"

#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/escape.hpp"

namespace moeplan::audit {

namespace {

std::string where(const Finding& f, const AuditReport& r) {
  if (f.row <= 0) return f.table;
  const std::string label = r.label(f.table, f.row);
  return row_ref(f.table, f.row) + (label.empty() ? "" : " " + label);
}

// A markdown table cell: a '|' would end the cell, a line break the row.
std::string md_cell(const std::string& s) {
  return escape_markdown(s);
}

std::string num(double v) {
  return sci(v);
}

std::string spread_line(const QuantityVerdict& q) {
  std::string s = fmt::format("{} {}: min {} ({}), max {} ({}), ", q.quantity, q.kind, num(q.min),
                              q.min_row, num(q.max), q.max_row);
  // With a baseline the tolerance applies to each row's distance from it: print that, not the
  // spread between the extremes.
  if (q.deviation)
    s += fmt::format("farthest from the baseline {} ({:+.3f}%)", q.deviation_row,
                     100 * *q.deviation);
  else
    s += fmt::format("range {:.2f}%", 100 * q.rel_range);
  if (q.kind == "equal" || q.kind == "equal_to_baseline")
    s += fmt::format(", tolerance {:.2f}%", 100 * q.tolerance);
  // Bounds as given (shortest exact form): rounded, 19.875 would read as 19.88.
  if (q.lower) s += fmt::format(", at least {}", *q.lower);
  if (q.upper) s += fmt::format(", at most {}", *q.upper);
  s += q.holds ? " -> holds" : " -> FAILS";
  if (!q.breaking.empty()) {
    s += "; broken by";
    for (const std::string& b : q.breaking) s += " " + b;
  }
  return s;
}

nlohmann::json opt(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

std::string sci(double v) {
  const double a = std::fabs(v);
  if (a == 0 || (a >= 1e-2 && a < 1e4)) return fmt::format("{:.4g}", v);
  int e = int(std::floor(std::log10(a)));
  double m = v / std::pow(10.0, e);
  if (std::fabs(std::stod(fmt::format("{:.3f}", m))) >= 10) m /= 10, ++e;  // 9.9996 rounds up
  return fmt::format("{:.4g}e{}", m, e);
}

std::string pct_against(double rel, double tol) {
  std::string s = fmt::format("{:+.2f}%", 100.0 * rel);
  if (!(std::fabs(rel) > tol * (1 + 1e-9)) || !std::isfinite(rel)) return s;
  for (int digits = 3;
       digits <= 6 && !(std::fabs(std::stod(s.substr(0, s.size() - 1))) > 100 * tol); ++digits)
    s = fmt::format("{:+.{}f}%", 100.0 * rel, digits);
  return s;
}

ReportFormat parse_report_format(std::string_view s) {
  if (s == "table") return ReportFormat::table;
  if (s == "json") return ReportFormat::json;
  if (s == "md") return ReportFormat::md;
  throw InputError(fmt::format("--format '{}' is not a format (valid: table, json, md)", s));
}

ReportFormat report_format_for(std::string_view format_flag, std::string_view output) {
  const std::optional<ReportFormat> flag =
      format_flag.empty() ? std::nullopt : std::optional(parse_report_format(format_flag));
  if (output.empty()) return flag.value_or(ReportFormat::table);
  const std::string ext = extension_lower(std::filesystem::path(output));
  std::optional<ReportFormat> by_ext;
  if (ext == ".json") by_ext = ReportFormat::json;
  if (ext == ".md") by_ext = ReportFormat::md;
  if (ext == ".txt") by_ext = ReportFormat::table;
  if (ext.empty() && flag) return *flag;  // e.g. -o /dev/stdout --format json
  if (!by_ext)
    throw InputError(fmt::format(
        "-o {}: cannot tell the format from {}; use .json, .md or .txt (terminal text){}", output,
        ext.empty() ? "a name without an extension" : fmt::format("the extension '{}'", ext),
        ext.empty() ? ", or give --format" : ""));
  if (flag && *flag != *by_ext)
    throw InputError(
        fmt::format("--format {} contradicts -o {}, which is written as {}; drop "
                    "--format or change the extension",
                    format_flag, output, *by_ext == ReportFormat::table ? "table" : ext.substr(1)));
  return *by_ext;
}

std::string render_terminal(const AuditReport& r) {
  std::string out;
  size_t failing = 0;
  for (const ClaimVerdict& c : r.claims) failing += c.holds ? 0 : 1;
  out += fmt::format("Claims: {} of {} hold\n", r.claims.size() - failing, r.claims.size());
  for (const ClaimVerdict& c : r.claims) {
    out += fmt::format("  {}  {}\n", c.holds ? "HOLDS" : "FAILS", c.name);
    if (!c.coverage.empty()) out += fmt::format("         covers {}\n", c.coverage);
    for (const QuantityVerdict& q : c.quantities) {
      out += fmt::format("         {}\n", spread_line(q));
      if (!q.note.empty()) out += fmt::format("           ({})\n", q.note);
    }
  }
  size_t counts[3] = {0, 0, 0};
  for (const Finding& f : r.findings) ++counts[int(f.severity)];
  out += fmt::format("Findings: {} error, {} warning, {} info\n", counts[0], counts[1], counts[2]);
  for (const Finding& f : r.findings)
    out += fmt::format("  {:<7}  {:<12}  {:<16}  {}\n", name(f.severity), where(f, r), f.quantity,
                       f.message);
  return out;
}

std::string render_json(const AuditReport& r) {
  nlohmann::json j;
  j["schema"] = 1;
  j["claims"] = nlohmann::json::array();
  for (const ClaimVerdict& c : r.claims) {
    nlohmann::json cj{
        {"name", c.name}, {"holds", c.holds}, {"rows", c.rows}, {"left_out", c.left_out}};
    cj["quantities"] = nlohmann::json::array();
    for (const QuantityVerdict& q : c.quantities)
      cj["quantities"].push_back({{"quantity", q.quantity},
                                  {"kind", q.kind},
                                  {"min", q.min},
                                  {"max", q.max},
                                  {"min_row", q.min_row},
                                  {"max_row", q.max_row},
                                  {"rel_range", q.rel_range},
                                  {"deviation", opt(q.deviation)},
                                  {"deviation_row", q.deviation ? nlohmann::json(q.deviation_row)
                                                                : nlohmann::json(nullptr)},
                                  {"tolerance", q.tolerance},
                                  {"at_least", opt(q.lower)},
                                  {"at_most", opt(q.upper)},
                                  {"holds", q.holds},
                                  {"breaking", q.breaking},
                                  {"note", q.note}});
    j["claims"].push_back(std::move(cj));
  }
  j["findings"] = nlohmann::json::array();
  for (const Finding& f : r.findings) {
    j["findings"].push_back(
        {{"severity", name(f.severity)},
         {"table", f.table.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.table)},
         {"row", f.row > 0 ? nlohmann::json(f.row) : nlohmann::json(nullptr)},
         {"label", r.label(f.table, f.row).empty() ? nlohmann::json(nullptr)
                                                   : nlohmann::json(r.label(f.table, f.row))},
         {"quantity", f.quantity},
         {"expected", opt(f.expected)},
         {"found", opt(f.found)},
         {"rel_diff", opt(f.rel_diff)},
         // A finding that compares nothing (no expected, no found: an info line of a whole
         // claim) has no tolerance: null, not 0, which an exact comparison's is.
         {"tolerance",
          f.expected || f.found ? nlohmann::json(f.tolerance) : nlohmann::json(nullptr)},
         {"message", f.message}});
    if (!f.expected_exact.empty()) j["findings"].back()["expected_exact"] = f.expected_exact;
    if (!f.found_exact.empty()) j["findings"].back()["found_exact"] = f.found_exact;
  }
  // File names are bytes, not always UTF-8 (a table's name is its file's): replaced, not fatal.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string render_markdown(const AuditReport& r) {
  std::string out =
      "# moeplan audit\n\n## Claims\n\n| verdict | claim | rows | quantity | spread "
      "|\n|---|---|---|---|---|\n";
  for (const ClaimVerdict& c : r.claims) {
    // What the claim covered: a table claim's coverage line, else its rows (a runs audit's
    // points), as the JSON's `rows` lists them.
    std::string rows = c.coverage;
    if (rows.empty())
      for (const std::string& row : c.rows) rows += (rows.empty() ? "" : ", ") + row;
    if (c.quantities.empty())
      out += fmt::format("| {} | {} | {} | | |\n", c.holds ? "holds" : "**fails**", md_cell(c.name),
                         md_cell(rows));
    for (const QuantityVerdict& q : c.quantities)
      out += fmt::format("| {} | {} | {} | {} | {} |\n", q.holds ? "holds" : "**fails**",
                         md_cell(c.name), md_cell(rows), q.quantity,
                         md_cell(spread_line(q) + (q.note.empty() ? "" : " (" + q.note + ")")));
  }
  out +=
      "\n## Findings\n\n| severity | where | quantity | expected | found | rel. diff | message |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const Finding& f : r.findings) {
    const std::string msg = md_cell(f.message);
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", name(f.severity),
                       md_cell(where(f, r)),
                       f.quantity, f.expected ? num(*f.expected) : "", f.found ? num(*f.found) : "",
                       f.rel_diff ? fmt::format("{:+.2f}%", 100 * *f.rel_diff) : "", msg);
  }
  return out;
}

std::string render(const AuditReport& r, ReportFormat f) {
  switch (f) {
    case ReportFormat::table:
      return render_terminal(r);
    case ReportFormat::json:
      return render_json(r);
    case ReportFormat::md:
      return render_markdown(r);
  }
  return {};
}

}  // namespace moeplan::audit
