#pragma once
// A test program's own scratch folder, under the system's temp folder and named by the process
// id, so that two checkouts testing at once on one machine never share one; removed when the
// program exits normally (a forked child that execs or _exits leaves it alone).
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace moeplan::test {

inline std::filesystem::path scratch() {
  struct Folder {
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("moeplan-test-" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(dir); }
    ~Folder() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static const Folder f;
  return f.dir;
}

// scratch()/name, emptied.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path d = scratch() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace moeplan::test
