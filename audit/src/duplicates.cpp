#include "moeplan/audit/duplicates.hpp"

#include <cmath>

#include <fmt/format.h>

#include "moeplan/audit/quantity.hpp"
#include "moeplan/audit/row_values.hpp"

namespace moeplan::audit {

namespace {

// What makes two rows the same run. Shape fields must be printed in both (column or shared).
// GQA (kv_heads) and the vocabulary change N and M; D̂ and epochs tell a strict-reuse run from
// a fresh-data run of the same D (the equal-resource paper's own comparison); mu is a training
// setting (the coupling loss's weight).
constexpr const char* kShapeKeys[] = {"layers",   "dense_layers", "d_model", "d_ffn", "heads",
                                      "kv_heads", "head_dim",     "experts", "top_k", "d_expert",
                                      "d_shared", "seq_len",      "vocab"};
constexpr const char* kRunKeys[] = {"tokens_consumed", "tokens_unique", "epochs",
                                    "lr_peak",         "batch_seqs",    "mu"};

bool same(const Cell& a, const Cell& b) {
  return std::fabs(a.value - b.value) <= a.half_width + b.half_width + 1e-12 * std::fabs(a.value);
}

bool is_identity_key(const std::string& q) {
  for (const char* k : kShapeKeys)
    if (q == k) return true;
  for (const char* k : kRunKeys)
    if (q == k) return true;
  return false;
}

// Same run: D printed in both and equal, at least two shape fields in common, and every shape
// or run key that both print agrees.
bool same_run(const RowView& a, const RowView& b) {
  const Cell *da = a.printed("tokens_consumed"), *db = b.printed("tokens_consumed");
  if (!da || !db || !same(*da, *db)) return false;
  int shape_common = 0;
  for (const char* k : kShapeKeys) {
    const Cell *x = a.printed(k), *y = b.printed(k);
    if (x && y) {
      if (!same(*x, *y)) return false;
      ++shape_common;
    }
  }
  if (shape_common < 2) return false;
  for (const char* k : kRunKeys) {
    const Cell *x = a.printed(k), *y = b.printed(k);
    if (x && y && !same(*x, *y)) return false;
  }
  // A dense row and a MoE row are never the same run.
  return (a.printed("experts") != nullptr) == (b.printed("experts") != nullptr);
}

}  // namespace

std::vector<Finding> find_duplicate_runs(const std::vector<ClaimTable>& tables,
                                         const AuditSpec& spec, double tol) {
  std::vector<RowView> views;
  for (const ClaimTable& t : tables)
    for (int i = 0; i < int(t.rows.size()); ++i) views.emplace_back(t, i, spec.table(t.name));
  std::vector<Finding> out;
  for (size_t i = 0; i < views.size(); ++i) {
    for (size_t j = i + 1; j < views.size(); ++j) {
      const RowView &a = views[i], &b = views[j];
      if (!same_run(a, b)) continue;
      const std::string ref_a = row_ref(a.table().name, a.row());
      const bool flops_comparable =
          same_flops_reading(spec.table(a.table().name), spec.table(b.table().name));
      for (const std::string& q : known_quantities()) {
        if (is_identity_key(q)) continue;
        if (!flops_comparable && (q == "flops_per_token" || q == "compute")) continue;
        const Cell *x = a.printed(q), *y = b.printed(q);
        if (!x || !y || same(*x, *y)) continue;
        out.push_back(Finding{
            Severity::error, b.table().name, b.row(), q, x->value, y->value,
            x->value != 0 ? (y->value - x->value) / x->value : 0, tol,
            fmt::format("same run as {} (same shape, D and hyper-parameters) but {} = {} here and "
                        "{} there",
                        ref_a, symbol(q), y->text, x->text)});
      }
    }
  }
  return out;
}

}  // namespace moeplan::audit
