#pragma once
// The same run printed twice (in one table or in two) with different numbers. A run is identified
// by its shape, its consumed tokens D and its hyper-parameters (η, B) as far as both rows print
// them; every other quantity both rows carry must then agree within rounding.
#include <vector>

#include "moeplan/audit/finding.hpp"
#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

std::vector<Finding> find_duplicate_runs(const std::vector<ClaimTable>& tables,
                                         const AuditSpec& spec, double tolerance);

}  // namespace moeplan::audit
