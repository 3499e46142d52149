#include "moeplan/sweeps/atomic_file.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

namespace {
// Names the file given and, when it is a link, the file written.
[[noreturn]] void fail(const std::filesystem::path& link, const std::filesystem::path& path,
                       const char* step, int err) {
  const std::string through =
      link == path ? std::string() : fmt::format(" (a link to '{}')", path.string());
  throw InputError(fmt::format("cannot write '{}'{}: {} failed: {}", link.string(), through, step,
                               std::strerror(err)));
}

// Writes every byte of `parts` to `fd`, retrying short and interrupted writes: false (errno
// set) on an error.
bool write_all(int fd, std::span<const std::string_view> parts) {
  for (const std::string_view content : parts) {
    size_t done = 0;
    while (done < content.size()) {
      const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      done += size_t(n);
    }
  }
  return true;
}

// Writes `parts` to a file that is not a regular one (a terminal, a pipe), opened as it is.
void write_stream(const std::filesystem::path& path, std::span<const std::string_view> parts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path, path, "opening it", errno);
  if (!write_all(fd, parts)) {
    const int err = errno;
    ::close(fd);
    fail(path, path, "write", err);
  }
  if (::close(fd) != 0) fail(path, path, "close", errno);
}
}  // namespace

std::string read_input_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format("'{}' is a folder; give the {} file", path.string(), what));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw InputError(
        fmt::format("cannot read {} file '{}' ({})", what, path.string(), std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(
          fmt::format("cannot read {} file '{}' ({})", what, path.string(), std::strerror(err)));
    }
    if (n == 0) break;
    if (out.size() + size_t(n) > kMaxInputBytes) {
      ::close(fd);
      throw InputError(
          fmt::format("{} file '{}' is larger than {} MiB, more than any such text "
                      "file moeplan reads (is it the right file?)",
                      what, path.string(), kMaxInputBytes >> 20));
    }
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  write_file_atomic(path, std::span<const std::string_view>(&content, 1));
}

void write_file_atomic(const std::filesystem::path& link, std::span<const std::string_view> parts) {
  namespace fs = std::filesystem;
  // A terminal, pipe or other device (-o /dev/stdout) has no folder to rename into and no
  // half-written state to avoid: it is written as it is, in order.
  struct stat target {};
  if (::stat(link.c_str(), &target) == 0 && !S_ISREG(target.st_mode) && !S_ISDIR(target.st_mode)) {
    write_stream(link, parts);
    return;
  }
  // A symlink is written through: its target is replaced, the link stays (a sweep.toml linked
  // from a shared folder keeps being the shared file).
  std::error_code ec;
  fs::path path = link;
  for (int hops = 0; fs::is_symlink(path, ec) && hops < 40; ++hops) {
    const fs::path to = fs::read_symlink(path, ec);
    if (ec) fail(link, link, "reading the symlink", ec.value());
    path = to.is_absolute() ? to : path.parent_path() / to;
  }
  if (fs::is_symlink(path, ec)) fail(link, link, "following the symlink", ELOOP);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  // A file replaced keeps its permission bits; a new one is 0644 (these files are shared).
  struct stat old_st {};
  const mode_t mode = ::stat(path.c_str(), &old_st) == 0 && S_ISREG(old_st.st_mode)
                          ? mode_t(old_st.st_mode & 07777)
                          : mode_t(0644);
  // Ctrl-C, a closed terminal or a kill between mkstemp and rename left a full-size hidden temp
  // file beside the target, which nothing removed: those signals wait until the rename is done
  // (or the temp removed), then act as they would have.
  struct HoldStops {
    sigset_t old{};
    HoldStops() {
      sigset_t hold;
      sigemptyset(&hold);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&hold, s);
      pthread_sigmask(SIG_BLOCK, &hold, &old);
    }
    ~HoldStops() { pthread_sigmask(SIG_SETMASK, &old, nullptr); }
  } hold;
  // A unique temp name beside the target, so concurrent writers never share one.
  std::string tmp = (dir / fmt::format(".{}.tmp.XXXXXX", path.filename().string())).string();
  const int fd = ::mkstemp(tmp.data());
  const int made = fd < 0 ? errno : 0;
  // Said as the user sees it, not as the temp file's failure.
  const std::string through =
      link == path ? std::string() : fmt::format(" (a link to '{}')", path.string());
  if (made == ENOENT)
    throw InputError(
        fmt::format("cannot write '{}'{}: its folder '{}' does not exist (create it "
                    "first, or choose another path)",
                    link.string(), through, dir.string()));
  if (made == EACCES || made == EROFS)
    throw InputError(
        fmt::format("cannot write '{}'{}: its folder '{}' does not let this process "
                    "write in it ({})",
                    link.string(), through, dir.string(), std::strerror(made)));
  if (fd < 0) fail(link, path, "creating a temp file in its folder", made);
  auto abandon = [&](const char* step) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(link, path, step, err);
  };
  if (::fchmod(fd, mode) != 0) abandon("fchmod");  // mkstemp makes 0600
  if (!write_all(fd, parts)) abandon("write");
  if (::fsync(fd) != 0) abandon("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(link, path, "close", err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EISDIR)
      throw InputError(
          fmt::format("cannot write '{}': it is a folder; give a file name", link.string()));
    fail(link, path, "rename", err);
  }
  // The rename itself must reach the disk too.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace moeplan
