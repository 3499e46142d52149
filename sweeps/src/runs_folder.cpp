#include "moeplan/sweeps/runs_folder.hpp"

#include <algorithm>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "moeplan/accounting/error.hpp"

namespace moeplan {

namespace fs = std::filesystem;

namespace {
// An error that says the path is no folder or no file: nothing there to read.
bool nothing_there(const std::error_code& ec) {
  return ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory ||
         ec == std::errc::too_many_symbolic_link_levels;
}
}  // namespace

std::vector<fs::path> point_record_files(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec)
    throw InputError(
        fmt::format("cannot read the runs folder '{}' ({})", dir.string(), ec.message()));
  std::vector<fs::path> out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path entry = it->path();
    std::error_code st;
    const bool folder = fs::is_directory(fs::status(entry, st));
    if (st && !nothing_there(st))
      throw InputError(fmt::format("cannot read '{}' ({}) in the runs folder '{}'", entry.string(),
                                   st.message(), dir.string()));
    if (!folder) continue;
    const fs::path record = entry / "record.json";
    const fs::file_status rs = fs::status(record, st);
    if (st && !nothing_there(st))
      throw InputError(fmt::format("cannot read '{}' ({}); fix the point folder's permissions",
                                   record.string(), st.message()));
    if (fs::exists(rs)) out.push_back(record);
  }
  if (ec)
    throw InputError(
        fmt::format("cannot read the runs folder '{}' ({})", dir.string(), ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

std::string json_error_text(const std::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("[json.exception.")) {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return std::string(what);
}

std::string damaged_record_remedy(const fs::path& record) {
  // `run` says whether the checkpoint is this plan's before it resumes from it.
  std::error_code ec;
  const bool ckpt =
      fs::exists(fs::symlink_status(record.parent_path() / "checkpoint" / "state.ckpt", ec));
  return fmt::format("{}move the point's folder away and run it again",
                     ckpt ? "remove only record.json and run the sweep again, which resumes from "
                            "the point's checkpoint and rebuilds the record, or "
                          : "");
}

}  // namespace moeplan
