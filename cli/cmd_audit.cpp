// `moeplan audit`: check published claim tables (--claims, --spec) or our own runs (runs/).
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/audit_tables.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/audit/render.hpp"
#include "moeplan/audit/runs_io.hpp"

namespace moeplan::cli {
namespace {

struct AuditFlags {
  std::string runs_dir;
  std::string plan;
  std::vector<std::string> claims;
  std::string spec;
  std::string format = "table";
  std::string out;
  std::optional<double> tolerance;
};

int run_audit(const AuditFlags& f) {
  namespace fs = std::filesystem;
  using namespace moeplan::audit;
  const ReportFormat format = parse_report_format(f.format);
  if (f.tolerance && !(*f.tolerance > 0 && *f.tolerance < 1))
    throw InputError(
        fmt::format("--tolerance {} must be a relative value in (0, 1), e.g. 0.01", *f.tolerance));
  AuditReport report;
  if (!f.runs_dir.empty()) {
    if (!f.claims.empty() || !f.spec.empty())
      throw InputError("give either a runs folder or --claims/--spec, not both");
    RunsAuditOptions opt;
    if (f.tolerance) opt.tolerance = *f.tolerance;
    report = audit_runs_dir(f.runs_dir, f.plan, opt);
  } else {
    if (!f.plan.empty())
      throw InputError("--plan goes with a runs folder: moeplan audit runs/ --plan sweep.toml");
    if (f.claims.empty() && f.spec.empty())
      throw InputError(
          "nothing to audit: give a runs folder, --claims TABLE.csv or --spec claims.toml");
    AuditSpec spec;
    fs::path spec_dir = ".";
    if (!f.spec.empty()) {
      spec = load_spec(f.spec);
      spec_dir =
          fs::path(f.spec).has_parent_path() ? fs::path(f.spec).parent_path() : fs::path(".");
    } else {
      spec.source = "(no spec)";
    }
    if (f.tolerance) spec.tolerance = *f.tolerance;
    std::vector<fs::path> files(f.claims.begin(), f.claims.end());
    report = audit_tables(load_claim_tables(files, spec, spec_dir), spec);
  }
  const std::string text = render(report, format);
  if (f.out.empty()) {
    fmt::print("{}", text);
  } else {
    write_file_atomic(f.out, text);
    fmt::print("{}: {} claims, {}; written to {}\n",
               report.all_hold() ? "all claims hold" : "a claim fails", report.claims.size(),
               fmt::format("{} findings", report.findings.size()), f.out);
  }
  return exit_status(report);
}

const bool registered = register_command(
    {"audit", "Verify equal-resource claims: published tables (--claims) or our own runs", 40,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<AuditFlags>();
       app.add_option("runs", f->runs_dir, "Folder of run records (runs/<point>/record.json)");
       app.add_option("--plan", f->plan, "Manifest (sweep.toml) the runs were planned from");
       app.add_option("--claims", f->claims, "Claim table (CSV); repeat for several tables");
       app.add_option("--spec", f->spec, "Claim spec (TOML, schema = 1): shared values and claims");
       app.add_option("--format", f->format, "Output: table (terminal), json or md")
           ->capture_default_str();
       app.add_option("-o,--out", f->out, "Write the report to this file (atomically)");
       app.add_option("--tolerance", f->tolerance,
                      "Relative tolerance (default 0.01, or the spec's)");
       app.footer(
           "Exit status: 0 every claim holds, 1 a claim fails, 2 unusable input.\n"
           "Example: moeplan audit --spec examples/audit-paper/claims.toml");
       return [f] { return run_audit(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
