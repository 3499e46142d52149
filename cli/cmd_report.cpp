// `moeplan report runs/ [more-runs/ ...] [-o report.md|report.html|report.txt]`: the sweep's
// comparison table; over several runs folders of one sweep (other seeds), the replicates'.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/runs_io.hpp"
#include "moeplan/reports/run_report.hpp"
#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan::cli {
namespace {

struct ReportFlags {
  std::vector<std::string> runs_dirs{"runs"};
  std::string output;
};

// A folder's records, read as `moeplan audit` and `moeplan run` read them too: a record one of
// them refuses as damaged is refused here, not shown.
std::vector<nlohmann::json> records_of(const std::string& dir) {
  std::vector<nlohmann::json> records = load_run_records(dir);
  if (!records.empty()) (void)audit::load_run_records(dir);
  return records;
}

// `moeplan audit DIR` (no --plan: each record against the plan it carries, the sweep's
// tolerances as the records say), for the report to count no point the audit refuses.
FolderAudit audit_of(const std::string& dir) {
  FolderAudit out;
  audit::AuditReport a;
  try {
    a = audit::audit_runs_dir(dir, "", audit::RunsAuditOptions{});
  } catch (const InputError& e) {
    // Records of two sweeps (FLOP conventions, reuse rules) the audit will not judge as one:
    // the report still shows them, its own checks marking what is not comparable.
    out.refused = e.what();
    return out;
  }
  out.claims = int(a.claims.size());
  for (const audit::ClaimVerdict& c : a.claims) {
    out.holding += c.holds;
    if (!c.holds) out.failing.push_back(c.name);
  }
  for (const audit::Finding& f : a.findings) {
    if (f.severity == audit::Severity::error) out.errors[f.table].push_back(f.message);
    if (f.severity == audit::Severity::warning) out.warnings[f.table].push_back(f.message);
  }
  return out;
}

int report(const ReportFlags& f) {
  const ReportFormat format = report_format_for(f.output);  // refuse a bad -o before reading
  std::string text;
  if (f.runs_dirs.size() == 1) {
    const auto records = records_of(f.runs_dirs[0]);
    const FolderAudit audit = audit_of(f.runs_dirs[0]);
    text = render_run_report(records, f.runs_dirs[0], format, &audit);
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
      folders.push_back(records_of(d));
      audits.push_back(audit_of(d));
    }
    text = render_replicate_report(folders, f.runs_dirs, format, audits);
  }
  if (f.output.empty()) {
    fmt::print("{}", text);
    return kExitOk;
  }
  write_file_atomic(f.output, text);
  fmt::print("wrote {}\n", f.output);
  return kExitOk;
}

const bool registered = register_command(
    {"report",
     "Compare a sweep's runs: validation BPC per point against dense, measured vs planned", 50,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<ReportFlags>();
       app.add_option("runs", f->runs_dirs,
                      "the runs folder of `moeplan run --out`; several: replicates of one sweep "
                      "run with other seeds (mean, sd, how often each point beats dense)")
           ->capture_default_str()
           ->check(non_empty_path());
       app.add_option("-o,--output", f->output, "write report.md, report.html or report.txt")
           ->check(non_empty_path());
       return [f] { return report(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
