#pragma once
// Output formats of `moeplan grid` / `moeplan plan`, by name or by file extension.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace moeplan {

enum class Format { table, csv, json, toml, md };

std::string_view name(Format f);
std::optional<Format> parse_format(std::string_view s);
// ".toml" -> toml, ".json" -> json, ".csv" -> csv, ".md" -> md, ".txt" -> table; else nullopt.
std::optional<Format> format_from_extension(const std::filesystem::path& path);
std::string format_names();  // "table, csv, json, toml, md"

// One CSV field (RFC 4180): quoted, its quotes doubled, where it holds a comma, a quote or a line
// break; as it is otherwise.
std::string csv_field(std::string_view s);

}  // namespace moeplan
