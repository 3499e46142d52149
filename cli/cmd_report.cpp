// `moeplan report runs/ [-o report.md|report.html|report.txt]`: the sweep's comparison table.
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/reports/run_report.hpp"
#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan::cli {
namespace {

struct ReportFlags {
  std::string runs_dir = "runs";
  std::string output;
};

int report(const ReportFlags& f) {
  const ReportFormat format = report_format_for(f.output);  // refuse a bad -o before reading
  const std::string text = render_run_report(load_run_records(f.runs_dir), f.runs_dir, format);
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
       app.add_option("runs", f->runs_dir, "the runs folder of `moeplan run --out`")
           ->capture_default_str();
       app.add_option("-o,--output", f->output, "write report.md, report.html or report.txt");
       return [f] { return report(*f); };
     }});

}  // namespace
}  // namespace moeplan::cli
