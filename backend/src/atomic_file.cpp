#include "moeplan/backend/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan::backend {

namespace fs = std::filesystem;

namespace {

std::string os_reason() {
  return std::strerror(errno);
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // some file systems refuse; the rename itself is still atomic
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  const fs::path dir = path.parent_path();
  // fmt rather than string operator+: GCC 12 raises a false -Wrestrict on the latter at -O3.
  std::string tmpl = (dir / fmt::format(".{}.tmp.XXXXXX", path.filename().string())).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    throw std::runtime_error(fmt::format("cannot write '{}': {}", path.string(), os_reason()));
  auto fail = [&](const char* what) {
    const std::string reason = os_reason();
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw std::runtime_error(
        fmt::format("cannot write '{}' ({}): {}", path.string(), what, reason));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    done += size_t(n);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const std::string reason = os_reason();
    ::unlink(tmpl.c_str());
    throw std::runtime_error(fmt::format("cannot write '{}' (close): {}", path.string(), reason));
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const std::string reason = os_reason();
    ::unlink(tmpl.c_str());
    throw std::runtime_error(fmt::format("cannot write '{}' (rename): {}", path.string(), reason));
  }
  fsync_dir(dir);
}

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
