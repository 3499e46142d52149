#pragma once
// The quantities a claim table can carry: one code name each (ACCOUNTING.md), recognised by
// that name or by the header the equal-resource paper prints.
#include <cstdint>
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

// A shape quantity (layers, widths, heads, experts, top_k, S, V) is a whole number within
// plausible bounds: "24B" layers is a unit typo, and recomputing its FLOPs would take hours.
// nullopt for a quantity that is not part of the shape.
struct ShapeBounds {
  int64_t min, max;
};
std::optional<ShapeBounds> shape_bounds(std::string_view quantity);
// Throws InputError "<what> = <text> (<value>): <quantity> must be a whole number from <min> to
// <max>" when a shape quantity's value is fractional or outside its bounds; nothing otherwise.
void check_shape_value(std::string_view quantity, double value, std::string_view text,
                       std::string_view what);

// Every value a table or a spec gives for a quantity: a shape value as check_shape_value; a
// count, FLOP figure, token figure, rate, η or loss is > 0 (a zero N, D or C makes every ratio
// built on it 0 or infinite, and a 0 = 0 "match" proves nothing); r_a is at most 1. mu may be 0
// (no coupling loss). Throws InputError "<what> = <text>: <quantity> must be ..." otherwise.
void check_quantity_value(std::string_view quantity, double value, std::string_view text,
                          std::string_view what);

}  // namespace moeplan::audit
