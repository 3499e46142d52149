#include "moeplan/audit/runs_io.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/io.hpp"
#include "moeplan/sweeps/ledger_json.hpp"
#include "moeplan/sweeps/runs_folder.hpp"

#if __has_include("moeplan/sweeps/manifest_io.hpp")
#include "moeplan/sweeps/manifest_io.hpp"
#define MOEPLAN_AUDIT_HAS_MANIFEST_IO 1
#endif

namespace moeplan::audit {

namespace fs = std::filesystem;

std::vector<RunRecord> load_run_records(const fs::path& runs_dir) {
  std::error_code ec;
  if (!fs::is_directory(runs_dir, ec))
    throw InputError(fmt::format("{}: not a folder of runs (expected runs/<point>/record.json)",
                                 runs_dir.string()));
  const std::vector<fs::path> files = point_record_files(runs_dir);
  if (files.empty())
    throw InputError(
        fs::exists(runs_dir / "record.json", ec)
            ? fmt::format("{}: one point's folder, not a runs folder; give the folder that holds "
                          "it, '{}'",
                          runs_dir.string(), runs_dir.parent_path().string())
            : fmt::format("{}: no <point>/record.json inside; run `moeplan run` first",
                          runs_dir.string()));
  std::vector<RunRecord> out;
  std::vector<std::string> dense;
  for (const fs::path& f : files) {
    const std::string text = read_text_file(f);  // unreadable: its permissions, not damage
    try {
      out.push_back(parse_run_record(text, f.string()));
    } catch (const InputError& e) {  // the reader's finding, and what the owner can do about it
      throw InputError(fmt::format("{} ({})", e.what(), damaged_record_remedy(f)));
    }
    check_point_folder(out.back().point_id, f);
    if (out.back().plan.role == "dense") dense.push_back(out.back().point_id);
  }
  // One sweep, one dense baseline: with two, every equal claim would be measured against
  // whichever sorts first.
  if (dense.size() > 1)
    throw InputError(fmt::format(
        "{}: holds {} dense baselines ({}): a runs folder is one sweep with one; audit each "
        "sweep's folder on its own, or move the extra one away",
        runs_dir.string(), dense.size(), fmt::join(dense, ", ")));
  return out;
}

AuditReport audit_runs_dir(const fs::path& runs_dir, const fs::path& plan_path,
                           RunsAuditOptions options) {
  std::vector<Plan> planned;
  if (!plan_path.empty()) {
#ifdef MOEPLAN_AUDIT_HAS_MANIFEST_IO
    const Manifest m = read_manifest(plan_path);
    planned.push_back(m.dense);
    planned.insert(planned.end(), m.points.begin(), m.points.end());
    if (!options.n_tolerance) options.n_tolerance = m.n_tolerance;
    if (!options.compute_tolerance) options.compute_tolerance = m.compute_tolerance;
    options.manifest_train = settings_from_text(train_to_json(m.train).dump());
#else
    throw InputError(
        fmt::format("--plan {}: this build cannot read manifests yet; audit the runs "
                    "against the plans their records carry (omit --plan)",
                    plan_path.string()));
#endif
  }
  return audit_run_records(load_run_records(runs_dir), planned, options);
}

AuditReport audit_run_records(const std::vector<RunRecord>& records,
                              const std::vector<Plan>& planned, RunsAuditOptions options) {
  // Without --plan (or --tolerance), equal N and C are the sweep's as its dense baseline's
  // record says (`run` writes the manifest's): report judges the folder the same way.
  for (const RunRecord& r : records)
    if (r.plan.role == "dense") {
      if (!options.n_tolerance && r.n_tolerance) options.n_tolerance = r.n_tolerance;
      if (!options.compute_tolerance && r.compute_tolerance)
        options.compute_tolerance = r.compute_tolerance;
    }
  return audit_runs(records, planned, options);
}

}  // namespace moeplan::audit
