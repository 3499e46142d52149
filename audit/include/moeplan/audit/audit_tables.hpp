#pragma once
// The whole audit of claim tables (pure): row checks per table, duplicated runs across tables,
// the spec's claims. Each table also gets an implicit claim, "rows internally consistent", that
// fails when its rows carry an error finding, so that a spec-less audit still has a verdict.
#include <vector>

#include "moeplan/audit/finding.hpp"
#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

// `spec` may be empty (no tables, no claims): rows are then checked for consistency only.
// Throws InputError for a spec that does not fit the tables (a missing table, a column it ignores
// that is not there, a quantity a claim needs that a row cannot provide, a missing shared value).
AuditReport audit_tables(const std::vector<ClaimTable>& tables, const AuditSpec& spec);

// Exit status of `moeplan audit`: 0 every claim holds, 1 a claim fails.
inline int exit_status(const AuditReport& r) {
  return r.all_hold() ? 0 : 1;
}

}  // namespace moeplan::audit
