#include "moeplan/audit/audit_tables.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/audit/claims.hpp"
#include "moeplan/audit/duplicates.hpp"
#include "moeplan/audit/row_checks.hpp"

namespace moeplan::audit {

AuditReport audit_tables(const std::vector<ClaimTable>& tables, const AuditSpec& spec) {
  for (const TableSpec& ts : spec.tables) {
    const auto it = std::find_if(tables.begin(), tables.end(),
                                 [&](const ClaimTable& t) { return t.name == ts.name; });
    if (it == tables.end())
      throw InputError(
          fmt::format("{}: [tables.{}] names a table that is not loaded (give its "
                      "file = \"...\" or --claims {}.csv)",
                      spec.source, ts.name, ts.name));
    for (const std::string& h : ts.ignore)
      if (std::find(it->headers.begin(), it->headers.end(), h) == it->headers.end())
        throw InputError(fmt::format("{}: [tables.{}] ignores column '{}', which {} does not have",
                                     spec.source, ts.name, h, it->source));
  }
  AuditReport report;
  for (const ClaimTable& t : tables)
    if (!t.labels.empty()) report.row_labels[t.name] = t.labels;
  std::vector<Finding> consistency;
  for (const ClaimTable& t : tables) {
    const TableSpec* ts = spec.table(t.name);
    auto f = check_table_rows(t, ts, ts && ts->tolerance ? *ts->tolerance : spec.tolerance);
    consistency.insert(consistency.end(), f.begin(), f.end());
  }
  const auto dups = find_duplicate_runs(tables, spec, spec.tolerance);
  consistency.insert(consistency.end(), dups.begin(), dups.end());
  for (const ClaimTable& t : tables) {
    ClaimVerdict cv;
    cv.name = fmt::format("table {}: rows internally consistent", t.name);
    cv.rows.push_back(fmt::format("{}:*", t.name));
    for (const Finding& f : consistency)
      if (f.table == t.name && f.severity == Severity::error) cv.holds = false;
    report.claims.push_back(std::move(cv));
  }
  report.findings = std::move(consistency);
  auto claims = evaluate_claims(tables, spec, report.findings);
  report.claims.insert(report.claims.end(), claims.begin(), claims.end());
  report.sort_findings();
  return report;
}

}  // namespace moeplan::audit
