#include "moeplan/audit/quantity.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

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

}  // namespace moeplan::audit
