#include "moeplan/audit/spec.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <toml.hpp>

#include "moeplan/accounting/error.hpp"
#include "moeplan/accounting/units.hpp"
#include "moeplan/audit/quantity.hpp"
#include "moeplan/sweeps/toml_error.hpp"

namespace moeplan::audit {

namespace {

// Sorted tables: deterministic order of [tables.*] and of keys in messages.
using Value = toml::basic_value<toml::discard_comments, std::map, std::vector>;

[[noreturn]] void bad(const AuditSpec& s, const std::string& what) {
  throw InputError(fmt::format("{}: {}", s.source, what));
}

double number(const AuditSpec& s, const Value& v, const std::string& key) {
  if (v.is_integer()) return double(v.as_integer());
  // TOML spells nan and inf; a NaN bound compares false both ways, so a claim on it would hold
  // for every row.
  if (v.is_floating() && !std::isfinite(v.as_floating()))
    bad(s, fmt::format("{} = {} must be a finite number (e.g. 2048, 2.86e21 or \"65B\")", key,
                       v.as_floating()));
  if (v.is_floating()) return v.as_floating();
  if (v.is_string()) return parse_quantity(v.as_string().str, fmt::format("{}: {}", s.source, key));
  bad(s, fmt::format("{} must be a number (e.g. 2048, 2.86e21 or \"65B\")", key));
}

// A tolerance as a number (0.01) or a string ("0.01", "1%"), in (0, 1), as --tolerance takes it.
double tolerance_value(const AuditSpec& s, const Value& v, const std::string& key) {
  const std::string what = fmt::format("{}: {} =", s.source, key);
  if (v.is_string()) return parse_tolerance(v.as_string().str, what);
  if (!v.is_integer() && !(v.is_floating() && std::isfinite(v.as_floating())))
    bad(s, fmt::format("{}{} must be a fraction in (0, 1) such as 0.01, or a percentage such as "
                       "\"1%\"",
                       key, v.is_floating() ? fmt::format(" = {}", v.as_floating()) : ""));
  return parse_tolerance(fmt::format("{}", number(s, v, key)), what);
}

Cell cell(const AuditSpec& s, const Value& v, const std::string& key) {
  if (v.is_string()) return parse_cell(v.as_string().str, fmt::format("{}: {}", s.source, key));
  Cell c;
  c.value = number(s, v, key);  // its sign is checked by check_quantity_value
  c.text = v.is_integer() ? std::to_string(v.as_integer()) : fmt::format("{}", c.value);
  return c;  // a number written into the spec is taken as exact
}

std::string string_of(const AuditSpec& s, const Value& v, const std::string& key) {
  if (!v.is_string()) bad(s, fmt::format("{} must be a string", key));
  return v.as_string().str;
}

// A quantity named by its code name or its paper header ("N", "D_hat", "ra_pct"): the code name.
std::string quantity_name(const std::string& q) {
  const auto m = column_meaning(q);
  return m ? m->quantity : q;
}
// What a number given under that name is multiplied by to be in code units: ra_pct = 20 is
// r_a = 0.2, as in a table's ra_pct column.
double quantity_scale(const std::string& q) {
  const auto m = column_meaning(q);
  return m ? m->scale : 1.0;
}

void require_quantity(const AuditSpec& s, const std::string& q, const std::string& key) {
  if (!is_known_quantity(q))
    bad(s, fmt::format("{} names '{}', which is not a quantity moeplan knows (e.g. total_params, "
                       "active_params, compute, tokens_unique, epochs, tokens_per_param)",
                       key, q));
}

void check_keys(const AuditSpec& s, const Value& table, const std::string& where,
                std::initializer_list<std::string_view> allowed) {
  for (const auto& [k, v] : table.as_table()) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || k == a;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
      bad(s, fmt::format("{}: unknown key '{}' (valid: {})", where, k, list));
    }
  }
}

TableSpec parse_table(const AuditSpec& s, const std::string& name, const Value& t) {
  const std::string where = fmt::format("[tables.{}]", name);
  if (!t.is_table()) bad(s, fmt::format("{} must be a table", where));
  check_keys(s, t, where, {"file", "shared", "convention", "flops", "ignore", "tolerance"});
  TableSpec ts;
  ts.name = name;
  if (t.contains("file")) ts.file = string_of(s, t.at("file"), where + ".file");
  if (t.contains("convention")) {
    const std::string c = string_of(s, t.at("convention"), where + ".convention");
    const size_t slash = c.find('/');
    const auto conv = parse_convention(c.substr(0, slash));
    std::optional<AttentionMask> mask = AttentionMask::full;
    if (slash != std::string::npos) mask = parse_attention_mask(c.substr(slash + 1));
    if (!conv || !mask)
      bad(s, fmt::format("{}.convention = '{}' (valid: paper, exact/full, exact/causal, megatron)",
                         where, c));
    ts.convention = *conv;
    ts.mask = *mask;
    ts.convention_stated = true;
  }
  if (t.contains("flops")) {
    const std::string f = string_of(s, t.at("flops"), where + ".flops");
    if (f == "training")
      ts.flops = FlopsKind::training;
    else if (f == "forward")
      ts.flops = FlopsKind::forward;
    else
      bad(s, fmt::format("{}.flops = '{}' (valid: training, forward)", where, f));
  }
  if (t.contains("ignore")) {
    if (!t.at("ignore").is_array()) bad(s, where + ".ignore must be an array of column headers");
    for (const Value& h : t.at("ignore").as_array())
      ts.ignore.insert(string_of(s, h, where + ".ignore"));
  }
  if (t.contains("tolerance"))
    ts.tolerance = tolerance_value(s, t.at("tolerance"), where + ".tolerance");
  if (t.contains("shared")) {
    const Value& sh = t.at("shared");
    if (!sh.is_table()) bad(s, where + ".shared must be a table of quantity = value");
    std::map<std::string, std::string> given_as;  // code name -> the key that gave it
    for (const auto& [given, v] : sh.as_table()) {
      // Paper headers as in a CSV column, `equal` or `where`: D_hat = 68e9, ra_pct = 20.
      const std::string k = quantity_name(given);
      require_quantity(s, k, where + ".shared");
      const std::string key = fmt::format("{}.shared.{}", where, given);
      if (const auto it = given_as.find(k); it != given_as.end())
        bad(s,
            fmt::format("{} and {}.shared.{} both give {}; keep one", key, where, it->second, k));
      given_as[k] = given;
      Cell c = cell(s, v, key);
      const double scale = quantity_scale(given);
      c.value *= scale;
      c.half_width *= scale;
      check_quantity_value(k, c.value, v.is_string() ? "\"" + c.text + "\"" : c.text,
                           fmt::format("{}: {}", s.source, key));
      ts.shared[k] = c;
    }
  }
  return ts;
}

std::vector<std::string> string_list(const AuditSpec& s, const Value& v, const std::string& key) {
  std::vector<std::string> out;
  if (v.is_string()) return {v.as_string().str};
  if (!v.is_array()) bad(s, fmt::format("{} must be a string or an array of strings", key));
  for (const Value& e : v.as_array()) out.push_back(string_of(s, e, key));
  return out;
}

ClaimSpec parse_claim(const AuditSpec& s, const Value& c, size_t index) {
  if (!c.is_table()) bad(s, fmt::format("claims[{}] must be a table", index + 1));
  ClaimSpec cs;
  cs.name = c.contains("name") ? string_of(s, c.at("name"), "claims.name")
                               : fmt::format("claim {}", index + 1);
  const std::string where = fmt::format("claim '{}'", cs.name);
  check_keys(s, c, where,
             {"name", "rows", "where", "equal", "at_least", "at_most", "between", "baseline",
              "strict_reuse", "tolerance"});
  if (c.contains("rows")) {
    const auto sel = string_list(s, c.at("rows"), where + ".rows");
    if (!(sel.size() == 1 && sel[0] == "all"))
      for (const std::string& r : sel) cs.rows.push_back(parse_row_selector(r, where + ".rows"));
  }
  if (c.contains("where")) {
    if (!c.at("where").is_table()) bad(s, where + ".where must be a table of quantity = value");
    for (const auto& [given, v] : c.at("where").as_table()) {
      const std::string k = quantity_name(given);
      require_quantity(s, k, where + ".where");
      WhereClause w{k, {}, {}, {}};
      const double scale = quantity_scale(given);
      if (v.is_array()) {
        if (v.as_array().size() != 2)
          bad(s, fmt::format("{}.where.{} must be [low, high]", where, k));
        w.lower = scale * number(s, v.as_array()[0], where + ".where." + k);
        w.upper = scale * number(s, v.as_array()[1], where + ".where." + k);
        if (*w.lower > *w.upper)
          bad(s, fmt::format("{}.where.{} = [{}, {}]: the low bound is above the high one; "
                             "write [low, high]",
                             where, k, *w.lower, *w.upper));
      } else {
        w.equals = scale * number(s, v, where + ".where." + k);
      }
      cs.where.push_back(w);
    }
  }
  if (c.contains("equal")) {
    const std::vector<std::string> given = string_list(s, c.at("equal"), where + ".equal");
    for (size_t i = 0; i < given.size(); ++i) {
      const std::string q = quantity_name(given[i]);
      require_quantity(s, q, where + ".equal");
      // "N" and "total_params" are one quantity: listed twice it would be tested twice.
      const auto seen = std::find(cs.equal.begin(), cs.equal.end(), q);
      if (seen != cs.equal.end())
        bad(s, fmt::format("{}.equal names {} twice ('{}' and '{}'); give each quantity once",
                           where, q, given[size_t(seen - cs.equal.begin())], given[i]));
      cs.equal.push_back(q);
    }
  }
  auto bounds = [&](const char* key, bool lower, bool upper) {
    if (!c.contains(key)) return;
    const std::string k = fmt::format("{}.{}", where, key);
    if (!c.at(key).is_table()) bad(s, fmt::format("{} must be a table, e.g. {{ epochs = 2 }}", k));
    for (const auto& [given, v] : c.at(key).as_table()) {
      const std::string q = quantity_name(given);
      require_quantity(s, q, k);
      BoundClaim b{q, {}, {}};
      const double scale = quantity_scale(given);
      if (lower && upper) {
        if (!v.is_array() || v.as_array().size() != 2)
          bad(s, fmt::format("{}.{} must be [low, high]", k, q));
        b.at_least = scale * number(s, v.as_array()[0], k + "." + q);
        b.at_most = scale * number(s, v.as_array()[1], k + "." + q);
        if (*b.at_least > *b.at_most)
          bad(s, fmt::format("{}.{} = [{}, {}]: the low bound is above the high one; write "
                             "[low, high]",
                             k, q, *b.at_least, *b.at_most));
      } else if (lower) {
        b.at_least = scale * number(s, v, k + "." + q);
      } else {
        b.at_most = scale * number(s, v, k + "." + q);
      }
      cs.bounds.push_back(b);
    }
  };
  bounds("at_least", true, false);
  bounds("at_most", false, true);
  bounds("between", true, true);
  if (c.contains("baseline")) {
    cs.baseline = parse_baseline(string_of(s, c.at("baseline"), where + ".baseline"),
                                 fmt::format("{}: {}.baseline", s.source, where));
  }
  if (c.contains("strict_reuse")) {
    if (!c.at("strict_reuse").is_boolean()) bad(s, where + ".strict_reuse must be true or false");
    cs.strict_reuse = c.at("strict_reuse").as_boolean();
    if (cs.strict_reuse && !cs.baseline)
      bad(s, fmt::format("{}: strict_reuse needs baseline = \"table:row\" (the dense run)", where));
  }
  if (c.contains("tolerance"))
    cs.tolerance = tolerance_value(s, c.at("tolerance"), where + ".tolerance");
  if (cs.equal.empty() && cs.bounds.empty() && !cs.strict_reuse)
    bad(s, fmt::format("{} claims nothing: give equal = [...], at_least/at_most/between = {{...}} "
                       "or strict_reuse = true",
                       where));
  return cs;
}

}  // namespace

bool same_flops_reading(const TableSpec* a, const TableSpec* b) {
  const TableSpec dflt;
  const TableSpec& x = a ? *a : dflt;
  const TableSpec& y = b ? *b : dflt;
  // The mask changes M only under exact: paper and megatron fix their own attention term.
  return x.convention == y.convention && x.flops == y.flops &&
         (x.convention != Convention::exact || x.mask == y.mask);
}

std::string flops_reading_label(const TableSpec* t) {
  const TableSpec dflt;
  const TableSpec& x = t ? *t : dflt;
  return fmt::format("{} {}", convention_label(x.convention, x.mask),
                     x.flops == FlopsKind::training ? "training" : "forward");
}

const TableSpec* AuditSpec::table(std::string_view name) const {
  for (const TableSpec& t : tables)
    if (t.name == name) return &t;
  return nullptr;
}

double parse_tolerance(std::string_view text, std::string_view what) {
  double v = 0;
  try {
    v = parse_quantity_or_percent(text, what);
  } catch (const InputError&) {
    throw InputError(
        fmt::format("{} {}: not a tolerance; give a fraction in (0, 1) such as 0.01, "
                    "or a percentage such as 1%",
                    what, text));
  }
  if (!(v > 0 && v < 1))
    throw InputError(
        fmt::format("{} {} is out of range: give a fraction in (0, 1) such as 0.01, "
                    "or a percentage in (0%, 100%) such as 1%",
                    what, text));
  return v;
}

RowSelector parse_baseline(std::string_view text, std::string_view where) {
  // A row label, resolved with the tables, unless the text reads as one table:row. A label may
  // hold a colon ("moe:k2"); one that reads as table:row too is checked against the row it
  // names when the tables are read (claims.cpp), so that "t:2" never picks one of two rows
  // silently.
  RowSelector r;
  try {
    r = parse_row_selector(text, where);
  } catch (const InputError&) {
    return RowSelector{"", 0, 0, std::string(text)};
  }
  if (text.find(':') == std::string_view::npos) return RowSelector{"", 0, 0, std::string(text)};
  if (r.first == 0 || r.first != r.last)
    throw InputError(
        fmt::format("{} = '{}' must name one row, e.g. \"dense:5\" or a row label", where, text));
  r.label = std::string(text);
  return r;
}

RowSelector parse_row_selector(std::string_view text, std::string_view where) {
  RowSelector r;
  const size_t colon = text.find(':');
  r.table = std::string(text.substr(0, colon));
  auto fail = [&]() {
    throw InputError(
        fmt::format("{}: '{}' is not a row reference (write table:3, table:2-5 or "
                    "table:*)",
                    where, text));
  };
  if (r.table.empty()) fail();
  if (colon == std::string_view::npos) return r;
  const std::string rest(text.substr(colon + 1));
  if (rest == "*") return r;
  try {
    size_t used = 0;
    r.first = std::stoi(rest, &used);
    r.last = r.first;
    if (used < rest.size()) {
      if (rest[used] != '-') fail();
      size_t used2 = 0;
      r.last = std::stoi(rest.substr(used + 1), &used2);
      if (used + 1 + used2 != rest.size()) fail();
    }
  } catch (const std::logic_error&) {
    fail();
  }
  if (r.first < 1 || r.last < r.first) fail();
  return r;
}

AuditSpec parse_spec(std::string_view text, std::string source) {
  AuditSpec s;
  s.source = std::move(source);
  Value root;
  try {
    std::istringstream in{std::string(text)};
    root = toml::parse<toml::discard_comments, std::map, std::vector>(in, s.source);
  } catch (const std::exception& e) {
    bad(s, fmt::format("not valid TOML: {}", toml_error_one_line(e.what())));
  }
  // A bound of 1e-400 read as 0, or 99999999999999999999 as 2^63 - 1, held every claim on it.
  refuse_out_of_range_toml_numbers(std::string(text), s.source);
  check_keys(s, root, "top level", {"schema", "tolerance", "tables", "claims"});
  if (!root.contains("schema") || !root.at("schema").is_integer() ||
      root.at("schema").as_integer() != 1)
    bad(s, "schema = 1 is required (the only spec schema this moeplan reads)");
  if (root.contains("tolerance"))
    s.tolerance = tolerance_value(s, root.at("tolerance"), "tolerance");
  if (!(s.tolerance > 0 && s.tolerance < 1))
    bad(s,
        fmt::format("tolerance = {} must be a relative value in (0, 1), e.g. 0.01", s.tolerance));
  if (root.contains("tables")) {
    if (!root.at("tables").is_table()) bad(s, "[tables] must be a table of [tables.NAME]");
    for (const auto& [name, t] : root.at("tables").as_table())
      s.tables.push_back(parse_table(s, name, t));
  }
  if (root.contains("claims")) {
    if (!root.at("claims").is_array()) bad(s, "claims must be an array of [[claims]] tables");
    const auto& arr = root.at("claims").as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      ClaimSpec c = parse_claim(s, arr[i], i);
      // The report and its JSON tell claims apart by name: two of one name read as one claim
      // that both holds and fails.
      if (c.name.find_first_not_of(' ') == std::string::npos)
        bad(s, fmt::format("claims[{}] name = '{}' is empty; give the claim a name, e.g. name = "
                           "\"equal N and C\"",
                           i + 1, c.name));
      for (size_t j = 0; j < s.claims.size(); ++j)
        if (s.claims[j].name == c.name)
          bad(s, fmt::format("claims[{}] name = '{}' is claims[{}]'s name too; give each claim "
                             "its own name",
                             i + 1, c.name, j + 1));
      s.claims.push_back(std::move(c));
    }
  }
  return s;
}

}  // namespace moeplan::audit
