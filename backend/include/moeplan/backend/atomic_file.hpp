#pragma once
// Files a user keeps are written atomically: temp file in the same folder, fsync, rename, fsync of
// the folder. A crash leaves either the old file or the new one, never half of one.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan::backend {

// The project's one atomic writer (sweeps/atomic_file.hpp): temp file in the same folder, fsync,
// rename, fsync of the folder; InputError naming the path and the OS reason on failure.
using moeplan::write_file_atomic;

// Whole file into memory; throws InputError naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& path);

// Creates `dir` (and parents) and proves it is writable by writing and removing a probe file.
// Throws InputError("cannot write to '<dir>': <reason>") otherwise.
void ensure_writable_dir(const std::filesystem::path& dir);

}  // namespace moeplan::backend
