#pragma once
// File reading and writing for the audit (the checks themselves are pure and live elsewhere).
#include <filesystem>
#include <string>
#include <vector>

#include "moeplan/audit/spec.hpp"
#include "moeplan/audit/table.hpp"
#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan::audit {

// Whole file as text; InputError naming the path when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

AuditSpec load_spec(const std::filesystem::path& path);

// The tables named by --claims plus those the spec lists with file = "..." (relative to the spec's
// folder). A --claims file takes the name of the spec table whose file it is, else its stem.
std::vector<ClaimTable> load_claim_tables(const std::vector<std::filesystem::path>& claim_files,
                                          const AuditSpec& spec,
                                          const std::filesystem::path& spec_dir);

// Reports are written with the project's one atomic writer (temp file, fsync, rename).
using moeplan::write_file_atomic;

}  // namespace moeplan::audit
