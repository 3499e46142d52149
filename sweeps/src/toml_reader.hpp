#pragma once
// Private to sweeps: typed access to one TOML table with errors that name the file, the full
// key path and what was expected, and a check that no unknown (misspelled) key is left over.
#include <cstdint>
#include <set>
#include <string>

#include <toml.hpp>

namespace moeplan::detail {

class TomlTable {
 public:
  // `where` is the key path of this table ("" for the top level, "points[2].arch", ...).
  TomlTable(const toml::value& table, std::string origin, std::string where);

  bool has(const std::string& key) const;
  int64_t integer(const std::string& key, const char* expected = "an integer");
  int64_t integer_or(const std::string& key, int64_t fallback);
  double number(const std::string& key, const char* expected = "a number");
  double number_or(const std::string& key, double fallback);
  std::string string(const std::string& key, const char* expected = "a string");
  std::string string_or(const std::string& key, const std::string& fallback);
  bool boolean(const std::string& key);
  bool boolean_or(const std::string& key, bool fallback);
  const toml::value& table(const std::string& key);
  const toml::array& array(const std::string& key, const char* expected);
  // Throws if a key was never read: "unknown key 'lr_peek' in points[1]".
  void reject_unknown() const;

  // "FILE: key 'points[2].arch.d_model': <what>" as an InputError.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  std::string path(const std::string& key) const;
  const std::string& origin() const { return origin_; }

 private:
  const toml::value* find(const std::string& key, const char* expected);
  const toml::value& table_;
  std::string origin_;
  std::string where_;
  std::set<std::string> read_;
};

// Parses TOML text; a syntax error becomes one InputError line naming the origin.
toml::value parse_toml(const std::string& text, const std::string& origin);

// TOML literals: shortest round-trip doubles (always with '.' or 'e'), escaped basic strings.
std::string toml_double(double v);
std::string toml_string(const std::string& s);

}  // namespace moeplan::detail
