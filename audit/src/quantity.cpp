#include "moeplan/audit/quantity.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan::audit {

namespace {
struct Entry {
  std::string_view quantity;
  std::string_view symbol;      // paper header / symbol
  std::string_view alias = "";  // a second paper spelling, if any
  double scale = 1.0;
};
// The paper header (symbol) maps to the code name; ra_pct is a percentage.
constexpr std::array kEntries = {
    Entry{"total_params", "N"},
    Entry{"active_params", "Na"},
    Entry{"activation_rate", "ra_pct", "", 0.01},
    Entry{"flops_per_token", "M"},
    Entry{"tokens_consumed", "D"},
    Entry{"tokens_unique", "D_hat"},
    Entry{"epochs", "Epoch", "Epochs"},
    Entry{"compute", "C"},
    Entry{"tokens_per_param", "D_over_N"},
    Entry{"layers", "L_layers", "L"},
    Entry{"dense_layers", "L_dense"},
    Entry{"heads", "H"},
    Entry{"kv_heads", "H_kv"},
    Entry{"d_model", "Dm"},
    Entry{"d_ffn", "Dffn"},
    Entry{"head_dim", "Dh"},
    Entry{"experts", "E"},
    Entry{"top_k", "K"},
    Entry{"d_expert", "De"},
    Entry{"d_shared", "Dse"},
    Entry{"mu", "mu"},
    Entry{"lr_peak", "eta"},
    Entry{"batch_seqs", "B"},
    Entry{"steps", "iters"},
    Entry{"val_bpc", "BPC"},
    Entry{"val_loss", "Loss"},
    Entry{"seq_len", "S"},
    Entry{"vocab", "V"},
};
}  // namespace

std::optional<ColumnMeaning> column_meaning(std::string_view h) {
  for (const Entry& e : kEntries) {
    if (h == e.quantity) return ColumnMeaning{std::string(e.quantity), 1.0};
    if (h == e.symbol || (!e.alias.empty() && h == e.alias))
      return ColumnMeaning{std::string(e.quantity), e.scale};
  }
  return std::nullopt;
}

const std::vector<std::string>& known_quantities() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Entry& e : kEntries) v.emplace_back(e.quantity);
    return v;
  }();
  return names;
}

bool is_known_quantity(std::string_view name) {
  const auto& q = known_quantities();
  return std::find(q.begin(), q.end(), name) != q.end();
}

std::string_view symbol(std::string_view quantity) {
  for (const Entry& e : kEntries)
    if (e.quantity == quantity) return e.symbol == "ra_pct" ? "r_a" : e.symbol;
  return quantity;
}

bool is_label_column(std::string_view h) {
  std::string lower(h);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  return lower == "label" || lower == "id" || lower == "run" || lower == "name" || lower == "model";
}

std::optional<ShapeBounds> shape_bounds(std::string_view q) {
  // 0 where it means "none": no dense layer, no dense FFN, no experts (a dense model), no shared
  // expert. Widths up to 10^6; experts up to 10^7 (fine-grained MoE has used 2^20).
  constexpr int64_t kLayers = 10'000, kWidth = 1'000'000;
  if (q == "layers") return ShapeBounds{1, kLayers};
  if (q == "dense_layers") return ShapeBounds{0, kLayers};
  if (q == "heads" || q == "kv_heads") return ShapeBounds{1, 10'000};
  if (q == "d_model" || q == "head_dim") return ShapeBounds{1, kWidth};
  if (q == "d_ffn" || q == "d_expert" || q == "d_shared") return ShapeBounds{0, kWidth};
  if (q == "experts") return ShapeBounds{0, 10'000'000};
  if (q == "top_k") return ShapeBounds{0, 10'000};
  if (q == "seq_len") return ShapeBounds{1, 100'000'000};
  if (q == "vocab") return ShapeBounds{2, 10'000'000};
  return std::nullopt;
}

void check_shape_value(std::string_view q, double value, std::string_view text,
                       std::string_view what) {
  const auto b = shape_bounds(q);
  if (!b || (value == std::floor(value) && value >= double(b->min) && value <= double(b->max)))
    return;
  // The value as read, beside the text when a suffix hides it: "24B" (2.4e10).
  const std::string plain(text);
  char* end = nullptr;
  const bool as_written = std::strtod(plain.c_str(), &end) == value && *end == '\0';
  std::string read = fmt::format("{:.6g}", value);
  if (const size_t e = read.find("e+"); e != std::string::npos) read.erase(e + 1, 1);
  throw InputError(fmt::format("{} = {}{}: {} must be a whole number from {}{} to {}", what, text,
                               as_written ? "" : " (" + read + ")", q, b->min,
                               b->min == 0 ? " (none)" : "", b->max));
}

void check_quantity_value(std::string_view q, double value, std::string_view text,
                          std::string_view what) {
  if (shape_bounds(q)) return check_shape_value(q, value, text, what);
  if (q == "mu") {  // 0: no coupling loss
    if (!(value >= 0 && std::isfinite(value)))
      throw InputError(fmt::format("{} = {}: mu (µ) must be 0 or more", what, text));
    return;
  }
  if (q == "activation_rate") {
    if (!(value > 0 && value <= 1))
      throw InputError(
          fmt::format("{} = {}: activation_rate must be in (0, 1] (ra_pct in (0, "
                      "100]); a dense model is 1",
                      what, text));
    return;
  }
  if (!(value > 0 && std::isfinite(value)))
    throw InputError(
        fmt::format("{} = {}: {} ({}) must be greater than 0; leave the cell blank "
                    "if it is not published",
                    what, text, q, symbol(q)));
}

}  // namespace moeplan::audit
