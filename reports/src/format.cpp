#include "moeplan/reports/format.hpp"

#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan {

std::string_view name(Format f) {
  switch (f) {
    case Format::table:
      return "table";
    case Format::csv:
      return "csv";
    case Format::json:
      return "json";
    case Format::toml:
      return "toml";
    case Format::md:
      return "md";
  }
  return "?";
}

std::optional<Format> parse_format(std::string_view s) {
  for (Format f : {Format::table, Format::csv, Format::json, Format::toml, Format::md})
    if (s == name(f)) return f;
  return std::nullopt;
}

std::optional<Format> format_from_extension(const std::filesystem::path& path) {
  const std::string ext = extension_lower(path);
  if (ext == ".toml") return Format::toml;
  if (ext == ".json") return Format::json;
  if (ext == ".csv") return Format::csv;
  if (ext == ".md") return Format::md;
  if (ext == ".txt") return Format::table;
  return std::nullopt;
}

std::string format_names() {
  return "table, csv, json, toml, md";
}

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace moeplan
