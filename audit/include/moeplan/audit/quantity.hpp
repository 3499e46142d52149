#pragma once
// The quantities a claim table can carry: one code name each (ACCOUNTING.md), recognised by
// that name or by the header the equal-resource paper prints.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeplan::audit {

struct ColumnMeaning {
  std::string quantity;  // code name, e.g. "activation_rate"
  double scale = 1.0;    // value in the table × scale = value in code units (ra_pct: 0.01)
};

// "N" -> total_params, "ra_pct" -> activation_rate ×0.01, "total_params" -> itself, ...
// nullopt for a header nobody knows.
std::optional<ColumnMeaning> column_meaning(std::string_view header);

// Every code name a table column or a spec may use (for error messages and validation).
const std::vector<std::string>& known_quantities();
bool is_known_quantity(std::string_view name);

// The paper's symbol for a code name, for messages: "total_params" -> "N".
std::string_view symbol(std::string_view quantity);

// Text column holding a row label (not a number): "label", "id", "run", "name", "model", in any
// case ("Model").
bool is_label_column(std::string_view header);

}  // namespace moeplan::audit
