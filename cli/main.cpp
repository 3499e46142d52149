// moeplan: plan, run, audit and report equal-resource MoE vs dense sweeps.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
#include "moeplan/reports/text_table.hpp"
#include "moeplan/sweeps/escape.hpp"

namespace moeplan::cli {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace

bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}
const std::vector<Command>& commands() {
  return registry();
}

size_t terminal_width() {
  if (const char* env = std::getenv("MOEPLAN_COLUMNS")) {
    const std::string v = env;
    size_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n > 100000)
      throw moeplan::InputError(fmt::format(
          "MOEPLAN_COLUMNS '{}' is not a width: give a whole number of terminal columns up to "
          "100000 for tables to fit in, or 0 for whole rows",
          moeplan::printable(v)));
    return n;
  }
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0)
    return size_t(ws.ws_col);
  return 0;
}

std::string for_terminal(const std::string& text) {
  return moeplan::fit_to_width(text, terminal_width());
}

std::vector<std::string>& args_storage() {
  static std::vector<std::string> a;
  return a;
}
const std::vector<std::string>& program_args() {
  return args_storage();
}

namespace {

// CLI11 words a single-value option given twice as "--N: At Most 1 required but received 2";
// say what happened instead. Every other parse error reads as CLI11 words it.
std::string parse_error_message(const CLI::ParseError& e) {
  const std::string what = e.what();
  const std::string at_most = ": At Most 1 required but received ";
  const size_t at = what.find(at_most);
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) == nullptr || at == std::string::npos)
    return what;
  const std::string option = what.substr(0, at), times = what.substr(at + at_most.size());
  return fmt::format("{} was given {} times; give it once", option, times);
}

// "--compute=" (nothing after '='): CLI11 took the next argument as its value, or said "1
// required TEXT:VALUE missing". As "--compute ''" it gets the option's own word on an empty value.
// Only an option of `sub` that takes a value; not a flag ("--count-router=" is CLI11's to read),
// nor anything after "--" (a file named "--x=").
std::vector<std::string> split_empty_assignments(int argc, char** argv, const CLI::App* sub) {
  std::vector<std::string> out;
  bool options = true;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") options = false;
    const CLI::Option* opt =
        options && sub && a.size() > 3 && a.rfind("--", 0) == 0 && a.find('=') == a.size() - 1
            ? sub->get_option_no_throw(a.substr(0, a.size() - 1))
            : nullptr;
    if (i > 0 && opt && opt->get_expected_max() > 0) {
      out.push_back(a.substr(0, a.size() - 1));
      out.emplace_back();
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// For CLI11's "The following arguments were not expected: 1 --threads" (its list reversed): the
// first option the command does not have, and the commands that do.
std::string unknown_option_message(const CLI::App& app, const CLI::App& sub,
                                   const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--") break;  // what follows is positional
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;
    const std::string name = a.substr(0, a.find('='));
    if (sub.get_option_no_throw(name) != nullptr) continue;
    // "-og2.toml": a short option with its value attached.
    if (a[1] != '-' && sub.get_option_no_throw(a.substr(0, 2)) != nullptr) continue;
    std::vector<std::string> owners;
    for (const CLI::App* other : app.get_subcommands([](const CLI::App*) { return true; }))
      if (other != &sub && other->get_option_no_throw(name) != nullptr)
        owners.push_back("`moeplan " + other->get_name() + "`");
    std::string owned;
    for (size_t i = 0; i < owners.size(); ++i)
      owned += (i == 0 ? "" : i + 1 == owners.size() ? " and " : ", ") + owners[i];
    return fmt::format("'{}' is not an option of `moeplan {}`{} (moeplan {} --help lists its own)",
                       name, sub.get_name(),
                       owners.empty() ? std::string() : "; it is one of " + owned, sub.get_name());
  }
  return {};
}

}  // namespace

}  // namespace moeplan::cli

namespace {
// What a command printed must have reached stdout: a full disk or a closed stdout lost it, with
// exit 0 and an empty file that looked like success. `run` that trains is exempt: its results
// are its files, and its progress lines to a reader that left are dropped, not a failure (an
// estimate's result is its output: not exempt). A command that failed keeps its status (audit's
// 1: a claim fails) and is told that its output was lost too.
int check_stdout(int rc, bool exempt, bool reported) {
  errno = 0;
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout;
  if (!failed || exempt || reported) return rc;
  const int err = errno;
  std::fprintf(stderr, "moeplan: error: cannot write the output to stdout%s\n",
               err ? fmt::format(" ({})", std::strerror(err)).c_str() : "");
  return rc == 0 ? moeplan::cli::kExitBadInput : rc;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace moeplan::cli;
  bool exempt = false, reported = false;
  const int rc = [&] {
    args_storage().assign(argv + (argc > 0 ? 1 : 0), argv + argc);
    CLI::App app{"moeplan: plan, train, audit and report equal-resource MoE vs dense sweeps"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "moeplan 0.1.0");
    auto cmds = commands();
    std::sort(cmds.begin(), cmds.end(),
              [](const Command& a, const Command& b) { return a.order < b.order; });
    std::map<CLI::App*, std::function<int()>> actions;
    for (const Command& c : cmds) {
      CLI::App* sub = app.add_subcommand(c.name, c.description);
      actions[sub] = c.setup(*sub);
    }
    // "A subcommand is required" is all CLI11 says to `moeplan foo` and to a bare `moeplan`.
    std::string names;
    for (const Command& c : cmds) names += (names.empty() ? "" : ", ") + c.name;
    const std::string first = argc > 1 ? argv[1] : "";
    const bool known =
        std::any_of(cmds.begin(), cmds.end(), [&](const Command& c) { return c.name == first; });
    const bool top_flag = first == "-h" || first == "--help" || first == "--version";
    if (argc < 2 || (!known && first.rfind('-', 0) != 0)) {
      std::fprintf(stderr, "moeplan: error: %s\n",
                   (argc < 2 ? fmt::format("give a command: {} (moeplan --help)", names)
                             : fmt::format("'{}' is not a moeplan command; use {} (moeplan --help)",
                                           first, names))
                       .c_str());
      return kExitBadInput;
    }
    if (!known && !top_flag) {  // "moeplan --nosuch": CLI11 said "A subcommand is required"
      std::fprintf(stderr, "moeplan: error: %s\n",
                   fmt::format("'{}' is not a moeplan option; give a command first: {} (moeplan "
                               "--help)",
                               moeplan::printable(first), names)
                       .c_str());
      return kExitBadInput;
    }
    const CLI::App* chosen = nullptr;
    for (const auto& [sub, action] : actions)
      if (sub->get_name() == first) chosen = sub;
    std::vector<std::string> args = split_empty_assignments(argc, argv, chosen);
    std::vector<char*> arg_ptrs;
    for (std::string& a : args) arg_ptrs.push_back(a.data());
    try {
      app.parse(int(arg_ptrs.size()), arg_ptrs.data());
    } catch (const CLI::ExtrasError& e) {
      std::string message;
      for (const auto& [sub, action] : actions)
        if (sub->parsed())
          message = unknown_option_message(app, *sub, {args.begin() + 2, args.end()});
      std::fprintf(stderr, "moeplan: error: %s\n",
                   message.empty() ? e.what() : moeplan::printable(message).c_str());
      return kExitBadInput;
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      // Printed here, not by CLI11 (which flushes it at once): a stdout that cannot take it is
      // then said with its reason by check_stdout, as every command's output is.
      std::fprintf(stdout, "%s\n", e.what());
      return 0;
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "moeplan: error: %s\n", parse_error_message(e).c_str());
      return kExitBadInput;
    }
    try {
      terminal_width();  // a bad MOEPLAN_COLUMNS is said before any work
      for (auto& [sub, action] : actions)
        if (sub->parsed()) {
          exempt = sub->get_name() == "run" && sub->count("--estimate") == 0;
          return action();
        }
    } catch (const std::system_error& e) {
      // fmt::print throws this when stdout cannot take the text (a full disk, a closed stdout).
      if (std::ferror(stdout)) {
        std::fprintf(stderr, "moeplan: error: cannot write the output to stdout (%s)\n",
                     moeplan::printable(e.code().message()).c_str());
        reported = true;
        return kExitBadInput;
      }
      std::fprintf(stderr, "moeplan: error: %s\n", moeplan::printable(e.what()).c_str());
      return kExitInternal;
    } catch (const moeplan::InputError& e) {
      // One line, shown as written: a name with a control character is escaped, not obeyed.
      std::fprintf(stderr, "moeplan: error: %s\n", moeplan::printable(e.what()).c_str());
      return kExitBadInput;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "moeplan: error: %s\n", moeplan::printable(e.what()).c_str());
      return kExitInternal;
    }
    return kExitBadInput;
  }();
  return check_stdout(rc, exempt, reported);
}
