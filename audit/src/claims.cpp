#include "moeplan/audit/claims.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/flops.hpp"
#include "moeplan/accounting/params.hpp"
#include "moeplan/audit/quantity.hpp"
#include "moeplan/audit/render.hpp"
#include "moeplan/audit/row_values.hpp"

namespace moeplan::audit {

namespace {

const ClaimTable& find_table(const std::vector<ClaimTable>& tables, const std::string& name,
                             const std::string& claim) {
  for (const ClaimTable& t : tables)
    if (t.name == name) return t;
  std::string known;
  for (const ClaimTable& t : tables) known += (known.empty() ? "" : ", ") + t.name;
  throw InputError(fmt::format("claim '{}' names table '{}', which is not loaded (tables: {})",
                               claim, name, known));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double rel_range(double lo, double hi) {
  return lo != 0 ? (hi - lo) / std::fabs(lo) : 0;
}

struct Valued {
  RowRef ref;
  RowValue value;
};

std::vector<Valued> values_of(const std::vector<RowRef>& rows, const AuditSpec& spec,
                              const std::string& q, const std::string& claim) {
  std::vector<Valued> out;
  for (const RowRef& r : rows) {
    const RowView view(*r.table, r.row - 1, spec.table(r.table->name));
    const auto v = view.value_or_shape(q);
    if (!v)
      throw InputError(fmt::format(
          "claim '{}' needs {} ({}) of row {}, {}, no shared value in the spec, and nothing to "
          "derive it from",
          claim, q, symbol(q), row_ref(r.table->name, r.row),
          r.table->has_column(q) ? "whose cell is empty" : "which has no such column"));
    out.push_back({r, *v});
  }
  return out;
}

std::string sources_note(const std::vector<Valued>& vals) {
  std::vector<std::string> seen;
  for (const Valued& v : vals)
    if (std::find(seen.begin(), seen.end(), v.value.source) == seen.end())
      seen.push_back(v.value.source);
  std::string s = "values: ";
  for (size_t i = 0; i < seen.size(); ++i) s += (i ? ", " : "") + seen[i];
  return s;
}

void fill_spread(QuantityVerdict& qv, const std::vector<Valued>& vals) {
  size_t lo = 0, hi = 0;
  for (size_t i = 1; i < vals.size(); ++i) {
    if (vals[i].value.value < vals[lo].value.value) lo = i;
    if (vals[i].value.value > vals[hi].value.value) hi = i;
  }
  qv.min = vals[lo].value.value;
  qv.max = vals[hi].value.value;
  qv.min_row = row_ref(vals[lo].ref.table->name, vals[lo].ref.row);
  qv.max_row = row_ref(vals[hi].ref.table->name, vals[hi].ref.row);
  qv.rel_range = rel_range(qv.min, qv.max);
}

// N and N_a recomputed from every row's shape (router out), beside the printed values: a
// warning when the shapes themselves break the claim.
void recomputed_note(QuantityVerdict& qv, const std::vector<RowRef>& rows, const AuditSpec& spec,
                     const std::optional<RowRef>& baseline, double tol, const std::string& claim,
                     std::vector<Finding>& findings) {
  std::vector<std::pair<RowRef, double>> vals;
  for (const RowRef& r : rows) {
    const RowView view(*r.table, r.row - 1, spec.table(r.table->name));
    if (!view.shape().known()) return;
    const ParamCounts p = count_params(view.shape().arch);
    vals.push_back({r, double(qv.quantity == "total_params" ? p.total_params : p.active_params)});
  }
  if (vals.empty()) return;
  double lo = vals[0].second, hi = lo, ref = 0;
  for (const auto& [r, v] : vals) {
    lo = std::min(lo, v), hi = std::max(hi, v);
    if (baseline && r.table == baseline->table && r.row == baseline->row) ref = v;
  }
  qv.note +=
      fmt::format("; recomputed from the shapes (router out): {:.0f} .. {:.0f}, range {:.2f}%", lo,
                  hi, 100 * rel_range(lo, hi));
  for (const auto& [r, v] : vals) {
    const double d = baseline ? (v - ref) / ref : 0;
    const bool breaks = baseline ? std::fabs(d) > tol : rel_range(lo, hi) > tol && v == hi;
    if (!breaks) continue;
    findings.push_back(Finding{
        Severity::warning, r.table->name, r.row, qv.quantity,
        baseline ? std::optional<double>(ref) : std::nullopt, v,
        baseline ? std::optional<double>(d) : std::nullopt, tol,
        fmt::format("claim '{}': recomputed from the shape, {} = {:.0f} "
                    "breaks it{}",
                    claim, symbol(qv.quantity), v,
                    baseline ? fmt::format(" ({:+.2f}% from the baseline)", 100 * d) : "")});
  }
}

}  // namespace

std::vector<size_t> outliers_to_remove(const std::vector<double>& values, double tol) {
  std::vector<size_t> kept(values.size()), removed;
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = i;
  auto range_ok = [&]() {
    double lo = values[kept[0]], hi = lo;
    for (size_t i : kept) lo = std::min(lo, values[i]), hi = std::max(hi, values[i]);
    return rel_range(lo, hi) <= tol;
  };
  while (kept.size() > 1 && !range_ok()) {
    std::vector<double> v;
    for (size_t i : kept) v.push_back(values[i]);
    const double m = median(v);
    size_t worst = 0;
    for (size_t k = 1; k < kept.size(); ++k)
      if (std::fabs(values[kept[k]] - m) > std::fabs(values[kept[worst]] - m)) worst = k;
    removed.push_back(kept[worst]);
    kept.erase(kept.begin() + long(worst));
  }
  return removed;
}

std::vector<RowRef> select_rows(const std::vector<ClaimTable>& tables, const AuditSpec& spec,
                                const ClaimSpec& claim) {
  std::vector<RowRef> rows;
  auto add_all = [&](const ClaimTable& t, int first, int last) {
    if (last > int(t.rows.size()))
      throw InputError(fmt::format("claim '{}' names row {} of table '{}', which has {} data rows",
                                   claim.name, last, t.name, t.rows.size()));
    for (int r = first; r <= last; ++r)  // selectors may overlap: each row counts once
      if (std::none_of(rows.begin(), rows.end(),
                       [&](const RowRef& x) { return x.table == &t && x.row == r; }))
        rows.push_back({&t, r});
  };
  if (claim.rows.empty()) {
    for (const ClaimTable& t : tables) add_all(t, 1, int(t.rows.size()));
  } else {
    for (const RowSelector& s : claim.rows) {
      const ClaimTable& t = find_table(tables, s.table, claim.name);
      if (s.first == 0)
        add_all(t, 1, int(t.rows.size()));
      else
        add_all(t, s.first, s.last);
    }
  }
  const double tol = claim.tolerance.value_or(spec.tolerance);
  for (const WhereClause& w : claim.where) {
    std::vector<RowRef> kept;
    const auto vals = values_of(rows, spec, w.quantity, claim.name);
    for (const Valued& v : vals) {
      const double x = v.value.value;
      bool keep = true;
      if (w.equals)
        keep = std::fabs(x - *w.equals) <= tol * std::fabs(*w.equals) + v.value.abs_band();
      if (w.lower) keep = keep && x >= *w.lower;
      if (w.upper) keep = keep && x <= *w.upper;
      if (keep) kept.push_back(v.ref);
    }
    rows = kept;
  }
  return rows;
}

std::vector<ClaimVerdict> evaluate_claims(const std::vector<ClaimTable>& tables,
                                          const AuditSpec& spec, std::vector<Finding>& findings) {
  std::vector<ClaimVerdict> out;
  for (const ClaimSpec& c : spec.claims) {
    ClaimVerdict cv;
    cv.name = c.name;
    const double tol = c.tolerance.value_or(spec.tolerance);
    std::vector<RowRef> rows = select_rows(tables, spec, c);
    std::optional<RowRef> baseline;
    if (c.baseline) {
      RowSelector sel = *c.baseline;
      if (!sel.label.empty()) {  // a row label: exactly one row of the loaded tables
        std::string all;
        int found = 0;
        for (const ClaimTable& t : tables)
          for (size_t i = 0; i < t.labels.size(); ++i) {
            all += fmt::format("{}{}", all.empty() ? "" : ", ", t.labels[i]);
            if (t.labels[i] == sel.label) sel = {t.name, int(i) + 1, int(i) + 1, ""}, ++found;
          }
        if (found != 1)
          throw InputError(
              fmt::format("claim '{}': baseline '{}' {}; name one row by its label or as table:row",
                          c.name, c.baseline->label,
                          found > 1 ? fmt::format("labels {} rows", found)
                                    : fmt::format("is no row's label ({})",
                                                  all.empty() ? "the tables have no label column"
                                                              : "labels: " + all)));
      }
      const ClaimTable& t = find_table(tables, sel.table, c.name);
      if (sel.first > int(t.rows.size()))
        throw InputError(
            fmt::format("claim '{}': baseline row {} of table '{}' does not exist ({} "
                        "data rows)",
                        c.name, sel.first, t.name, t.rows.size()));
      baseline = RowRef{&t, sel.first};
      // The baseline leads the group, whether the selection listed it or not.
      std::erase_if(rows, [&](const RowRef& r) {
        return r.table == baseline->table && r.row == baseline->row;
      });
      rows.insert(rows.begin(), *baseline);
    }
    if (rows.empty())
      throw InputError(fmt::format("claim '{}' selects no rows (check rows and where)", c.name));
    for (const RowRef& r : rows) cv.rows.push_back(row_ref(r.table->name, r.row));

    auto breaking_finding = [&](const Valued& v, const std::string& q, double expected,
                                const std::string& why) {
      findings.push_back(
          Finding{Severity::error, v.ref.table->name, v.ref.row, q, expected, v.value.value,
                  expected != 0 ? std::optional<double>((v.value.value - expected) / expected)
                                : std::nullopt,
                  tol, fmt::format("claim '{}': {}", c.name, why)});
    };

    std::vector<std::string> equal = c.equal;
    if (c.strict_reuse && std::find(equal.begin(), equal.end(), "tokens_unique") == equal.end())
      equal.push_back("tokens_unique");
    for (const std::string& q : equal) {
      const auto vals = values_of(rows, spec, q, c.name);
      QuantityVerdict qv;
      qv.quantity = q;
      qv.tolerance = tol;
      fill_spread(qv, vals);
      qv.note = sources_note(vals);
      if (baseline) {
        qv.kind = "equal_to_baseline";
        size_t bi = 0;
        for (size_t i = 0; i < vals.size(); ++i)
          if (vals[i].ref.table == baseline->table && vals[i].ref.row == baseline->row) bi = i;
        const double ref = vals[bi].value.value;
        for (const Valued& v : vals) {
          const double d = (v.value.value - ref) / ref;
          if (std::fabs(d) > tol) {
            qv.breaking.push_back(row_ref(v.ref.table->name, v.ref.row));
            breaking_finding(
                v, q, ref,
                fmt::format("{} = {} is {:+.2f}% from the baseline {}'s {} (tolerance {:.2f}%)",
                            symbol(q), sci(v.value.value), 100 * d, cv.rows[0], sci(ref),
                            100 * tol));
          }
        }
      } else {
        qv.kind = "equal";
        std::vector<double> xs;
        for (const Valued& v : vals) xs.push_back(v.value.value);
        const double m = median(xs);
        for (size_t i : outliers_to_remove(xs, tol)) {
          const Valued& v = vals[i];
          qv.breaking.push_back(row_ref(v.ref.table->name, v.ref.row));
          breaking_finding(v, q, m,
                           fmt::format("{} = {} is {:+.2f}% from the group's median {}; "
                                       "the group spans {:.2f}% > {:.2f}%",
                                       symbol(q), sci(v.value.value), 100 * (v.value.value - m) / m,
                                       sci(m), 100 * qv.rel_range, 100 * tol));
        }
      }
      if (q == "total_params" || q == "active_params")
        recomputed_note(qv, rows, spec, baseline, tol, c.name, findings);
      if (q == "compute" || q == "flops_per_token") {
        std::vector<std::string> convs;
        for (const RowRef& r : rows) {
          const TableSpec* ts = spec.table(r.table->name);
          const std::string l = convention_label(ts ? ts->convention : Convention::paper,
                                                 ts ? ts->mask : AttentionMask::full);
          if (std::find(convs.begin(), convs.end(), l) == convs.end()) convs.push_back(l);
        }
        std::string joined;
        for (const std::string& l : convs) joined += (joined.empty() ? "" : ", ") + l;
        qv.note += fmt::format("; FLOPs as each table claims them: {}", joined);
      }
      qv.holds = qv.breaking.empty();
      cv.holds = cv.holds && qv.holds;
      cv.quantities.push_back(qv);
    }
    for (const BoundClaim& b : c.bounds) {
      const auto vals = values_of(rows, spec, b.quantity, c.name);
      QuantityVerdict qv;
      qv.quantity = b.quantity;
      qv.kind = b.at_least && b.at_most ? "between" : b.at_least ? "at_least" : "at_most";
      qv.lower = b.at_least;
      qv.upper = b.at_most;
      qv.tolerance = 0;
      fill_spread(qv, vals);
      qv.note = sources_note(vals);
      for (const Valued& v : vals) {
        const double x = v.value.value;
        // A printed value may sit on the bound after rounding: allow its own half-unit.
        const double slack = v.value.abs_band();
        std::optional<double> broken;
        std::string why;
        if (b.at_least && x + slack < *b.at_least) {
          broken = *b.at_least;
          why = fmt::format("{} = {} is below the claimed at least {}", symbol(b.quantity), sci(x),
                            sci(*b.at_least));
        } else if (b.at_most && x - slack > *b.at_most) {
          broken = *b.at_most;
          why = fmt::format("{} = {} is above the claimed at most {}", symbol(b.quantity), sci(x),
                            sci(*b.at_most));
        }
        if (!broken) continue;
        qv.breaking.push_back(row_ref(v.ref.table->name, v.ref.row));
        breaking_finding(v, b.quantity, *broken, why);
      }
      qv.holds = qv.breaking.empty();
      cv.holds = cv.holds && qv.holds;
      cv.quantities.push_back(qv);
    }
    out.push_back(std::move(cv));
  }
  return out;
}

}  // namespace moeplan::audit
