#pragma once
// A claim table: rows of published numbers, columns named by code name (quantity.hpp).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace moeplan::audit {

// One published number with the rounding its text implies: "5.85e8" is 5.85e8 ± 5e5.
struct Cell {
  double value = 0;
  double half_width = 0;  // half a unit of the last printed digit, in code units (0 = exact)
  std::string text;       // as printed
  double rel_half_width() const {
    return value != 0 ? half_width / (value < 0 ? -value : value) : 0;
  }
};

// Parse a number as people print it ("2.15e9", "2.15B", "346M", "0.4665") with its rounding.
// `scale` converts table units to code units (ra_pct: 0.01). Throws InputError naming `what`.
// The sign is not checked here: check_quantity_value knows each quantity's range.
Cell parse_cell(std::string_view text, std::string_view what, double scale = 1.0);

struct ClaimTable {
  std::string name;                     // how specs and findings refer to it ("moe7b")
  std::string source;                   // file it came from, for messages
  std::vector<std::string> headers;     // as in the file
  std::vector<std::string> quantities;  // code name per column ("" = ignored or label column)
  std::vector<std::map<std::string, Cell>> rows;  // data row i (0-based) -> quantity -> cell
  std::vector<std::string> labels;                // per row; empty when there is no label column

  bool has_column(std::string_view quantity) const;
};

// CSV text (comma-separated, first line = headers, no quoting needed for numbers) into a table.
// Unknown headers throw InputError naming the header and the file, unless listed in `ignore`.
// Ragged rows, unparseable numbers and shape values that are not whole numbers within their
// bounds (check_shape_value) throw InputError naming file, row and column. A leading UTF-8
// byte-order mark is skipped.
ClaimTable parse_claim_table(std::string_view csv_text, std::string name, std::string source,
                             const std::set<std::string>& ignore = {});

}  // namespace moeplan::audit
