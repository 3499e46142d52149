#pragma once
// Each sub-command lives in its own cli/cmd_*.cpp and registers itself here at start-up.
// The CLI only parses flags, calls the libraries and prints: no logic of its own.
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace moeplan::cli {

// Exit statuses shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitClaimFailed = 1;  // audit: a claim does not hold
inline constexpr int kExitBadInput = 2;     // unusable input; one line on stderr

// `setup` declares the sub-command's flags on `app` and returns the action to run after parsing.
using Setup = std::function<std::function<int()>(CLI::App& app)>;
struct Command {
  std::string name;
  std::string description;
  int order;  // position in --help
  Setup setup;
};

// For options that name a file or folder: an empty value ('') is refused, not read as "not given".
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string("'' is an empty path; give a file or folder name")
                             : std::string();
      },
      "PATH");
}

bool register_command(Command c);
const std::vector<Command>& commands();
// The command line as given, without the program name (kept by main for `run --nproc`, whose
// ranks are this program again with the same arguments).
const std::vector<std::string>& program_args();

}  // namespace moeplan::cli
