#pragma once
// Claim checks over groups of rows (pure): equality within a tolerance (spread, or distance from a
// baseline row), bounds (at_least / at_most / between), strict reuse (every row's unique data
// equals the baseline's). Rows that break a claim are named and reported as error findings.
#include <vector>

#include "moeplan/audit/finding.hpp"
#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

// Throws InputError when a claim names a table that is not loaded, a row past a table's end, or a
// quantity some of its rows cannot provide (not a column, not shared, not derivable).
std::vector<ClaimVerdict> evaluate_claims(const std::vector<ClaimTable>& tables,
                                          const AuditSpec& spec, std::vector<Finding>& findings);

// The rows a claim keeps after group selection and optional filters, equality or bounds
// alone; shared by evaluate_claims and the tests. Pure.
struct RowRef {
  const ClaimTable* table;
  int row;  // 1-based
};
std::vector<RowRef> select_rows(const std::vector<ClaimTable>& tables, const AuditSpec& spec,
                                const ClaimSpec& claim);

// The fewest rows whose removal brings a group's relative range within tolerance (the largest
// group within tolerance is kept; of several as large, the one nearest the median), farthest
// from the median first. Indices into `values`.
std::vector<size_t> outliers_to_remove(const std::vector<double>& values, double tolerance);

}  // namespace moeplan::audit
