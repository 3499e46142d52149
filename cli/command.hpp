#pragma once
// Each sub-command lives in its own cli/cmd_*.cpp and registers itself here at start-up.
// The CLI only parses flags, calls the libraries and prints: no logic of its own.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace moeplan::cli {

// Exit statuses shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitClaimFailed = 1;  // audit: a claim does not hold
inline constexpr int kExitBadInput = 2;     // unusable input; one line on stderr
// Anything else that went wrong (a failed system call, an allocation, a bug): one line on
// stderr, a status of its own (sysexits' EX_SOFTWARE), not run's 3 (points left to another
// process) or 4 (diverged), which a script acts on.
inline constexpr int kExitInternal = 70;

// `setup` declares the sub-command's flags on `app` and returns the action to run after parsing.
using Setup = std::function<std::function<int()>(CLI::App& app)>;
struct Command {
  std::string name;
  std::string description;
  int order;  // position in --help
  Setup setup;
};

// For options that name a file or folder: an empty value ('') is refused, not read as "not given".
// `what`: "file name" or "folder name", as the option takes.
inline CLI::Validator non_empty_path(const char* what) {
  return CLI::Validator(
      [what](std::string& value) {
        return value.empty() ? "'' is an empty path; give a " + std::string(what) : std::string();
      },
      "PATH");
}

// For options whose absence means a default (--compute, --vocab, ...): an empty value ('', a
// shell variable left unset) is refused, not read as "not given" and planned on the default.
inline CLI::Validator non_empty_value() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string(
                                   "'' is empty; give a value, or leave the flag out for "
                                   "its default")
                             : std::string();
      },
      "VALUE");
}

// For integer options: plain decimal digits with an optional sign, in [lo, hi]. CLI11 reads "010"
// as octal 8 and "0x5" as hex; a count typed with a leading zero means ten. Leading zeros are
// dropped. A value past the type (int64, or an int's range given) is refused naming the range:
// CLI11 clamped one past int64 to its maximum in silence, and said only "Could not convert" past
// an int. (Each option checks its own lower bound within it, with its own words; a value below the
// type is refused here naming `least`, the option's own smallest value, not the type's minimum.)
inline CLI::Validator decimal_integer(int64_t hi = std::numeric_limits<int64_t>::max(),
                                      int64_t lo = std::numeric_limits<int64_t>::min(),
                                      int64_t least = std::numeric_limits<int64_t>::min()) {
  return CLI::Validator(
      [hi, lo, least](std::string& value) {
        size_t i = value.size() > 0 && (value[0] == '-' || value[0] == '+') ? 1 : 0;
        const size_t digits = i;
        while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
        if (i == digits || i != value.size())
          return "'" + value + "' is not a whole number in decimal digits (e.g. 8)";
        const size_t first = value.find_first_not_of('0', digits);
        value.erase(digits, (first == std::string::npos ? value.size() - 1 : first) - digits);
        int64_t v = 0;
        const char* b = value.data() + (value[0] == '+' ? 1 : 0);
        const auto [end, ec] = std::from_chars(b, value.data() + value.size(), v);
        // Past int64 from_chars fails; the sign says which side. Only the side crossed is named
        // (an option's own lower bound is checked with its own words).
        const bool negative = value[0] == '-';
        if (ec != std::errc() || end != value.data() + value.size() || v > hi || v < lo) {
          if ((ec != std::errc() && !negative) || (ec == std::errc() && v > hi))
            return "'" + value + "' is above the largest value allowed, " + std::to_string(hi);
          return "'" + value + "' is below the smallest value allowed, " +
                 std::to_string(std::max(least, lo));
        }
        return std::string();
      },
      "INT");
}

// How wide a line may print: MOEPLAN_COLUMNS where set (0: any width), else the width of the
// terminal standard output is, read anew each call (a window resized during a run), else 0 (a
// pipe or a file gets lines as they are). InputError on a MOEPLAN_COLUMNS that is not a whole
// number; main reads it before any command's work.
size_t terminal_width();
// `text` for standard output at terminal_width(): its wider tables in parts that fit, the key
// column in each, and its longer prose broken at spaces (moeplan::fit_to_width).
std::string for_terminal(const std::string& text);

bool register_command(Command c);
const std::vector<Command>& commands();
// The command line as given, without the program name (kept by main for `run --nproc`, whose
// ranks are this program again with the same arguments).
const std::vector<std::string>& program_args();

}  // namespace moeplan::cli
