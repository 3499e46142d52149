// moeplan: plan, run, audit and report equal-resource MoE vs dense sweeps.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include <fmt/format.h>

#include "command.hpp"
#include "moeplan/accounting/error.hpp"
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

}  // namespace

}  // namespace moeplan::cli

int main(int argc, char** argv) {
  using namespace moeplan::cli;
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
  if (argc < 2 || (!known && first.rfind('-', 0) != 0)) {
    std::fprintf(stderr, "moeplan: error: %s\n",
                 (argc < 2 ? fmt::format("give a command: {} (moeplan --help)", names)
                           : fmt::format("'{}' is not a moeplan command; use {} (moeplan --help)",
                                         first, names))
                     .c_str());
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moeplan: error: %s\n", parse_error_message(e).c_str());
    return kExitBadInput;
  }
  try {
    for (auto& [sub, action] : actions)
      if (sub->parsed()) return action();
  } catch (const moeplan::InputError& e) {
    // One line, shown as written: a name with a control character is escaped, not obeyed.
    std::fprintf(stderr, "moeplan: error: %s\n", moeplan::printable(e.what()).c_str());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moeplan: error: %s\n", moeplan::printable(e.what()).c_str());
    return kExitInternal;
  }
  return kExitBadInput;
}
