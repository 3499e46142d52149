#pragma once
// Reading run records (runs/<point>/record.json) and, optionally, the manifest they were planned
// from; then audit_runs() from runs.hpp.
#include <filesystem>
#include <vector>

#include "moeplan/audit/finding.hpp"
#include "moeplan/audit/runs.hpp"

namespace moeplan::audit {

// Every runs_dir/*/record.json, sorted by folder name. InputError if the folder is missing,
// holds no record, or a record is unreadable.
std::vector<RunRecord> load_run_records(const std::filesystem::path& runs_dir);

// `plan_path` empty: each record is audited against the plan it carries.
AuditReport audit_runs_dir(const std::filesystem::path& runs_dir,
                           const std::filesystem::path& plan_path, RunsAuditOptions options);
// The same on records already read (load_run_records), against `planned` (empty: the plans
// they carry); equal N and C default to the dense record's sweep tolerances.
AuditReport audit_run_records(const std::vector<RunRecord>& records,
                              const std::vector<Plan>& planned, RunsAuditOptions options);

}  // namespace moeplan::audit
