#pragma once
// Whole-file writes that never leave a half-written file behind.
#include <filesystem>
#include <string_view>

namespace moeplan {

// Writes `content` to a temp file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the folder. Throws InputError naming the path and the system's reason on failure.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

}  // namespace moeplan
