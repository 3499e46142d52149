// `moeplan report runs/ [more-runs/ ...] [-o report.md|.html|.txt|.csv|.json]`: the sweep's
// comparison table; over several runs folders of one sweep (other seeds), the replicates'.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/runs_io.hpp"
#include "moeplan/reports/run_report.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/escape.hpp"

namespace moeplan::cli {
namespace {

struct ReportFlags {
  std::vector<std::string> runs_dirs{"runs"};
  std::string output;
  std::optional<std::string> format;  // not given: from -o's extension, else the terminal table
  std::string charts;  // a folder for the HTML report's charts as .svg files
};

// --charts DIR: a folder, made where missing; a file there is refused before any reading.
void check_charts_folder(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    throw InputError(fmt::format(
        "--charts '{}' is a file, not a folder; give a folder for the charts' .svg files (made "
        "where missing)",
        dir));
}

// Each chart as DIR/<id>.svg, written atomically, and a line naming them. Files of other charts
// already there (an earlier report's) are left as they are: the line names this report's.
void write_charts(const std::string& dir, const std::vector<ChartFile>& charts) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw InputError(fmt::format("--charts '{}': cannot make the folder ({})", dir, ec.message()));
  std::string names;
  for (const ChartFile& c : charts) {
    write_file_atomic((std::filesystem::path(dir) / (c.id + ".svg")).string(), c.svg);
    names += (names.empty() ? "" : ", ") + c.id + ".svg";
  }
  if (charts.empty())
    fmt::print("wrote no chart to {}: the records have no complete point and no curve to draw\n",
               printable(dir));
  else
    fmt::print("wrote {} chart(s) to {}: {}\n", charts.size(), printable(dir), names);
}

// A folder's records, read as `moeplan audit` and `moeplan run` read them too (a record one of
// them refuses as damaged is refused here, not shown), and what `moeplan audit DIR` says of
// them (no --plan: each record against the plan it carries, the sweep's tolerances as the
// records say), for the report to count no point the audit refuses.
struct Folder {
  std::vector<nlohmann::json> records;
  FolderAudit audit;
};
Folder read_folder(const std::string& dir) {
  Folder f{load_run_records(dir), {}};
  const std::vector<audit::RunRecord> parsed = audit::load_run_records(dir);
  FolderAudit& out = f.audit;
  audit::AuditReport a;
  try {
    a = audit::audit_run_records(parsed, {}, audit::RunsAuditOptions{});
  } catch (const InputError& e) {
    // Records of two sweeps (FLOP conventions, reuse rules) the audit will not judge as one:
    // the report still shows them, its own checks marking what is not comparable.
    out.refused = e.what();
    return f;
  }
  out.claims = int(a.claims.size());
  for (const audit::ClaimVerdict& c : a.claims) {
    out.holding += c.holds;
    if (!c.holds) out.failing.push_back(c.name);
  }
  for (const audit::Finding& x : a.findings) {
    if (x.severity == audit::Severity::error) {
      out.errors[x.table].push_back(x.message);
      out.error_quantities[x.table].insert(x.quantity);
    }
    if (x.severity == audit::Severity::warning) out.warnings[x.table].push_back(x.message);
  }
  return f;
}

int report(const ReportFlags& f) {
  const ReportFormat format = run_report_format(f.format, f.output);  // refuse a bad -o first
  if (!f.charts.empty()) check_charts_folder(f.charts);
  std::string text;
  std::vector<ChartFile> charts;
  if (f.runs_dirs.size() == 1) {
    const Folder one = read_folder(f.runs_dirs[0]);
    text = render_run_report(one.records, f.runs_dirs[0], format, &one.audit);
    if (!f.charts.empty()) charts = run_report_charts(one.records, &one.audit);
  } else {
    // Replicates are other seeds' folders: one folder named twice (runs and ./runs/) would be
    // counted as two runs that agree perfectly.
    for (size_t i = 0; i < f.runs_dirs.size(); ++i)
      for (size_t j = 0; j < i; ++j) {
        std::error_code ec;
        if (std::filesystem::equivalent(f.runs_dirs[j], f.runs_dirs[i], ec))
          throw InputError(fmt::format(
              "runs folders '{}' and '{}' are the same folder; replicates are the runs folders "
              "of one sweep trained with other seeds (e.g. runs/main-job/seed-1235/runs)",
              f.runs_dirs[j], f.runs_dirs[i]));
      }
    std::vector<std::vector<nlohmann::json>> folders;
    std::vector<FolderAudit> audits;
    for (const std::string& d : f.runs_dirs) {
      Folder one = read_folder(d);
      folders.push_back(std::move(one.records));
      audits.push_back(std::move(one.audit));
    }
    text = render_replicate_report(folders, f.runs_dirs, format, audits);
    if (!f.charts.empty()) charts = replicate_report_charts(folders, f.runs_dirs, audits);
  }
  if (f.output.empty()) {
    // Tables fitted to a terminal's width; markdown, HTML, CSV and JSON go out as they are.
    fmt::print("{}", format == ReportFormat::text ? for_terminal(text) : text);
  } else {
    write_file_atomic(f.output, text);
    fmt::print("wrote {}\n", printable(f.output));
  }
  if (!f.charts.empty()) write_charts(f.charts, charts);
  return kExitOk;
}

const bool registered = register_command(
    {"report",
     "Compare a sweep's runs: validation BPC per point against dense, measured vs planned", 50,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<ReportFlags>();
       app.add_option(
              "runs", f->runs_dirs,
              "the runs folder of `moeplan run --out`; several: replicates of one sweep "
              "run with other seeds (mean, sd, how often each point beats dense, the margin's 95 % "
              "confidence interval and p, and Holm's step-down over the points); or one sweep "
              "planned at other `grid --lr-scale` factors, a folder per factor and seed (each "
              "point's best η, bracketed or not, and best against dense's best, paired by seed)")
           ->capture_default_str()
           ->check(non_empty_path("folder name"));
       app.add_option("-o,--output", f->output,
                      "write report.md, report.html, report.txt, or each point's figures for a "
                      "script as report.csv or report.json")
           ->check(non_empty_path("file name"));
       app.add_option(
           "--format", f->format,
           "table, md, html, csv or json (default: -o's extension, else table); csv and json: one "
           "row per point (per folder and point for replicates), numbers unrounded, empty or null "
           "where the tables print -");
       app.add_option("--charts", f->charts,
                      "also write the HTML report's charts to this folder, one standalone .svg "
                      "file each (bpc-ra.svg, bpc-time.svg, ...), for a paper or slides")
           ->check(non_empty_path("folder name"));
       return [f] { return report(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
