#pragma once
// Whole-file writes that never leave a half-written file behind.
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace moeplan {

// Writes `content` to a temp file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the folder. A file replaced keeps its permission bits (a new one is 0644); a symlink is
// followed and its target replaced, the link kept. A path that is neither a regular file nor
// a folder (a terminal, a pipe: -o /dev/stdout) is written directly, as a stream. Throws InputError
// naming the path and the system's reason on failure.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);
// The same, the file being `parts` one after another: a large file (a checkpoint's weights and
// optimizer state) is written from where its parts lie, without first joining them in memory.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::string_view> parts);

// A file name's extension in lower case, with its dot: "r.HTML" -> ".html", "x" -> "". The output
// formats are chosen by it (-o r.MD is Markdown as r.md is).
inline std::string extension_lower(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  for (char& c : ext)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return ext;
}

}  // namespace moeplan
