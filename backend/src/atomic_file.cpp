#include "moeplan/backend/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan::backend {

namespace fs = std::filesystem;

namespace {

std::string os_reason() {
  return std::strerror(errno);
}

}  // namespace

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path.string(), os_reason()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(fmt::format("cannot read '{}': read error", path.string()));
  return std::move(ss).str();
}

void ensure_writable_dir(const fs::path& dir) {
  std::error_code ec;
  // The nearest part of the path that exists must be a folder (or a link to one): a file there,
  // or a link to nothing, made create_directories say only "File exists".
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    if (fs::exists(fs::symlink_status(p, ec))) {
      if (fs::is_symlink(fs::symlink_status(p, ec)) && !fs::exists(fs::status(p, ec)))
        throw InputError(
            fmt::format("cannot write to '{}': '{}' is a link to '{}', which does "
                        "not exist; make that folder, or give another",
                        dir.string(), p.string(), fs::read_symlink(p, ec).string()));
      if (!fs::is_directory(fs::status(p, ec)))
        throw InputError(
            fmt::format("cannot write to '{}': '{}' is a file, not a folder; give "
                        "a folder, or move the file away",
                        dir.string(), p.string()));
      break;
    }
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("cannot write to '{}': {}", dir.string(), ec.message()));
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("cannot write to '{}': not a directory", dir.string()));
  const fs::path probe = dir / ".moeplan-write-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw InputError(fmt::format("cannot write to '{}': {}", dir.string(), os_reason()));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace moeplan::backend
