#pragma once
// The value of a quantity in one row: printed in a column, shared by the table (spec), derived
// from other printed values, or recomputed from the shape. Each value says where it came from
// and how wide its rounding band is, so a check can tell rounding from a real discrepancy.
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/accounting/arch.hpp"
#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

struct RowValue {
  double value = 0;
  double rel_band = 0;  // relative half-width of the rounding it carries
  std::string source;   // "published", "shared", "D / (D/N)", "shape (router out)"
  // A derived value's exact range over its inputs' rounding (a ratio of coarse numbers is
  // lopsided: 3e11 / 1e11 lies in [2.5/1.5, 3.5/0.5] = [1.67, 7]); unset: value ± abs_band().
  std::optional<double> lo, hi;
  std::string text;  // as printed, for a published or shared value ("" otherwise)
  // How a finding shows it as printed ("20.20100", not "20.2": the digits it turns on), or ""
  // when it was not printed or is r_a (an ra_pct column prints percent, not the fraction).
  std::string printed_as(std::string_view quantity) const {
    return quantity == "activation_rate" ? std::string() : text;
  }
  double abs_band() const { return rel_band * (value < 0 ? -value : value); }
  double low() const { return lo ? *lo : value - abs_band(); }
  double high() const { return hi ? *hi : value + abs_band(); }
};

// Shape of a row: columns override the table's shared values. Missing fields are listed by code
// name; defaults that were assumed (head_dim = d_model/heads, a dense model without E) too.
struct ShapeResolution {
  Arch arch;                         // count_router/count_norms false
  std::vector<std::string> missing;  // fields needed to recompute N / N_a
  bool has_seq_len = false, has_vocab = false;
  bool known() const { return missing.empty(); }
};

class RowView {
 public:
  RowView(const ClaimTable& table, int row_index, const TableSpec* spec);

  const ClaimTable& table() const { return table_; }
  int row() const { return row_ + 1; }  // 1-based
  // Printed in a column or shared by the spec.
  const Cell* printed(const std::string& quantity) const;
  bool has(const std::string& quantity) const { return printed(quantity) != nullptr; }
  // Printed, else derived from printed values (the derivation with the narrowest rounding band),
  // never using a quantity in `avoid` (so a check does not compare a value with itself).
  std::optional<RowValue> value(const std::string& quantity,
                                const std::set<std::string>& avoid = {}) const;
  // value(), else recomputed from the shape (router and norms out: the paper's stated reading).
  std::optional<RowValue> value_or_shape(const std::string& quantity) const;
  const ShapeResolution& shape() const { return shape_; }

 private:
  const ClaimTable& table_;
  int row_;
  const TableSpec* spec_;
  ShapeResolution shape_;
};

}  // namespace moeplan::audit
