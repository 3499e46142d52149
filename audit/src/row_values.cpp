#include "moeplan/audit/row_values.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"

namespace moeplan::audit {

namespace {

// One-step derivations from printed values; bands of products and ratios add.
struct Derivation {
  const char* quantity;
  const char* label;
  std::vector<const char*> inputs;
  std::function<double(const std::vector<double>&)> f;
};

const std::vector<Derivation>& derivations() {
  static const std::vector<Derivation> d = {
      {"total_params",
       "D / (D/N)",
       {"tokens_consumed", "tokens_per_param"},
       [](auto& v) { return v[0] / v[1]; }},
      {"total_params",
       "N_a / r_a",
       {"active_params", "activation_rate"},
       [](auto& v) { return v[0] / v[1]; }},
      {"active_params",
       "r_a · N",
       {"activation_rate", "total_params"},
       [](auto& v) { return v[0] * v[1]; }},
      {"activation_rate",
       "N_a / N",
       {"active_params", "total_params"},
       [](auto& v) { return v[0] / v[1]; }},
      {"compute",
       "M · D",
       {"flops_per_token", "tokens_consumed"},
       [](auto& v) { return v[0] * v[1]; }},
      {"flops_per_token",
       "C / D",
       {"compute", "tokens_consumed"},
       [](auto& v) { return v[0] / v[1]; }},
      {"tokens_consumed",
       "C / M",
       {"compute", "flops_per_token"},
       [](auto& v) { return v[0] / v[1]; }},
      {"tokens_consumed",
       "D̂ · epochs",
       {"tokens_unique", "epochs"},
       [](auto& v) { return v[0] * v[1]; }},
      {"tokens_consumed",
       "iters · B · S",
       {"steps", "batch_seqs", "seq_len"},
       [](auto& v) { return v[0] * v[1] * v[2]; }},
      {"tokens_unique",
       "D / epochs",
       {"tokens_consumed", "epochs"},
       [](auto& v) { return v[0] / v[1]; }},
      {"epochs",
       "D / D̂",
       {"tokens_consumed", "tokens_unique"},
       [](auto& v) { return v[0] / v[1]; }},
      {"tokens_per_param",
       "D / N",
       {"tokens_consumed", "total_params"},
       [](auto& v) { return v[0] / v[1]; }},
  };
  return d;
}

int64_t as_int(const Cell& c) {
  return std::llround(c.value);
}

}  // namespace

RowView::RowView(const ClaimTable& table, int row_index, const TableSpec* spec)
    : table_(table), row_(row_index), spec_(spec) {
  Arch& a = shape_.arch;
  auto field = [&](const char* q, int64_t& out, bool required) {
    if (const Cell* c = printed(q))
      out = as_int(*c);
    else if (required)
      shape_.missing.emplace_back(q);
  };
  field("layers", a.layers, true);
  field("d_model", a.d_model, true);
  field("heads", a.heads, true);
  field("experts", a.experts, false);
  const bool moe = a.experts > 0;
  field("top_k", a.top_k, moe);
  field("d_expert", a.d_expert, moe);
  field("d_shared", a.d_shared, false);
  // A table without experts is dense: every layer is a dense layer. In a table of dense and MoE
  // rows, the MoE fields its spec shares are for the MoE rows; a dense row's own are checked by
  // RowChecker (a dense row that prints d_expert = 512 is a contradiction, not a dense model).
  if (moe) {
    field("dense_layers", a.dense_layers, true);
  } else {
    a.dense_layers = a.layers;
    const auto& row = table_.rows[size_t(row_)];
    if (!row.count("top_k")) a.top_k = 0;
    if (!row.count("d_expert")) a.d_expert = 0;
    if (!row.count("d_shared")) a.d_shared = 0;
  }
  field("d_ffn", a.d_ffn, !moe || a.dense_layers > 0);
  a.kv_heads = a.heads;
  field("kv_heads", a.kv_heads, false);
  if (const Cell* c = printed("head_dim"))
    a.head_dim = as_int(*c);
  else if (a.heads > 0 && a.d_model % a.heads == 0)
    a.head_dim = a.d_model / a.heads;  // MHA
  else if (a.heads > 0 && a.d_model > 0)  // why it cannot be derived, and where
    shape_.missing.emplace_back(fmt::format(
        "head_dim (row {}:{}: d_model {} is not a multiple of heads {}, so it is not d_model / "
        "heads)",
        table_.name, row_ + 1, a.d_model, a.heads));
  else
    shape_.missing.emplace_back("head_dim");
  if (const Cell* c = printed("seq_len")) a.seq_len = as_int(*c), shape_.has_seq_len = true;
  if (const Cell* c = printed("vocab")) a.vocab = as_int(*c), shape_.has_vocab = true;
}

const Cell* RowView::printed(const std::string& q) const {
  const auto& row = table_.rows[size_t(row_)];
  if (auto it = row.find(q); it != row.end()) return &it->second;
  if (spec_)
    if (auto it = spec_->shared.find(q); it != spec_->shared.end()) return &it->second;
  return nullptr;
}

std::optional<RowValue> RowView::value(const std::string& q,
                                       const std::set<std::string>& avoid) const {
  if (const Cell* c = printed(q)) {
    const auto& row = table_.rows[size_t(row_)];
    return RowValue{c->value, c->rel_half_width(), row.count(q) ? "published" : "shared", {}, {},
                    c->text};
  }
  std::optional<RowValue> best;
  for (const Derivation& d : derivations()) {
    if (q != d.quantity) continue;
    std::vector<double> in, bands;
    double band = 0;
    bool ok = true;
    for (const char* i : d.inputs) {
      const Cell* c = avoid.count(i) ? nullptr : printed(i);
      if (!c) {
        ok = false;
        break;
      }
      in.push_back(c->value);
      bands.push_back(c->rel_half_width());
      band += c->rel_half_width();
    }
    if (!ok) continue;
    if (best && band >= best->rel_band) continue;
    // Products and ratios of positive inputs are monotonic in each: the range is at a corner.
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (unsigned corner = 0; corner < (1u << in.size()); ++corner) {
      std::vector<double> x = in;
      for (size_t k = 0; k < x.size(); ++k)
        x[k] *= (corner >> k) & 1u ? 1 + bands[k] : 1 - bands[k];
      const double y = d.f(x);
      lo = std::min(lo, y), hi = std::max(hi, y);
    }
    best = RowValue{d.f(in), band, d.label, lo, hi, {}};
  }
  return best;
}

std::optional<RowValue> RowView::value_or_shape(const std::string& q) const {
  if (auto v = value(q)) return v;
  // A row without experts is dense (docs/audit.md): its E and K are 0, so that `where` on E or
  // K runs over a table of dense rows too (it stopped, "no such column").
  if ((q == "experts" || q == "top_k") && shape_.arch.experts == 0)
    return RowValue{0, 0, "dense row (no experts)", {}, {}, {}};
  if (!shape_.known()) return std::nullopt;
  const ParamCounts p = count_params(shape_.arch);
  if (q == "total_params")
    return RowValue{double(p.total_params), 0, "shape (router out)", {}, {}, {}};
  if (q == "active_params")
    return RowValue{double(p.active_params), 0, "shape (router out)", {}, {}, {}};
  if (q == "activation_rate")
    return RowValue{p.activation_rate(), 0, "shape (router out)", {}, {}, {}};
  if (q == "flops_per_token" && shape_.has_seq_len) {
    // In the FLOP reading the table claims (paper training unless its spec says otherwise): a
    // megatron table's M from its shape is megatron's, or equal M would compare two readings.
    const TableSpec dflt;
    const TableSpec& ts = spec_ ? *spec_ : dflt;
    if (ts.convention != Convention::paper && !shape_.has_vocab) return std::nullopt;
    const AttentionMask mask = ts.convention == Convention::exact      ? ts.mask
                               : ts.convention == Convention::megatron ? AttentionMask::causal
                                                                       : AttentionMask::full;
    const FlopsPerToken f = flops_per_token(shape_.arch, ts.convention, mask);
    const bool training = ts.flops == FlopsKind::training;
    return RowValue{training ? f.total : f.forward,
                    0,
                    fmt::format("shape ({} {})", convention_label(ts.convention, mask),
                                training ? "training" : "forward"),
                    {},
                    {},
                    {}};
  }
  return std::nullopt;
}

}  // namespace moeplan::audit
