#include "toml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/escape.hpp"
#include "moeplan/sweeps/toml_error.hpp"

namespace moeplan {

std::string toml_error_one_line(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace moeplan

namespace moeplan::detail {
namespace {

// A value's text as written in the file ("" where toml11 kept no location).
std::string source_text(const toml::value& v) {
  const toml::source_location loc = v.location();
  const std::string& line = loc.line_str();
  return loc.column() >= 1 && loc.column() - 1 < line.size()
             ? line.substr(loc.column() - 1, loc.region())
             : std::string();
}

// toml11 3.7 reads a decimal integer past 64 bits as the nearest int64 limit, silently: seed =
// 99999999999999999999 became 9223372036854775807. A limit whose text is not the limit itself
// is such an overflow.
void refuse_out_of_range_numbers(const toml::value& v, const std::string& origin,
                                 const std::string& key) {
  if (v.is_table()) {
    for (const auto& [k, e] : v.as_table())
      refuse_out_of_range_numbers(e, origin, key.empty() ? k : key + "." + k);
  } else if (v.is_array()) {
    const toml::array& a = v.as_array();
    for (size_t i = 0; i < a.size(); ++i)
      refuse_out_of_range_numbers(a[i], origin, fmt::format("{}[{}]", key, i));
  } else if (v.is_floating() && std::fabs(v.as_floating()) < std::numeric_limits<double>::min()) {
    // Below a double's range toml11 reads 0 (or a denormal): seed = 1e-400 became 0 in silence.
    // A zero whose digits before the exponent are not all zeros is such an underflow.
    const std::string text = source_text(v);
    const std::string mantissa = text.substr(0, text.find_first_of("eE"));
    if (mantissa.find_first_of("123456789") != std::string::npos)
      throw InputError(fmt::format(
          "{}: key '{}' = {} is below the smallest number a double holds (2.2e-308); write 0 if "
          "0 is meant",
          origin, key, text));
  } else if (v.is_integer() && (v.as_integer() == std::numeric_limits<int64_t>::max() ||
                                v.as_integer() == std::numeric_limits<int64_t>::min())) {
    const std::string text = source_text(v);
    std::string digits;
    for (char c : text)
      if (c != '_' && c != '+') digits += c;
    const std::string limit = std::to_string(v.as_integer());
    const bool is_limit = digits == limit || digits == "0x7fffffffffffffff" ||
                          digits == "0x7FFFFFFFFFFFFFFF" || digits == "0o777777777777777777777" ||
                          digits == "0b" + std::string(63, '1');
    if (!is_limit)
      throw InputError(
          fmt::format("{}: key '{}' = {} is past the 64-bit integers TOML holds ({} to {})", origin,
                      key, text.empty() ? limit : text, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max()));
  }
}
}  // namespace

toml::value parse_toml(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  toml::value root;
  try {
    root = toml::parse(in, origin);
  } catch (const toml::syntax_error& e) {
    throw InputError(fmt::format("{}: not valid TOML: {}", origin, toml_error_one_line(e.what())));
  } catch (const std::exception& e) {
    throw InputError(fmt::format("{}: not valid TOML: {}", origin, toml_error_one_line(e.what())));
  }
  refuse_out_of_range_numbers(root, origin, "");
  return root;
}

}  // namespace moeplan::detail

namespace moeplan {
void refuse_out_of_range_toml_numbers(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  toml::value root;
  try {
    root = toml::parse(in, origin);
  } catch (const std::exception&) {
    return;  // not TOML: the caller's own parse says where
  }
  detail::refuse_out_of_range_numbers(root, origin, "");
}
}  // namespace moeplan

namespace moeplan::detail {

std::string toml_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);  // shortest representation that reads back exactly
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", unsigned(c));
        else
          out += char(c);
    }
  }
  return out + "\"";
}

TomlTable::TomlTable(const toml::value& table, std::string origin, std::string where)
    : table_(table), origin_(std::move(origin)), where_(std::move(where)) {
  if (!table_.is_table())
    throw InputError(fmt::format("{}: key '{}' must be a table, found {}", origin_,
                                 where_.empty() ? "(top level)" : where_,
                                 toml::stringize(table_.type())));
}

namespace {
// "= 272.5 must be ..., found a float": the value a type error found, as its TOML text (a table
// or an array by its type alone).
std::string found(const toml::value& v, const char* expected) {
  std::string value;
  if (v.is_string()) value = toml_string(v.as_string().str);
  if (v.is_floating()) value = toml_double(v.as_floating());
  if (v.is_integer()) value = std::to_string(v.as_integer());
  if (v.is_boolean()) value = v.as_boolean() ? "true" : "false";
  if (value.size() > 60) {  // cut between characters, never inside one ("é" is two bytes)
    size_t cut = 0;
    for (size_t n;
         cut < value.size() && cut + (n = std::max<size_t>(1, utf8_length_at(value, cut))) <= 57;)
      cut += n;
    value = value.substr(0, cut) + "...";
  }
  const std::string type = v.is_floating()  ? "a float"
                           : v.is_integer() ? "an integer"
                           : v.is_string()  ? "a string"
                           : v.is_boolean() ? "a boolean"
                           : v.is_array()   ? "an array"
                           : v.is_table()   ? "a table"
                                            : toml::stringize(v.type());
  return value.empty() ? fmt::format("must be {}, found {}", expected, type)
                       : fmt::format("= {} must be {}, found {}", value, expected, type);
}
}  // namespace

std::string TomlTable::path(const std::string& key) const {
  return where_.empty() ? key : where_ + "." + key;
}

void TomlTable::fail(const std::string& key, const std::string& what) const {
  throw InputError(fmt::format("{}: key '{}' {}", origin_, path(key), what));
}

bool TomlTable::has(const std::string& key) const {
  return table_.as_table().count(key) > 0;
}

const toml::value* TomlTable::find(const std::string& key, const char* expected) {
  read_.insert(key);
  const auto& t = table_.as_table();
  const auto it = t.find(key);
  if (it == t.end()) fail(key, fmt::format("is missing; expected {}", expected));
  return &it->second;
}

int64_t TomlTable::integer(const std::string& key, const char* expected) {
  const toml::value* v = find(key, expected);
  if (v->is_integer()) return v->as_integer();
  if (v->is_floating()) {
    const double d = v->as_floating();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return int64_t(d);
  }
  fail(key, found(*v, expected));
}

int64_t TomlTable::integer_or(const std::string& key, int64_t fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return integer(key);
}

double TomlTable::number(const std::string& key, const char* expected) {
  const toml::value* v = find(key, expected);
  // No stored figure of a manifest or arch is infinite or NaN: `inf` would pass every
  // relative comparison with what the arch implies (|inf − x| <= rel·inf).
  if (v->is_floating() && !std::isfinite(v->as_floating()))
    fail(key, fmt::format("= {} must be {} (finite)", v->as_floating(), expected));
  if (v->is_floating()) return v->as_floating();
  if (v->is_integer()) return double(v->as_integer());
  fail(key, found(*v, expected));
}

double TomlTable::number_or(const std::string& key, double fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return number(key);
}

std::string TomlTable::string(const std::string& key, const char* expected) {
  const toml::value* v = find(key, expected);
  if (v->is_string()) return v->as_string().str;
  fail(key, found(*v, expected));
}

std::string TomlTable::string_or(const std::string& key, const std::string& fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return string(key);
}

bool TomlTable::boolean(const std::string& key) {
  const toml::value* v = find(key, "true or false");
  if (v->is_boolean()) return v->as_boolean();
  fail(key, found(*v, "true or false"));
}

bool TomlTable::boolean_or(const std::string& key, bool fallback) {
  if (!has(key)) {
    read_.insert(key);
    return fallback;
  }
  return boolean(key);
}

const toml::value& TomlTable::table(const std::string& key) {
  const toml::value* v = find(key, "a table");
  if (!v->is_table()) fail(key, found(*v, "a table"));
  return *v;
}

const toml::array& TomlTable::array(const std::string& key, const char* expected) {
  const toml::value* v = find(key, expected);
  if (!v->is_array()) fail(key, found(*v, expected));
  return v->as_array();
}

void TomlTable::reject_unknown() const {
  for (const auto& [key, value] : table_.as_table())
    if (!read_.count(key)) fail(key, "is not a known key here (misspelled?)");
}

}  // namespace moeplan::detail
