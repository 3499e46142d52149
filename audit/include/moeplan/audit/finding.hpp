#pragma once
// What an audit says: a verdict per claim, and findings (error | warning | info) that each name
// the table, the row, the quantity, the expected and found values and the tolerance.
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moeplan::audit {

enum class Severity { error, warning, info };
std::string_view name(Severity s);

struct Finding {
  Severity severity = Severity::info;
  std::string table;     // table name, or the run point id
  int row = 0;           // 1-based data row; 0 = not about one row
  std::string quantity;  // code name ("flops_per_token")
  std::optional<double> expected;
  std::optional<double> found;
  std::optional<double> rel_diff;  // (found − expected) / expected
  double tolerance = 0;            // relative
  std::string message;             // one line, says why
  // Exact integers (FLOP counts) behind `expected` and `found` where a double may round them: a
  // ledger of 5e19 FLOPs one FLOP off reads the same as a double. Empty otherwise.
  std::string expected_exact = {}, found_exact = {};
};

// One quantity of one claim: the spread over the claim's rows and its verdict.
struct QuantityVerdict {
  std::string quantity;
  std::string kind;  // "equal", "at_least", "at_most", "between", "equal_to_baseline"
  double min = 0, max = 0;
  std::string min_row, max_row;  // "table:row"
  double rel_range = 0;          // (max − min) / |min|
  // equal_to_baseline: what is tested, the farthest row's x / baseline − 1 (signed), and its row.
  std::optional<double> deviation;
  std::string deviation_row;
  double tolerance = 0;
  std::optional<double> lower, upper;  // bounds
  bool holds = true;
  std::vector<std::string> breaking;  // "table:row" of rows that break it
  std::string note;                   // where the values came from, recomputed spread, ...
};

struct ClaimVerdict {
  std::string name;
  std::vector<std::string> rows;  // "table:row"
  // What the selection covered, e.g. "8 of 8 moe7b rows, 1 of 6 dense rows; where compute =
  // 2.86e21 left out 5: dense:1-4,6" ("" for a table's own consistency claim).
  std::string coverage;
  std::vector<std::string> left_out;  // "table:row" of the rows `where` dropped
  std::vector<QuantityVerdict> quantities;
  bool holds = true;
};

struct AuditReport {
  std::vector<ClaimVerdict> claims;
  std::vector<Finding> findings;
  // Tables with a label column: table -> each data row's label, shown beside "table:row".
  std::map<std::string, std::vector<std::string>> row_labels;
  std::string label(const std::string& table, int row) const;  // "" when it has none
  bool all_hold() const;
  // Findings ordered by severity (errors first), then table, row, quantity: stable output.
  void sort_findings();
};

// "moe7b:3"
std::string row_ref(const std::string& table, int row);

}  // namespace moeplan::audit
