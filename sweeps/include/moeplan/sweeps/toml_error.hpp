#pragma once
// toml11's parse errors span several lines (the message, then the file, line number and a caret
// under the place): moeplan's errors are one line.
#include <string>
#include <string_view>

namespace moeplan {

// `what` with every run of whitespace (line breaks included) made one space: "[error] toml::
// insert_value: value ("name") already exists. --> s.toml | 3 | name = "a" | ~~~ ...", the
// line numbers kept.
std::string toml_error_one_line(std::string_view what);

}  // namespace moeplan
