#include "moeplan/audit/io.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan::audit {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw InputError(fmt::format("{}: is a folder, expected a file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(fmt::format("{}: cannot read ({})", path.string(), std::strerror(errno)));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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
  };
  for (const fs::path& f : claim_files) {
    const fs::path cf = canonical_or_self(f);
    const TableSpec* match = nullptr;
    for (const TableSpec& ts : spec.tables)
      if (!ts.file.empty() && canonical_or_self(spec_dir / ts.file) == cf) match = &ts;
    const std::string name = match ? match->name : f.stem().string();
    load(f, name, match ? match : spec.table(name));
  }
  for (const TableSpec& ts : spec.tables) {
    if (ts.file.empty()) continue;
    const fs::path f = spec_dir / ts.file;
    if (std::find(loaded.begin(), loaded.end(), canonical_or_self(f)) != loaded.end()) continue;
    load(f, ts.name, &ts);
  }
  return tables;
}

}  // namespace moeplan::audit
