#include "moeplan/sweeps/atomic_file.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

namespace {
[[noreturn]] void fail(const std::filesystem::path& path, const char* step, int err) {
  throw InputError(
      fmt::format("cannot write '{}': {} failed: {}", path.string(), step, std::strerror(err)));
}
}  // namespace

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  const std::filesystem::path dir =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // A unique temp name beside the target, so concurrent writers never share one.
  std::string tmp = (dir / fmt::format(".{}.tmp.XXXXXX", path.filename().string())).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) fail(path, "creating a temp file in its folder", errno);
  auto abandon = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, step, err);
  };
  if (::fchmod(fd, 0644) != 0) abandon("fchmod");  // mkstemp makes 0600; these files are shared
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("write");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) abandon("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, "close", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, "rename", err);
  }
  // The rename itself must reach the disk too.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace moeplan
