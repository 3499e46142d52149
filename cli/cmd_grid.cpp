// `moeplan grid`: an equal-resource sweep over the activation rate, as a table or a manifest.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/backend/corpus.hpp"
#include "moeplan/backend/run.hpp"
#include "moeplan/reports/sweep_report.hpp"
#include "moeplan/sweeps/atomic_file.hpp"
#include "moeplan/sweeps/grid.hpp"
#include "moeplan/sweeps/manifest_io.hpp"
#include "plan_flags.hpp"

namespace moeplan::cli {
namespace {

struct GridFlags {
  PlanFlags plan;
  std::string ra;
  int points = 0;  // used only when --points is given
  std::string format;
  std::string output;
  std::vector<std::string> train;
};

// `moeplan run` reads a relative source path from the manifest's folder (symlinks resolved); as
// typed here it is relative to the folder grid runs in. Written relative to -o's folder, it names
// the same file from there. Where that folder is unknown (no -o, or -o /dev/stdout and the like:
// the shell puts the manifest somewhere), the path is written absolute.
std::string source_for_manifest(const std::string& spec, const std::filesystem::path& output) {
  namespace fs = std::filesystem;
  const auto f = backend::source_file(spec);
  if (!f || f->path.is_absolute()) return spec;
  std::error_code ec;
  // A glob's folder is resolved; its file-name pattern is kept as written.
  const fs::path file =
      fs::weakly_canonical(fs::absolute(f->path).parent_path(), ec) / f->path.filename();
  const bool stream =
      output.empty() || (fs::exists(output, ec) && !fs::is_regular_file(output, ec));
  if (stream) return f->kind + ":" + file.string();
  const fs::path rel = file.lexically_relative(backend::source_base_of(output));
  return f->kind + ":" + (rel.empty() ? file : rel).string();
}

const bool registered = register_command(
    {"grid", "Plan an equal-resource sweep over the activation rate r_a (and its dense baseline)",
     10, [](CLI::App& app) -> std::function<int()> {
       auto f = std::make_shared<GridFlags>();
       add_plan_flags(app, f->plan, true);
       app.add_option("--ra", f->ra, "activation rates: a range A:B or a list 0.1,0.2,0.3")
           ->required();
       const CLI::Option* points_flag =
           app.add_option("--points", f->points,
                          "points in an A:B range, inclusive (default 8; a range only)")
               ->transform(decimal_integer(kMaxPoints, std::numeric_limits<int>::min(), 1));
       const CLI::Option* format_flag = app.add_option("--format", f->format,
                                                       "table, csv, json, toml, md (default: "
                                                       "table, or -o's extension)");
       app.add_option("-o,--output", f->output,
                      "also write the sweep to this file (atomically), in the format of its "
                      "extension")
           ->check(non_empty_path("file name"));
       app.add_option(
              "--train", f->train,
              "a [train] setting of the manifest, KEY=VALUE (repeatable): source=text:FILE, "
              "erc_loss=0.01, capacity_factor=1.25, positions=rope, device=cuda, ...")
           ->take_all()
           ->allow_extra_args(false);
       return [f, points_flag, format_flag] {
         const Format format = output_format(given(format_flag, f->format), f->output);
         SweepRequest req;
         req.plan = make_plan_request(f->plan);
         req.activation_rates = parse_ra_spec(
             f->ra, points_flag->count() > 0 ? std::optional<int>(f->points) : std::nullopt);
         req.created_by = command_line_for_record("moeplan grid");
         apply_train_settings(req.train, f->train);
         req.train.source = source_for_manifest(req.train.source, f->output);
         const Manifest m = plan_sweep(req);
         const std::string text = render_manifest(m, format);
         if (f->output.empty()) {
           fmt::print("{}", format == Format::table ? for_terminal(text) : text);
         } else {
           write_file_atomic(f->output, text);
           if (format != Format::table)
             fmt::print("{}", for_terminal(render_manifest(m, Format::table)));
           fmt::print("wrote {} ({}: dense baseline + {} point{})\n", f->output, name(format),
                      m.points.size(), m.points.size() == 1 ? "" : "s");
         }
         // A file source that cannot feed the sweep is said now, not when `run` refuses it: a
         // warning, since the data may be made after the plan (the built-in corpus is generated
         // to size, and checked by run against this machine's memory).
         if (m.train.source != "builtin") {
           const std::filesystem::path base =
               f->output.empty() ? std::filesystem::path() : backend::source_base_of(f->output);
           std::vector<const Plan*> plans{&m.dense};
           for (const Plan& p : m.points) plans.push_back(&p);
           for (const Plan* p : plans) {
             try {
               backend::check_source_fits(*p, m.train, base);
             } catch (const InputError& e) {
               std::fprintf(stderr, "moeplan: warning: %s; `moeplan run` would refuse this sweep\n",
                            e.what());
               break;
             }
           }
         }
         if (const std::string w = capacity_factor_warning(m); !w.empty())
           fmt::print(stderr, "moeplan: warning: {}\n", w);
         return kExitOk;
       };
     }});

}  // namespace
}  // namespace moeplan::cli
