#pragma once
// The comparison of a sweep's run records: validation BPC per point against the dense baseline,
// with the measured N, C [paper], D consumed, D̂ unique and epochs beside the planned ones.
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeplan {

// Every <dir>/<point>/record.json, the dense baseline first, then MoE points by r_a.
// InputError when the folder is missing, holds no record, or a record is unreadable.
std::vector<nlohmann::json> load_run_records(const std::filesystem::path& dir);

// text, markdown and html are for people; csv and json carry each point's figures for a script
// (numbers unrounded, in FLOPs, tokens, seconds and bytes, and empty or null where the tables
// print "-").
enum class ReportFormat { text, markdown, html, csv, json };
// `--format` (table, md, html, csv, json; nullopt where not given) and -o's extension (none or
// .txt, .md, .html, .csv, .json): --format where given, and then an extension naming another
// format is refused; else the extension's. InputError for an unknown name (--format '' too) or
// extension.
ReportFormat run_report_format(const std::optional<std::string>& format_flag,
                               const std::filesystem::path& output);

// What `moeplan audit` says of one runs folder (the command fills it from the audit, which
// checks far more than the report: every ledger against its plan, the data, the tolerances).
// The report counts no point whose record the audit finds an error in, nor any point when the
// dense baseline's has one, and says so: a table must not declare a win the audit refuses.
struct FolderAudit {
  int claims = 0, holding = 0;
  std::vector<std::string> failing;  // names of the claims that fail
  std::map<std::string, std::vector<std::string>> errors, warnings;  // point id -> messages
  // point id -> the quantities of its errors ("compute", "flops", "flops:attention", ...): the
  // report's C column is not "ok" where the audit finds the FLOP ledger behind it wrong.
  std::map<std::string, std::set<std::string>> error_quantities;
  std::string refused;  // the audit's reason when it refuses the folder (records of two sweeps)
};

// `source` names where the records came from (printed in the title). `audit`: the folder's, or
// nullptr for none (no audit line, nothing left out for it).
std::string render_run_report(const std::vector<nlohmann::json>& records, const std::string& source,
                              ReportFormat format, const FolderAudit* audit = nullptr);

// Several runs folders of the same sweep, each trained with other seeds: per point, the final
// validation BPC over the replicates (mean, sample sd, range), its difference from the dense
// baseline of the same folder with its confidence interval and p, in how many folders the point
// beat that baseline, and Holm's step-down over the points. Folders whose plans differ in η only
// (grid --lr-scale; one folder per η, or several, one per seed, every η the same seeds) are a
// learning-rate sweep instead: each point's best η of those tried and its best against dense's
// best, paired by seed. InputError when a point's plan differs between folders otherwise. `names`
// are the folders as given.
// `audits`: one per folder, or empty.
std::string render_replicate_report(const std::vector<std::vector<nlohmann::json>>& folders,
                                    const std::vector<std::string>& names, ReportFormat format,
                                    const std::vector<FolderAudit>& audits = {});

// The charts the HTML report draws, each a standalone SVG document named by its chart id (one
// folder: bpc-ra, time-ra, memory-ra, bpc-time, val-c, loss-d, those that have something to
// draw; replicates: replicates, margins; a learning-rate sweep: lr-sweep), in the report's order:
// figures for a paper or slides.
struct ChartFile {
  std::string id, svg;
};
std::vector<ChartFile> run_report_charts(const std::vector<nlohmann::json>& records,
                                         const FolderAudit* audit = nullptr);
std::vector<ChartFile> replicate_report_charts(
    const std::vector<std::vector<nlohmann::json>>& folders, const std::vector<std::string>& names,
    const std::vector<FolderAudit>& audits = {});

}  // namespace moeplan
