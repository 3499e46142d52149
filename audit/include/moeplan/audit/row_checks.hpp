#pragma once
// Internal consistency of each row of a claim table (pure: no I/O).
//   r_a = N_a/N; N, N_a, r_a recomputed from the shape with and without router weights (which
//   reading fits, and whether the rows of a table agree on it); M against every convention the
//   accounting knows (paper, exact/full, exact/causal, megatron; training and forward); C = M·D;
//   epochs = D/D̂; D/N; iters = D/(B·S); µ = (D_se + E·D_e)/D_m; η and B against step-law (info).
#include <vector>

#include "moeplan/audit/finding.hpp"
#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

// `spec` is the table's entry in the claim spec, or nullptr. With an entry, a check whose input is
// missing (e.g. M present but seq_len unknown) throws InputError naming the value to add; without
// one the check is skipped and one info finding per table says what was skipped and why.
std::vector<Finding> check_table_rows(const ClaimTable& table, const TableSpec* spec,
                                      double tolerance);

}  // namespace moeplan::audit
