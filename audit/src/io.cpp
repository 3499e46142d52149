#include "moeplan/audit/io.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"
#include "moeplan/sweeps/atomic_file.hpp"

namespace moeplan::audit {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  const std::string ext = extension_lower(path);
  return read_input_file(path, ext == ".csv"    ? "claim table"
                               : ext == ".toml" ? "audit spec"
                                                : "audit input");
}

AuditSpec load_spec(const fs::path& path) {
  return parse_spec(read_text_file(path), path.string());
}

namespace {
fs::path canonical_or_self(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c;
}
}  // namespace

std::vector<ClaimTable> load_claim_tables(const std::vector<fs::path>& claim_files,
                                          const AuditSpec& spec, const fs::path& spec_dir) {
  std::vector<ClaimTable> tables;
  std::vector<fs::path> loaded;
  auto load = [&](const fs::path& file, const std::string& name, const TableSpec* ts) {
    for (const ClaimTable& t : tables)
      if (t.name == name)
        throw InputError(
            fmt::format("two claim tables are named '{}' ({} and {}); rename one or "
                        "list it in the spec under another [tables.NAME]",
                        name, t.source, file.string()));
    tables.push_back(parse_claim_table(read_text_file(file), name, file.string(),
                                       ts ? ts->ignore : std::set<std::string>{}));
    loaded.push_back(canonical_or_self(file));
    // A printed value wins over a shared one: where the two disagree beyond their rounding, the
    // spec said something about the table that the table does not say, refused.
    if (ts)
      for (const auto& [q, shared] : ts->shared)
        for (size_t i = 0; i < tables.back().rows.size(); ++i) {
          const auto& row = tables.back().rows[i];
          const auto it = row.find(q);
          if (it == row.end()) continue;
          const Cell& c = it->second;
          if (std::fabs(c.value - shared.value) <=
              c.half_width + shared.half_width + 1e-12 * std::fabs(shared.value))
            continue;
          throw InputError(fmt::format(
              "{} data row {} prints {} = {}, the spec's [tables.{}.shared] says {} = {}; a "
              "shared value is for what the table does not print: remove it, or fix the one "
              "that is wrong",
              file.string(), i + 1, q, c.text, name, q, shared.text));
        }
  };
  for (const fs::path& f : claim_files) {
    const fs::path cf = canonical_or_self(f);
    if (std::find(loaded.begin(), loaded.end(), cf) != loaded.end())
      throw InputError(fmt::format("--claims {} is given twice; give each table once", f.string()));
    const TableSpec* match = nullptr;
    for (const TableSpec& ts : spec.tables)
      if (!ts.file.empty() && canonical_or_self(spec_dir / ts.file) == cf) match = &ts;
    const std::string name = match ? match->name : f.stem().string();
    load(f, name, match ? match : spec.table(name));
  }
  for (const TableSpec& ts : spec.tables) {
    if (ts.file.empty()) continue;
    const fs::path f = spec_dir / ts.file;
    if (const auto at = std::find(loaded.begin(), loaded.end(), canonical_or_self(f));
        at != loaded.end()) {
      // Loaded already: by --claims for this entry, or by another entry of the same file.
      const std::string& other = tables[size_t(at - loaded.begin())].name;
      if (other != ts.name)
        throw InputError(
            fmt::format("[tables.{}] file = \"{}\" is [tables.{}]'s file too; one table, one entry",
                        ts.name, ts.file, other));
      continue;
    }
    try {
      load(f, ts.name, &ts);
    } catch (const InputError& e) {
      // The spec's own words for where the file was named (a relative file is read from the
      // spec's folder).
      if (!fs::exists(f))
        throw InputError(fmt::format("[tables.{}] file = \"{}\": {}", ts.name, ts.file, e.what()));
      throw;
    }
  }
  return tables;
}

}  // namespace moeplan::audit
