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

// For integer options: plain decimal digits with an optional sign. CLI11 reads "010" as octal 8
// and "0x5" as hex; a count typed with a leading zero means ten. Leading zeros are dropped.
inline CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& value) {
        size_t i = value.size() > 0 && (value[0] == '-' || value[0] == '+') ? 1 : 0;
        const size_t digits = i;
        while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
        if (i == digits || i != value.size())
          return "'" + value + "' is not a whole number in decimal digits (e.g. 8)";
        const size_t first = value.find_first_not_of('0', digits);
        value.erase(digits, (first == std::string::npos ? value.size() - 1 : first) - digits);
        return std::string();
      },
      "INT");
}

bool register_command(Command c);
const std::vector<Command>& commands();
// The command line as given, without the program name (kept by main for `run --nproc`, whose
// ranks are this program again with the same arguments).
const std::vector<std::string>& program_args();

}  // namespace moeplan::cli
