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

// An input file a user names (a manifest, an arch or backbone file, a claim table or spec), read
// whole: at most kMaxInputBytes, so that /dev/zero or a multi-GB file by mistake is refused in a
// line instead of filling memory. A pipe (`<(...)`) is read as a file. Throws InputError naming
// the path, `what` it should be and the system's reason; a folder is refused as such.
inline constexpr std::size_t kMaxInputBytes = std::size_t(256) << 20;
std::string read_input_file(const std::filesystem::path& path, std::string_view what);

// A file name's extension in lower case, with its dot: "r.HTML" -> ".html", "x" -> "". The output
// formats are chosen by it (-o r.MD is Markdown as r.md is).
inline std::string extension_lower(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  for (char& c : ext)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return ext;
}

}  // namespace moeplan
