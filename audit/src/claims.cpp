#include "moeplan/audit/claims.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

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

// Relative to a zero, any other value is infinitely far (0 .. 1024 is not "equal"), and a zero
// is 0 % from a zero.
double rel_range(double lo, double hi) {
  if (lo == 0) return hi == 0 ? 0 : std::numeric_limits<double>::infinity();
  return (hi - lo) / std::fabs(lo);
}

double rel_diff(double v, double ref) {
  if (ref == 0) return v == 0 ? 0 : std::copysign(std::numeric_limits<double>::infinity(), v);
  return (v - ref) / std::fabs(ref);
}

// A relative difference exactly at the tolerance holds: 2.8886e21 / 2.86e21 − 1 is 1 % on paper
// but 0.010000000000000009 in doubles, so the comparison allows 1e-9 of the tolerance.
bool within(double rel, double tol) {
  return std::fabs(rel) <= tol * (1 + 1e-9);
}

// A row's value as its table printed it (RowValue::printed_as), else 4 digits.
std::string as_printed(const RowValue& v, const std::string& q) {
  const std::string t = v.printed_as(q);
  return t.empty() ? sci(v.value) : t;
}

bool same_row(const RowRef& a, const RowRef& b) {
  return a.table == b.table && a.row == b.row;
}

// A number as a spec gives it, in its shortest exact form: 2.86e21, 2.86e12, 19.875, 8.44e-4.
std::string as_given(double v) {
  const double a = std::fabs(v);
  if (a == 0 || (a >= 1e-3 && a < 1e5)) return fmt::format("{}", v);
  std::string s;
  for (int digits = 0; digits <= 17; ++digits)
    if (s = fmt::format("{:.{}e}", v, digits); std::stod(s) == v) break;
  const size_t e = s.find('e');
  const int exponent = std::stoi(s.substr(e + 1));
  return fmt::format("{}e{}", s.substr(0, e), exponent);
}

std::string where_text(const std::vector<WhereClause>& where) {
  std::string s;
  for (const WhereClause& w : where) {
    s += s.empty() ? "where " : " and ";
    if (w.equals)
      s += fmt::format("{} = {}", w.quantity, as_given(*w.equals));
    else
      s += fmt::format("{} in [{}, {}]", w.quantity, as_given(*w.lower), as_given(*w.upper));
  }
  return s;
}

// The tables rows come from, in the order they first appear.
std::vector<const ClaimTable*> tables_of(const std::vector<RowRef>& rows) {
  std::vector<const ClaimTable*> out;
  for (const RowRef& r : rows)
    if (std::find(out.begin(), out.end(), r.table) == out.end()) out.push_back(r.table);
  return out;
}

// "dense:1-4,6 moe7b:3": rows grouped by table (in `order`), runs of rows as ranges.
std::string compact_rows(const std::vector<const ClaimTable*>& order,
                         const std::vector<RowRef>& rows) {
  std::string out;
  for (const ClaimTable* t : order) {
    std::vector<int> nums;
    for (const RowRef& r : rows)
      if (r.table == t) nums.push_back(r.row);
    if (nums.empty()) continue;
    std::sort(nums.begin(), nums.end());
    out += fmt::format("{}{}:", out.empty() ? "" : " ", t->name);
    for (size_t i = 0; i < nums.size();) {
      size_t j = i;
      while (j + 1 < nums.size() && nums[j + 1] == nums[j] + 1) ++j;
      out += fmt::format("{}{}", i ? "," : "", nums[i]);
      if (j > i) out += fmt::format("-{}", nums[j]);
      i = j + 1;
    }
  }
  return out;
}

// A claim on M or C (equal, a bound, or a where filter) reads one number per row: rows from
// tables that count FLOPs differently (paper vs megatron, training vs forward) are not
// comparable as printed, and converting them needs every row's shape. Refused, naming the tables.
void require_one_flops_reading(const std::vector<RowRef>& rows, const AuditSpec& spec,
                               const std::string& claim, const std::string& q,
                               const std::string& use) {
  if (q != "compute" && q != "flops_per_token") return;
  std::vector<std::string> readings;  // "table: reading", one per table
  std::vector<const ClaimTable*> seen;
  bool mixed = false;
  const TableSpec* first = rows.empty() ? nullptr : spec.table(rows.front().table->name);
  for (const RowRef& r : rows) {
    if (std::find(seen.begin(), seen.end(), r.table) != seen.end()) continue;
    seen.push_back(r.table);
    const TableSpec* ts = spec.table(r.table->name);
    mixed = mixed || !same_flops_reading(first, ts);
    readings.push_back(fmt::format("{}: {}", r.table->name, flops_reading_label(ts)));
  }
  if (!mixed) return;
  std::string list;
  for (const std::string& x : readings) list += (list.empty() ? "" : ", ") + x;
  throw InputError(fmt::format(
      "claim '{}' {} {} ({}) across tables that count FLOPs differently ({}); the same run's {} "
      "differs between these readings, so compare tables of one convention, or restate one "
      "table's values in the other's convention (`moeplan conventions` shows the terms)",
      claim, use, symbol(q), q, list, symbol(q)));
}

struct Selection {
  std::vector<RowRef> listed;  // by `rows`, before `where`
  std::vector<RowRef> kept;    // after `where`
};

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
    const double d = baseline ? rel_diff(v, ref) : 0;
    const bool breaks = baseline ? !within(d, tol) : !within(rel_range(lo, hi), tol) && v == hi;
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

// Which FLOP convention the rows' M is read under: as their tables state it, or paper, the
// default, for a table that states none (no spec entry, or no convention key).
std::string conventions_note(const std::vector<RowRef>& rows, const AuditSpec& spec) {
  std::vector<std::string> stated, assumed;  // labels; names of tables that state none
  auto add = [](std::vector<std::string>& v, const std::string& x) {
    if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
  };
  for (const RowRef& r : rows) {
    const TableSpec* ts = spec.table(r.table->name);
    if (ts && ts->convention_stated)
      add(stated, flops_reading_label(ts));
    else
      add(assumed, r.table->name);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (assumed.empty()) return "FLOPs as each table claims them: " + join(stated);
  if (stated.empty())
    return "FLOPs read as paper training, the default: no table states a convention";
  return fmt::format(
      "FLOPs as each table claims them: {}; paper training, the default, assumed for {} (no "
      "convention stated)",
      join(stated), join(assumed));
}

}  // namespace

std::vector<size_t> outliers_to_remove(const std::vector<double>& values, double tol) {
  // The largest group of values within the tolerance of one another is kept, the rest removed:
  // over the sorted values, every window [lo, hi] whose relative range is within tolerance; the
  // widest keeps the most. Removing greedily from the median blamed two rows of 1.0095, 1.0095,
  // 1.0192, 1.0192 against 1.0000 where dropping the 1.0000 alone suffices. Of windows keeping
  // as many, the one nearest the median (then the lowest) is kept.
  const size_t n = values.size();
  if (n < 2) return {};
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  const double m = median(values);
  size_t best_lo = 0, best_len = 0;
  double best_off = 0;
  for (size_t lo = 0, hi = 0; lo < n; ++lo) {
    if (hi < lo) hi = lo;
    while (hi + 1 < n && within(rel_range(values[order[lo]], values[order[hi + 1]]), tol)) ++hi;
    const size_t len = hi - lo + 1;
    const double mid = 0.5 * (values[order[lo]] + values[order[hi]]);
    const double off = std::fabs(mid - m);
    if (len > best_len || (len == best_len && off < best_off))
      best_lo = lo, best_len = len, best_off = off;
  }
  // The removed, farthest from the median first.
  std::vector<size_t> removed;
  for (size_t k = 0; k < n; ++k)
    if (k < best_lo || k >= best_lo + best_len) removed.push_back(order[k]);
  std::stable_sort(removed.begin(), removed.end(), [&](size_t a, size_t b) {
    return std::fabs(values[a] - m) > std::fabs(values[b] - m);
  });
  return removed;
}

namespace {

Selection select(const std::vector<ClaimTable>& tables, const AuditSpec& spec,
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
  Selection sel{rows, rows};
  for (const WhereClause& w : claim.where) {
    require_one_flops_reading(sel.kept, spec, claim.name, w.quantity, "filters rows by");
    std::vector<RowRef> kept;
    const auto vals = values_of(sel.kept, spec, w.quantity, claim.name);
    for (const Valued& v : vals) {
      const double x = v.value.value;
      bool keep = true;
      if (w.equals) {
        // Within the range the printed value allows (a derived value's is lopsided), or within
        // the tolerance of it.
        const double lo = v.value.low(), hi = v.value.high(), e = *w.equals;
        const double off = e < lo ? lo - e : e > hi ? e - hi : 0;
        keep = off <= 0 || (e != 0 && within(off / std::fabs(e), tol));
      }
      if (w.lower) keep = keep && x >= *w.lower;
      if (w.upper) keep = keep && x <= *w.upper;
      if (keep) kept.push_back(v.ref);
    }
    sel.kept = kept;
  }
  return sel;
}

// "8 of 8 moe7b rows, 1 of 6 dense rows; where compute = 2.86e21 left out 5: dense:1-4,6", tables
// in the order the claim lists them.
std::string coverage(const Selection& sel, const std::vector<RowRef>& rows,
                     const std::vector<WhereClause>& where, const std::vector<RowRef>& left_out) {
  std::vector<RowRef> all = sel.listed;
  all.insert(all.end(), rows.begin(), rows.end());  // a baseline the listing does not name
  const auto order = tables_of(all);
  std::string s;
  for (const ClaimTable* t : order) {
    const auto n =
        std::count_if(rows.begin(), rows.end(), [&](const RowRef& r) { return r.table == t; });
    if (n > 0)
      s += fmt::format("{}{} of {} {} rows", s.empty() ? "" : ", ", n, t->rows.size(), t->name);
  }
  if (!where.empty())
    s += fmt::format("; {} left out {}", where_text(where),
                     left_out.empty()
                         ? "none"
                         : fmt::format("{}: {}", left_out.size(), compact_rows(order, left_out)));
  return s;
}

}  // namespace

std::vector<RowRef> select_rows(const std::vector<ClaimTable>& tables, const AuditSpec& spec,
                                const ClaimSpec& claim) {
  return select(tables, spec, claim).kept;
}

std::vector<ClaimVerdict> evaluate_claims(const std::vector<ClaimTable>& tables,
                                          const AuditSpec& spec, std::vector<Finding>& findings) {
  std::vector<ClaimVerdict> out;
  for (const ClaimSpec& c : spec.claims) {
    ClaimVerdict cv;
    cv.name = c.name;
    const double tol = c.tolerance.value_or(spec.tolerance);
    // A where on a quantity the claim tests would leave out the rows that break it (a row of
    // 3 % more C is not kept by "where C = X", so "equal C" holds over the rest): refused.
    for (const WhereClause& w : c.where) {
      const std::string& q = w.quantity;
      const bool tested = std::find(c.equal.begin(), c.equal.end(), q) != c.equal.end() ||
                          std::any_of(c.bounds.begin(), c.bounds.end(),
                                      [&](const BoundClaim& b) { return b.quantity == q; }) ||
                          (c.strict_reuse && q == "tokens_unique");
      if (tested)
        throw InputError(fmt::format(
            "claim '{}' selects its rows by {} ({}) and tests {} too: a row that breaks the "
            "claim would be left out instead of failing it; name the rows instead (a spec's "
            "rows = [\"table:2-5\"], or --rows), or leave {} out of the claim",
            c.name, symbol(q), where_text({w}), symbol(q), symbol(q)));
    }
    const Selection picked = select(tables, spec, c);
    std::vector<RowRef> rows = picked.kept;
    std::optional<RowRef> baseline;
    if (c.baseline) {
      RowSelector sel = *c.baseline;
      // The rows labelled as the baseline is written; a table:row baseline may be a label too.
      std::string all;
      std::vector<RowSelector> labelled;
      for (const ClaimTable& t : tables)
        for (size_t i = 0; i < t.labels.size(); ++i) {
          all += fmt::format("{}{}", all.empty() ? "" : ", ", t.labels[i]);
          if (t.labels[i] == c.baseline->label)
            labelled.push_back({t.name, int(i) + 1, int(i) + 1, ""});
        }
      const bool names_a_row =
          !sel.table.empty() && std::any_of(tables.begin(), tables.end(), [&](const ClaimTable& t) {
            return t.name == sel.table && sel.first <= int(t.rows.size());
          });
      if (!sel.table.empty() && !labelled.empty()) {
        if (!names_a_row && labelled.size() == 1) {
          sel = labelled[0];  // "moe:2" is no table:row here, but one row's label
        } else if (names_a_row &&
                   std::any_of(labelled.begin(), labelled.end(), [&](const RowSelector& l) {
                     return l.table != sel.table || l.first != sel.first;
                   })) {
          throw InputError(fmt::format(
              "claim '{}': baseline '{}' is row {} of table '{}' and the label of {}; rename the "
              "label or name the baseline by the other",
              c.name, c.baseline->label, sel.first, sel.table,
              row_ref(labelled[0].table, labelled[0].first)));
        }
      }
      if (sel.table.empty()) {  // a row label: exactly one row of the loaded tables
        if (labelled.size() != 1) {
          std::string which;
          for (const RowSelector& l : labelled)
            which += fmt::format("{}{}", which.empty() ? "" : ", ", row_ref(l.table, l.first));
          throw InputError(fmt::format(
              "claim '{}': baseline '{}' {}; name one row by its label or as table:row", c.name,
              c.baseline->label,
              !labelled.empty() ? fmt::format("labels {} rows ({})", labelled.size(), which)
                                : fmt::format("is no row's label ({})",
                                              all.empty() ? "the tables have no label column"
                                                          : "labels: " + all)));
        }
        sel = labelled[0];
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
    // A claim over no rows, or over its baseline alone, holds whatever the tables say: refused.
    const size_t others = rows.size() - (baseline ? 1 : 0);
    const bool compares = !c.equal.empty() || c.strict_reuse;
    if (others == 0 || (!baseline && compares && rows.size() < 2)) {
      const std::string listed = fmt::format("{} row{} listed", picked.listed.size(),
                                             picked.listed.size() == 1 ? "" : "s");
      const std::string kept =
          c.where.empty() ? ""
                          : fmt::format(", {} kept by {}", picked.kept.size(), where_text(c.where));
      if (baseline)
        throw InputError(fmt::format(
            "claim '{}' has no row besides its baseline {} to compare with it ({}{}); check "
            "rows and where",
            c.name, row_ref(baseline->table->name, baseline->row), listed, kept));
      throw InputError(fmt::format("claim '{}' selects {} ({}{}); check rows and where", c.name,
                                   rows.empty() ? "no rows" : "one row, nothing to compare it with",
                                   listed, kept));
    }
    for (const RowRef& r : rows) cv.rows.push_back(row_ref(r.table->name, r.row));
    std::vector<RowRef> left_out;
    for (const RowRef& r : picked.listed)
      if (std::none_of(rows.begin(), rows.end(), [&](const RowRef& k) { return same_row(k, r); }))
        left_out.push_back(r);
    for (const RowRef& r : left_out) cv.left_out.push_back(row_ref(r.table->name, r.row));
    cv.coverage = coverage(picked, rows, c.where, left_out);

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
      require_one_flops_reading(rows, spec, c.name, q, "compares");
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
        qv.deviation = 0.0;
        qv.deviation_row = cv.rows[0];
        for (const Valued& v : vals) {
          const double d = rel_diff(v.value.value, ref);
          if (std::fabs(d) > std::fabs(*qv.deviation)) {
            qv.deviation = d;
            qv.deviation_row = row_ref(v.ref.table->name, v.ref.row);
          }
          if (!within(d, tol)) {
            qv.breaking.push_back(row_ref(v.ref.table->name, v.ref.row));
            breaking_finding(
                v, q, ref,
                fmt::format("{} = {} is {} from the baseline {}'s {} (tolerance {:.2f}%)",
                            symbol(q), as_printed(v.value, q), pct_against(d, tol), cv.rows[0],
                            as_printed(vals[bi].value, q), 100 * tol));
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
          breaking_finding(
              v, q, m,
              fmt::format("{} = {} is {:+.2f}% from the group's median {}; "
                          "the group spans {} > {:.2f}%",
                          symbol(q), as_printed(v.value, q), 100 * (v.value.value - m) / m, sci(m),
                          pct_against(qv.rel_range, tol).substr(1), 100 * tol));
        }
      }
      if (q == "total_params" || q == "active_params")
        recomputed_note(qv, rows, spec, baseline, tol, c.name, findings);
      if (q == "compute" || q == "flops_per_token") qv.note += "; " + conventions_note(rows, spec);
      qv.holds = qv.breaking.empty();
      cv.holds = cv.holds && qv.holds;
      cv.quantities.push_back(qv);
    }
    for (const BoundClaim& b : c.bounds) {
      require_one_flops_reading(rows, spec, c.name, b.quantity, "bounds");
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
        // A printed value may sit on the bound after rounding: allow its own half-unit, and a
        // derived one the exact range its inputs' rounding allows.
        std::optional<double> broken;
        std::string why;
        // A `between` names its interval: beside an `at_most` on the same quantity its line was
        // that one's, word for word.
        const std::string interval = b.at_least && b.at_most
                                         ? fmt::format(" of the claimed [{}, {}]",
                                                       as_given(*b.at_least), as_given(*b.at_most))
                                         : "";
        if (b.at_least && v.value.high() < *b.at_least) {
          broken = *b.at_least;
          why = interval.empty()
                    ? fmt::format("{} = {} is below the claimed at least {}", symbol(b.quantity),
                                  as_printed(v.value, b.quantity), as_given(*b.at_least))
                    : fmt::format("{} = {} is below the lower end{}", symbol(b.quantity),
                                  as_printed(v.value, b.quantity), interval);
        } else if (b.at_most && v.value.low() > *b.at_most) {
          broken = *b.at_most;
          why = interval.empty()
                    ? fmt::format("{} = {} is above the claimed at most {}", symbol(b.quantity),
                                  as_printed(v.value, b.quantity), as_given(*b.at_most))
                    : fmt::format("{} = {} is above the upper end{}", symbol(b.quantity),
                                  as_printed(v.value, b.quantity), interval);
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
