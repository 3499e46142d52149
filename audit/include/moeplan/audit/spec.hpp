#pragma once
// The claim spec (TOML, schema = 1): what each table's rows share, what convention its M claims,
// and the claims (groups of rows claiming equal quantities or bounds). Format: docs/audit.md.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/accounting/flops.hpp"
#include "moeplan/audit/table.hpp"

namespace moeplan::audit {

enum class FlopsKind { training, forward };  // is a table's M forward+backward or forward only

struct TableSpec {
  std::string name;
  std::string file;  // as written; relative to the spec's folder ("" = via --claims)
  std::map<std::string, Cell> shared;  // quantity -> value every row has unless it has a column
  Convention convention = Convention::paper;  // the convention the table's M claims
  bool convention_stated = false;             // false: paper is the default, assumed
  AttentionMask mask = AttentionMask::full;   // for convention = exact
  FlopsKind flops = FlopsKind::training;
  std::set<std::string> ignore;  // headers to skip
  std::optional<double> tolerance;
};

struct RowSelector {
  std::string table;
  int first = 0, last = 0;  // 1-based inclusive; 0,0 = every row
  // A baseline as written. With table empty: a row label, resolved with the tables; with a
  // table: the table:row text, which must not also be another row's label.
  std::string label;
};

struct WhereClause {  // keep rows whose quantity equals a value (within tolerance) or lies in [lo,
                      // hi]
  std::string quantity;
  std::optional<double> equals;
  std::optional<double> lower, upper;
};

struct BoundClaim {
  std::string quantity;
  std::optional<double> at_least, at_most;  // both set = between
};

struct ClaimSpec {
  std::string name;
  std::vector<RowSelector> rows;  // empty = every row of every table
  std::vector<WhereClause> where;
  std::vector<std::string> equal;  // quantities claimed equal across the rows
  std::vector<BoundClaim> bounds;
  std::optional<RowSelector> baseline;  // one row: equal quantities are measured against it
  bool strict_reuse = false;            // tokens_unique of every row == the baseline's
  std::optional<double> tolerance;
};

struct AuditSpec {
  std::string source;       // file name, for messages
  double tolerance = 0.01;  // relative; published values carry 3 significant digits
  std::vector<TableSpec> tables;
  std::vector<ClaimSpec> claims;
  const TableSpec* table(std::string_view name) const;
};

// M and C compare only between tables that claim them in one convention (and mask), both
// training or both forward: the same run's M is 3x apart between a training and a forward table,
// and megatron counts the LM head that paper leaves out. A table without a spec entry (nullptr)
// reads as paper training.
bool same_flops_reading(const TableSpec* a, const TableSpec* b);
// "paper training", "megatron forward", "exact/causal training".
std::string flops_reading_label(const TableSpec* t);

// Parse spec text (TOML). Throws InputError naming the key and what would be valid.
AuditSpec parse_spec(std::string_view toml_text, std::string source);

// A relative tolerance as a fraction ("0.01") or a percentage ("1%" = 0.01), in (0, 1). Throws
// InputError "<what> <text> ..." naming the valid forms otherwise.
double parse_tolerance(std::string_view text, std::string_view what);

// "moe7b:3", "moe7b:2-5", "moe7b:*" (or "moe7b").
RowSelector parse_row_selector(std::string_view text, std::string_view where);
// A claim's baseline: one row as "table:row", or a row label (no ':'), which evaluate_claims
// resolves against the loaded tables. Throws InputError naming `where` for a range or a table.
RowSelector parse_baseline(std::string_view text, std::string_view where);

}  // namespace moeplan::audit
