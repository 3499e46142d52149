// `moeplan show sweep.toml`: read a manifest (checking every key and every stored count against
// its arch) and render it as a table, CSV, JSON, TOML or Markdown.
#include <memory>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/reports/sweep_report.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "plan_flags.hpp"

namespace moeplan::cli {
namespace {

struct ShowFlags {
  std::string manifest;
  std::string format;
  std::string output;
};

const bool registered = register_command(
    {"show", "Check a manifest (sweep.toml) and print it as table, csv, json, toml or md", 30,
     [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<ShowFlags>();
       app.add_option("manifest", f->manifest, "the manifest, e.g. sweep.toml")
           ->required()
           ->check(non_empty_path("file name"));
       const CLI::Option* format_flag =
           app.add_option("--format", f->format,
                          "table, csv, json, toml, md (default: -o's extension, else table)");
       app.add_option("-o,--output", f->output, "write to this file (atomically)")
           ->check(non_empty_path("file name"));
       return [f, format_flag] {
         const Format format = output_format(given(format_flag, f->format), f->output);
         const Manifest m = read_manifest(f->manifest);
         const std::string text = render_manifest(m, format);
         if (const std::string w = capacity_factor_warning(m); !w.empty())
           fmt::print(stderr, "moeplan: warning: {}\n", w);
         if (f->output.empty()) {
           fmt::print("{}", format == Format::table ? for_terminal(text) : text);
         } else {
           write_file_atomic(f->output, text);
           fmt::print("wrote {} ({})\n", f->output, name(format));
         }
         return kExitOk;
       };
     }});

}  // namespace
}  // namespace moeplan::cli
